"""Partial sums of one output tile, reduced across the programs that computed them: the split-K GEMM's K ranges
(`gemm.py`) and the backward's dK/dV over parts of a GQA group (`attention_bwd.py`).

Each of the PARTS programs of a tile counts its arrival in the tile's int32 counter before storing anything. One that
is not the last stores its fp32 partial in the workspace and counts that too; the last arriver waits for those stores
only, sums the others' partials and its own registers in part order (bitwise repeatable whatever the arrival order),
and puts the counter back to zero (the counters are reused: `common/scratch.py`). The last arriver stores and reloads
nothing of its own. Only it waits, and only on programs that have arrived, which store without waiting on anything:
no program waits on one that has not started. Memory order as in `portable/gemm_skinny.py`: every thread's partial
stores, a barrier of the partition's warps, one release atomic at GPU scope; the last arriver's acquire (its arrival,
or the wait's reads), then a barrier, before its reads. A counter's low 16 bits count arrivals, its high 16 the
partials stored.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from xkernels.hopper.pipeline import partition_barrier


@gluon.jit
def tile_partials(acc, WS, tile_id, PARTS: gl.constexpr):
    """(the tile's (PARTS, rows, cols) fp32 workspace, each accumulator element's offset in one partial)"""
    ROWS: gl.constexpr = acc.shape[0]
    COLS: gl.constexpr = acc.shape[1]
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, acc.type.layout))
    cols = gl.arange(0, COLS, gl.SliceLayout(0, acc.type.layout))
    at = gl.expand_dims(rows, 1) * COLS + gl.expand_dims(cols, 0)
    return WS + tile_id.to(gl.int64) * (PARTS * ROWS * COLS), at


@gluon.jit
def reduce_parts(acc, WS, CNT, tile_id, part, PARTS: gl.constexpr):
    """Count this program's part `part` of tile `tile_id`; if it is not the last to arrive, store its partial and
    count the store. Returns (whether it arrived last, the sum of every part's partial in part order: meaningful to
    the last arriver only, which also resets the counter)."""
    ROWS: gl.constexpr = acc.shape[0]
    COLS: gl.constexpr = acc.shape[1]
    tile_ws, at = tile_partials(acc, WS, tile_id, PARTS)
    # acquire: a last arriver that already sees every store counted skips the loop below, and this is its acquire
    arrived = gl.atomic_add(CNT + tile_id, 1, sem="acquire", scope="gpu")
    last = (arrived & 0xFFFF) == PARTS - 1
    total = acc
    if last:
        stored = arrived >> 16
        while stored < PARTS - 1:  # the programs that arrived before this one are storing; nothing else is waited
            stored = gl.atomic_add(CNT + tile_id, 0, sem="acquire", scope="gpu") >> 16
        partition_barrier()
        total = gl.zeros_like(acc)
        for j in gl.static_range(PARTS):
            if j == part:
                partial = acc
            else:
                partial = gl.load(tile_ws + j * (ROWS * COLS) + at, cache_modifier=".cg")
            total += partial
        gl.atomic_xchg(CNT + tile_id, 0, sem="relaxed", scope="gpu")  # the counters are reused
    else:
        gl.store(tile_ws + part * (ROWS * COLS) + at, acc)
        partition_barrier()
        gl.atomic_add(CNT + tile_id, 1 << 16, sem="release", scope="gpu")
    return last, total
