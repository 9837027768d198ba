"""`xkernels bench --suite host`: what a caller pays per call, ours against torch's in the same run.

Per shape and for each of ours and torch's (torch.matmul; SDPA with its default backend choice):
  - host issue time: wall time of N calls with no synchronization, per call (the queue never fills: N is small);
  - back-to-back time: N calls between two CUDA events, per call: what a model calling the op in a loop sees;
  - graph time: the same N calls captured in one CUDA graph and replayed between events, per call: device time.
Calls cycle through input sets spanning 4x the L2 (`timing.rotation_count`, the seeds' rotation), as a model's
layers do: each call reads its operands from HBM, not from the L2 its predecessor filled. Where one set fits the
L2 (a 4096 x 4096 weight is 32 MB), the graph is also timed on one set (`graph_l2_us`: the operands stay in L2
between replays, a microbenchmark's view). A caller is host-bound where back-to-back time exceeds graph time.
Outputs are checked against the float64 reference before any timing (a failed check is reported, not timed).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import xkernels
from xkernels.bench.report import pyplot
from xkernels.bench.runner import rotated_inputs
from xkernels.bench.timing import graph_ms, l2_bytes
from xkernels.testing.cases import AttentionCase, Case, GemmCase

CALLS = 50


def host_cases() -> list[Case]:
    gemm = [GemmCase(n, n, n, "bf16") for n in (1024, 2048, 4096, 8192)]
    attention = [AttentionCase(1, 8, 8, 512, 512, 64, True, "bf16"), AttentionCase(4, 32, 32, 1024, 1024, 128, True,
                                                                                   "bf16"),
                 AttentionCase(2, 32, 32, 2048, 2048, 128, True, "bf16")]
    return gemm + attention


def _torch_fn(case: Case) -> Callable[[tuple], object]:
    if isinstance(case, GemmCase):
        if case.b_layout == "nk":
            return lambda ab: torch.matmul(ab[0], ab[1].t())
        return lambda ab: torch.matmul(*ab)
    return lambda qkv: F.scaled_dot_product_attention(*qkv, is_causal=case.causal, enable_gqa=case.hq != case.hkv)


@dataclass
class HostTiming:
    host_us: float  # issue time per call, no sync
    b2b_us: float  # back-to-back, between events, per call
    graph_us: float  # CUDA-graph replay, per call
    sets: int = 1  # input sets the calls cycle through
    graph_l2_us: float | None = None  # graph replay on one input set that fits the L2 (None: none fits,
    # or one set is all there is)

    @property
    def host_bound(self) -> float:
        return self.b2b_us / self.graph_us


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def time_host(fn: Callable[[tuple], object], input_sets: Sequence[tuple], repeats: int = 7, *,
              in_l2: bool = False) -> HostTiming:
    """Host, back-to-back and graph time per call of `fn`, the calls cycling through `input_sets`; with `in_l2`
    (one set fits the L2) the graph on the first set alone too."""
    sets = list(input_sets)
    for i in range(5):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    host, b2b = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(CALLS):
            fn(sets[i % len(sets)])
        host.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(CALLS):
            fn(sets[i % len(sets)])
        end.record()
        torch.cuda.synchronize()
        b2b.append(start.elapsed_time(end) / CALLS * 1e3)
    cycle = itertools.cycle(sets)
    graph_us = 1e3 * graph_ms(lambda: fn(next(cycle)), reps=CALLS, repeats=repeats)
    graph_l2_us = None
    if in_l2 and len(sets) > 1:
        graph_l2_us = 1e3 * graph_ms(lambda: fn(sets[0]), reps=CALLS, repeats=repeats)
    return HostTiming(_median(host), _median(b2b), graph_us, len(sets), graph_l2_us)


@dataclass
class HostRow:
    kernel: str
    shape: str
    backend: str
    check: dict
    ours: HostTiming | None = None
    torch: HostTiming | None = None

    def as_dict(self) -> dict:
        out = asdict(self)
        if self.ours and self.torch:
            out["host_ratio"] = self.ours.host_us / self.torch.host_us
            out["ours_b2b_over_graph"] = self.ours.host_bound
            out["torch_b2b_over_graph"] = self.torch.host_bound
            out["b2b_speedup"] = self.torch.b2b_us / self.ours.b2b_us
            out["graph_speedup"] = self.torch.graph_us / self.ours.graph_us
            if self.ours.graph_l2_us and self.torch.graph_l2_us:
                out["graph_l2_speedup"] = self.torch.graph_l2_us / self.ours.graph_l2_us
        return out


def run_host_case(case: Case) -> HostRow:
    inputs = case.inputs("cuda", seed=0)
    check = case.check(inputs).row()
    row = HostRow("gemm" if isinstance(case, GemmCase) else "attention", case.shape, xkernels.last_backend() or "",
                  check)
    if not check["passed"]:
        return row
    sets = rotated_inputs(case, inputs)
    in_l2 = case.nbytes <= l2_bytes()
    row.ours = time_host(case.run, sets, in_l2=in_l2)
    row.torch = time_host(_torch_fn(case), sets, in_l2=in_l2)
    return row


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(rows: list[dict], command: str, device: str) -> str:
    head = ["kernel", "shape", "ours host us", "torch host us", "host ratio (target <= 1.25)", "ours b2b us",
            "ours graph us", "ours b2b/graph", "torch b2b us", "torch graph us", "torch b2b/graph",
            "b2b speedup", "graph speedup", "sets", "graph speedup, one set in L2"]
    lines = [f"# xkernels bench --suite host: {device}", "", f"Command: `{command}`", "",
             f"Per call, medians of 7 repeats of {CALLS} calls. host: issue time without sync; b2b: back-to-back "
             "calls between CUDA events (what a caller sees); graph: the same calls replayed from one CUDA graph "
             "(device time); the calls cycle through `sets` input sets spanning 4x the L2, and where there are "
             "several the graph is timed on one set too (operands in L2). speedup = torch time / ours.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r.get("ours"):
            lines.append(f"| {r['kernel']} | {r['shape']} | FAIL {r['check'].get('reason')} |")
            continue
        o, t = r["ours"], r["torch"]
        lines.append(f"| {r['kernel']} | {r['shape']} | {o['host_us']:.1f} | {t['host_us']:.1f} | "
                     f"{r['host_ratio']:.2f} | {o['b2b_us']:.1f} | {o['graph_us']:.1f} | "
                     f"{r['ours_b2b_over_graph']:.2f} | {t['b2b_us']:.1f} | {t['graph_us']:.1f} | "
                     f"{r['torch_b2b_over_graph']:.2f} | {r['b2b_speedup']:.2f} | {r['graph_speedup']:.2f} | "
                     f"{o.get('sets', 1)} | {_ratio(r.get('graph_l2_speedup'))} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path) -> bool:
    """Per shape: back-to-back and graph time per call, ours and torch's (log scale); False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in rows if r.get("ours")]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(12, 4.5))
    series = [("ours", "b2b_us"), ("ours", "graph_us"), ("torch", "b2b_us"), ("torch", "graph_us")]
    width = 0.8 / len(series)
    for i, (who, field) in enumerate(series):
        ax.bar([j + i * width for j in range(len(rows))], [r[who][field] for r in rows], width,
               label=f"{who} {field[:-3]}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([f"{r['kernel']} {r['shape']}" for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("us per call")
    ax.set_title("back-to-back (caller) vs CUDA-graph (device) time per call")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
