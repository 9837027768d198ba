"""Why the head-major walk loses back to back on some rows but not in ncu (benchmarks/NOTES.md, 2026-12-06): the
persistent forward on both walks, each timed four ways in CUDA-graph replay (device time per call, interleaved
shuffled rounds, `bench.timing.interleaved_graph_ms`):

  b2b      calls back to back on the same inputs (what `persistent_ab.py` and the sweep time);
  flushed  each call after a 256 MiB write that evicts the L2 (the write's own time, measured alone, subtracted):
           every call starts from a cold L2, as under ncu;
  rotated  calls cycling over 4 copies of the inputs (no call finds its inputs in L2; nothing between calls);
  mixed    walk 0 and walk 1 alternating, per call (the other walk's L2 state and tail before each).

If walk 1 matches walk 0 when flushed or rotated but not b2b, the difference is what the previous call left in L2;
if it stays behind when flushed, it is the launch boundary (a tail or a start the ncu replay does not see).

    python scripts/walk_b2b.py --json walk_b2b.json [--md walk_b2b.md] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json

import torch

import xkernels
from xkernels.bench.timing import graph_ms, interleaved_graph_ms
from xkernels.testing import attention_inputs

# (B, Hq, Hkv, S, D, causal): the rows where walk 0 led back to back, and one where walk 1 led
ROWS = [(8, 32, 8, 2048, 128, True), (8, 32, 8, 2048, 128, False), (32, 32, 32, 512, 64, True),
        (32, 32, 32, 512, 128, True)]
WALKS = {"walk 0": "hopper:persistent=2,walk=0", "walk 1": "hopper:persistent=2,walk=1"}
COPIES = 4


def row(b: int, hq: int, hkv: int, s: int, d: int, causal: bool, rounds: int) -> dict:
    sets = [attention_inputs(b, hq, s, s, d, torch.bfloat16, "cuda", hkv=hkv, seed=i) for i in range(COPIES)]
    gqa = hq != hkv
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def call(backend, inputs):
        return xkernels.attention(*inputs, is_causal=causal, enable_gqa=gqa, backend=backend)

    def rotated(backend):
        state = {"i": 0}

        def fn():
            state["i"] = (state["i"] + 1) % COPIES
            return call(backend, sets[state["i"]])
        return fn

    fns = {}
    for name, backend in WALKS.items():
        call(backend, sets[0])  # compile and warm outside the graphs
        fns[f"{name} b2b"] = lambda be=backend: call(be, sets[0])
        fns[f"{name} flushed"] = lambda be=backend: (scratch.fill_(1), call(be, sets[0]))
        fns[f"{name} rotated"] = rotated(backend)
    fns["mixed (walk 0 + walk 1)"] = lambda: (call(WALKS["walk 0"], sets[0]), call(WALKS["walk 1"], sets[0]))
    fns["flush alone"] = lambda: scratch.fill_(1)
    med = interleaved_graph_ms(fns, rounds)
    flush = med.pop("flush alone")
    for name in WALKS:
        med[f"{name} flushed"] -= flush
    out = {"shape": f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}", "flush_ms": flush, "ms": med}
    alone = [graph_ms(lambda be=be: call(be, sets[0])) for be in WALKS.values()]
    out["mixed_vs_sum_of_b2b"] = med["mixed (walk 0 + walk 1)"] / sum(alone)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for r in ROWS:
        rows.append(row(*r, args.rounds))
        ms = rows[-1]["ms"]
        print(rows[-1]["shape"], " ".join(f"{k} {v * 1e3:.0f} us" for k, v in ms.items()), flush=True)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    if args.md:
        cols = [f"{w} {m}" for m in ("b2b", "flushed", "rotated") for w in WALKS]
        lines = ["| shape | " + " | ".join(cols) + " | mixed / (b2b 0 + b2b 1) |", "|---" * (len(cols) + 2) + "|"]
        for r in rows:
            lines.append(f"| {r['shape']} | " + " | ".join(f"{r['ms'][c] * 1e3:.0f} us" for c in cols)
                         + f" | {r['mixed_vs_sum_of_b2b']:.3f} |")
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
