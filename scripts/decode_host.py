"""Where a decode step's host time goes: xkernels.attention on a cache that grows by one token per call (as
transformers' DynamicCache does), timed per call against SDPA, then profiled (cProfile, top functions).

    python scripts/decode_host.py [--json decode_host.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import torch.nn.functional as F

import xkernels


def steps(fn, n: int = 64, b: int = 4, hq: int = 32, hkv: int = 4, s0: int = 512, d: int = 64) -> float:
    """Seconds per call over `n` calls, each with one more key, synchronized at the end only."""
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(b, hkv, s0 + n, d, dtype=torch.bfloat16, device="cuda")
    caches = [(kv[:, :, :s0 + i].contiguous(), kv[:, :, :s0 + i].contiguous()) for i in range(n)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k, v in caches:
        fn(q, k, v)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    ours = lambda q, k, v: xkernels.attention(q, k, v, enable_gqa=True)  # noqa: E731
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    res = {}
    for name, fn in (("xkernels", ours), ("sdpa", sdpa)):
        steps(fn)  # first pass: plans, compiles
        res[name + "_us_per_call_growing"] = 1e6 * steps(fn, s0=1024)
    prof = cProfile.Profile()
    prof.enable()
    steps(ours, s0=2048)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    res["profile"] = out.getvalue()
    res["backend"] = xkernels.last_backend()
    print(json.dumps({k: v for k, v in res.items() if k != "profile"}, indent=1))
    print(res["profile"])
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
