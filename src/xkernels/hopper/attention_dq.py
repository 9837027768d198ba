"""Hopper attention backward, dQ, in Gluon: the forward's shape (a TMA producer feeding two consumer warpgroups of 64
query rows through K and V rings), with the backward's three products per key tile.

Per program: 128 query rows of one (batch, query head); dQ needs no reduction across programs (each query row is
owned by one program), so it is deterministic and has no workspace. The LSE (natural log, turned into log2 units)
and delta = rowsum(dO * O) - dLSE of the program's rows are read once. Partitions:
  - producer (1 warp): Q and dO of both warpgroups once; then per key tile: acquire a K stage, TMA K; acquire a V
    stage, TMA V (separate rings: V frees after dP, K only after dQ's product);
  - consumer warpgroup w (4 warps), per key tile j:
      issue S = Q K^T async -> issue dP = dO V^T async
      -> wait S -> P = exp2(S c - lse), masked                 <- window: dP runs on the tensor cores
      -> wait dP -> release V(j) -> dS = P (dP - delta)
      -> issue dQ += dS K -> wait -> release K(j).
Q, dO, K and V are read through 2-D descriptors over their layouts' views, as in the dK/dV kernel: rows past a head's
sequence read the next head's or batch entry's rows (or zeros at the end); keys there are masked out of P (so of
dS), and queries there get LSE = +inf (P = 0) and are never stored. Causal is top-left aligned, row blocks longest
first. Barriers: `barriers.attention_barriers` (the forward's set), listed in `barriers.py`.
VARLEN: as in the dK/dV kernel (packed descriptors, the sequence's rows and lengths, bottom-right causal); a program
past its sequence's rows loads no key and stores nothing.
Sliding windows (SHIFT, BAND: `common.seqlen.Band`): the key walk starts at the tile of the block's first row's lower
edge (`kv_band_start`) and the tiles up to `full_lo` are masked on that side, as in the forward; a block whose
window holds no key walks nothing and stores dQ = 0.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from xkernels.common.seqlen import kv_band_start, kv_bounds, kv_bounds_shifted, sequence
from xkernels.hopper import tma
from xkernels.hopper.barriers import attention_barriers
from xkernels.hopper.configs import HopperAttentionDqConfig
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.softmax import mask_scores

WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup (a wgmma's M)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _producer(q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, q_ready, k, v, q_row0, q_col, kv_row0, kv_col,
              start_m, lo, hi, BLOCK_N: gl.constexpr):
    mbarrier.expect(q_ready, 4 * q_desc.block_type.nbytes)  # Q and dO of both warpgroups
    for w in gl.static_range(2):
        tma.async_load(q_desc, [(q_row0 + start_m + w * WG_ROWS).to(gl.int32), q_col], q_ready, q_bufs.index(w))
        tma.async_load(do_desc, [(q_row0 + start_m + w * WG_ROWS).to(gl.int32), q_col], q_ready, do_bufs.index(w))
    it = 0
    for start_n in range(lo, hi, BLOCK_N):
        s = k.acquire(it)
        mbarrier.expect(k.ready.index(s), k_desc.block_type.nbytes)
        tma.async_load(k_desc, [(kv_row0 + start_n).to(gl.int32), kv_col], k.ready.index(s), k.bufs.index(s))
        s = v.acquire(it)
        mbarrier.expect(v.ready.index(s), v_desc.block_type.nbytes)
        tma.async_load(v_desc, [(kv_row0 + start_n).to(gl.int32), kv_col], v.ready.index(s), v.bufs.index(s))
        it += 1


@gluon.jit
def _consumer(W: gl.constexpr, q_bufs, do_bufs, q_ready, k, v, LSE, DELTA, DQ, dq_base, dq_ss, stats_row0, start_m,
              lo, full_lo, full_hi, hi, SQ, SKV, offset, qk_scale, scale, HEAD_DIM: gl.constexpr,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, BAND: gl.constexpr):
    s_layout: gl.constexpr = wgmma_acc(BLOCK_N)
    acc_layout: gl.constexpr = wgmma_acc(HEAD_DIM)
    op_layout: gl.constexpr = wgmma_operand(HEAD_DIM)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_bufs.dtype
    q = q_bufs.index(W)
    do = do_bufs.index(W)
    rows = start_m + W * WG_ROWS + gl.arange(0, WG_ROWS, rows_s)
    inside = rows < SQ
    # queries past SQ: LSE = +inf makes their P exactly 0 (whatever rows the flat tile holds there)
    lse = gl.load(LSE + stats_row0 + rows, mask=inside, other=float("inf")) * LOG2E
    delta = gl.load(DELTA + stats_row0 + rows, mask=inside, other=0.0)
    dq = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, acc_layout)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_ready, 0)
    it = 0
    for start_n in range(lo, hi, BLOCK_N):
        ks = k.wait(it)
        k_tile = k.bufs.index(ks)
        s_tok = warpgroup_mma(q, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # S = Q K^T
        v_tile = v.bufs.index(v.wait(it))
        dp_tok = warpgroup_mma(do, v_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)  # dP = dO V^T
        # arrive -> independent work -> wait: dP stays in flight while this warpgroup exponentiates and masks S
        s = warpgroup_mma_wait(1, deps=[s_tok])
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        masked = start_n >= full_hi
        if BAND >= 0:
            masked = masked | (start_n < full_lo)
        if masked:  # tail, diagonal or (a window's lower side) band-edge tile
            p = mask_scores(p, start_n, rows + offset, SKV, CAUSAL, cols_s, BAND, 0.0)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        v.release(it)
        ds = p * (dp - gl.expand_dims(delta, 1))
        ds_op = gl.convert_layout(ds.to(dtype), op_layout)
        dq_tok = warpgroup_mma(ds_op, k_tile, dq, is_async=True)  # dQ += dS K
        dq, _ = warpgroup_mma_wait(0, deps=[dq_tok, ds_op])  # the operand stays live until the product retires
        k.release(it)
        it += 1
    out_rows = start_m + W * WG_ROWS + gl.arange(0, WG_ROWS, gl.SliceLayout(1, acc_layout))
    d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, acc_layout))
    ptrs = DQ + dq_base + gl.expand_dims(out_rows.to(gl.int64) * dq_ss, 1) + gl.expand_dims(d, 0)
    gl.store(ptrs, (dq * scale).to(dtype), mask=gl.expand_dims(out_rows < SQ, 1))


@gluon.jit
def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, CU_Q, CU_K, dq_sb, dq_sh, dq_ss, lse_sh,
                        q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, HQ, GROUP, SQ, SKV, qk_scale, scale,
                        HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        VARLEN: gl.constexpr, SHIFT: gl.constexpr, BAND: gl.constexpr):
    BLOCK_M: gl.constexpr = 2 * WG_ROWS
    m_blocks = gl.cdiv(SQ, BLOCK_M)
    m_block = gl.program_id(0) % m_blocks
    if CAUSAL:
        m_block = m_blocks - 1 - m_block  # longest rows first, as the forward
    start_m = m_block * BLOCK_M
    bh = (gl.program_id(0) // m_blocks).to(gl.int64)
    b = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    q0, sq, k0, skv, offset = sequence(CU_Q, CU_K, b, SQ, SKV, VARLEN)
    offset = offset + SHIFT  # a window's upper side past the alignment's diagonal (`common.seqlen.Band`)
    # the views' rows and columns (`views.descriptor_view`; packed: from the sequence's first row, head h at column
    # h * D): this head's first row in Q and dO, and its kv head's in K and V
    q_row0 = q0 + b * q_rb + h * q_rh
    q_col = (h * q_ch).to(gl.int32)
    kv_row0 = k0 + b * kv_rb + hk * kv_rh
    kv_col = (hk * kv_ch).to(gl.int32)
    if VARLEN:  # LSE and delta (Hq, total_q)
        stats_row0 = h * lse_sh + q0
        # a program past its sequence's rows loads no key and stores nothing
        full_hi, hi = kv_bounds_shifted(start_m, offset, skv, BLOCK_M, BLOCK_N, CAUSAL)
        hi = gl.where(start_m < sq, hi, 0)
    else:  # LSE and delta (B, Hq, Sq)
        stats_row0 = bh * SQ
        if SHIFT > 0:
            full_hi, hi = kv_bounds_shifted(start_m, offset, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        else:
            full_hi, hi = kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    lo = 0
    full_lo = 0
    if BAND >= 0:  # a window's lower side: no key tile before the block's first row's reach; tiles to full_lo masked
        lo, full_lo = kv_band_start(start_m, offset, BLOCK_M, BLOCK_N, BAND)
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready, k, v, _ = attention_barriers(k_bufs, v_bufs, False, 2)
    dq_base = b * dq_sb + h * dq_sh + q0 * dq_ss
    gl.warp_specialize([
        (_consumer, (0, q_bufs, do_bufs, q_ready, k, v, LSE, DELTA, DQ, dq_base, dq_ss, stats_row0, start_m,
                     lo, full_lo, full_hi, hi, sq, skv, offset, qk_scale, scale, HEAD_DIM, BLOCK_N, CAUSAL, BAND)),
        (_consumer, (1, q_bufs, do_bufs, q_ready, k, v, LSE, DELTA, DQ, dq_base, dq_ss, stats_row0, start_m,
                     lo, full_lo, full_hi, hi, sq, skv, offset, qk_scale, scale, HEAD_DIM, BLOCK_N, CAUSAL, BAND)),
        (_producer, (q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, q_ready, k, v, q_row0, q_col, kv_row0, kv_col,
                     start_m, lo, hi, BLOCK_N)),
    ], [4, 1], [232, 24])


def descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                cfg: HopperAttentionDqConfig) -> list:
    """Host TMA descriptors of Q, K, V and dO over their 2-D views (`attention_bwd.view_geometry`): 64-row boxes
    for Q and dO, `cfg.block_n`-row boxes for K and V."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from xkernels.hopper.attention_bwd import view_geometry

    return [TensorDescriptor(t, *view_geometry(t, rows))
            for t, rows in ((q, 64), (k, cfg.block_n), (v, cfg.block_n), (do, 64))]


def grid(batch: int, heads: int, sq: int) -> int:
    return triton.cdiv(sq, 128) * batch * heads
