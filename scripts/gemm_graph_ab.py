"""Why a GEMM is slower in CUDA-graph replay than back to back (the sweep's 8192 x 4096 x 4096: 0.84x torch.matmul
in graph replay, 1.02x back to back, in runs 05 of 2026-12-01 and 79 of 2026-12-04): per shape, torch.matmul and
xkernels.matmul (the default pick, with `out=` preallocated, other tile walks, a 128 x 128 tile) timed three ways in
interleaved rounds: back to back (events around `reps` eager calls), a graph of `reps` calls, a graph of one call
replayed `reps` times. B as [N, K], bf16; each output checked against torch's first.

    python scripts/gemm_graph_ab.py --json gemm_graph_ab.json [--md gemm_graph_ab.md] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch

import xkernels
from xkernels.bench.timing import capture

SHAPES = [(4096, 4096, 4096), (8192, 4096, 4096), (8192, 6144, 4096), (16384, 4096, 4096), (8192, 4096, 8192)]


def back_to_back_ms(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def graph_reps_ms(fn, reps: int, per_graph: int) -> float:
    """A graph of `per_graph` calls replayed until `reps` calls ran, per call."""
    graph, _ = capture(fn, per_graph)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps // per_graph):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / (reps // per_graph * per_graph)


def shape_rows(m: int, n: int, k: int, rounds: int, reps: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = (torch.rand(m, k, device="cuda", generator=g) - 0.5).bfloat16()
    b = (torch.rand(n, k, device="cuda", generator=g) - 0.5).bfloat16()
    want = (a @ b.T).float()
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    fns = {"torch": lambda: a @ b.T,
           "auto": lambda: xkernels.matmul(a, b, b_layout="nk"),
           "auto out=": lambda: xkernels.matmul(a, b, b_layout="nk", out=c),
           "walk=row": lambda: xkernels.matmul(a, b, b_layout="nk", walk="row"),
           "walk=zorder": lambda: xkernels.matmul(a, b, b_layout="nk", walk="zorder"),
           "128x128 S6": lambda: xkernels.matmul(a, b, b_layout="nk",
                                                 backend="hopper:block_m=128,block_n=128,stages=6")}
    kernels = {}
    for name, fn in fns.items():
        got = fn().float()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, (name, err)
        kernels[name] = "torch" if name == "torch" else xkernels.last_backend()
    times = {name: {"b2b": [], "graph": [], "graph1": []} for name in fns}
    for r in range(rounds):
        order = list(fns)
        random.Random(r).shuffle(order)
        for name in order:
            times[name]["b2b"].append(back_to_back_ms(fns[name], reps))
            times[name]["graph"].append(graph_reps_ms(fns[name], reps, reps))
            times[name]["graph1"].append(graph_reps_ms(fns[name], reps, 1))
    med = {name: {how: statistics.median(v) for how, v in t.items()} for name, t in times.items()}
    return [{"shape": f"{m}x{n}x{k}", "variant": name, "kernel": kernels[name],
             **{f"{how}_us": 1e3 * ms for how, ms in med[name].items()},
             "x_torch_graph": med["torch"]["graph"] / med[name]["graph"]} for name in fns]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rows, lines = [], ["| shape | variant | kernel | b2b us | graph x reps us | graph x 1 us | x torch (graph) |",
                       "|---|---|---|---|---|---|---|"]
    for m, n, k in SHAPES:
        for row in shape_rows(m, n, k, args.rounds, args.reps):
            rows.append(row)
            lines.append(f"| {row['shape']} | {row['variant']} | {row['kernel']} | {row['b2b_us']:.1f} | "
                         f"{row['graph_us']:.1f} | {row['graph1_us']:.1f} | {row['x_torch_graph']:.2f} |")
            print(lines[-1], flush=True)
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
        torch.cuda.empty_cache()
    if args.md:
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
