"""Hopper attention backward, dK and dV, in Gluon: a TMA producer feeding two consumer warpgroups through a Q/dO ring.

Per program: BLOCK_N = 128 keys of one kv head, 64 per consumer warpgroup (with SPLIT_D, 64 keys shared by both),
walking every query block of every query head of its GQA group, so dK and dV sum over the group in registers (no
atomics: deterministic). dQ comes from a separate dQ kernel, or with FUSED_DQ from this one (below); delta =
rowsum(dO * O) - dLSE from the portable preprocess kernel. Partitions:
  - producer (1 warp): K and V once; then per query block: acquire a ring stage, TMA Q and dO into it, copy the
    block's LSE (in log2 units) and delta into the stage's stats rows, arrive (the TMA bytes and this arrive together
    make the stage ready);
  - consumer warpgroup w (4 warps): its 64 keys against every query block, on transposed scores (keys on rows), so
    P^T and dS^T come out of one product as the register A operand of the next and are never transposed:
      issue S^T = K_w Q^T and dP^T = V_w dO^T async -> wait S^T -> P^T = exp2(S^T c - lse), masked
                                                       <- window: dP^T runs on the tensor cores
      -> issue dV += P^T dO async -> wait dP^T -> dS^T = P^T (dP^T - delta)   <- window: dV's wgmma
      -> issue dK += dS^T Q -> wait all -> release the stage.
FUSED_DQ (FA3's plan): each warpgroup also writes its dS^T rows to a shared [128 keys, BLOCK_M] tile (a `ds` ring
with one stage per Q/dO stage, released with it), waits for the other warpgroup's half, and computes its half of the
head dim of dQ's partial over the program's 128 keys, dQ[:, half] = dS K[:, half], besides dK += dS^T Q from its own
rows (FUSED_DQ = 1: dK issued before the handshake, dQ after it; 2: dQ first, so dK stays in flight while dQ's
partial is staged; 3, D64: the warpgroups take turns by step, one computing the whole dQ = dS K over every column,
64 x 64 wgmmas that read a third less shared memory per product than two 64 x 32 halves, the other skipping the
handshake). The fp32 partial goes to one of two `dq` slots of the warpgroup; a 1-warp writer partition
reduce-adds it into an fp32 buffer by TMA and hands the slot back once the reduce has read it, so the consumers never
wait on a reduce (`dq_reduce.py`). The additions from different key blocks land in any order, so dQ is not bitwise
repeatable; the separate dQ kernel is.
SPLIT_D (D256, where 64 x D fp32 dK and dV do not fit one warpgroup's registers): BLOCK_N = 64 keys, both
warpgroups on all of them, warpgroup w owning columns [w D/2, (w + 1) D/2) of dK and dV, dV[:, half] += P^T dO[:, half]
and dK[:, half] += dS^T Q[:, half]. SPLIT_D = 2 (shipped, `_exchange_step`): warpgroup 0 computes S^T and P^T,
warpgroup 1 dP^T; dP^T goes to warpgroup 0 (fp32, so dS^T = P^T (dP^T - delta) uses the fp32 P^T), P^T and dS^T
come back through a 2-slot shared-memory `ScoreExchange` as both warpgroups' A operands. SPLIT_D = 1 (an ablation):
each warpgroup computes the whole S^T and dP^T itself, 1.5x the tensor work with no exchange (0.80-0.87x cuDNN
where SPLIT_D = 2 measured 0.90-1.08x).
Q, dO, K and V are read through 2-D descriptors over their tensors as they are laid out (`views.descriptor_view`:
heads-outer (B, H, S, D), or sequence-outer (B, S, H, D) views as transformers and flash_attn callers hold them; Q and
dO share one geometry, K and V another, passed as each view's row and column steps): tiles past a head's last row
read the next head's or batch entry's rows (or zeros at the end; the host keeps views tight, `views.tight`), which
the masks (LSE = +inf for queries past SQ, keys past SKV) turn into exact zeros of P^T and dS^T. Causal is top-left
aligned, as in the forward. Barriers: `barriers.py`.
VARLEN (packed batches, `attention_varlen`'s layout): programs over (sequence, kv head, key block) of the longest
sequence; Q, dO, K and V through (total, H * D) descriptors (`packed_descriptor`: head h at column h * D), rows from
the sequence's first, so a tile past its end holds the next sequence's rows, masked as above against the sequence's
own lengths (exact zeros times finite values: a non-finite value in a neighbouring sequence would reach this one,
as a neighbouring head's does in the dense layout); causal bottom-right (query i sees keys j <= i + Skv - Sq);
LSE and delta (Hq, total_q); a program past its sequence's keys walks no query and stores nothing
(`common.seqlen.q_bounds`).
Sliding windows (SHIFT, BAND: `common.seqlen.Band`): the diagonal moves by SHIFT, and a key block's walk stops at the
last query its band reaches (`q_bounds`), so a block that no query sees walks nothing and stores dK = dV = 0; every
step masks the lower side in `_probabilities` as it masks the causal one.
MASK_SPLIT (config `mask_split`; D64's and D128's split configs, D64's fused one): the query walk in two loops, the
steps that need the mask (the causal diagonal's, a key tail's, a window's) and then the rest, whose compares and
selects are dropped (`_mask_end`). EVEN_KEYS (config `even_keys`, opt-in; a dense call with a full mask and its key
count a multiple of BLOCK_N): no step needs the mask, and the walk is one unmasked loop.
GROUP_PARTS (config `group_parts`; a dense causal call with too few (batch, kv head, key block) programs for the SMs,
`select.group_parts`): GROUP_PARTS programs per key block, each walking GROUP / GROUP_PARTS of the group's query
heads, so the longest walk (a causal call's first key block) is that much shorter; their fp32 dK and dV partials are
summed in part order by whichever arrives last (`partials.reduce_parts`: bitwise repeatable), which stores them.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xkernels.common.dtypes import smem_layout
from xkernels.common.seqlen import q_bounds, sequence
from xkernels.hopper import tma
from xkernels.hopper.barriers import attention_bwd_barriers, attention_dq_ring, attention_ds_ring, score_exchange
from xkernels.hopper.configs import HopperAttentionBwdConfig
from xkernels.hopper.dq_reduce import dq_writer, rotated, rotation, stage_dq
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.partials import reduce_parts
from xkernels.hopper.pipeline import partition_barrier
from xkernels.hopper.views import descriptor_view

WG_KEYS = gl.constexpr(64)  # keys per consumer warpgroup (a wgmma's M)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, LSE, DELTA, b, h0,
              start_n, lo, q_end, q0, kv_row, kv_col, q_row_g, q_col_g, q_rh, q_ch, sq, lse_sh, HQ, heads, SQ,
              BLOCK_M: gl.constexpr, VARLEN: gl.constexpr, ROTATE: gl.constexpr):
    """K and V once; then the query blocks of `heads` query heads from h0 (the program's part of its GQA group),
    each into a ring stage."""
    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    tma.async_load(k_desc, [kv_row, kv_col], kv_ready, k_buf)
    tma.async_load(v_desc, [kv_row, kv_col], kv_ready, v_buf)
    rows_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    offs = gl.arange(0, BLOCK_M, rows_layout)
    rot, span = rotation(lo, q_end, start_n, BLOCK_M, k_desc.block_type.shape[0])
    it = 0
    for g in range(heads):
        h = h0 + g
        if VARLEN:
            stats_row0 = h * lse_sh + q0  # (Hq, total_q)
        else:
            stats_row0 = (b * HQ + h) * SQ  # (B, Hq, Sq)
        q_row0 = q_row_g + g * q_rh  # query head h's first row and its columns in Q's and dO's views
        q_col = (q_col_g + g * q_ch).to(gl.int32)
        for step in range(lo, q_end, BLOCK_M):
            start_m = rotated(step, lo, rot, span, ROTATE)
            s = qdo.acquire(it)
            mbarrier.expect(qdo.ready.index(s), 2 * q_desc.block_type.nbytes)
            tma.async_load(q_desc, [(q_row0 + start_m).to(gl.int32), q_col], qdo.ready.index(s), qdo.bufs.index(s))
            tma.async_load(do_desc, [(q_row0 + start_m).to(gl.int32), q_col], qdo.ready.index(s), do_bufs.index(s))
            rows = start_m + offs
            inside = rows < sq
            # queries past the sequence: LSE = +inf makes their P exactly 0 (whatever rows the tile holds there)
            lse = gl.load(LSE + stats_row0 + rows, mask=inside, other=float("inf")) * LOG2E
            delta = gl.load(DELTA + stats_row0 + rows, mask=inside, other=0.0)
            stats.index(2 * s).store(lse)
            stats.index(2 * s + 1).store(delta)
            mbarrier.arrive(qdo.ready.index(s))  # with the TMA bytes: the stage is ready
            it += 1


@gluon.jit
def _probabilities(s_t, lse, keys, diag_keys, queries, qk_scale, SKV, CAUSAL: gl.constexpr, BAND: gl.constexpr,
                   MASK: gl.constexpr = True):
    """P^T = exp2(S^T c - lse) of one step; with MASK zero for keys past SKV, (causal) keys after their query and (a
    window's lower side, BAND >= 0) keys more than BAND before it: `diag_keys` are the keys shifted onto the queries'
    diagonal (key j - offset: j - (Skv - Sq) bottom-right, j top-left, less a window's SHIFT), so query i keeps key j
    for diag_keys <= i <= diag_keys + BAND. Without MASK the caller knows every pair is kept (`_mask_end`)."""
    p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
    if not MASK:
        return p_t
    keep = gl.expand_dims(keys < SKV, 1)
    if CAUSAL:
        keep = keep & (gl.expand_dims(diag_keys, 1) <= gl.expand_dims(queries, 0))
    if BAND >= 0:
        keep = keep & (gl.expand_dims(queries, 0) <= gl.expand_dims(diag_keys + BAND, 1))
    return gl.where(keep, p_t, 0.0)


@gluon.jit
def _exchange_step(W: gl.constexpr, k_w, v_w, q, do, q_w, do_w, x, it, lse, delta, keys, diag_keys, queries, dk, dv,
                   qk_scale, SKV, zero_s, CAUSAL: gl.constexpr, BAND: gl.constexpr, MASK: gl.constexpr):
    """One query block of SPLIT_D = 2: consumer 0 computes S^T and consumer 1 dP^T (each product once, where
    SPLIT_D = 1 computes both in both), exchanged through slot it % 2 of `x` (`barriers.ScoreExchange`); then each
    adds its columns' dV += P^T dO and dK += dS^T Q with P^T and dS^T read from shared memory. Returns (dk, dv)."""
    slot = it % 2
    lap = (it // 2) & 1
    dtype: gl.constexpr = k_w.dtype
    if W == 0:
        s_tok = warpgroup_mma(k_w, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # S^T = K Q^T
    else:
        dp_tok = warpgroup_mma(v_w, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # dP^T = V dO^T
    # arrive -> wait window: the product above runs while this waits for step it - 2's readers of the slot
    mbarrier.wait(x.free.index(slot), lap ^ 1)  # each slot's first use passes at once
    if W == 0:
        p_t = _probabilities(warpgroup_mma_wait(0, deps=[s_tok]), lse, keys, diag_keys, queries, qk_scale, SKV,
                             CAUSAL, BAND, MASK)
        x.p.index(slot).store(p_t.to(dtype))
        # arrive -> wait window: consumer 1's dP^T lands while P^T was computed and stored
        mbarrier.wait(x.dp_ready.index(slot), lap)
        dp_t = x.dp.index(slot).load(p_t.type.layout)
        x.ds.index(slot).store((p_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype))
        fence_async_shared()  # generic-proxy stores -> both consumers' wgmmas (async proxy)
        partition_barrier()  # every thread's P^T and dS^T rows are stored before the one arrive
        mbarrier.arrive(x.pds_ready.index(slot))
    else:
        dp_t = warpgroup_mma_wait(0, deps=[dp_tok])
        x.dp.index(slot).store(dp_t)
        partition_barrier()
        mbarrier.arrive(x.dp_ready.index(slot))
        mbarrier.wait(x.pds_ready.index(slot), lap)
    dv_tok = warpgroup_mma(x.p.index(slot), do_w, dv, is_async=True)  # dV[:, half] += P^T dO[:, half]
    dk_tok = warpgroup_mma(x.ds.index(slot), q_w, dk, is_async=True)  # dK[:, half] += dS^T Q[:, half]
    dv, dk = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok])
    mbarrier.arrive(x.free.index(slot))
    return dk, dv


@gluon.jit
def _query_step(W: gl.constexpr, k_a, v_a, k_w, v_w, k_buf, qdo, do_bufs, stats, ds, x, dq_out, it, start_m, keys,
                diag_keys, dk, dv, qk_scale, skv, zero_s, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                CAUSAL: gl.constexpr, FUSED_DQ: gl.constexpr, SPLIT_D: gl.constexpr, BAND: gl.constexpr,
                MASK: gl.constexpr):
    """Consumer W's step `it`: the query block at start_m against its keys (the module docstring's schedule), with
    `_probabilities`' mask where MASK. Returns (dk, dv)."""
    HALF: gl.constexpr = HEAD_DIM // 2
    COLS: gl.constexpr = HALF if SPLIT_D else HEAD_DIM
    s_layout: gl.constexpr = wgmma_acc(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_acc(COLS)
    op_layout: gl.constexpr = wgmma_operand(COLS)
    dq_layout: gl.constexpr = wgmma_acc(HALF)
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)  # queries
    dtype: gl.constexpr = k_buf.dtype
    s = qdo.wait(it, FUSED_DQ > 0)  # FUSED_DQ: masked stage index (`pipeline.ring_slot`)
    q = qdo.bufs.index(s)
    do = do_bufs.index(s)
    if SPLIT_D:  # the columns of Q and dO that this warpgroup's dK and dV columns take
        q_w = q.slice(W * HALF, HALF, dim=1)
        do_w = do.slice(W * HALF, HALF, dim=1)
    else:
        q_w = q
        do_w = do
    queries = start_m + gl.arange(0, BLOCK_M, cols)
    if SPLIT_D == 2:
        lse = stats.index(2 * s).load(cols)
        delta = stats.index(2 * s + 1).load(cols)
        dk, dv = _exchange_step(W, k_w, v_w, q, do, q_w, do_w, x, it, lse, delta, keys, diag_keys, queries,
                                dk, dv, qk_scale, skv, zero_s, CAUSAL, BAND, MASK)
        qdo.release(it)
    else:
        s_tok = warpgroup_mma(k_a, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # S^T = K Q^T
        dp_tok = warpgroup_mma(v_a, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # dP^T = V dO^T
        lse = stats.index(2 * s).load(cols)
        delta = stats.index(2 * s + 1).load(cols)
        p_t = _probabilities(warpgroup_mma_wait(1, deps=[s_tok]), lse, keys, diag_keys, queries, qk_scale, skv,
                             CAUSAL, BAND, MASK)
        p_op = gl.convert_layout(p_t.to(dtype), op_layout)
        dv_tok = warpgroup_mma(p_op, do_w, dv, is_async=True)  # dV += P^T dO
        dp_t = warpgroup_mma_wait(1, deps=[dp_tok])
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        if FUSED_DQ:
            d = ds.acquire(it, True)  # both warpgroups' dQ and dK products of STAGES steps ago have retired
            ds_w = ds.bufs.index(d).slice(W * WG_KEYS, WG_KEYS)  # [64 keys, BLOCK_M]: this warpgroup's rows
            ds_w.store(ds_t.to(dtype))
            fence_async_shared()  # generic-proxy stores -> the wgmmas (async proxy) of both warpgroups
            mbarrier.arrive(ds.ready.index(d))
            if FUSED_DQ == 3:
                dk_tok = warpgroup_mma(ds_w, q, dk, is_async=True)  # dK += dS^T Q, A from shared memory
                if it % 2 == W:  # this warpgroup's turn: dQ = dS K over the program's keys, every column
                    # arrive -> wait window: dK's wgmma runs while the other warpgroup's rows land
                    ds.wait(it, True)
                    dq_tok = warpgroup_mma(ds.bufs.index(d).permute((1, 0)), k_buf,
                                           gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout),
                                           use_acc=False, is_async=True)
                    dv, dk, dq, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, p_op])
                    stage_dq(dq_out, it // 2, dq)  # this warpgroup's ring holds every other step's
                else:
                    dv, dk, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_op])
            elif FUSED_DQ == 1:
                dk_tok = warpgroup_mma(ds_w, q, dk, is_async=True)  # dK += dS^T Q, A from shared memory
                # arrive -> wait window: dK's wgmma runs while the other warpgroup's rows land
                ds.wait(it, True)
                dq_tok = warpgroup_mma(ds.bufs.index(d).permute((1, 0)), k_buf.slice(W * HALF, HALF, dim=1),
                                       gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout), use_acc=False,
                                       is_async=True)  # dQ[:, half] = dS K[:, half] over the program's keys
                dv, dk, dq, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok, p_op])
                stage_dq(dq_out, it, dq)
            else:
                # arrive -> wait window: dV's wgmma (issued before dS^T) runs while the other warpgroup's
                # rows land
                ds.wait(it, True)
                dq_tok = warpgroup_mma(ds.bufs.index(d).permute((1, 0)), k_buf.slice(W * HALF, HALF, dim=1),
                                       gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout), use_acc=False,
                                       is_async=True)
                dk_tok = warpgroup_mma(ds_w, q, dk, is_async=True)
                # dV and dQ retire (wgmma groups retire in issue order); dK stays on the tensor cores while
                # dQ's partial goes to shared memory for the writer warp
                dv, dq, _ = warpgroup_mma_wait(1, deps=[dv_tok, dq_tok, p_op])
                stage_dq(dq_out, it, dq)
                dk = warpgroup_mma_wait(0, deps=[dk_tok])
            qdo.release(it, MASK=True)  # also frees dS^T stage it % STAGES (the ds ring empties are qdo's)
        else:
            ds_op = gl.convert_layout(ds_t.to(dtype), op_layout)
            dk_tok = warpgroup_mma(ds_op, q_w, dk, is_async=True)  # dK += dS^T Q
            dv, dk, _, _ = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_op, ds_op])  # the operands stay live
            qdo.release(it)
    return dk, dv


@gluon.jit
def _mask_end(lo, q_end, key0, skv, offset, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, BAND: gl.constexpr,
              MASK_SPLIT: gl.constexpr, UNMASKED: gl.constexpr):
    """Where a consumer's masked steps end (its steps from `lo` are masked up to here, unmasked after): `lo` with
    UNMASKED (no step needs the mask); with MASK_SPLIT, the first query block at or past the last of its keys'
    diagonal (causal), or `lo` (full); every step where its keys run past skv, a window's lower side cuts some block
    (BAND >= 0), or without MASK_SPLIT. Interior steps, most of a long sequence's, then skip the compares and selects
    of the mask."""
    end = q_end
    if UNMASKED:
        end = lo
    elif MASK_SPLIT and BAND < 0:
        if key0 + WG_KEYS <= skv:
            if CAUSAL:
                last_diag = key0 + WG_KEYS - 1 - offset  # query last_diag on sees every one of these keys
                end = gl.minimum(lo + gl.cdiv(gl.maximum(last_diag - lo, 0), BLOCK_M) * BLOCK_M, q_end)
            else:
                end = lo
    return end


@gluon.jit
def _consumer(W: gl.constexpr, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, ds, x, dq_out, DK, DV, dk_sb,
              dk_sh, dk_ss, dv_sb, dv_sh, dv_ss, b, hk, start_n, lo, q_end, k0, skv, offset, heads, qk_scale, scale,
              WS, CNT, unit, part, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
              FUSED_DQ: gl.constexpr, SPLIT_D: gl.constexpr, KV_REGS: gl.constexpr, BAND: gl.constexpr,
              MASK_SPLIT: gl.constexpr, UNMASKED: gl.constexpr, ROTATE: gl.constexpr, GROUP_PARTS: gl.constexpr):
    """Consumer warpgroup W: its keys against the query blocks of `heads` query heads (the program's part of its
    GQA group), then dK and dV stored, or (GROUP_PARTS > 1) reduced with the other parts' and stored by the last."""
    HALF: gl.constexpr = HEAD_DIM // 2  # FUSED_DQ: this warpgroup's columns of dQ; SPLIT_D: of dK and dV
    COLS: gl.constexpr = HALF if SPLIT_D else HEAD_DIM  # columns of dK and dV in this warpgroup's registers
    s_layout: gl.constexpr = wgmma_acc(BLOCK_M)
    acc_layout: gl.constexpr = wgmma_acc(COLS)
    dtype: gl.constexpr = k_buf.dtype
    if SPLIT_D:  # both warpgroups on the program's 64 keys
        key0 = start_n
        k_w = k_buf
        v_w = v_buf
    else:  # [64, D]: this warpgroup's keys
        key0 = start_n + W * WG_KEYS
        k_w = k_buf.slice(W * WG_KEYS, WG_KEYS)
        v_w = v_buf.slice(W * WG_KEYS, WG_KEYS)
    keys = key0 + gl.arange(0, WG_KEYS, gl.SliceLayout(1, s_layout))
    diag_keys = keys - offset  # causal: a key is seen from query diag_keys on (with a window's lower side, to BAND on)
    dk = gl.zeros([WG_KEYS, COLS], gl.float32, acc_layout)
    dv = gl.zeros([WG_KEYS, COLS], gl.float32, acc_layout)
    zero_s = gl.zeros([WG_KEYS, BLOCK_M], gl.float32, s_layout)
    mbarrier.wait(kv_ready, 0)
    if KV_REGS:  # the A operands of S^T and dP^T, read from shared memory once
        k_a = k_w.load(wgmma_operand(BLOCK_M))
        v_a = v_w.load(wgmma_operand(BLOCK_M))
    else:
        k_a = k_w
        v_a = v_w
    mask_end = _mask_end(lo, q_end, key0, skv, offset, BLOCK_M, CAUSAL, BAND, MASK_SPLIT, UNMASKED)
    rot, span = rotation(lo, q_end, start_n, BLOCK_M, 2 * WG_KEYS)  # (ROTATE: a dense full walk, no split)
    it = 0
    for _g in range(heads):
        if not UNMASKED:  # (UNMASKED: no masked loop compiled at all)
            for step in range(lo, mask_end, BLOCK_M):  # diagonal, tail or window-edge steps (all: MASK_SPLIT=0)
                start_m = rotated(step, lo, rot, span, ROTATE)
                dk, dv = _query_step(W, k_a, v_a, k_w, v_w, k_buf, qdo, do_bufs, stats, ds, x, dq_out, it, start_m,
                                     keys, diag_keys, dk, dv, qk_scale, skv, zero_s, HEAD_DIM, BLOCK_M, CAUSAL,
                                     FUSED_DQ, SPLIT_D, BAND, True)
                it += 1
        if (MASK_SPLIT or UNMASKED) and BAND < 0:  # (a window masks every step: `_mask_end`)
            for start_m in range(mask_end, q_end, BLOCK_M):  # every (key, query) pair kept
                dk, dv = _query_step(W, k_a, v_a, k_w, v_w, k_buf, qdo, do_bufs, stats, ds, x, dq_out, it, start_m,
                                     keys, diag_keys, dk, dv, qk_scale, skv, zero_s, HEAD_DIM, BLOCK_M, CAUSAL,
                                     FUSED_DQ, SPLIT_D, BAND, False)
                it += 1
    rows = key0 + gl.arange(0, WG_KEYS, gl.SliceLayout(1, acc_layout))
    d = (W * HALF if SPLIT_D else 0) + gl.arange(0, COLS, gl.SliceLayout(0, acc_layout))
    keep_rows = gl.expand_dims(rows < skv, 1)
    key_rows = gl.expand_dims((k0 + rows).to(gl.int64), 1)
    dk_ptrs = DK + b * dk_sb + hk * dk_sh + key_rows * dk_ss + gl.expand_dims(d, 0)
    dv_ptrs = DV + b * dv_sb + hk * dv_sh + key_rows * dv_ss + gl.expand_dims(d, 0)
    write_dk = True
    write_dv = True
    if GROUP_PARTS > 1:  # tiles 4 unit + 2 W (dK) and + 1 (dV): each sums to the group's gradient in its last part
        write_dk, dk = reduce_parts(dk, WS, CNT, unit * 4 + 2 * W, part, GROUP_PARTS)
        write_dv, dv = reduce_parts(dv, WS, CNT, unit * 4 + 2 * W + 1, part, GROUP_PARTS)
    if write_dk:
        gl.store(dk_ptrs, (dk * scale).to(dtype), mask=keep_rows)
    if write_dv:
        gl.store(dv_ptrs, dv.to(dtype), mask=keep_rows)


@gluon.jit
def attention_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, DK, DV, CU_Q, CU_K, dk_sb, dk_sh,
                          dk_ss, dv_sb, dv_sh, dv_ss, lse_sh, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, HQ, HKV,
                          GROUP, SQ, SKV, qk_scale, scale, WS, CNT,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          CAUSAL: gl.constexpr, FUSED_DQ: gl.constexpr, SPLIT_D: gl.constexpr,
                          KV_REGS: gl.constexpr, VARLEN: gl.constexpr, SHIFT: gl.constexpr, BAND: gl.constexpr,
                          MASK_SPLIT: gl.constexpr = False, EVEN_KEYS: gl.constexpr = False,
                          ROTATE: gl.constexpr = False, GROUP_PARTS: gl.constexpr = 1):
    gl.static_assert(BLOCK_N == (1 if SPLIT_D else 2) * WG_KEYS,
                     "two consumer warpgroups of 64 keys, or (SPLIT_D) one set of 64 keys shared by both")
    gl.static_assert((SPLIT_D >= 0) and (SPLIT_D <= 2), "SPLIT_D: 0 (off), 1 or 2")
    gl.static_assert(not (SPLIT_D and FUSED_DQ), "SPLIT_D takes the separate dQ kernel")
    gl.static_assert(not (SPLIT_D and KV_REGS), "KV_REGS: the A operands of one warpgroup's own 64 keys")
    gl.static_assert(not (VARLEN and FUSED_DQ), "packed batches take the separate dQ kernel")
    gl.static_assert((FUSED_DQ != 3) or (HEAD_DIM == 64), "FUSED_DQ = 3: a [BLOCK_M, D] fp32 dQ fits beside dK and dV "
                     "at D64 only")
    gl.static_assert(not (EVEN_KEYS and VARLEN), "EVEN_KEYS: a dense call's key count")
    gl.static_assert(not ROTATE or (FUSED_DQ and not CAUSAL and BAND < 0 and not MASK_SPLIT and not VARLEN
                                    and not SPLIT_D and not EVEN_KEYS), "ROTATE: the fused kernel's dense full walk, "
                     "one masked loop")
    gl.static_assert(GROUP_PARTS == 1 or not (FUSED_DQ or VARLEN or SPLIT_D), "GROUP_PARTS: the dense split "
                     "kernel's two-warpgroup walk")
    # dense full rows over whole key blocks: no key past SKV, no causal or window side in any step
    UNMASKED: gl.constexpr = EVEN_KEYS and (not CAUSAL) and BAND < 0
    PRODUCER_REGS: gl.constexpr = 32 if SPLIT_D else 24  # D256's K/V boxes take more addresses (24: spills)
    n_blocks = gl.cdiv(SKV, BLOCK_N)
    # programs over (batch, kv head, key block, part of the group), the parts of one key block side by side
    part = gl.program_id(0) % GROUP_PARTS
    unit = gl.program_id(0) // GROUP_PARTS
    start_n = (unit % n_blocks) * BLOCK_N
    bhk = (unit // n_blocks).to(gl.int64)
    b = bhk // HKV
    hk = bhk % HKV
    heads = GROUP // GROUP_PARTS  # query heads this program walks, from h0 (the host splits only even groups)
    h0 = hk * GROUP + part * heads
    q0, sq, k0, skv, offset = sequence(CU_Q, CU_K, b, SQ, SKV, VARLEN)
    offset = offset + SHIFT  # a window's upper side past the alignment's diagonal (`common.seqlen.Band`)
    # causal: earlier queries see none of these keys; a window's lower side: nor do later ones past its reach;
    # packed: a program past its sequence's keys walks no query
    lo, q_end = q_bounds(start_n, offset, sq, skv, BLOCK_M, CAUSAL, VARLEN, BLOCK_N, BAND)
    if VARLEN:
        k0_rows = k0.to(gl.int32)  # (a packed batch has fewer than 2^31 rows) one register through the consumers' loop
    else:
        k0_rows = 0
    # the views' rows and columns (`views.descriptor_view`; packed: from the sequence's first row, head h at column
    # h * D): the program's K/V tile, and the first query head of its group in Q and dO
    kv_row = (k0 + b * kv_rb + hk * kv_rh + start_n).to(gl.int32)
    kv_col = (hk * kv_ch).to(gl.int32)
    q_row_g = q0 + b * q_rb + h0 * q_rh
    q_col_g = h0 * q_ch
    k_buf = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_buf = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    kv_ready, qdo = attention_bwd_barriers(q_bufs)
    if FUSED_DQ:
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], k_desc.dtype)
        ds = attention_ds_ring(gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, BLOCK_M], ds_layout), qdo)
        dq0 = attention_dq_ring(gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout))
        dq1 = attention_dq_ring(gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout))
    else:  # placeholders the consumers never touch
        ds = qdo
        dq0 = qdo
        dq1 = qdo
    if SPLIT_D == 2:
        xs_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_KEYS, BLOCK_M], k_desc.dtype)
        x_dtype: gl.constexpr = k_desc.dtype
        x = score_exchange(gl.allocate_shared_memory(x_dtype, [2, WG_KEYS, BLOCK_M], xs_layout),
                           gl.allocate_shared_memory(x_dtype, [2, WG_KEYS, BLOCK_M], xs_layout),
                           gl.allocate_shared_memory(gl.float32, [2, WG_KEYS, BLOCK_M],
                                                     gl.NVMMASharedLayout.get_default_for([WG_KEYS, BLOCK_M],
                                                                                          gl.float32)))
    else:
        x = stats  # a placeholder the consumers never touch
    # Gluon takes the partition list as written in the call (a list held in a variable does not compile), so the
    # two variants spell it out: with the dQ writer warp, and without it (the shipped kernel, no idle warp)
    if FUSED_DQ:
        gl.warp_specialize([
            (_consumer, (0, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, ds, x, dq0, DK, DV, dk_sb, dk_sh, dk_ss,
                         dv_sb, dv_sh, dv_ss, b, hk, start_n, lo, q_end, k0_rows, skv, offset, heads, qk_scale,
                         scale, WS, CNT, unit, part, HEAD_DIM, BLOCK_M, CAUSAL, FUSED_DQ, SPLIT_D, KV_REGS, BAND,
                         MASK_SPLIT, UNMASKED, ROTATE, GROUP_PARTS)),
            (_consumer, (1, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, ds, x, dq1, DK, DV, dk_sb, dk_sh, dk_ss,
                         dv_sb, dv_sh, dv_ss, b, hk, start_n, lo, q_end, k0_rows, skv, offset, heads, qk_scale,
                         scale, WS, CNT, unit, part, HEAD_DIM, BLOCK_M, CAUSAL, FUSED_DQ, SPLIT_D, KV_REGS, BAND,
                         MASK_SPLIT, UNMASKED, ROTATE, GROUP_PARTS)),
            (_producer, (q_desc, do_desc, k_desc, v_desc, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, LSE, DELTA,
                         b, h0, start_n, lo, q_end, q0, kv_row, kv_col, q_row_g, q_col_g, q_rh, q_ch, sq, lse_sh,
                         HQ, heads, SQ, BLOCK_M, VARLEN, ROTATE)),
            (dq_writer, (dq_desc, dq0, dq1, b, h0, start_n, lo, q_end, HQ, heads, SQ, HEAD_DIM, BLOCK_M, BLOCK_N,
                         FUSED_DQ, ROTATE)),
        ], [4, 1, 1], [240, PRODUCER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (0, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, ds, x, dq0, DK, DV, dk_sb, dk_sh, dk_ss,
                         dv_sb, dv_sh, dv_ss, b, hk, start_n, lo, q_end, k0_rows, skv, offset, heads, qk_scale,
                         scale, WS, CNT, unit, part, HEAD_DIM, BLOCK_M, CAUSAL, FUSED_DQ, SPLIT_D, KV_REGS, BAND,
                         MASK_SPLIT, UNMASKED, ROTATE, GROUP_PARTS)),
            (_consumer, (1, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, ds, x, dq1, DK, DV, dk_sb, dk_sh, dk_ss,
                         dv_sb, dv_sh, dv_ss, b, hk, start_n, lo, q_end, k0_rows, skv, offset, heads, qk_scale,
                         scale, WS, CNT, unit, part, HEAD_DIM, BLOCK_M, CAUSAL, FUSED_DQ, SPLIT_D, KV_REGS, BAND,
                         MASK_SPLIT, UNMASKED, ROTATE, GROUP_PARTS)),
            (_producer, (q_desc, do_desc, k_desc, v_desc, k_buf, v_buf, kv_ready, qdo, do_bufs, stats, LSE, DELTA,
                         b, h0, start_n, lo, q_end, q0, kv_row, kv_col, q_row_g, q_col_g, q_rh, q_ch, sq, lse_sh,
                         HQ, heads, SQ, BLOCK_M, VARLEN, ROTATE)),
        ], [4, 1], [240, PRODUCER_REGS])


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                cfg: HopperAttentionBwdConfig, dq_accum: torch.Tensor | None = None) -> list:
    """Host TMA descriptors of Q, K, V and dO over their 2-D views (`view_geometry`), and of the fp32 dQ buffer
    (flat (B * H * S, D) rows; [BLOCK_M, D / 2] boxes) for FUSED_DQ, else a stand-in (Q's again)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = q.shape[-1]
    out = [TensorDescriptor(t, *view_geometry(t, rows))
           for t, rows in ((q, cfg.block_m), (k, cfg.block_n), (v, cfg.block_n), (do, cfg.block_m))]
    if dq_accum is None:
        out.append(out[0])
    else:
        shape, strides, box, layout = dq_accum_geometry(dq_accum.numel() // d, d, cfg)
        out.append(TensorDescriptor(dq_accum.view(-1, d), shape, strides, box, layout))
    return out


def view_geometry(t: torch.Tensor, rows: int) -> tuple:
    """(shape, strides, box, layout) of a dense (B, H, S, D) tensor's 2-D view (`views.descriptor_view`, which the
    caller checked) in [rows, D] boxes: what `descriptors` encodes and a plan's prepared launch takes."""
    (n_rows, cols), strides, _ = descriptor_view(t)
    d = t.shape[-1]
    return [n_rows, cols], list(strides), [rows, d], smem_layout((rows, d), t.dtype)


def dq_accum_geometry(rows: int, d: int, cfg: HopperAttentionBwdConfig) -> tuple:
    """(shape, strides, box, layout) of the fused variant's contiguous fp32 dQ buffer seen as a (rows, D) matrix of
    [BLOCK_M, D / 2] boxes (each half reduced on its own; FUSED_DQ = 3: [BLOCK_M, D], one partial per step): what
    `descriptors` encodes and a plan's launch takes."""
    box = (cfg.block_m, d if cfg.fused_dq == 3 else d // 2)
    return [rows, d], [d, 1], list(box), smem_layout(box, torch.float32)


def packed_geometry(t: torch.Tensor, rows: int) -> tuple:
    """(shape, strides, box, layout) of a packed (total, H, D) tensor seen as a (total, H * D) matrix of [rows, D]
    boxes (head h at column h * D): what `packed_descriptor` encodes, and what a plan's prepared launch takes."""
    total, h, d = t.shape
    return [total, h * d], [t.stride(0), 1], [rows, d], smem_layout((rows, d), t.dtype)


def packed_descriptor(t: torch.Tensor, rows: int):
    """A host TMA descriptor of a packed tensor (`packed_geometry`), for the VARLEN variants of this kernel and the
    dQ kernel. Needs a unit last stride, heads D apart, 16-byte aligned base and row stride (`packed_ready`)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, *packed_geometry(t, rows))


def packed_layout_ready(t: torch.Tensor) -> bool:
    """The strides `packed_descriptor` needs (its base address aside)."""
    total, h, d = t.shape
    return (t.stride(2) == 1 and (h == 1 or t.stride(1) == d) and (t.stride(0) * t.element_size()) % 16 == 0
            and t.stride(0) >= h * d)


def packed_ready(t: torch.Tensor) -> bool:
    return packed_layout_ready(t) and t.data_ptr() % 16 == 0


def grid(batch: int, kv_heads: int, skv: int, cfg: HopperAttentionBwdConfig) -> int:
    return triton.cdiv(skv, cfg.block_n) * batch * kv_heads * cfg.group_parts


def group_workspace(batch: int, kv_heads: int, skv: int, cfg: HopperAttentionBwdConfig, head_dim: int) -> tuple:
    """(int32 counters, fp32 words) a GROUP_PARTS launch reduces dK and dV through (`partials.reduce_parts`): per
    (batch, kv head, key block), a dK and a dV tile of each consumer warpgroup's 64 keys, one partial per part."""
    tiles = 4 * triton.cdiv(skv, cfg.block_n) * batch * kv_heads
    return tiles, tiles * cfg.group_parts * WG_KEYS.value * head_dim
