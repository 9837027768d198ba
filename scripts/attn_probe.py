"""Hopper attention probe: correctness gate, then the fast path timed against cuDNN (and the portable kernel).

    python3 scripts/attn_probe.py [--rows targets|quick|tune|recipes|bf16io] [--variant [dD:]key=value,...]...
                                  [--portable] [--iters N] [--time-failed] [--json out.json]

Each row: NaN-poisoned check against the float64 reference (O and LSE), then CUDA-event medians for every variant, the
portable kernel and SDPA-cuDNN on the same rotated inputs. It prints one line per row as it goes, so a hang or crash
still leaves the rows before it (the JSON is rewritten after each row). Exit code 1 when any check failed. The
committed bench (`xkernels bench`) is the reference; this is the quick loop.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

import torch

from xkernels.bench.peers import _sdpa_peer
from xkernels.bench.timing import rotation_count, time_cuda
from xkernels.testing.cases import AttentionCase


def rows(kind: str) -> list[AttentionCase]:
    """The issue's target rows (bf16), then fp16 and bf16io on the first seeds' row."""
    shapes = [(1, 32, 8192, 8192, 128, False), (1, 32, 8192, 16384, 128, False), (1, 32, 16384, 16384, 128, False),
              (1, 32, 8192, 8192, 128, True), (4, 32, 4096, 4096, 64, False), (1, 16, 8192, 8192, 256, False),
              (1, 16, 8192, 8192, 256, True)]
    if kind == "recipes":  # bf16io first: its time against bf16's is the issue's target
        return [AttentionCase(1, 32, 32, 8192, 8192, 128, False, r) for r in ("bf16io", "bf16", "fp16")]
    if kind == "bf16io":  # bf16io against bf16 at D128 and D256
        return [AttentionCase(1, h, h, 8192, 8192, d, False, r) for h, d in ((32, 128), (16, 256))
                for r in ("bf16io", "bf16")]
    if kind == "tune":  # D64, D256 causal and the three recipes on the first seeds' row
        return [AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16"),
                AttentionCase(1, 16, 16, 8192, 8192, 256, True, "bf16")] + [
                AttentionCase(1, 32, 32, 8192, 8192, 128, False, r) for r in ("fp16", "bf16", "bf16io")]
    if kind == "quick":
        shapes = [shapes[i] for i in (0, 3, 4, 5)]
    cases = [AttentionCase(b, h, h, sq, skv, d, causal, "bf16") for b, h, sq, skv, d, causal in shapes]
    if kind == "quick":
        return cases
    return cases + [AttentionCase(1, 32, 32, 8192, 8192, 128, False, r) for r in ("fp16", "bf16io")]


def parse_variant(text: str) -> tuple[int | None, str]:
    """'stages=3,block_n=64' -> the backend 'hopper:stages=3,block_n=64' for every row; 'd64:stages=4' -> for rows
    of head dim 64 only."""
    d, _, text = text.rpartition(":")
    return (int(d[1:]) if d else None), f"hopper:{text}" if text else "hopper"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="targets", choices=["targets", "quick", "tune", "recipes", "bf16io"])
    ap.add_argument("--variant", action="append", default=None,
                    help="hopper config overrides, e.g. stages=3; 'd64:block_n=64' applies to D64 rows only")
    ap.add_argument("--portable", action="store_true", help="also time the portable kernel")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--time-failed", action="store_true",
                    help="also time variants that fail the accuracy contract (off-contract ablations such as acc16)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or [""])]
    results = []
    for base in rows(args.rows):
        first = base.inputs("cuda", seed=0)
        sets = [first] + [base.inputs("cuda", seed=i) for i in range(1, rotation_count(base.nbytes))]
        line = {"shape": base.shape, "recipe": base.recipe, "tflops": {}, "check": {}, "accuracy": {}}
        cases = {backend: replace(base, backend=backend) for d, backend in variants if d in (None, base.d)}
        if args.portable:
            cases["portable"] = replace(base, backend="portable")
        for name, case in cases.items():
            try:
                c = case.check(first)
            except Exception as e:  # compile error or a config that does not fit: report, go on
                line["check"][name] = f"error: {type(e).__name__} {(str(e).splitlines() or [''])[0][:200]}"
                continue
            line["check"][name] = "ok" if c.passed else f"FAIL {c.reason}"
            line["accuracy"][name] = {k: v if math.isfinite(v) else None  # strict JSON: NaN -> null
                                      for k, v in (("rel_rms", c.rel_rms), ("max_abs_diff", c.max_abs_diff))}
            if c.passed or args.time_failed:
                line["tflops"][name] = round(time_cuda(case.run, sets, iters=args.iters).tflops(base.flops), 1)
        peer = _sdpa_peer("cuDNN", "CUDNN_ATTENTION", base)
        with peer.context():
            line["tflops"]["cuDNN"] = round(time_cuda(peer.fn, sets, iters=args.iters).tflops(base.flops), 1)
        ref = line["tflops"]["cuDNN"]
        print(f"{base.recipe:6s} {base.shape:32s} " + "  ".join(
            f"{k}: {v} ({v / ref:.2f}x)" for k, v in line["tflops"].items()) +
            "".join(f"  [{k}: {v}]" for k, v in line["check"].items() if v != "ok"), flush=True)
        results.append(line)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        del sets, first
        torch.cuda.empty_cache()
    return int(any(v != "ok" for line in results for v in line["check"].values()))


if __name__ == "__main__":
    sys.exit(main())
