"""Where a decode step's host time goes: xkernels.attention on a cache that grows by one token per call (as
transformers' DynamicCache does), timed per call against SDPA in interleaved rounds, with variants that take parts
away on the same host: the fused merge (one launch, no partials allocated), the launches stubbed out (what is left
is Python and allocations), and a bare torch.empty of the output; then a cProfile of the shipped path.

    python scripts/decode_host.py [--json decode_host.json] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import json
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import xkernels
from xkernels import decode, plans
from xkernels.common import launch
from xkernels.portable import configs as portable_configs

B, HQ, HKV, D = 4, 32, 4, 64  # a 1.1B Llama's decoding step (generate_host.py's model), batch 4


def steps(fn, n: int = 64, s0: int = 512) -> float:
    """Seconds per call over `n` calls, each with one more key, synchronized at the end only."""
    q = torch.randn(B, HQ, 1, D, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(B, HKV, s0 + n, D, dtype=torch.bfloat16, device="cuda")
    caches = [(kv[:, :, :s0 + i].contiguous(), kv[:, :, :s0 + i].contiguous()) for i in range(n)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k, v in caches:
        fn(q, k, v)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


@contextlib.contextmanager
def fused_merge():
    """The split-KV configs with the fused merge (the last split of a row block merges; no combine launch)."""
    real = portable_configs.decode_config
    portable_configs.decode_config = lambda *a, **k: dataclasses.replace(real(*a, **k), fused_combine=True)
    plans._PLANS.clear()
    decode._PLANS.clear()
    try:
        yield
    finally:
        portable_configs.decode_config = real
        plans._PLANS.clear()
        decode._PLANS.clear()


@contextlib.contextmanager
def no_launches():
    """The compiled kernels' launcher calls made no-ops (the stream lookup and everything before it still run)."""
    real = launch.Kernel._call
    launch.Kernel._call = lambda self, *a, **k: None
    try:
        yield
    finally:
        launch.Kernel._call = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ours = lambda q, k, v: xkernels.attention(q, k, v, enable_gqa=True)  # noqa: E731
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    empty = lambda q, k, v: torch.empty_like(q)  # noqa: E731
    variants = {"sdpa": (sdpa, contextlib.nullcontext), "xkernels": (ours, contextlib.nullcontext),
                "xkernels fused merge": (ours, fused_merge), "xkernels launches stubbed": (ours, no_launches),
                "torch.empty_like(q)": (empty, contextlib.nullcontext)}
    backends = {}
    for name, (fn, ctx) in variants.items():  # first pass: plans, compiles
        with ctx():
            steps(fn)
            backends[name] = xkernels.last_backend()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            fn, ctx = variants[name]
            with ctx():
                times[name].append(1e6 * steps(fn, s0=1024))
    res = {"us_per_call": {k: statistics.median(v) for k, v in times.items()}, "rounds": times,
           "backend": backends, "shape": f"B{B} H{HQ}/{HKV} D{D}, 1 query row, 1024-1088 keys"}
    prof = cProfile.Profile()
    prof.enable()
    steps(ours, s0=2048)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    res["profile"] = out.getvalue()
    print(json.dumps({k: v for k, v in res.items() if k != "profile"}, indent=1))
    print(res["profile"])
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
