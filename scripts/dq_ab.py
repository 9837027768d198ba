"""The Hopper backward's dQ paths on the backward anchor rows: the portable dQ kernel, the Gluon one (also on a side
stream beside the dK/dV kernel), and dQ fused into the dK/dV kernel; device time of the whole backward (CUDA events
behind a GPU-side sleep, `time_cuda`), the variants and SDPA-cuDNN's backward in the same process, and dQ's (and for
the fused variant dK's) error against float64 on a small row first.

    python scripts/dq_ab.py --json dq_ab.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import backward, select
from xkernels.bench.suites import BWD_ROWS
from xkernels.bench.timing import time_cuda
from xkernels.hopper.configs import ATTENTION_DQ_CONFIGS
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads


def setup(b, h, s, d, causal, seed=0):
    q, k, v = attention_inputs(b, h, s, s, d, torch.bfloat16, "cuda", seed=seed)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=False, precision="auto",
                                                  backend="auto")
    return q, k, v, do, o, lse, choice.config


def variants(cfg, d: int) -> dict:
    """The backward with each dQ path (the selected config's dK/dV tiles)."""
    plain = dataclasses.replace(cfg.dkdv, fused_dq=False)
    out = {"portable_dq": select.HopperBackward(plain, cfg.portable, None),
           "gluon_dq": select.HopperBackward(plain, cfg.portable, ATTENTION_DQ_CONFIGS[d]),
           "gluon_dq_concurrent": select.HopperBackward(plain, cfg.portable, ATTENTION_DQ_CONFIGS[d], True)}
    if not plain.split_d:  # D256's head-dim split takes the separate dQ kernel
        for n in (1, 2):  # the two wgmma orders of the fused step (`HopperAttentionBwdConfig.fused_dq`)
            out[f"fused_dq{n}"] = select.HopperBackward(dataclasses.replace(plain, fused_dq=n), cfg.portable, None)
    return out


def ms(fn) -> float:
    """Median device time of fn() (autograd's backward does not capture in a graph from here: its engine syncs
    with the stream the forward ran on)."""
    return time_cuda(lambda _: fn(), [None], iters=30).median_ms


def run(q, k, v, do, o, lse, cfg, causal):
    grads = [torch.empty_like(t) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=q.shape[-1] ** -0.5, cfg=cfg)
    return grads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "check": [], "rows": []}
    for d in (64, 128):
        for causal in (False, True):
            q, k, v, do, o, lse, cfg = setup(1, 4, 777, d, causal, seed=d)
            refs = reference_attention_grads(q, k, v, do, is_causal=causal)
            for name, variant in variants(cfg, d).items():
                grads = run(q, k, v, do, o, lse, variant, causal)
                for g, ref, which in zip(grads, refs, "qkv", strict=True):
                    c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
                    res["check"].append({"variant": name, "grad": which, "d": d, "causal": causal,
                                         "passed": c.passed, "reason": c.reason, "rel_rms": c.rel_rms})
                    print(res["check"][-1], flush=True)
    for b, h, s, d, causal in BWD_ROWS:
        if d not in ATTENTION_DQ_CONFIGS:
            continue
        q, k, v, do, o, lse, cfg = setup(b, h, s, d, causal)
        times = {name: ms(lambda c=c: run(q, k, v, do, o, lse, c, causal))  # noqa: B023
                 for name, c in variants(cfg, d).items()}
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            cudnn_ms = ms(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))  # noqa: B023
        flops = 4 * d * s * s * b * h * 2.5 / (2 if causal else 1)
        row = {"shape": f"B{b} H{h} {s} D{d}{' causal' if causal else ''}", "cudnn_ms": cudnn_ms}
        for name, t in times.items():
            row[f"{name}_ms"] = t
            row[f"{name}_tflops"] = flops / t / 1e9
            row[f"{name}_x_cudnn"] = cudnn_ms / t
        res["rows"].append(row)
        print(row, flush=True)
        json.dump(res, open(args.json, "w"), indent=1)
    json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
