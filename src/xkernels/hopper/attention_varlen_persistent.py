"""Persistent Hopper forward over packed variable-length batches: the persistent kernel's chained tiles
(`attention_persistent.py`) on a walk over (sequence, query block, head).

Packed batches are mostly short sequences, where a CTA per row block pays its prologue (four in-kernel tensor maps,
barrier setup, the first Q and K latencies) for a few key tiles; here the grid is the SM count and every partition
walks the same static list of B * m_blocks * Hq tiles (m_blocks from max_seqlen_q), sequence-major so a sequence's
K/V stay in L2 while its heads run. Inside a sequence (config `walk`): 0, longest query blocks first with heads
fastest, so the programs running at one time cover every head of a few query blocks (a long sequence's K/V for all
heads, 64 MiB at 4K keys, H32 D128, streams again for every few blocks); 1, units of real tiles dealt head-major
(`common/tile_scheduler.py`: a head's blocks, or causal pairs of them, side by side on one head's K/V; no tile past
a sequence's end, so the programs do not drift apart). A tile past its sequence's end (WALK 0) is skipped by
every partition alike (each reads cu_seqlens); a tile whose rows see no key (Sk = 0, or causal with Sq > Sk) loads
nothing: its consumers store O = 0 and LSE = -inf directly. The walk is a plain `for` over the list in every
partition; the consumers chain tiles from the next tile's side (`_consumer`), so none scans ahead.

Descriptors are made once on the host over 2-D views of the packed Q, K, V (`views.descriptor_view`
of (1, H, total, D)), so a tile does not stop at its sequence's end:
  * Q rows past the end are another sequence's (or TMA's zero fill): computed row-wise, never stored;
  * K rows past the end get a -inf score (`mask_scores` against the sequence's own Sk);
  * V rows past the end would meet P = 0, but 0 * inf is NaN: each consumer zeroes them in shared memory before the
    tail tile's P.V (`_zero_tail`), so no neighbour's values reach a sequence;
  * O leaves through the consumer's O buffer: a warpgroup's 64 rows all inside the sequence by a TMA store left in
    flight (O_TMA, shipped: 1-3 % faster than masked stores everywhere on the packed batches, H100 2026-12-06/06),
    the sequence's last rows by masked stores (a TMA store would write the neighbour's rows).
Causal is aligned bottom-right per sequence, as every varlen kernel here.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xkernels.common.seqlen import kv_bounds_shifted, sequence_bounds
from xkernels.common.tile_scheduler import packed_tile, packed_tiles_of
from xkernels.hopper import configs, tma
from xkernels.hopper.attention_fwd import (
    _key_steps,
    _load_tiles,
    _normalize,
    _scores,
    consumer_registers,
    producer_registers,
)
from xkernels.hopper.barriers import kv_rings, q_slot_barriers, tail_zeroed_barriers
from xkernels.hopper.configs import HopperAttentionConfig
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.softmax import softmax_step
from xkernels.hopper.views import descriptor_view
from xkernels.recipes import AttentionRecipe

WG_ROWS = gl.constexpr(configs.WG_ROWS)


@gluon.jit
def _walk_range(UNITS, walk, PAIRS: gl.constexpr, WALK: gl.constexpr):
    """(start, stop, step) of this program's loop: WALK 0, over the list's tile indices (past a sequence's end
    included); WALK 1, over the n-th tiles of its units."""
    if WALK == 0:
        start = gl.program_id(0)
        stop = walk[0]
        step = gl.num_programs(0)
    else:
        start = 0
        stop = packed_tiles_of(gl.program_id(0), gl.num_programs(0), UNITS, walk[0] // (walk[1] * walk[2]), PAIRS)
        step = 1
    return start, stop, step


@gluon.jit
def _work(n, CU_Q, CU_K, UNITS, walk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
          WALK: gl.constexpr, PAIRS: gl.constexpr):
    """Tile n of the walk (n_tiles, m_blocks, HQ) in order WALK (module docstring; WALK 0: the list's n-th, WALK 1:
    this program's n-th): (h, q0, SQ, k0, SKV, start_m, diag, full_hi, hi); the tile exists when start_m < SQ and
    loads keys when hi > 0."""
    if WALK == 0:
        m_blocks = walk[1]
        HQ = walk[2]
        tile = n
        b = tile // (m_blocks * HQ)
        r = tile % (m_blocks * HQ)
        h = r % HQ
        start_m = (m_blocks - 1 - r // HQ) * BLOCK_M
    else:
        b, h, block = packed_tile(n, gl.program_id(0), gl.num_programs(0), UNITS, CU_Q,
                                  walk[0] // (walk[1] * walk[2]), BLOCK_M, PAIRS)
        start_m = block * BLOCK_M
    q0, SQ, k0, SKV = sequence_bounds(CU_Q, CU_K, b)
    diag = SKV - SQ  # bottom-right: row i's last key is i + diag
    full_hi, hi = kv_bounds_shifted(start_m, diag, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    return h, q0, SQ, k0, SKV, start_m, diag, full_hi, hi


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_bufs, q_ready, q_free, k, v, v_landed, CU_Q, CU_K, UNITS, at, walk, GROUP,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, NUM_WG: gl.constexpr, WALK: gl.constexpr,
              PAIRS: gl.constexpr):
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    it = 0
    done = 0
    start, stop, step = _walk_range(UNITS, walk, PAIRS, WALK)
    for tile in range(start, stop, step):
        h, q0, SQ, k0, SKV, start_m, diag, full_hi, hi = _work(tile, CU_Q, CU_K, UNITS, walk, BLOCK_M, BLOCK_N, CAUSAL,
                                                               WALK, PAIRS)
        if (start_m < SQ) & (hi > 0):
            slot = done % 2
            mbarrier.wait(q_free.index(slot), ((done // 2) & 1) ^ 1)  # each slot's first tile passes at once
            hk = h // GROUP
            it = _load_tiles(q_desc, k_desc, v_desc, q_bufs, slot * NUM_WG, q_ready.index(slot), k, v, v_landed,
                             ((h * at[0] + q0 + start_m).to(gl.int32), h * at[1]),
                             ((hk * at[2] + k0).to(gl.int32), hk * at[3]), hi, it, BLOCK_N, False, NUM_WG, 8)
            done += 1


@gluon.jit
def _store_rows(x, ptr_base, row_stride, rows_left, o_buf, HEAD_DIM: gl.constexpr):
    """x [64, D] (a wgmma accumulator layout) to the first `rows_left` rows at ptr_base (row stride row_stride),
    through shared memory `o_buf` so each thread stores 16-byte vectors."""
    o_buf.store(x.to(o_buf.dtype))
    td: gl.constexpr = HEAD_DIM // 8  # threads along a row, 8 elements each
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // td, td], [4, 1], [1, 0])
    y = o_buf.load(layout)
    rows = gl.arange(0, WG_ROWS, gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    ptrs = ptr_base + gl.expand_dims(rows.to(gl.int64) * row_stride, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, y, mask=gl.expand_dims(rows < rows_left, 1))


@gluon.jit
def _epilogue(acc, m_i, l_i, o_buf, o_desc, O, LSE, h, q0, SQ, row0, o_at, o_st, o_sh, lse_sh, HEAD_DIM: gl.constexpr,
              CAUSAL: gl.constexpr, WRITE_LSE: gl.constexpr, O_TMA: gl.constexpr):
    """A warpgroup's rows of one tile: O = acc / l (rows that saw no key: 0) and the LSE, rows inside the sequence.
    O_TMA: 64 rows inside the sequence leave by a TMA store left in flight (the buffer's next user waits for it)."""
    out, lse = _normalize(acc, m_i, l_i, CAUSAL)
    if O_TMA:
        tma.store_wait(0)  # the previous tile's O store has read this buffer
        if row0 + WG_ROWS <= SQ:
            o_buf.store(out.to(o_buf.dtype))
            fence_async_shared()
            tma.async_store(o_desc, [(h * o_at[0] + q0 + row0).to(gl.int32), h * o_at[1]], o_buf)
        else:
            _store_rows(out, O + (q0 + row0) * o_st + h.to(gl.int64) * o_sh, o_st, SQ - row0, o_buf, HEAD_DIM)
    else:
        _store_rows(out, O + (q0 + row0) * o_st + h.to(gl.int64) * o_sh, o_st, SQ - row0, o_buf, HEAD_DIM)
    if WRITE_LSE:
        offs = row0 + gl.arange(0, WG_ROWS, lse.type.layout)
        gl.store(LSE + h.to(gl.int64) * lse_sh + q0 + offs, lse, mask=offs < SQ)


@gluon.jit
def _store_empty(WG: gl.constexpr, o_buf, O, LSE, h, q0, SQ, row0, o_st, o_sh, lse_sh, HEAD_DIM: gl.constexpr,
                 WRITE_LSE: gl.constexpr, O_TMA: gl.constexpr):
    """O = 0 and LSE = -inf for a warpgroup's rows of a tile that sees no key."""
    zero = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, wgmma_acc(HEAD_DIM))
    if O_TMA:
        tma.store_wait(0)  # the O buffer is free
    _store_rows(zero, O + (q0 + row0) * o_st + h.to(gl.int64) * o_sh, o_st, SQ - row0, o_buf, HEAD_DIM)
    if WRITE_LSE:
        lse_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = row0 + gl.arange(0, WG_ROWS, lse_layout)
        gl.store(LSE + h.to(gl.int64) * lse_sh + q0 + offs, gl.full([WG_ROWS], float("-inf"), gl.float32, lse_layout),
                 mask=offs < SQ)


@gluon.jit
def _zero_chunk(v_tile, r: gl.constexpr, valid, layout: gl.constexpr, CHUNK: gl.constexpr):
    part = v_tile.slice(r, CHUNK)
    rows = r + gl.arange(0, CHUNK, gl.SliceLayout(1, layout))
    part.store(gl.where(gl.expand_dims(rows < valid, 1), part.load(layout), 0.0).to(v_tile.dtype))


@gluon.jit
def _zero_tail(v_tile, valid, HEAD_DIM: gl.constexpr, PAST_END_ONLY: gl.constexpr = False):
    """Rows >= valid of a V tile in shared memory set to 0 (keys past the sequence end: another sequence's values,
    which P = 0 would not cancel if they were inf or NaN), then fenced for the async P.V that reads the tile.
    PAST_END_ONLY: only the 32-row chunks that hold such rows are rewritten (the others are left as loaded)."""
    rows_n: gl.constexpr = v_tile.shape[0]
    td: gl.constexpr = HEAD_DIM // 8
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // td, td], [4, 1], [1, 0])
    CHUNK: gl.constexpr = 32
    for r in gl.static_range(0, rows_n, CHUNK):
        if PAST_END_ONLY:
            if r + CHUNK > valid:
                _zero_chunk(v_tile, r, valid, layout, CHUNK)
        else:
            _zero_chunk(v_tile, r, valid, layout, CHUNK)
    fence_async_shared()


@gluon.jit
def _tail_ready(WG: gl.constexpr, v_tile, valid, v_zeroed, tile_n, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                ZERO_TAIL: gl.constexpr):
    """The last V tile of this program's loaded tile `tile_n` made safe for its P.V: rows >= valid (another
    sequence's values) zeroed. ZERO_TAIL 2: warpgroup 0 alone zeroes, then arrives on the tile slot's `v_zeroed`
    barrier, which warpgroup 1 waits on before its P.V reads the tile (every tile arrives, tail or not, so the
    phases count tiles); no store races another warpgroup's async read. 3 (shipped), as 2 but rewriting only the
    32-row chunks that hold rows past the end (0.5-2 % faster than 2 on the packed batches, H100: 2026-12-06/06).
    Ablations: 1, both warpgroups rewrite the
    tile (the same zeros, unsynchronized: a race by the memory model's rules, no faster when measured); 0, no
    zeroing (a neighbour's inf or NaN then reaches the sequence)."""
    if ZERO_TAIL == 1:
        if valid < BLOCK_N:
            _zero_tail(v_tile, valid, HEAD_DIM)
    elif ZERO_TAIL >= 2:
        if WG == 0:
            if valid < BLOCK_N:
                _zero_tail(v_tile, valid, HEAD_DIM, ZERO_TAIL == 3)
            mbarrier.arrive(v_zeroed.index(tile_n % 4))
        else:
            mbarrier.wait(v_zeroed.index(tile_n % 4), (tile_n // 4) & 1)


@gluon.jit
def _consumer(WG: gl.constexpr, o_desc, O, LSE, CU_Q, CU_K, UNITS, q_bufs, o_bufs, q_ready, q_free, k, v, v_zeroed,
              walk, o_at, o_st, o_sh, lse_sh, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr,
              WRITE_LSE: gl.constexpr, NUM_WG: gl.constexpr, CHAIN: gl.constexpr, ZERO_TAIL: gl.constexpr,
              WALK: gl.constexpr, PAIRS: gl.constexpr, O_TMA: gl.constexpr):
    """`attention_persistent._consumer_chained` on the varlen walk, written from the next tile's side: a loaded tile
    starts by issuing its first QK^T together with the last P.V of the tile before it (pending), runs its first
    softmax under that P.V, then stores the pending tile's O; the program's last tile ends alone after the walk. The
    pending tile's V rows past its sequence are zeroed before that P.V."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    s_layout: gl.constexpr = wgmma_acc(BLOCK_N)
    o_layout: gl.constexpr = wgmma_acc(HEAD_DIM)
    p_layout: gl.constexpr = wgmma_operand(HEAD_DIM)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    pv_dtype: gl.constexpr = v.bufs.dtype
    acc_dtype: gl.constexpr = gl.float16 if ACC16 else gl.float32
    step_scale = qk_scale if POSITIVE_SCALE else 1.0
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    m_0 = gl.full([WG_ROWS], float("-inf"), gl.float32, rows_s)
    l_0 = gl.zeros([WG_ROWS], gl.float32, rows_s)
    o_buf = o_bufs.index(WG)

    # the pending tile (its last P.V not issued yet): its softmax state and where its rows go
    acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
    m_i = m_0
    l_i = l_0
    p_op = gl.convert_layout(zero_s.to(pv_dtype), p_layout)
    pending = gl.to_tensor(0)
    p_h = gl.to_tensor(0)
    p_q0 = gl.to_tensor(0).to(gl.int64)
    p_sq = gl.to_tensor(0)
    p_row0 = gl.to_tensor(0)
    p_tail = gl.to_tensor(0)  # rows of its last V tile inside the sequence (BLOCK_N: all)
    it = gl.to_tensor(0)
    n = gl.to_tensor(0)
    start, stop, step = _walk_range(UNITS, walk, PAIRS, WALK)
    for tile in range(start, stop, step):
        h, q0, SQ, k0, SKV, start_m, diag, full_hi, hi = _work(tile, CU_Q, CU_K, UNITS, walk, BLOCK_M, BLOCK_N, CAUSAL,
                                                               WALK, PAIRS)
        row0 = start_m + WG * WG_ROWS
        if (start_m < SQ) & (hi == 0) & (row0 < SQ):  # rows that see no key: nothing loaded
            _store_empty(WG, o_buf, O, LSE, h, q0, SQ, row0, o_st, o_sh, lse_sh, HEAD_DIM, WRITE_LSE, O_TMA)
        if (start_m < SQ) & (hi > 0):
            slot = n % 2
            offs_m = row0 + gl.arange(0, WG_ROWS, rows_s) + diag
            mbarrier.wait(q_ready.index(slot), (n // 2) & 1)
            s = k.wait(it)
            if pending != 0:
                v_tile = v.bufs.index(v.wait(it - 1))
                _tail_ready(WG, v_tile, p_tail, v_zeroed, n - 1, HEAD_DIM, BLOCK_N, ZERO_TAIL)
                if CHAIN:
                    qk_tok = warpgroup_mma(q_bufs.index(slot * NUM_WG + WG), k.bufs.index(s).permute((1, 0)),
                                           zero_s, use_acc=False, is_async=True)
                    acc_tok = warpgroup_mma(p_op, v_tile, acc, is_async=True)
                    # arrive -> independent work -> wait: the pending tile's last P.V runs while this tile's first
                    # scores are masked and exponentiated
                    qk = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[qk_tok])
                    k.release(it)
                    qk = _scores(qk, 0, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
                    p, m_new, l_new, _ = softmax_step(qk, m_0, l_0, step_scale, CAUSAL)
                    acc, p_op = warpgroup_mma_wait(0, deps=[acc_tok, p_op])
                    v.release(it - 1)
                    if p_row0 < p_sq:
                        _epilogue(acc, m_i, l_i, o_buf, o_desc, O, LSE, p_h, p_q0, p_sq, p_row0, o_at, o_st, o_sh,
                                  lse_sh, HEAD_DIM, CAUSAL, WRITE_LSE, O_TMA)
                else:  # ablation: the pending tile ends (P.V, epilogue) before this tile's first QK^T is issued
                    acc = warpgroup_mma(p_op, v_tile, acc)
                    v.release(it - 1)
                    if p_row0 < p_sq:
                        _epilogue(acc, m_i, l_i, o_buf, o_desc, O, LSE, p_h, p_q0, p_sq, p_row0, o_at, o_st, o_sh,
                                  lse_sh, HEAD_DIM, CAUSAL, WRITE_LSE, O_TMA)
                    qk = warpgroup_mma(q_bufs.index(slot * NUM_WG + WG), k.bufs.index(s).permute((1, 0)), zero_s,
                                       use_acc=False)
                    k.release(it)
                    qk = _scores(qk, 0, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
                    p, m_new, l_new, _ = softmax_step(qk, m_0, l_0, step_scale, CAUSAL)
            else:  # the program's first loaded tile
                qk = warpgroup_mma(q_bufs.index(slot * NUM_WG + WG), k.bufs.index(s).permute((1, 0)), zero_s,
                                   use_acc=False)
                k.release(it)
                qk = _scores(qk, 0, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
                p, m_new, l_new, _ = softmax_step(qk, m_0, l_0, step_scale, CAUSAL)
            p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
            acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
            it += 1
            acc, m_i, l_i, p_op, it = _key_steps(q_bufs.index(slot * NUM_WG + WG), k, v, acc, m_new, l_new, p_op, it,
                                                 BLOCK_N, full_hi, hi, offs_m, SKV, qk_scale, zero_s, BLOCK_N, CAUSAL,
                                                 POSITIVE_SCALE, OVERLAP, CAUSAL)
            mbarrier.arrive(q_free.index(slot))  # every QK^T reading this tile's Q has retired
            pending = gl.to_tensor(1)
            p_h = h
            p_q0 = q0
            p_sq = SQ
            p_row0 = row0
            p_tail = SKV - ((hi - 1) // BLOCK_N) * BLOCK_N
            n += 1
    if pending != 0:  # the program's last loaded tile: its last P.V alone
        v_tile = v.bufs.index(v.wait(it - 1))
        _tail_ready(WG, v_tile, p_tail, v_zeroed, n - 1, HEAD_DIM, BLOCK_N, ZERO_TAIL)
        acc = warpgroup_mma(p_op, v_tile, acc)
        v.release(it - 1)
        if p_row0 < p_sq:
            _epilogue(acc, m_i, l_i, o_buf, o_desc, O, LSE, p_h, p_q0, p_sq, p_row0, o_at, o_st, o_sh, lse_sh,
                      HEAD_DIM, CAUSAL, WRITE_LSE, O_TMA)
    if O_TMA:
        tma.store_wait(0)


@gluon.jit(do_not_specialize=["GROUP", "n_tiles", "m_blocks", "HQ"])
def attention_varlen_persistent_kernel(q_desc, k_desc, v_desc, o_desc, O, LSE, CU_Q, CU_K, UNITS, q_rh, q_ch, kv_rh,
                                       kv_ch, o_rh, o_ch, o_st, o_sh, lse_sh, GROUP, n_tiles, m_blocks, HQ, qk_scale,
                                       HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                       CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr,
                                       NUM_WG: gl.constexpr, ACC16: gl.constexpr, WRITE_LSE: gl.constexpr,
                                       CHAIN: gl.constexpr = True, ZERO_TAIL: gl.constexpr = 2,
                                       WALK: gl.constexpr = 0, PAIRS: gl.constexpr = False,
                                       O_TMA: gl.constexpr = False):
    """q (total_q, Hq, D), k and v (total_k, Hkv, D) through descriptors over their 2-D views (a head's rows start
    at h * *_rh, its columns at h * *_ch); O (total_q, Hq, D) by its (token, head) strides, and (O_TMA) through
    o_desc over its 2-D view (o_rh, o_ch); LSE (Hq, total_q);
    UNITS (B + 1) the units before each sequence (WALK 1, `tile_scheduler.packed_units_kernel`, with PAIRS causal
    blocks paired as it counted them; else not read)."""
    at = (q_rh, q_ch, kv_rh, kv_ch)
    o_at = (o_rh, o_ch)
    walk = (n_tiles, m_blocks, HQ)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_WG, WG_ROWS, HEAD_DIM], q_desc.layout)
    o_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, WG_ROWS, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    k, v, v_landed = kv_rings(k_bufs, v_bufs, False, NUM_WG)
    q_ready, q_free = q_slot_barriers(2, NUM_WG)
    v_zeroed = tail_zeroed_barriers()  # ZERO_TAIL=2: warpgroup 0 -> warpgroup 1 (`_tail_ready`), slot n % 4
    regs: gl.constexpr = consumer_registers(NUM_WG, False)
    producer_regs: gl.constexpr = producer_registers(NUM_WG, False, 8)
    gl.static_assert(NUM_WG == 2, "two consumer warpgroups")
    gl.warp_specialize([
        (_consumer, (0, o_desc, O, LSE, CU_Q, CU_K, UNITS, q_bufs, o_bufs, q_ready, q_free, k, v, v_zeroed, walk,
                     o_at, o_st, o_sh, lse_sh, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                     WRITE_LSE, NUM_WG, CHAIN, ZERO_TAIL, WALK, PAIRS, O_TMA)),
        (_consumer, (1, o_desc, O, LSE, CU_Q, CU_K, UNITS, q_bufs, o_bufs, q_ready, q_free, k, v, v_zeroed, walk,
                     o_at, o_st, o_sh, lse_sh, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                     WRITE_LSE, NUM_WG, CHAIN, ZERO_TAIL, WALK, PAIRS, O_TMA)),
        (_producer, (q_desc, k_desc, v_desc, q_bufs, q_ready, q_free, k, v, v_landed, CU_Q, CU_K, UNITS, at, walk,
                     GROUP, BLOCK_N, CAUSAL, NUM_WG, WALK, PAIRS))], [4, 1], [regs, producer_regs])


def packed_view(t: torch.Tensor):
    """`descriptor_view` of a packed (total, H, D) tensor seen as (1, H, total, D), or None."""
    return descriptor_view(t.unsqueeze(0).transpose(1, 2))


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: HopperAttentionConfig | None,
             recipe: AttentionRecipe) -> bool:
    """Whether this kernel serves the call: a persistent config with two consumers, a head dim up to 128, no V
    conversion in the kernel (bf16io only with `v_pass`: V already fp16), and Q, K, V (K and V alike) with 2-D
    descriptor views."""
    if (cfg is None or not cfg.persistent or cfg.consumers != 2 or cfg.converts_in_kernel(recipe)
            or q.shape[-1] > 128):
        return False  # (its tiles are chained: two Q slots, which D256's shared memory cannot hold)
    kv = packed_view(k)
    return packed_view(q) is not None and kv is not None and packed_view(v) is not None \
        and packed_view(v)[1:] == kv[1:]


def packed_walk(is_causal: bool, group: int) -> int:
    """Config walk=2's order here: head-major units (1) for full MHA, the L2-chunk walk (0) elsewhere. On the packed
    batch of `scripts/varlen_ab.py` (32 sequences of 256-4096, H100), full MHA at D128 ran 7.76-7.90 ms on walk 1
    in three runs, 7.66-8.89 on walk 0 (which rereads a sequence's K/V for every few query blocks: the CPU model
    `scripts/walk_l2_model.py` has 9.2 GB against 2.1) and 8.02-8.16 on the per-sequence grid; causal, GQA and D64
    ran level on both walks, and walk 1 costs a launch more (the unit count): benchmarks/results/h100/2026-12-06/
    02-walk-default, 04-pingpong-tests, 06-varlen-ablate."""
    return 1 if not is_causal and group == 1 else 0


def launch_spec(batch: int, heads: int, max_seqlen_q: int, head_dim: int, sms: int, *, is_causal: bool,
                recipe: AttentionRecipe, positive_scale: bool, write_lse: bool, cfg: HopperAttentionConfig,
                group: int) -> tuple[int, tuple[int, int, int], dict[str, object], dict[str, int]]:
    """(grid, the walk (n_tiles, m_blocks, HQ), constexprs, options); `group` query heads per KV head."""
    cfg.check(head_dim, recipe, "varlen_persistent")
    walk = packed_walk(is_causal, group) if cfg.walk == 2 else cfg.walk
    m_blocks = -(-max_seqlen_q // cfg.block_m)
    n_tiles = batch * m_blocks * heads
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=is_causal,
                      POSITIVE_SCALE=positive_scale, OVERLAP=bool(cfg.overlap), NUM_WG=cfg.consumers,
                      ACC16=bool(cfg.acc16) or recipe.pv_acc_dtype == torch.float16, WRITE_LSE=write_lse,
                      CHAIN=True, ZERO_TAIL=3, WALK=walk, PAIRS=False, O_TMA=True)
    return min(n_tiles, sms), (n_tiles, m_blocks, heads), constexprs, dict(num_warps=4)


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, *, block_n: int) -> list:
    """Host TMA descriptors of the packed Q, K, V and O over their 2-D views (`packed_view`)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from xkernels.common.dtypes import smem_layout

    descs = []
    for t, rows in ((q, configs.WG_ROWS), (k, block_n), (v, block_n), (o, configs.WG_ROWS)):
        (shape, strides, _) = packed_view(t)
        block = [rows, t.shape[-1]]
        descs.append(TensorDescriptor(t, list(shape), list(strides), block,
                                      smem_layout(tuple(block), t.dtype)))
    return descs
