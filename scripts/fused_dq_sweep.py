"""Where the fused-dQ Hopper backward beats the split one: device time of the whole backward with the shipped split
config (the Gluon dQ kernel beside dK/dV) and with dQ fused into the dK/dV kernel, and SDPA-cuDNN's backward, in
the same process, over sequence lengths at a fixed token count per head dim and mask (CUDA events behind a GPU-side
sleep, `time_cuda`, median of 30). The fused variant's gradients are first checked against float64 autograd on a
small row with a tail.

    python scripts/fused_dq_sweep.py --json fused_dq_sweep.json [--md fused_dq_sweep.md] [--gqa] [--dims 64]

--gqa: GQA rows instead (H32 over 8 KV heads, 2K-16K keys at 32K tokens, and B1 H32/8 8K): each dK/dV program
walks its group's four query heads, so a grid of a quarter as many CTAs does as much work.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import backward, select
from xkernels.bench.timing import time_cuda
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

TOKENS = 32768  # B * S per row: each row does the same number of query rows
SEQS = (1024, 2048, 4096, 8192, 16384)
EXTRA = ((1, 32, 8192), (4, 32, 4096), (2, 16, 4096))  # the backward anchors' (B, H, S)
GQA = tuple((TOKENS // s, 32, s, 8) for s in SEQS[1:]) + ((1, 32, 8192, 8),)  # (B, Hq, S, Hkv)


def setup(b, h, s, d, causal, seed=0, hkv=None):
    q, k, v = attention_inputs(b, h, s, s, d, torch.bfloat16, "cuda", seed=seed, hkv=hkv or h)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, return_lse=True, enable_gqa=hkv is not None)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=hkv is not None,
                                                  precision="auto", backend="auto")
    split = choice.config
    fused = select.hopper_backward(d, split.portable, fused_dq=True)
    return q, k, v, do, o, lse, {"split": split, "fused": fused}


def run(q, k, v, do, o, lse, cfg, causal):
    grads = [torch.empty_like(t) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=q.shape[-1] ** -0.5, cfg=cfg)
    return grads


def ms(fn) -> float:
    return time_cuda(lambda _: fn(), [None], iters=30).median_ms


def measure(b: int, h: int, s: int, d: int, causal: bool, hkv: int | None = None) -> dict:
    q, k, v, do, o, lse, cfgs = setup(b, h, s, d, causal, hkv=hkv)
    times = {n: ms(lambda c=c: run(q, k, v, do, o, lse, c, causal)) for n, c in cfgs.items()}
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    try:  # (a torch whose cuDNN backend refuses GQA: no peer on those rows)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=hkv is not None)
            times["cudnn"] = ms(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    except RuntimeError:
        times["cudnn"] = float("nan")
    flops = 4 * d * s * s * b * h * 2.5 / (2 if causal else 1)
    return {"b": b, "h": h, "hkv": hkv or h, "s": s, "d": d, "causal": causal,
            **{f"{n}_ms": t for n, t in times.items()},
            **{f"{n}_tflops": flops / t / 1e9 for n, t in times.items()},
            "fused_over_split": times["split"] / times["fused"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--gqa", action="store_true")
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    args = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "check": [], "rows": []}
    for d in args.dims:
        for causal in (False, True):
            q, k, v, do, o, lse, cfgs = setup(1, 4, 777, d, causal, seed=d, hkv=1 if args.gqa else None)
            refs = reference_attention_grads(q, k, v, do, is_causal=causal)
            grads = run(q, k, v, do, o, lse, cfgs["fused"], causal)
            for g, ref, which in zip(grads, refs, "qkv", strict=True):
                c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
                res["check"].append({"grad": which, "d": d, "causal": causal, "passed": c.passed,
                                     "reason": c.reason})
                print(res["check"][-1], flush=True)
    shapes = list(GQA) if args.gqa else [(TOKENS // s, 16, s, None) for s in SEQS] + [(*r, None) for r in EXTRA]
    for d in args.dims:
        for causal in (False, True):
            for b, h, s, hkv in shapes:
                res["rows"].append(measure(b, h, s, d, causal, hkv))
                print({key: round(val, 3) if isinstance(val, float) else val for key, val in res["rows"][-1].items()},
                      flush=True)
                json.dump(res, open(args.json, "w"), indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"# fused vs split dQ backward on {res['device']} (device ms, median of 30)\n\n")
            f.write("| shape | split ms | fused ms | cuDNN ms | split/fused | split x cuDNN | fused x cuDNN |\n")
            f.write("|---|---|---|---|---|---|---|\n")
            for r in res["rows"]:
                heads = f"H{r['h']}" if r["hkv"] == r["h"] else f"H{r['h']}/{r['hkv']}"
                shape = f"B{r['b']} {heads} {r['s']} D{r['d']}{' causal' if r['causal'] else ''}"
                f.write(f"| {shape} | {r['split_ms']:.3f} | {r['fused_ms']:.3f} | {r['cudnn_ms']:.3f} | "
                        f"{r['fused_over_split']:.3f} | {r['cudnn_ms'] / r['split_ms']:.2f} | "
                        f"{r['cudnn_ms'] / r['fused_ms']:.2f} |\n")


if __name__ == "__main__":
    main()
