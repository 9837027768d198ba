"""Portable flash-attention forward: online softmax in exp2 with the scale folded in, read top to bottom.

One program owns BLOCK_M query rows of one (batch, head) and streams K/V tiles of BLOCK_N keys through an online
softmax. Tiles that need no mask (inside the sequence and, when causal, wholly below the diagonal) run a loop without
masking; the diagonal and tail tiles run a masked loop; tiles wholly above the diagonal are never visited. GQA maps
query head h to kv head h // (Hq / Hkv): no K/V copies. Causal is top-left aligned, as in
F.scaled_dot_product_attention(is_causal=True): query i sees keys j <= i, whatever Sq and Skv are. A sliding window
(`common.seqlen.Band`) is aligned the same way: query i sees keys i - left <= j <= i + right; the tiles below the
window of the block's first row are never visited, and those the lower side cuts for some row run masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.common.seqlen import Band, kv_band_start, kv_bounds_shifted
from xkernels.portable import tiles
from xkernels.portable.configs import AttentionConfig
from xkernels.portable.dot import mma
from xkernels.portable.softmax import finish, online_step, scores, start_rows
from xkernels.portable.tiles import load_tile, store_tile
from xkernels.recipes import AttentionRecipe


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, lo, hi, offs_m, qk_scale, SKV,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                  PV_DTYPE: tl.constexpr, DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr,
                  EMPTY_ROWS: tl.constexpr, BAND: tl.constexpr = -1, gap_at=0, gap=0, SOFTCAP: tl.constexpr = 0.0):
    """Fold K/V tiles [lo, hi) into the running (acc, row sum l_i, row max m_i), all in base-2 units. K and V come
    from descriptors (`k_src`, `v_src`), or without them from those base pointers and row strides. Causal keeps key
    j for row i when j <= offs_m[i] (callers shift offs_m for other alignments and windows), a lower band side
    (BAND >= 0) when j >= offs_m[i] - BAND; with a band, tiles from `gap_at` on are taken `gap` keys further on
    (one loop over the band's two masked stretches, around the unmasked tiles between them: one loop fewer keeps
    the registers of a D256 tile on sm_80 within the file). EMPTY_ROWS: some rows may see no key at all
    (`softmax.online_step`); SOFTCAP: the scores' soft cap (`softmax.scores`)."""
    offs_n = tl.arange(0, BLOCK_N)
    for tile in tl.range(lo, hi, BLOCK_N):
        start_n = tile
        if BAND >= 0:
            start_n = tile + tl.where(tile >= gap_at, gap, 0)
        if DESCRIPTORS:
            k = k_src.load([start_n, 0])
        else:
            k = load_tile(k_src, start_n, 0, SKV, HEAD_DIM, k_ss, BLOCK_N, HEAD_DIM)
        s = scores(mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32), INTERPRET), qk_scale, SOFTCAP)
        if MASKED:
            keys = start_n + offs_n
            keep = keys[None, :] < SKV
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None])
            if BAND >= 0:
                keep = keep & (keys[None, :] >= offs_m[:, None] - BAND)
            s = tl.where(keep, s, float("-inf"))
        p, m_i, l_i, acc = online_step(s, m_i, l_i, acc, EMPTY_ROWS)
        # recipe: P rounded to PV_DTYPE; V converted in-kernel when its storage dtype differs (bf16io)
        if DESCRIPTORS:
            v = v_src.load([start_n, 0]).to(PV_DTYPE)
        else:
            v = load_tile(v_src, start_n, 0, SKV, HEAD_DIM, v_ss, BLOCK_N, HEAD_DIM).to(PV_DTYPE)
        acc = mma(p.to(PV_DTYPE), v, acc, INTERPRET)
    return acc, l_i, m_i


@triton.jit
def _band(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, start_m, offset, full_hi, hi, offs_m, qk_scale, SKV,
          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
          PV_DTYPE: tl.constexpr, DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr, BAND: tl.constexpr,
          SOFTCAP: tl.constexpr):
    """The key tiles of a row block from `start_m` under a band (`common.seqlen.Band`; the diagonal at `offset`,
    SHIFT included; `offs_m` the rows shifted so): tiles [lo, mid) that the lower side cuts for some row and
    [top, hi) past `full_hi` (the upper side, the tail) run masked in one loop, the tiles [mid, top) between them
    unmasked; keys below lo are never visited. Rows may see no key."""
    lo, full_lo = kv_band_start(start_m, offset, BLOCK_M, BLOCK_N, BAND)
    mid = max(lo, min(full_lo, full_hi))
    top = max(mid, full_hi)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, mid, top, offs_m, qk_scale, SKV,
                                  HEAD_DIM, BLOCK_N, CAUSAL, False, PV_DTYPE, DESCRIPTORS, INTERPRET, False,
                                  SOFTCAP=SOFTCAP)
    return _attend_tiles(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, lo, hi - (top - mid), offs_m, qk_scale, SKV,
                         HEAD_DIM, BLOCK_N, CAUSAL, True, PV_DTYPE, DESCRIPTORS, INTERPRET, True, BAND, mid,
                         top - mid, SOFTCAP)


@triton.jit
def attend_row_block(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, start_m, offset, full_hi, hi, offs_m, qk_scale, SKV,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                     PV_DTYPE: tl.constexpr, DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr,
                     EMPTY_ROWS: tl.constexpr, BAND: tl.constexpr, SOFTCAP: tl.constexpr):
    """Every key tile of the row block from `start_m` (the diagonal at `offset`, a window's SHIFT included; `offs_m`
    the rows shifted so), for the dense and the varlen kernel: [0, full_hi) unmasked and [full_hi, hi) masked, or
    with a window's lower side (BAND >= 0) `_band`'s walk. EMPTY_ROWS: rows may see no key (the masked tiles')."""
    if BAND >= 0:
        acc, l_i, m_i = _band(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, start_m, offset, full_hi, hi, offs_m,
                              qk_scale, SKV, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, PV_DTYPE, DESCRIPTORS, INTERPRET,
                              BAND, SOFTCAP)
    else:
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, 0, full_hi, offs_m, qk_scale, SKV,
                                      HEAD_DIM, BLOCK_N, CAUSAL, False, PV_DTYPE, DESCRIPTORS, INTERPRET, False,
                                      SOFTCAP=SOFTCAP)
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, full_hi, hi, offs_m, qk_scale, SKV,
                                      HEAD_DIM, BLOCK_N, CAUSAL, True, PV_DTYPE, DESCRIPTORS, INTERPRET, EMPTY_ROWS,
                                      SOFTCAP=SOFTCAP)
    return acc, l_i, m_i


# SQ and SKV are specialized (divisible by 16 or not), as M, N, K in the GEMM: vector loads where TMA is absent
@triton.jit(do_not_specialize=["HQ", "GROUP"])
def attention_fwd_kernel(Q, K, V, O, LSE,
                         q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
                         HQ, GROUP, SQ, SKV, qk_scale, SINKS,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, PV_DTYPE: tl.constexpr, WRITE_LSE: tl.constexpr,
                         DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr, ACC_DTYPE: tl.constexpr,
                         SHIFT: tl.constexpr = 0, BAND: tl.constexpr = -1, SOFTCAP: tl.constexpr = 0.0,
                         HAS_SINKS: tl.constexpr = False):
    # one grid axis (CUDA caps the others at 65535): row blocks of one (batch, head) are neighbours, sharing K/V in L2
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    start_m = (tl.program_id(0) % m_blocks) * BLOCK_M
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)  # int64: batch/head offsets can pass 2^31 elements
    b = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    q_base, k_base = Q + b * q_sb + h * q_sh, K + b * k_sb + hk * k_sh
    v_base, o_base = V + b * v_sb + hk * v_sh, O + b * o_sb + h * o_sh
    if DESCRIPTORS:
        q_desc = tiles.make_tensor_descriptor(q_base, shape=[SQ, HEAD_DIM], strides=[q_ss, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        k_src = tiles.make_tensor_descriptor(k_base, shape=[SKV, HEAD_DIM], strides=[k_ss, 1],
                                          block_shape=[BLOCK_N, HEAD_DIM])
        v_src = tiles.make_tensor_descriptor(v_base, shape=[SKV, HEAD_DIM], strides=[v_ss, 1],
                                          block_shape=[BLOCK_N, HEAD_DIM])
        o_desc = tiles.make_tensor_descriptor(o_base, shape=[SQ, HEAD_DIM], strides=[o_ss, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])
        q = q_desc.load([start_m, 0])  # rows past SQ read as zeros; their results are clipped at the store
    else:
        k_src, v_src = k_base, v_base
        q = load_tile(q_base, start_m, 0, SQ, HEAD_DIM, q_ss, BLOCK_M, HEAD_DIM)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    sink = 0.0
    if HAS_SINKS:  # this head's sink logit (gpt-oss), for every row
        sink = tl.full([BLOCK_M], 0.0, tl.float32) + tl.load(SINKS + h).to(tl.float32)
    m_i, l_i = start_rows(sink, BLOCK_M, HAS_SINKS)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], ACC_DTYPE)  # fp16 for the acc16 recipes

    # [0, full_hi): whole tiles inside Skv and (causal) wholly at or below the diagonal of this row block
    # [full_hi, hi): the tail tile and the diagonal tiles, masked; keys >= hi are never visited
    full_hi, hi = kv_bounds_shifted(start_m, SHIFT, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    # (a window's right side shifts the diagonal by SHIFT; its left side walks `_band`: rows may see no key)
    acc, l_i, m_i = attend_row_block(acc, l_i, m_i, q, k_src, v_src, k_ss, v_ss, start_m, SHIFT, full_hi, hi,
                                     offs_m + SHIFT, qk_scale, SKV, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, PV_DTYPE,
                                     DESCRIPTORS, INTERPRET, False, BAND, SOFTCAP)

    o, lse = finish(acc, l_i, m_i, BAND >= 0 or HAS_SINKS)
    o = o.to(O.dtype.element_ty)
    if DESCRIPTORS:
        o_desc.store([start_m, 0], o)
    else:
        store_tile(o_base, start_m, 0, SQ, HEAD_DIM, o_ss, o, BLOCK_M, HEAD_DIM)
    if WRITE_LSE:
        tl.store(LSE + bh * SQ + offs_m, lse, mask=offs_m < SQ)


def launch_spec(batch: int, heads: int, sq: int, head_dim: int, *, is_causal: bool, recipe: AttentionRecipe,
                write_lse: bool, cfg: AttentionConfig, band: Band | None = None, softcap: float = 0.0,
                sinks: bool = False) -> tuple[int, dict[str, object], dict[str, int]]:
    """(grid, constexprs, launch options) for `attention_fwd_kernel` with the config `select` chose; its runtime
    arguments are `plans.attention_args` (shared with the Hopper kernel). `band`: a sliding window (its `causal`
    replaces `is_causal`); `softcap`: the scores' soft cap; `sinks`: the kernel reads sink logits (SINKS, its last
    runtime argument, which the plans append)."""
    grid = triton.cdiv(sq, cfg.block_m) * batch * heads
    return grid, cfg.constexprs(head_dim, recipe, causal=is_causal, write_lse=write_lse, band=band,
                                softcap=softcap, sinks=sinks), cfg.options()
