"""Hopper flash-attention forward over packed variable-length batches, in Gluon: the dense kernel's program
(`attention_fwd._program`: TMA producer, 2-3 consumer warpgroups, split-barrier K/V rings) run on one sequence.

A program owns BLOCK_M query rows of one (sequence, head). It reads its sequence's bounds from cu_seqlens, makes its
TMA descriptors over that sequence only (so tiles stop at the sequence end: zero fill on loads, clipped stores, no
padding computed and no neighbour's rows touched), and returns at once past the sequence end (the grid covers
max_seqlen_q). Causal is aligned bottom-right per sequence, as the portable varlen kernel: query i sees keys
j <= i + Sk - Sq, and so is a sliding window (SHIFT, BAND: `common.seqlen.Band`; the dense kernel's band, its first
tile at the block's first row's lower edge). Rows that see no key store O = 0 and LSE = -inf; a block none of
whose rows sees a key (Sk = 0, causal with Sq > Sk, a window past the keys) stores them directly, without starting
the pipeline.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from xkernels.common.seqlen import Band, kv_band_start, kv_bounds_shifted, sequence_bounds
from xkernels.hopper import configs, tma
from xkernels.hopper.attention_fwd import LOG2E, _program, constexprs
from xkernels.hopper.configs import HopperAttentionConfig
from xkernels.recipes import AttentionRecipe

WG_ROWS = gl.constexpr(configs.WG_ROWS)


@gluon.jit
def _store_empty(O, LSE, o_base, lse_base, start_m, SQ, o_st, lse_empty, HEAD_DIM: gl.constexpr,
                 NUM_WG: gl.constexpr, WRITE_LSE: gl.constexpr):
    """O = 0 and LSE = `lse_empty` (-inf, or the head's sink logit) for the block's rows inside the sequence (rows
    that see no key), 64 rows at a time."""
    td: gl.constexpr = HEAD_DIM // 8 if HEAD_DIM // 8 <= 32 else 32  # threads along a row, 16 bytes each
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // td, td], [4, 1], [1, 0])
    lse_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    for w in gl.static_range(NUM_WG):
        rows = start_m + w * WG_ROWS + gl.arange(0, WG_ROWS, gl.SliceLayout(1, layout))
        ptrs = O + o_base + gl.expand_dims(rows.to(gl.int64) * o_st, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, gl.zeros([WG_ROWS, HEAD_DIM], O.dtype.element_ty, layout), mask=gl.expand_dims(rows < SQ, 1))
        if WRITE_LSE:
            r = start_m + w * WG_ROWS + gl.arange(0, WG_ROWS, lse_layout)
            gl.store(LSE + lse_base + r, gl.full([WG_ROWS], 0.0, gl.float32, lse_layout) + lse_empty, mask=r < SQ)


@gluon.jit(do_not_specialize=["HQ", "GROUP", "MAX_SQ"])
def attention_varlen_kernel(Q, K, V, O, LSE, CU_Q, CU_K, q_st, q_sh, k_st, k_sh, v_st, v_sh, o_st, o_sh,
                            lse_sh, HQ, GROUP, MAX_SQ, qk_scale, SINKS, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr,
                            POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, NUM_WG: gl.constexpr,
                            ACC16: gl.constexpr, CONVERT_STEPS: gl.constexpr, WRITE_LSE: gl.constexpr,
                            SHIFT: gl.constexpr, BAND: gl.constexpr, HAS_SINKS: gl.constexpr,
                            SOFTCAP: gl.constexpr):
    """The portable varlen kernel's arguments (`varlen.run`): q (total_q, Hq, D), k and v (total_k, Hkv, D) by their
    (token, head) strides, LSE (Hq, total_q), SINKS (Hq,) fp32 sink logits where HAS_SINKS."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    m_blocks = gl.cdiv(MAX_SQ, BLOCK_M)
    m_block = gl.program_id(0) % m_blocks
    if CAUSAL:
        m_block = m_blocks - 1 - m_block  # longest rows first, as the dense kernel
    start_m = m_block * BLOCK_M
    bh = gl.program_id(0) // m_blocks
    b = bh // HQ
    h = (bh % HQ).to(gl.int64)
    hk = h // GROUP
    q0, SQ, k0, SKV = sequence_bounds(CU_Q, CU_K, b)
    sink = 0.0  # the head's sink logit (natural log units): where a row's softmax starts, the LSE of a keyless row
    lse_empty = float("-inf")
    if HAS_SINKS:
        sink = gl.load(SINKS + h).to(gl.float32)
        lse_empty = sink
    if start_m < SQ:
        diag = SKV - SQ + SHIFT  # bottom-right (and a window's upper side): row i's last key is i + diag
        full_hi, hi = kv_bounds_shifted(start_m, diag, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        lo = 0
        full_lo = 0
        if BAND >= 0:  # a window's lower side: tiles from the block's first row's reach, masked below full_lo
            lo, full_lo = kv_band_start(start_m, diag, BLOCK_M, BLOCK_N, BAND)
        o_base = q0 * o_st + h * o_sh
        lse_base = h * lse_sh + q0
        if hi > lo:
            q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], Q.dtype.element_ty)
            kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], K.dtype.element_ty)
            q_desc = tma.make_tensor_descriptor(Q + q0 * q_st + h * q_sh, [SQ, HEAD_DIM], [q_st, 1],
                                                [WG_ROWS, HEAD_DIM], q_layout)
            k_desc = tma.make_tensor_descriptor(K + k0 * k_st + hk * k_sh, [SKV, HEAD_DIM], [k_st, 1],
                                                [BLOCK_N, HEAD_DIM], kv_layout)
            v_desc = tma.make_tensor_descriptor(V + k0 * v_st + hk * v_sh, [SKV, HEAD_DIM], [v_st, 1],
                                                [BLOCK_N, HEAD_DIM], kv_layout)
            o_desc = tma.make_tensor_descriptor(O + o_base, [SQ, HEAD_DIM], [o_st, 1], [WG_ROWS, HEAD_DIM], q_layout)
            _program(q_desc, k_desc, v_desc, o_desc, LSE, lse_base, start_m, full_hi, hi, SQ, SKV, diag, qk_scale,
                     HEAD_DIM, BLOCK_N, STAGES, CAUSAL, CONVERT_V, POSITIVE_SCALE, OVERLAP, NUM_WG, ACC16,
                     CONVERT_STEPS, WRITE_LSE, CAUSAL or BAND >= 0, lo, full_lo, BAND, sink * LOG2E, HAS_SINKS,
                     SOFTCAP)
        else:
            _store_empty(O, LSE, o_base, lse_base, start_m, SQ, o_st, lse_empty, HEAD_DIM, NUM_WG, WRITE_LSE)


def launch_spec(batch: int, heads: int, max_seqlen_q: int, head_dim: int, *, is_causal: bool,
                recipe: AttentionRecipe, positive_scale: bool, write_lse: bool, cfg: HopperAttentionConfig,
                band: Band | None = None, sinks: bool = False,
                softcap: float = 0.0) -> tuple[int, dict[str, object], dict[str, int]]:
    """(grid, constexprs, launch options) for `attention_varlen_kernel` (V viewed as fp16 for bf16io, as the
    dense kernel); `band` a sliding window (bottom-right), `sinks` the sink logits read, `softcap` the scores' soft
    cap."""
    cfg.check(head_dim, recipe)
    grid = triton.cdiv(max_seqlen_q, cfg.block_m) * batch * heads
    return grid, constexprs(cfg, head_dim, recipe, causal=is_causal, positive_scale=positive_scale,
                            write_lse=write_lse, band=band, sinks=sinks, softcap=softcap), dict(num_warps=4)
