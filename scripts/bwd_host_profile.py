"""Where a backward call's host time goes: cProfile of `torch.autograd.grad` through `xkernels.attention` on a small
problem (device time well under the host's), the top functions by cumulative and by own time.

    python3 scripts/bwd_host_profile.py [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import xkernels
from xkernels.testing import attention_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    q, k, v = (t.requires_grad_() for t in attention_inputs(1, 4, 256, 256, 128, torch.bfloat16, "cuda", seed=0))
    o = xkernels.attention(q, k, v, is_causal=True)
    do = torch.randn_like(o)

    def step():
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        step()
    host = (time.perf_counter() - t0) / args.calls * 1e6
    torch.cuda.synchronize()
    print(f"backward host time per call: {host:.1f} us ({xkernels.last_backend()})", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
