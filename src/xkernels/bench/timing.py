"""CUDA-event timing with the seeds' method: warm-up, rotation over input sets, many runs, median and spread."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

L2_BYTES_FALLBACK = 50 * 2**20


@dataclass(frozen=True)
class Timing:
    median_ms: float  # device time per call, between CUDA events
    min_ms: float
    max_ms: float
    runs: int
    input_sets: int
    host_us: float  # host time to issue one call (Python, validation, launch): what a host-bound caller pays

    def tflops(self, flops: int) -> float:
        return flops / self.median_ms / 1e9


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or L2_BYTES_FALLBACK


def rotation_count(working_set_bytes: int) -> int:
    """Input sets to rotate through so a run rarely finds its inputs in L2: enough to span 4x the L2, at most 8."""
    need = -(-4 * l2_bytes() // max(working_set_bytes, 1))
    return int(min(max(need, 1), 8))


CHUNK = 10


def shuffled_rounds(names: Iterable[str], rounds: int, seed: int) -> Iterator[list[str]]:
    """`rounds` orders of `names`, round r shuffled by Random(seed + r): no function always runs first or after the
    same neighbour."""
    names = list(names)
    for r in range(rounds):
        order = list(names)
        random.Random(seed + r).shuffle(order)
        yield order


def _samples(fn: Callable[[object], object], input_sets: Sequence[object], *, warmup: int,
             iters: int) -> tuple[list[float], float]:
    """(device ms of each of `iters` runs, host seconds to issue one call): `time_cuda`'s method."""
    n = len(input_sets)
    fn(input_sets[0])  # a first call may compile (e.g. a kernel variant the check did not build): keep it off host_s
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(warmup):
        fn(input_sets[i % n])
    host_s = (time.perf_counter() - t0) / max(warmup, 1)  # issue time per call: the queue never fills in a warm-up
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    sleep_cycles = int(2 * CHUNK * host_s * 2.0e9) + 100_000  # at most ~2 GHz: the sleep lasts at least this long
    for i in range(iters):
        if i % CHUNK == 0:
            torch.cuda._sleep(sleep_cycles)
        starts[i].record()
        fn(input_sets[i % n])
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], host_s


def time_cuda(fn: Callable[[object], object], input_sets: Sequence[object], *, warmup: int = 20,
              iters: int = 100) -> Timing:
    """Time fn(inputs) cycling through `input_sets`; each run between its own pair of CUDA events.

    A start event is recorded before the host issues the call, so when the host is slower than the kernel the host's
    work would land inside the measured interval. Each chunk of runs is therefore queued behind a GPU-side sleep
    long enough for the host to issue the whole chunk: the events then time the device work alone, for ours and the
    peers alike, and the host cost per call is reported on its own (`host_us`).
    """
    ms, host_s = _samples(fn, input_sets, warmup=warmup, iters=iters)
    return Timing(statistics.median(ms), min(ms), max(ms), iters, len(input_sets), host_s * 1e6)


def time_rounds(runs: dict[str, tuple[Callable[[object], object], Sequence[object], Callable[[], object]]], *,
                rounds: int = 3, warmup: int = 20, iters: int = 100, seed: int = 0) -> dict[str, Timing | str]:
    """`time_cuda` of several functions in interleaved rounds: each round warms every function up and times it
    for iters / rounds runs, in its own shuffled order (seeded), and a function's Timing is over the pooled runs, so
    a drift of the clock or of the temperature over a row hits ours and the peers alike. `runs`: name -> (fn, input
    sets, a context manager factory to run it in, e.g. a forced SDPA backend). A function that raises RuntimeError
    (but running out of memory) gets its error text and leaves the later rounds."""
    per = max(1, -(-iters // rounds))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    host: dict[str, list[float]] = {name: [] for name in runs}
    failed: dict[str, str] = {}
    for order in shuffled_rounds(runs, rounds, seed):
        for name in order:
            if name in failed:
                continue
            fn, sets, context = runs[name]
            try:
                with context():
                    ms, host_s = _samples(fn, sets, warmup=warmup, iters=per)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as e:  # e.g. a forced SDPA backend that does not support this shape
                failed[name] = str(e).splitlines()[0][:160]
                continue
            samples[name] += ms
            host[name].append(host_s)
    out: dict[str, Timing | str] = {}
    for name in runs:
        if name in failed:
            out[name] = failed[name]
        else:
            ms = samples[name]
            out[name] = Timing(statistics.median(ms), min(ms), max(ms), len(ms), len(runs[name][1]),
                               statistics.median(host[name]) * 1e6)
    return out


def capture(fn: Callable[[], object], reps: int = 1) -> tuple[torch.cuda.CUDAGraph, object]:
    """`reps` calls of `fn` captured in one CUDA graph after a warm-up call on a side stream (torch's recipe: the
    warm-up's lazy initializations stay out of the capture). Returns the graph, not yet replayed, and the last
    call's result (tensors the graph writes at each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            result = fn()
    return graph, result


def graph_ms(fn: Callable[[], object], reps: int = 10, repeats: int = 5) -> float:
    """Device time per call of `fn`: `reps` calls captured in one CUDA graph (`capture`), replayed `repeats` times
    between events; the median replay, per call."""
    graph, _ = capture(fn, reps)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    del graph
    return statistics.median(times)


def interleaved_graph_ms(fns: dict[str, Callable[[], object]], rounds: int = 3, seed: int = 0) -> dict[str, float]:
    """Median `graph_ms` of each of `fns` over `rounds` interleaved rounds, each round in its own shuffled order
    (seeded): a drift of the clock between calls hits every function alike, and none always runs first or after the
    same neighbour (a fixed order measured the same kernel up to 19 % apart by its place in it)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for order in shuffled_rounds(fns, rounds, seed):
        for name in order:
            times[name].append(graph_ms(fns[name]))
    return {name: statistics.median(ts) for name, ts in times.items()}
