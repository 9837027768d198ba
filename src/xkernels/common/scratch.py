"""Scratch memory kept across calls, one set per (device, stream): arrival counters and fp32 partials of the
kernels that reduce a tile's partials across programs (`hopper/partials.py`: split-K GEMMs, the backward's dK/dV over
parts of a GQA group, the few-row GEMM's K slices).

A split-K launch needs arrival counters that start at zero and a partials buffer. Allocating and zeroing them per
call costs a caching-allocator call and a fill launch on the host (~15-20 us per GEMM on the H200 host, more than the
kernel's device time at M = 1-16). The kernels put every counter back to zero when they finish (the last arriver of
a column block resets its own), so a buffer zeroed once can serve every later launch on the same stream: launches on
one stream run in order, and each stream has its own set, so concurrent streams never share a counter.

What this module refuses, and why (the caller then allocates per call, as before):
  * CUDA-graph capture: a graph would bake in this stream's buffer and could replay on another stream concurrently
    with eager calls here; per-call memory from the graph's own pool is private to the graph.
  * more than `MAX_BYTES` of partials: a cache should not hold a large share of the device's memory.
Buffers are allocated on a private side stream, so an allocator that routes the current stream's allocations into a
CUDA-graph pool (inductor's CUDA-graph trees during warm-up) never hands one of them out: a pool that lends memory to
a buffer outliving the graph breaks the graph's memory plan. A buffer outgrown by a later call is released only after
the work queued on its stream (`record_stream`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xkernels.common.runtime import device_index, side_stream

MAX_BYTES = 64 << 20  # fp32 partials per stream; larger splits allocate per call
MAX_STREAMS = 16  # sets kept per device; the oldest is released (after its stream's work) beyond that


@dataclass
class _Set:
    stream: object  # the torch.cuda.Stream the set serves (None on the CPU), kept for record_stream
    counters: torch.Tensor  # int32, all zero between launches
    partials: torch.Tensor  # fp32, contents undefined


_SETS: dict[tuple, _Set] = {}


def _alloc(device: torch.device, counters: int, partials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed counters and uninitialized partials on `device`, allocated off the current stream (module docstring)
    and ordered before the current stream's next work."""
    if device.type != "cuda":
        return (torch.zeros(counters, dtype=torch.int32, device=device),
                torch.empty(partials, dtype=torch.float32, device=device))
    index = device_index(device)
    side = side_stream(index)
    current = torch.cuda.current_stream(index)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        c = torch.zeros(counters, dtype=torch.int32, device=device)
        p = torch.empty(partials, dtype=torch.float32, device=device)
    current.wait_stream(side)  # the zeros land before this stream's next launch reads them
    return c, p


def _release(old: _Set) -> None:
    if old.stream is not None:  # free only after the work already queued on its stream
        old.counters.record_stream(old.stream)
        old.partials.record_stream(old.stream)


def split_k(device: torch.device, counters: int, partials: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(at least `counters` int32 arrival counters, all zero; at least `partials` fp32 words) for a split-K launch on
    the current stream of `device`, kept for the next launch there; None where this module refuses (module
    docstring): allocate per call then."""
    if partials * 4 > MAX_BYTES:
        return None
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        # the current stream's id, without the Stream object torch.cuda.current_stream builds (~3 us of host time
        # per call on the H200's host); the object is made only when a set is allocated
        key = (device.index, torch._C._cuda_getCurrentStream(device.index)[0])
    else:
        key = (str(device),)
    have = _SETS.get(key)
    if have is not None and have.counters.numel() >= counters and have.partials.numel() >= partials:
        return have.counters, have.partials
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    if have is not None:
        _release(have)
        del _SETS[key]
    grow = (max(counters, have.counters.numel() if have else 0), max(partials, have.partials.numel() if have else 0))
    same_device = [k for k in _SETS if k[:1] == key[:1]]
    if len(same_device) >= MAX_STREAMS:
        _release(_SETS.pop(same_device[0]))
    c, p = _alloc(device, *grow)
    _SETS[key] = _Set(stream, c, p)
    return c, p


def clear() -> None:
    """Release every kept set (after the work queued on its stream)."""
    for s in _SETS.values():
        _release(s)
    _SETS.clear()


def counters_and_partials(device: torch.device, counters: int, partials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 counters at zero, fp32 partials) for one launch: the kept set (`split_k`), or where that refuses, one
    fresh allocation with its counters zeroed (under CUDA-graph capture: from the graph's pool, its fill captured)."""
    kept = split_k(device, counters, partials)
    if kept is not None:
        return kept
    partials_at = -(-counters // 4) * 4  # in 4-byte words: the partials 16-byte aligned after the counters
    ws = torch.empty(partials_at + partials, dtype=torch.int32, device=device)
    ws[:counters].zero_()  # the counters start at zero; the partials are written before they are read
    return ws[:counters], ws[partials_at:].view(torch.float32)
