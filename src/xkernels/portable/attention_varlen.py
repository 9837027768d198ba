"""Portable flash-attention forward over packed variable-length batches (FlashAttention's varlen layout).

q is (total_q, Hq, D) and k, v are (total_k, Hkv, D): sequence b holds rows cu_seqlens_q[b]..cu_seqlens_q[b+1] of q
and cu_seqlens_k[b]..cu_seqlens_k[b+1] of k and v. One program owns BLOCK_M query rows of one (sequence, head); it
reads its sequence's bounds, returns at once past the sequence end (the grid covers max_seqlen_q), and runs the dense
kernel's tile walk (`attention_fwd.attend_row_block`) on that sequence only, so no padding is computed. Causal is
aligned bottom-right per sequence, as FlashAttention >= 2.1 and KV caches do: query i sees keys j <= i + Sk - Sq,
and so is a sliding window (`common.seqlen.Band`): keys i + Sk - Sq - left <= j <= i + Sk - Sq + right. Rows that
see no key (causal with Sq > Sk, a window past the keys, or Sk = 0) return O = 0 and LSE = -inf.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.common.seqlen import Band, kv_bounds_shifted, sequence_bounds
from xkernels.portable import tiles
from xkernels.portable.attention_fwd import attend_row_block
from xkernels.portable.configs import AttentionConfig
from xkernels.portable.softmax import finish, start_rows
from xkernels.portable.tiles import load_tile, store_tile
from xkernels.recipes import AttentionRecipe


@triton.jit(do_not_specialize=["HQ", "GROUP", "MAX_SQ"])
def attention_varlen_kernel(Q, K, V, O, LSE, CU_Q, CU_K, q_st, q_sh, k_st, k_sh, v_st, v_sh, o_st, o_sh,
                            lse_sh, HQ, GROUP, MAX_SQ, qk_scale, SINKS,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, PV_DTYPE: tl.constexpr, WRITE_LSE: tl.constexpr,
                            DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr, ACC_DTYPE: tl.constexpr,
                            SHIFT: tl.constexpr = 0, BAND: tl.constexpr = -1, SOFTCAP: tl.constexpr = 0.0,
                            HAS_SINKS: tl.constexpr = False):
    m_blocks = tl.cdiv(MAX_SQ, BLOCK_M)
    start_m = (tl.program_id(0) % m_blocks) * BLOCK_M
    bh = tl.program_id(0) // m_blocks
    b = bh // HQ
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP
    q0, SQ, k0, SKV = sequence_bounds(CU_Q, CU_K, b)
    if start_m < SQ:
        q_base, o_base = Q + q0 * q_st + h * q_sh, O + q0 * o_st + h * o_sh
        k_base, v_base = K + k0 * k_st + hk * k_sh, V + k0 * v_st + hk * v_sh
        if DESCRIPTORS:
            q_desc = tiles.make_tensor_descriptor(q_base, shape=[SQ, HEAD_DIM], strides=[q_st, 1],
                                                  block_shape=[BLOCK_M, HEAD_DIM])
            k_src = tiles.make_tensor_descriptor(k_base, shape=[SKV, HEAD_DIM], strides=[k_st, 1],
                                                 block_shape=[BLOCK_N, HEAD_DIM])
            v_src = tiles.make_tensor_descriptor(v_base, shape=[SKV, HEAD_DIM], strides=[v_st, 1],
                                                 block_shape=[BLOCK_N, HEAD_DIM])
            o_desc = tiles.make_tensor_descriptor(o_base, shape=[SQ, HEAD_DIM], strides=[o_st, 1],
                                                  block_shape=[BLOCK_M, HEAD_DIM])
            q = q_desc.load([start_m, 0])
        else:
            k_src, v_src = k_base, v_base
            q = load_tile(q_base, start_m, 0, SQ, HEAD_DIM, q_st, BLOCK_M, HEAD_DIM)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offset = SKV - SQ + SHIFT  # bottom-right: row i's last key is i + offset (a window's right side: + SHIFT)
        sink = 0.0
        if HAS_SINKS:  # this head's sink logit (gpt-oss), for every row
            sink = tl.full([BLOCK_M], 0.0, tl.float32) + tl.load(SINKS + h).to(tl.float32)
        m_i, l_i = start_rows(sink, BLOCK_M, HAS_SINKS)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], ACC_DTYPE)  # fp16 for the acc16 recipes
        full_hi, hi = kv_bounds_shifted(start_m, offset, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i = attend_row_block(acc, l_i, m_i, q, k_src, v_src, k_st, v_st, start_m, offset, full_hi, hi,
                                         offs_m + offset, qk_scale, SKV, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, PV_DTYPE,
                                         DESCRIPTORS, INTERPRET, True, BAND, SOFTCAP)
        o, lse = finish(acc, l_i, m_i, True)  # rows that saw no key: O = 0, LSE = -inf
        o = o.to(O.dtype.element_ty)
        if DESCRIPTORS:
            o_desc.store([start_m, 0], o)
        else:
            store_tile(o_base, start_m, 0, SQ, HEAD_DIM, o_st, o, BLOCK_M, HEAD_DIM)
        if WRITE_LSE:  # (Hq, total_q), natural log, as flash_attn's varlen softmax_lse
            tl.store(LSE + h * lse_sh + q0 + offs_m, lse, mask=offs_m < SQ)


def launch_spec(batch: int, heads: int, max_seqlen_q: int, head_dim: int, *, is_causal: bool,
                recipe: AttentionRecipe, write_lse: bool, cfg: AttentionConfig, band: Band | None = None,
                softcap: float = 0.0, sinks: bool = False) -> tuple[int, dict[str, object], dict[str, int]]:
    """(grid, constexprs, launch options) for `attention_varlen_kernel`; `band`: a sliding window; `softcap`: the
    scores' soft cap; `sinks`: sink logits read (SINKS, the last runtime argument)."""
    grid = triton.cdiv(max_seqlen_q, cfg.block_m) * batch * heads
    constexprs = cfg.constexprs(head_dim, recipe, causal=is_causal, write_lse=write_lse, band=band, softcap=softcap,
                                sinks=sinks)
    return grid, constexprs, cfg.options()
