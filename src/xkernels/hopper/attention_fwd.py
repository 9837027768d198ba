"""Hopper flash-attention forward in Gluon: a TMA producer feeding 2-3 consumer warpgroups through K and V rings.

Per program: BLOCK_M query rows of one (batch, head), split over NUM_WG consumer warpgroups (own partitions, 64 rows
each: two at D128/D256, three at D64) that share the K/V tiles. Partitions:
  - producer (1 warp): every consumer's Q rows once, then for each key tile: acquire a K stage, TMA K; acquire a V
    stage, TMA V. K and V have separate rings, so a K stage frees once the QK^T wgmmas that read it retire, and the
    producer fetches the next K while this tile's P.V is still reading V. For bf16io the producer is a warpgroup
    that also rewrites each V tile in place from bf16 to fp16 (the seeds' conversion, kept out of the consumers);
  - consumer warpgroup w (4 warps): its 64 Q rows against every key tile, the pipelined loop below.

The pipelined loop (the seeds' split barrier: arrive -> independent work -> wait), tile j:
  issue QK^T(j) async -> issue P.V(j-1) async
  -> wait QK^T(j) only -> release K(j) -> mask + online softmax of tile j   <- window: P.V(j-1) runs on the tensor cores
  -> wait P.V(j-1) -> release V(j-1) -> rescale O by alpha(j).
OVERLAP=False waits for both wgmmas before the softmax (the window closed): D64 ships it that way (measured faster).
Every barrier the kernel uses, and what it guards, is listed in `hopper/barriers.py`.

Causal is top-left aligned as in the portable kernel: fully masked tiles are never loaded, only the diagonal and tail
tiles are masked, and row blocks run longest first. O leaves through the Q buffers and a TMA store.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xkernels.common.seqlen import Band, band_constexprs, kv_band_start, kv_bounds, kv_bounds_shifted
from xkernels.hopper import configs, tma
from xkernels.hopper.barriers import attention_barriers
from xkernels.hopper.configs import HopperAttentionConfig
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.named_barrier import pass_turn, wait_turn
from xkernels.hopper.softmax import cap_scores, log2_approx, mask_scores, softmax_step
from xkernels.portable.softmax import softcap_constexpr
from xkernels.recipes import AttentionRecipe

WG_ROWS = gl.constexpr(configs.WG_ROWS)
LOG2E = gl.constexpr(1.4426950408889634)


@constexpr_function
def consumer_registers(num_wg, convert_v):
    """Registers per thread of the worker consumer partitions; the default partition (consumer 0) gets what is left
    of the register file."""
    return 160 if num_wg == 3 else (232 if convert_v else 240)


@constexpr_function
def producer_registers(num_wg, convert_v, convert_steps):
    """Registers per thread of the producer (1 warp, or a warpgroup converting V). A converting producer holds
    1/CONVERT_STEPS of a V tile in registers (D128, 2 steps: 32 registers of data; consumer 0 gives up the
    difference, which is why HopperAttentionConfig.check refuses 2 steps at D256)."""
    if not convert_v:
        return 24
    return 32 if num_wg == 3 else (72 if convert_steps <= 2 else 40)


@gluon.jit
def _convert_v(v, v_landed, it, STEPS: gl.constexpr):
    """bf16io: rewrite V tile `it` in place from bf16 to fp16 (the ring is typed fp16 and TMA copied the bf16 bits),
    then hand it to the consumers on `v.ready`. Runs in the producer warpgroup, so the consumers' registers and issue
    slots stay with the wgmma/softmax loop; its latency still adds to V's."""
    STAGES: gl.constexpr = v.bufs.shape[0]
    s = it % STAGES
    mbarrier.wait(v_landed.index(s), (it // STAGES) & 1)
    tile = v.bufs.index(s)
    rows: gl.constexpr = tile.shape[0]
    td: gl.constexpr = tile.shape[1] // 8  # threads along a row, 8 elements (16 bytes) each
    chunk: gl.constexpr = rows // STEPS  # rows per step; fewer steps, fewer barriers (below), more registers
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // td, td], [4, 1], [1, 0])
    for r in gl.static_range(0, rows, chunk):
        part = tile.slice(r, chunk)
        part.store(part.load(layout).to(gl.bfloat16, bitcast=True).to(gl.float16))
    fence_async_shared()  # generic-proxy stores -> visible to the consumers' wgmma (async proxy)
    mbarrier.arrive(v.ready.index(s))


@gluon.jit
def _load_q(q_desc, q_bufs, q_first, q_ready, q_at, NUM_WG: gl.constexpr):
    """Every consumer's Q rows of a row block (into Q buffers q_first, q_first + 1, ...) from q_at = (row, col) of
    the Q descriptor, all landing on `q_ready`."""
    mbarrier.expect(q_ready, NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma.async_load(q_desc, [q_at[0] + w * WG_ROWS, q_at[1]], q_ready, q_bufs.index(q_first + w))


@gluon.jit
def _load_tiles(q_desc, k_desc, v_desc, q_bufs, q_first, q_ready, k, v, v_landed, q_at, kv_at, hi, it,
                BLOCK_N: gl.constexpr, CONVERT_V: gl.constexpr, NUM_WG: gl.constexpr, CONVERT_STEPS: gl.constexpr,
                lo=0):
    """One row block's TMA loads: every consumer's Q rows (into Q buffers q_first, q_first + 1, ...) from
    q_at = (row, col) of the Q descriptor, then the key
    tiles [lo, hi) from kv_at = (row, col) of K's and V's, on ring counters from `it`; returns the counter after
    them. For bf16io the producer is a warpgroup that also converts V tile j-1 after issuing K tile j."""
    _load_q(q_desc, q_bufs, q_first, q_ready, q_at, NUM_WG)
    it = gl.to_tensor(it)  # a loop-carried counter, also when the caller passes a literal
    first = it
    for start_n in range(lo, hi, BLOCK_N):
        k.load(k_desc, [kv_at[0] + start_n, kv_at[1]], it)
        if CONVERT_V:
            if it > first:
                # V(it-1) was issued a tile ago: converting it before waiting for V(it)'s stage starts it as early as
                # the ring allows (the consumers need it right after issuing QK^T(it))
                _convert_v(v, v_landed, it - 1, CONVERT_STEPS)
        s = v.acquire(it)
        mbarrier.expect(v_landed.index(s), v_desc.block_type.nbytes)
        tma.async_load(v_desc, [kv_at[0] + start_n, kv_at[1]], v_landed.index(s), v.bufs.index(s))
        it += 1
    if CONVERT_V:
        _convert_v(v, v_landed, it - 1, CONVERT_STEPS)
    return it


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_bufs, q_ready, k, v, v_landed, start_m, lo, hi, BLOCK_N: gl.constexpr,
              CONVERT_V: gl.constexpr, NUM_WG: gl.constexpr, CONVERT_STEPS: gl.constexpr):
    """TMA loads of one program (per-head descriptors: rows from 0): key tiles [lo, hi)."""
    _load_tiles(q_desc, k_desc, v_desc, q_bufs, 0, q_ready, k, v, v_landed, (start_m, 0), (0, 0), hi, 0, BLOCK_N,
                CONVERT_V, NUM_WG, CONVERT_STEPS, lo)


@gluon.jit
def _scores(qk, start_n, full_hi, offs_m, SKV, qk_scale, CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr,
            cols_layout: gl.constexpr, full_lo=0, BAND: gl.constexpr = -1, SOFTCAP: gl.constexpr = 0.0):
    """The tile's scores, masked where it is a tail or diagonal tile (from `full_hi` on) or, with a window's lower
    side (BAND >= 0), a tile below `full_lo` that the side cuts for some row; with SOFTCAP > 0 scaled and capped."""
    if SOFTCAP > 0:
        qk = cap_scores(qk, qk_scale, SOFTCAP)  # the softmax then takes a scale of 1 (`_step_scale`)
    elif not POSITIVE_SCALE:
        qk = qk * qk_scale  # the softmax's max-then-scale identity needs a scale > 0: scale first, then mask
    masked = start_n >= full_hi
    if BAND >= 0:
        masked = masked | (start_n < full_lo)
    if masked:  # tail, diagonal or band-edge tile
        qk = mask_scores(qk, start_n, offs_m, SKV, CAUSAL, cols_layout, BAND)
    return qk


@gluon.jit
def _step_scale(qk_scale, POSITIVE_SCALE: gl.constexpr, SOFTCAP: gl.constexpr):
    """The scale `softmax_step` applies: the kernel's where the scores reach it unscaled, else 1 (`_scores`)."""
    if POSITIVE_SCALE and SOFTCAP == 0:
        out = qk_scale
    else:
        out = 1.0
    return out


@gluon.jit
def _key_steps(q, k, v, acc, m_i, l_i, p_op, it, lo, full_hi, hi, offs_m, SKV, qk_scale, zero_s,
               BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr,
               EMPTY_ROWS: gl.constexpr, full_lo=0, BAND: gl.constexpr = -1, SOFTCAP: gl.constexpr = 0.0,
               PINGPONG: gl.constexpr = False, WG: gl.constexpr = 0):
    """The pipelined loop over key tiles [lo, hi) of one warpgroup (module docstring), entered with P of the tile
    before `lo` in `p_op` (its P.V not issued yet) and the ring counter `it` at tile `lo`; returns (acc, m_i, l_i,
    p_op, it) in the same state after tile hi - 1. `offs_m`: the rows' causal limits (key j kept for row i when
    j <= offs_m[i]; with BAND >= 0 also j >= offs_m[i] - BAND, masked below `full_lo`); `zero_s`: a zero score tile in
    the wgmma accumulator layout. PINGPONG: warpgroup WG issues each step's two products in its turn
    (`named_barrier.py`), with both stages landed first so that a turn never waits for data."""
    rows_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, zero_s.type.layout)
    pv_dtype: gl.constexpr = v.bufs.dtype  # bf16io: fp16, converted in place by the producer
    step_scale = _step_scale(qk_scale, POSITIVE_SCALE, SOFTCAP)
    for start_n in range(lo, hi, BLOCK_N):
        s = k.wait(it)
        if PINGPONG:
            v_tile = v.bufs.index(v.wait(it - 1))
            wait_turn(WG)
        qk_tok = warpgroup_mma(q, k.bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if not PINGPONG:
            v_tile = v.bufs.index(v.wait(it - 1))
        acc_tok = warpgroup_mma(p_op, v_tile, acc, is_async=True)
        if PINGPONG:
            pass_turn(WG)
        # arrive -> independent work -> wait: P.V(it-1) stays in flight while this warpgroup masks and exponentiates
        # tile it; with OVERLAP off, both wgmmas retire first (the window closed)
        qk = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[qk_tok])
        k.release(it)
        qk = _scores(qk, start_n, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s, full_lo, BAND,
                     SOFTCAP)
        p, m_new, l_i, alpha = softmax_step(qk, m_i, l_i, step_scale, EMPTY_ROWS)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc_tok, p_op])
        v.release(it - 1)
        # deferred rescale: P.V(it-1) has landed
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1).to(acc.dtype)
        p_op = gl.convert_layout(p.to(pv_dtype), p_op.type.layout)
        m_i = m_new
        it += 1
    return acc, m_i, l_i, p_op, it


@gluon.jit
def first_key_tile(q, q_ready, k, full_hi, offs_m, SKV, qk_scale, zero_s, m_0, l_0, CAUSAL: gl.constexpr,
                   POSITIVE_SCALE: gl.constexpr, p_layout: gl.constexpr, pv_dtype: gl.constexpr,
                   PINGPONG: gl.constexpr = False, WG: gl.constexpr = 0):
    """A persistent consumer's first key tile of its program's first tile (Q in slot 0): scores and softmax only,
    its P.V goes out with the next step's QK^T. With PINGPONG, warpgroup 1 first opens warpgroup 0's turn. Returns
    (m_i, l_i, P as the P.V operand, the ring counter after it)."""
    cols_s: gl.constexpr = gl.SliceLayout(0, zero_s.type.layout)
    mbarrier.wait(q_ready, 0)
    if PINGPONG and WG == 1:
        pass_turn(WG)  # warpgroup 0 takes the first turn
    it = gl.to_tensor(0)
    s = k.wait(it)
    qk = warpgroup_mma(q, k.bufs.index(s).permute((1, 0)), zero_s, use_acc=False)
    k.release(it)
    qk = _scores(qk, 0, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
    p, m_i, l_i, _ = softmax_step(qk, m_0, l_0, _step_scale(qk_scale, POSITIVE_SCALE, 0.0), False)
    return m_i, l_i, gl.convert_layout(p.to(pv_dtype), p_layout), it + 1


@gluon.jit
def _attend(q, q_ready, q_phase, q_free, k, v, it, start_m, full_hi, hi, SKV, diag, qk_scale,
            HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr,
            OVERLAP: gl.constexpr, ACC16: gl.constexpr, EMPTY_ROWS: gl.constexpr, FREE_Q: gl.constexpr,
            lo=0, full_lo=0, BAND: gl.constexpr = -1, sink=0.0, HAS_SINKS: gl.constexpr = False,
            SOFTCAP: gl.constexpr = 0.0):
    """One warpgroup's 64 query rows (from start_m) against key tiles [lo, hi), on ring counters from `it`: the
    pipelined loop of the module docstring. Causal keeps key j for row i when j <= i + diag (diag = 0: top-left;
    Skv - Sq: bottom-right); a window's lower side (BAND >= 0) keeps j >= i + diag - BAND, masking the tiles below
    `full_lo`. EMPTY_ROWS: rows may see no key. FREE_Q: arrive on q_free once the last QK^T retired
    (the persistent producer then loads the next tile's Q under this tile's last P.V and epilogue). HAS_SINKS: every
    row's softmax starts at an attention sink `sink` (the head's logit times log2(e)), a key of value 0: the running
    max starts there and the row sum at 1, so the LSE includes it and a row that sees no key gets O = 0. SOFTCAP > 0:
    the scores soft-capped (`hopper.softmax.cap_scores`).
    Returns (O accumulator, row max, row sum, the ring counter after these tiles)."""
    s_layout: gl.constexpr = wgmma_acc(BLOCK_N)
    o_layout: gl.constexpr = wgmma_acc(HEAD_DIM)
    p_layout: gl.constexpr = wgmma_operand(HEAD_DIM)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    pv_dtype: gl.constexpr = v.bufs.dtype  # bf16io: fp16, converted in place by the producer
    acc_dtype: gl.constexpr = gl.float16 if ACC16 else gl.float32  # ACC16: the seeds' fp16 P.V accumulator
    step_scale = _step_scale(qk_scale, POSITIVE_SCALE, SOFTCAP)
    offs_m = start_m + gl.arange(0, WG_ROWS, rows_s)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)

    # tile 0: scores and softmax only; its P.V is issued together with tile 1's QK^T
    if HAS_SINKS:
        m_i = gl.full([WG_ROWS], 0.0, gl.float32, rows_s) + sink
        l_i = gl.full([WG_ROWS], 1.0, gl.float32, rows_s)
    else:
        m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, rows_s)
        l_i = gl.zeros([WG_ROWS], gl.float32, rows_s)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
    mbarrier.wait(q_ready, q_phase)
    it = gl.to_tensor(it)  # a loop-carried counter, also when the caller passes a literal
    s = k.wait(it)
    qk = warpgroup_mma(q, k.bufs.index(s).permute((1, 0)), zero_s, use_acc=False)
    k.release(it)
    qk = _scores(qk, lo, full_hi, offs_m + diag, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s, full_lo, BAND,
                 SOFTCAP)
    p, m_i, l_i, alpha = softmax_step(qk, m_i, l_i, step_scale, EMPTY_ROWS)
    p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
    it += 1
    acc, m_i, l_i, p_op, it = _key_steps(q, k, v, acc, m_i, l_i, p_op, it, lo + BLOCK_N, full_hi, hi, offs_m + diag,
                                         SKV, qk_scale, zero_s, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, EMPTY_ROWS,
                                         full_lo, BAND, SOFTCAP)
    if FREE_Q:  # every QK^T reading this warpgroup's Q rows has retired
        mbarrier.arrive(q_free)
    v_tile = v.bufs.index(v.wait(it - 1))
    acc = warpgroup_mma(p_op, v_tile, acc)
    v.release(it - 1)
    return acc, m_i, l_i, it


@gluon.jit
def _normalize(acc, m_i, l_i, EMPTY_ROWS: gl.constexpr):
    """(O = acc / l in fp32, natural-log LSE) of the rows; EMPTY_ROWS: rows that saw no key (row sum exactly 0) get
    O = 0, LSE = -inf; a NaN row sum (a NaN or infinite score) stays NaN, as in SDPA."""
    rows_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    # one reciprocal a row, then a multiply an element: a division an element costs four instructions each (its
    # range checks), as much as a key step's softmax on the short rows where a tile has two or three key tiles
    if EMPTY_ROWS:
        inv_l = gl.where(l_i != 0, 1.0 / l_i, 0.0)  # a NaN sum stays NaN (NaN != 0)
        lse = gl.where(l_i != 0, (m_i + log2_approx(gl.where(l_i != 0, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
    else:
        inv_l = 1.0 / l_i
        lse = (m_i + log2_approx(l_i)) * 0.6931471805599453
    out = acc.to(gl.float32) * gl.expand_dims(gl.convert_layout(inv_l, rows_o), 1)
    return out, lse


@gluon.jit
def _consumer(WG: gl.constexpr, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
              SKV, diag, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr, WRITE_LSE: gl.constexpr,
              EMPTY_ROWS: gl.constexpr, BAND: gl.constexpr, sink, HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr):
    """One warpgroup of one program: `_attend`, then O through its (now free) Q buffer and a TMA store."""
    q = q_bufs.index(WG)
    row0 = start_m + WG * WG_ROWS
    acc, m_i, l_i, it = _attend(q, q_ready, 0, q_ready, k, v, 0, row0, full_hi, hi, SKV, diag, qk_scale, HEAD_DIM,
                                BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, EMPTY_ROWS, False, lo, full_lo,
                                BAND, sink, HAS_SINKS, SOFTCAP)
    out, lse = _normalize(acc, m_i, l_i, EMPTY_ROWS)
    q.store(out.to(q.dtype))  # this warpgroup's Q buffer is free: every wgmma reading it has retired
    fence_async_shared()
    tma.async_store(o_desc, [row0, 0], q)
    if WRITE_LSE:
        offs_m = row0 + gl.arange(0, WG_ROWS, lse.type.layout)
        gl.store(LSE + lse_row0 + offs_m, lse, mask=offs_m < SQ)
    tma.store_wait(0)


@gluon.jit
def attention_fwd_kernel(Q, K, V, O, LSE, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
                         HQ, GROUP, SQ, SKV, qk_scale, SINKS, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr,
                         POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, NUM_WG: gl.constexpr,
                         ACC16: gl.constexpr, CONVERT_STEPS: gl.constexpr, WRITE_LSE: gl.constexpr,
                         SHIFT: gl.constexpr, BAND: gl.constexpr, HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr):
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    m_blocks = gl.cdiv(SQ, BLOCK_M)  # one grid axis, row blocks of a head adjacent (see the portable kernel)
    m_block = gl.program_id(0) % m_blocks
    if CAUSAL:
        m_block = m_blocks - 1 - m_block  # longest rows first: the last wave holds the short ones
    start_m = m_block * BLOCK_M
    bh = (gl.program_id(0) // m_blocks).to(gl.int64)
    b = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], Q.dtype.element_ty)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], K.dtype.element_ty)
    # per-(batch, head) descriptors: TMA bounds stop tiles at this head's sequence end (zero fill, clipped stores)
    q_desc = tma.make_tensor_descriptor(Q + b * q_sb + h * q_sh, [SQ, HEAD_DIM], [q_ss, 1], [WG_ROWS, HEAD_DIM],
                                        q_layout)
    k_desc = tma.make_tensor_descriptor(K + b * k_sb + hk * k_sh, [SKV, HEAD_DIM], [k_ss, 1], [BLOCK_N, HEAD_DIM],
                                        kv_layout)
    v_desc = tma.make_tensor_descriptor(V + b * v_sb + hk * v_sh, [SKV, HEAD_DIM], [v_ss, 1], [BLOCK_N, HEAD_DIM],
                                        kv_layout)
    o_desc = tma.make_tensor_descriptor(O + b * o_sb + h * o_sh, [SQ, HEAD_DIM], [o_ss, 1], [WG_ROWS, HEAD_DIM],
                                        q_layout)

    lo = 0
    full_lo = 0
    if BAND >= 0:  # a window (`common.seqlen.Band`): tiles [lo, hi), the lower side masked below full_lo
        full_hi, hi = kv_bounds_shifted(start_m, SHIFT, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        lo, full_lo = kv_band_start(start_m, SHIFT, BLOCK_M, BLOCK_N, BAND)
        # a block whose window lies past every key still walks one (fully masked) tile: its rows get O = 0
        lo = min(lo, ((max(hi, 1) - 1) // BLOCK_N) * BLOCK_N)
    elif SHIFT > 0:  # a window's right side alone: the causal mask shifted
        full_hi, hi = kv_bounds_shifted(start_m, SHIFT, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    else:
        full_hi, hi = kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    sink = 0.0
    if HAS_SINKS:  # (Hq,) sink logits (gpt-oss), fp32; in the kernel's log2 units
        sink = gl.load(SINKS + h).to(gl.float32) * LOG2E
    _program(q_desc, k_desc, v_desc, o_desc, LSE, bh * SQ, start_m, full_hi, hi, SQ, SKV, SHIFT, qk_scale, HEAD_DIM,
             BLOCK_N, STAGES, CAUSAL, CONVERT_V, POSITIVE_SCALE, OVERLAP, NUM_WG, ACC16, CONVERT_STEPS, WRITE_LSE,
             BAND >= 0, lo, full_lo, BAND, sink, HAS_SINKS, SOFTCAP)


@gluon.jit
def _program(q_desc, k_desc, v_desc, o_desc, LSE, lse_row0, start_m, full_hi, hi, SQ, SKV, diag, qk_scale,
             HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
             CONVERT_V: gl.constexpr, POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, NUM_WG: gl.constexpr,
             ACC16: gl.constexpr, CONVERT_STEPS: gl.constexpr, WRITE_LSE: gl.constexpr, EMPTY_ROWS: gl.constexpr,
             lo=0, full_lo=0, BAND: gl.constexpr = -1, sink=0.0, HAS_SINKS: gl.constexpr = False,
             SOFTCAP: gl.constexpr = 0.0):
    """One program's rings, barriers and partitions, given its descriptors (per (batch, head) in the dense kernel,
    per (sequence, head) in the varlen one) and the key tiles it visits: [lo, hi), unmasked in [full_lo, full_hi),
    masked elsewhere (BAND >= 0: a window's lower side; hi > lo: the consumers wait for tile lo); HAS_SINKS: every
    row's softmax starts at `sink` (`_attend`); SOFTCAP > 0: soft-capped scores."""
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, WG_ROWS, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready, k, v, v_landed = attention_barriers(k_bufs, v_bufs, CONVERT_V, NUM_WG)
    regs: gl.constexpr = consumer_registers(NUM_WG, CONVERT_V)
    producer_warps: gl.constexpr = 4 if CONVERT_V else 1
    producer_regs: gl.constexpr = producer_registers(NUM_WG, CONVERT_V, CONVERT_STEPS)
    if NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (0, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
                         SKV, diag, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE,
                         EMPTY_ROWS, BAND, sink, HAS_SINKS, SOFTCAP)),
            (_consumer, (1, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
                         SKV, diag, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE,
                         EMPTY_ROWS, BAND, sink, HAS_SINKS, SOFTCAP)),
            (_producer, (q_desc, k_desc, v_desc, q_bufs, q_ready, k, v, v_landed, start_m, lo, hi, BLOCK_N,
                         CONVERT_V, NUM_WG, CONVERT_STEPS))], [4, producer_warps], [regs, producer_regs])
    else:
        gl.static_assert(NUM_WG == 3, "2 or 3 consumer warpgroups")
        gl.warp_specialize([
            (_consumer, (0, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
                         SKV, diag, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE,
                         EMPTY_ROWS, BAND, sink, HAS_SINKS, SOFTCAP)),
            (_consumer, (1, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
                         SKV, diag, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE,
                         EMPTY_ROWS, BAND, sink, HAS_SINKS, SOFTCAP)),
            (_consumer, (2, o_desc, q_bufs, q_ready, k, v, LSE, lse_row0, start_m, lo, full_lo, full_hi, hi, SQ,
                         SKV, diag, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE,
                         EMPTY_ROWS, BAND, sink, HAS_SINKS, SOFTCAP)),
            (_producer, (q_desc, k_desc, v_desc, q_bufs, q_ready, k, v, v_landed, start_m, lo, hi, BLOCK_N,
                         CONVERT_V, NUM_WG, CONVERT_STEPS))], [4, 4, producer_warps], [regs, regs, producer_regs])


def constexprs(cfg: HopperAttentionConfig, head_dim: int, recipe: AttentionRecipe, *, causal: bool,
               positive_scale: bool, write_lse: bool, band: Band | None = None, sinks: bool = False,
               softcap: float = 0.0) -> dict[str, object]:
    """`attention_fwd_kernel`'s (and the varlen kernel's) compile-time arguments: the config's, a sliding window's
    SHIFT and BAND (`band`, its `causal` replacing `causal`; none: 0 and -1), HAS_SINKS and SOFTCAP (the API's
    `softcap` times log2(e); 0: none)."""
    masks = band_constexprs(band, causal)
    return cfg.constexprs(head_dim, recipe, causal=masks["CAUSAL"], positive_scale=positive_scale,
                          write_lse=write_lse) | masks | dict(HAS_SINKS=sinks, SOFTCAP=softcap_constexpr(softcap))


def launch_spec(batch: int, heads: int, sq: int, head_dim: int, *, is_causal: bool, recipe: AttentionRecipe,
                positive_scale: bool, write_lse: bool, cfg: HopperAttentionConfig,
                band: Band | None = None, sinks: bool = False,
                softcap: float = 0.0) -> tuple[int, dict[str, object], dict[str, int]]:
    """(grid, constexprs, launch options): the runtime arguments are `plans.attention_args` and the sink logits, as
    for the portable kernel (for bf16io V viewed as fp16, whose bf16 bits the producer converts in shared memory,
    or with `v_pass` V converted to fp16 before the launch). `band`: a sliding window; `sinks`: the kernel reads
    (Hq,) sink logits; `softcap`: the scores' soft cap."""
    cfg.check(head_dim, recipe)
    grid = triton.cdiv(sq, cfg.block_m) * batch * heads
    return grid, constexprs(cfg, head_dim, recipe, causal=is_causal, positive_scale=positive_scale,
                            write_lse=write_lse, band=band, sinks=sinks, softcap=softcap), dict(num_warps=4)
