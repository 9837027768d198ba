"""Time candidate tiles of the portable attention backward on the GPU in hand, with SDPA's backends on the same
inputs in the same call (device time of the backward alone, median of `--reps` calls).

  python scripts/bwd_tiles.py --json out/bwd_tiles.json
Candidates are `AttentionBwdConfig(kv_m, kv_n, q_m, q_n, num_warps, num_stages)`; a candidate that fails to
compile or launch is reported, not fatal. Each candidate's gradients are checked against SDPA-cuDNN's (rel-RMS).
"""

from __future__ import annotations

import argparse
import functools
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.timing import time_cuda
from xkernels.portable import attention_bwd
from xkernels.portable.configs import AttentionBwdConfig

SHAPES = [(1, 32, 8192, 128, False), (1, 32, 8192, 128, True), (4, 32, 4096, 64, False), (1, 16, 8192, 256, False),
          (2, 16, 4096, 128, True)]
CANDIDATES = {  # the shipped tile first
    64: [(64, 64, 64, 64, 4, 2), (32, 64, 64, 64, 4, 2), (64, 64, 128, 64, 4, 2)],
    128: [(64, 128, 128, 64, 8, 2), (64, 128, 64, 64, 8, 2), (64, 128, 64, 128, 8, 2), (64, 128, 128, 64, 8, 1)],
    256: [(32, 64, 128, 32, 8, 1), (32, 64, 64, 16, 8, 1)],
}


def device_ms(fn, reps: int) -> float:
    """Median device time of fn(), each call between CUDA events queued behind a GPU sleep (`time_cuda`), so the
    host's issue time stays out of it. (Not a CUDA graph: SDPA's autograd backward cannot be captured.)"""
    return time_cuda(lambda _: fn(), [None], warmup=20, iters=reps).median_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="bwd_tiles.json")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    rows = []
    for b, h, s, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = ((torch.rand((b, h, s, d), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
                       for _ in range(4))
        pairs = s * (s + 1) // 2 if causal else s * s
        flops = 2.5 * 4 * d * pairs * b * h
        shape = f"B{b} H{h} {s // 1024}K D{d}{' causal' if causal else ''}"
        row = {"shape": shape, "flops": flops, "peers": {}, "candidates": {}}
        ref = None
        for name, backend in (("SDPA-cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA-flash", SDPBackend.FLASH_ATTENTION)):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(*leaves, is_causal=causal)

            peer_bwd = functools.partial(torch.autograd.grad, o, leaves, do, retain_graph=True)

            if ref is None:
                ref = peer_bwd()
            ms = device_ms(peer_bwd, args.reps)
            row["peers"][name] = {"ms": ms, "tflops": flops / ms / 1e9}
        with torch.no_grad():
            o, lse = xkernels.attention(q, k, v, is_causal=causal, return_lse=True)
        for cand in CANDIDATES[d]:
            cfg = AttentionBwdConfig(*cand)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))

            ours = functools.partial(attention_bwd.launch, q, k, v, o, lse, do, dq, dk, dv, None, is_causal=causal,
                                     scale=1 / math.sqrt(d), cfg=cfg)

            try:
                ours()
                errs = [((a.double() - r.double()).norm() / r.double().norm()).item()
                        for a, r in zip((dq, dk, dv), ref, strict=True)]
                ms = device_ms(ours, args.reps)
                row["candidates"][str(cfg)] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_rms_vs_cudnn": max(errs)}
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is a result
                row["candidates"][str(cfg)] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
