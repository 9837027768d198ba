"""CUDA-event timing with the seeds' method: warm-up, rotation over input sets, many runs, median and spread."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

L2_BYTES_FALLBACK = 50 * 2**20


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int
    input_sets: int

    def tflops(self, flops: int) -> float:
        return flops / self.median_ms / 1e9


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or L2_BYTES_FALLBACK


def rotation_count(working_set_bytes: int) -> int:
    """Input sets to rotate through so a run rarely finds its inputs in L2: enough to span 4x the L2, at most 8."""
    need = -(-4 * l2_bytes() // max(working_set_bytes, 1))
    return int(min(max(need, 1), 8))


def time_cuda(fn: Callable[[object], object], input_sets: Sequence[object], *, warmup: int = 20,
              iters: int = 100) -> Timing:
    """Time fn(inputs) cycling through `input_sets`; each run between its own pair of CUDA events."""
    n = len(input_sets)
    for i in range(warmup):
        fn(input_sets[i % n])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(input_sets[i % n])
        ends[i].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing(statistics.median(ms), min(ms), max(ms), iters, n)
