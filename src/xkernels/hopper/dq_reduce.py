"""The fused-dQ backward's path from the consumers' fp32 dQ partials to the fp32 dQ buffer (`attention_bwd.py`'s
FUSED_DQ): a consumer stages each step's partial in a slot of its two-slot `dq` ring (`stage_dq`); a 1-warp writer
partition reduce-adds each slot into the buffer by TMA and hands the slot back once the reduce has read it
(`dq_writer`), so the consumers never wait on a reduce. And the query walk's rotation (ROTATE, `rotation`, `rotated`):
the programs of a head, walking together, reduce into different dQ rows at any one time.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from xkernels.hopper import tma


@gluon.jit
def rotation(lo, q_end, start_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """ROTATE: (the walk's first query block's offset from lo, the walk's span): key block n starts its walk n
    blocks after lo (modulo the walk's length), so the programs of a head, walking together, reduce their dQ
    partials into different rows at any one time rather than all into the same ones."""
    n_q = gl.maximum(gl.cdiv(q_end - lo, BLOCK_M), 1)
    return ((start_n // BLOCK_N) % n_q) * BLOCK_M, n_q * BLOCK_M


@gluon.jit
def rotated(step, lo, rot, span, ROTATE: gl.constexpr):
    """The query block of walk step `step` (lo, lo + BLOCK_M, ...): itself, or with ROTATE moved on by `rot` and
    wrapped within the walk's span."""
    start = step
    if ROTATE:
        start = step + rot
        if start >= lo + span:
            start = start - span
    return start


@gluon.jit
def stage_dq(dq_out, it, dq):
    """FUSED_DQ: hand step `it`'s fp32 dQ partial to the writer warp through slot it % 2 of this consumer's ring."""
    slot = dq_out.acquire(it, True)  # the writer's reduce of two steps ago has read this slot
    dq_out.bufs.index(slot).store(dq)
    fence_async_shared()  # generic-proxy stores -> the writer's TMA reduce (async proxy)
    mbarrier.arrive(dq_out.ready.index(slot))


@gluon.jit
def dq_writer(dq_desc, dq0, dq1, b, h0, start_n, lo, q_end, HQ, heads, SQ, HEAD_DIM: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FUSED_DQ: gl.constexpr, ROTATE: gl.constexpr):
    """FUSED_DQ's dQ writer (1 warp): per step, each consumer's fp32 partial [BLOCK_M, D / 2] (FUSED_DQ = 3: the
    step's one [BLOCK_M, D] partial, from the consumer whose turn it was) goes from its `dq` slot into the fp32
    buffer by a TMA reduce-add, and the slot is handed back once the reduce has read it, so the consumers never wait
    on a reduce. Bulk groups complete in issue order: after issuing consumer w's reduce of
    step it, `store_wait(2)` leaves only that one and the other consumer's of step it - 1 pending, so w's reduce
    of step it - 1 has read its slot."""
    HALF: gl.constexpr = HEAD_DIM // 2
    rot, span = rotation(lo, q_end, start_n, BLOCK_M, BLOCK_N)
    it = 0
    for g in range(heads):
        row0 = (b * HQ + h0 + g) * SQ
        for step in range(lo, q_end, BLOCK_M):
            at = (row0 + rotated(step, lo, rot, span, ROTATE)).to(gl.int32)
            if FUSED_DQ == 3:
                write_turn(dq_desc, at, dq0, dq1, it)
            else:
                write_halves(dq_desc, at, dq0, dq1, it, HALF)
            it += 1
    tma.store_wait(0)  # the last reduces have completed before the kernel ends


@gluon.jit
def write_turn(dq_desc, at, dq0, dq1, it):
    """FUSED_DQ = 3: step `it`'s whole [BLOCK_M, D] partial, from consumer it % 2's ring (its entry it // 2); after
    issuing it, `store_wait(1)` leaves only it pending, so step it - 1's reduce has read the other ring's slot."""
    prev = gl.maximum(it - 1, 0) // 2
    if it % 2 == 0:
        s = dq0.wait(it // 2, True)
        tma.async_reduce_add(dq_desc, [at, 0], dq0.bufs.index(s))
        tma.store_wait(1)
        mbarrier.arrive(dq1.empty.index(prev & 1), pred=it > 0)
    else:
        s = dq1.wait(it // 2, True)
        tma.async_reduce_add(dq_desc, [at, 0], dq1.bufs.index(s))
        tma.store_wait(1)
        mbarrier.arrive(dq0.empty.index(prev & 1))


@gluon.jit
def write_halves(dq_desc, at, dq0, dq1, it, HALF: gl.constexpr):
    """FUSED_DQ = 1, 2: consumer w's [BLOCK_M, D / 2] partial of step `it` into columns [w D / 2, (w + 1) D / 2)."""
    s = dq0.wait(it)
    tma.async_reduce_add(dq_desc, [at, 0], dq0.bufs.index(s))
    tma.store_wait(2)
    mbarrier.arrive(dq0.empty.index(s ^ 1), pred=it > 0)  # step it - 1's slot (2 slots)
    s = dq1.wait(it)
    tma.async_reduce_add(dq_desc, [at, HALF], dq1.bufs.index(s))
    tma.store_wait(2)
    mbarrier.arrive(dq1.empty.index(s ^ 1), pred=it > 0)
