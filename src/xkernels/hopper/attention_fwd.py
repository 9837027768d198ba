"""Hopper flash-attention forward in Gluon: a TMA producer warp feeding two consumer warpgroups through K/V rings.

STATUS: compiled for sm_90 and spill-free (`xkernels inspect`), NOT yet run on a GPU. It is reachable only when the
hopper layer is forced (`XKERNELS_LAYER=hopper` or `dispatch.use_layer("hopper")`); `tests/gpu` runs it against the
float64 reference, and the default dispatch keeps the portable kernel until a device run has validated and timed it.

Per program: BLOCK_M query rows of one (batch, head), the 128 rows split 64/64 over two consumer warpgroups.
  - loader (1 warp): Q once, then for each K/V tile: acquire a ring stage, TMA K onto `k_full`, V onto `v_full`
    (separate barriers, so QK^T starts before V has landed);
  - consumers: wait K -> wgmma S = Q K^T -> online softmax in exp2 with the scale folded in -> wait V ->
    wgmma O += P V with P from registers -> release the stage.
Split-barrier windows: K and V of later tiles stream in while a tile's softmax runs (ring of STAGES); V's wait comes
after the softmax, so V's copy hides behind QK^T and the softmax. The O tile leaves through Q's shared buffer and a TMA
store. Causal is top-left aligned as in the portable kernel: fully masked tiles are never loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from xkernels.hopper.pipeline import allocate_ring, consumer_release, consumer_wait, producer_acquire
from xkernels.portable.attention_fwd import runtime_args
from xkernels.recipes import AttentionRecipe


@gluon.jit
def _kv_bounds(start_m, SKV, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """[0, full_hi) needs no mask; [full_hi, hi) holds the tail and diagonal tiles; keys >= hi are never visited."""
    full_hi = (SKV // BLOCK_N) * BLOCK_N
    hi = SKV
    if CAUSAL:
        full_hi = min(full_hi, start_m)
        hi = min(SKV, start_m + BLOCK_M)
    return full_hi, hi


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready, k_full, v_full, kv_empty, start_m, hi,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [start_m, 0], q_ready, q_smem)
    it = 0
    for start_n in range(0, hi, BLOCK_N):
        s = producer_acquire(kv_empty, it, STAGES)
        mbarrier.expect(k_full.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [start_n, 0], k_full.index(s), k_ring.index(s))
        mbarrier.expect(v_full.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [start_n, 0], v_full.index(s), v_ring.index(s))
        it += 1


@gluon.jit
def _consumers(o_desc, q_smem, k_ring, v_ring, v16_smem, q_ready, k_full, v_full, kv_empty, LSE, lse_row0, start_m,
               full_hi, hi, SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr, WRITE_LSE: gl.constexpr,
               num_warps: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    pv_dtype: gl.constexpr = v16_smem.dtype if CONVERT_V else v_ring.dtype

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    offs_m = start_m + gl.arange(0, BLOCK_M, rows_s)
    mbarrier.wait(q_ready, 0)
    it = 0
    for start_n in range(0, hi, BLOCK_N):
        s = consumer_wait(k_full, it, STAGES)
        qk = warpgroup_mma(q_smem, k_ring.index(s).permute((1, 0)),
                           gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)) * qk_scale
        if start_n >= full_hi:  # tail or diagonal tile
            keys = start_n + gl.arange(0, BLOCK_N, cols_s)
            keep = gl.expand_dims(keys, 0) < SKV
            if CAUSAL:
                keep = keep & (gl.expand_dims(keys, 0) <= gl.expand_dims(offs_m, 1))
            qk = gl.where(keep, qk, float("-inf"))
        # every row sees key 0 in the first tile, so m_new is finite and alpha never NaN
        m_new = gl.maximum(m_i, gl.max(qk, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(qk - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
        # V's copy has been in flight since the loader issued it, hidden behind QK^T and the softmax above
        mbarrier.wait(v_full.index(s), (it // STAGES) & 1)
        if CONVERT_V:
            # bf16io: V bf16 -> fp16 through registers into a staging buffer the tensor cores can read
            v16_smem.store(v_ring.index(s).load(gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0]))
                           .to(pv_dtype))
            fence_async_shared()
            acc = warpgroup_mma(p_op, v16_smem, acc)
        else:
            acc = warpgroup_mma(p_op, v_ring.index(s), acc)
        consumer_release(kv_empty, it, STAGES)
        m_i = m_new
        it += 1

    out = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q_smem.store(out.to(q_smem.dtype))  # Q's buffer is free: every QK^T wgmma above completed synchronously
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [start_m, 0], q_smem)
    if WRITE_LSE:
        gl.store(LSE + lse_row0 + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_m < SQ)
    tma.store_wait(0)


@gluon.jit
def attention_fwd_kernel(Q, K, V, O, LSE, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
                         HQ, GROUP, SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr,
                         WRITE_LSE: gl.constexpr, num_warps: gl.constexpr):
    m_blocks = gl.cdiv(SQ, BLOCK_M)  # one grid axis, row blocks of a head adjacent (see the portable kernel)
    start_m = (gl.program_id(0) % m_blocks) * BLOCK_M
    bh = (gl.program_id(0) // m_blocks).to(gl.int64)
    b = bh // HQ
    h = bh % HQ
    hk = h // GROUP
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], Q.dtype.element_ty)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], K.dtype.element_ty)
    # per-(batch, head) descriptors: TMA bounds stop tiles at this head's sequence end (zero fill, clipped stores)
    q_desc = tma.make_tensor_descriptor(Q + b * q_sb + h * q_sh, [SQ, HEAD_DIM], [q_ss, 1], [BLOCK_M, HEAD_DIM],
                                        q_layout)
    k_desc = tma.make_tensor_descriptor(K + b * k_sb + hk * k_sh, [SKV, HEAD_DIM], [k_ss, 1], [BLOCK_N, HEAD_DIM],
                                        kv_layout)
    v_desc = tma.make_tensor_descriptor(V + b * v_sb + hk * v_sh, [SKV, HEAD_DIM], [v_ss, 1], [BLOCK_N, HEAD_DIM],
                                        kv_layout)
    o_desc = tma.make_tensor_descriptor(O + b * o_sb + h * o_sh, [SQ, HEAD_DIM], [o_ss, 1], [BLOCK_M, HEAD_DIM],
                                        q_layout)

    q_smem = gl.allocate_shared_memory(Q.dtype.element_ty, [BLOCK_M, HEAD_DIM], q_layout)
    k_ring = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_ring = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float16)
    v16_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N if CONVERT_V else 16, HEAD_DIM], v16_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    k_full, kv_empty = allocate_ring(STAGES)
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(v_full.index(s), count=1)
    full_hi, hi = _kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    gl.warp_specialize([
        (_consumers, (o_desc, q_smem, k_ring, v_ring, v16_smem, q_ready, k_full, v_full, kv_empty, LSE, bh * SQ,
                      start_m, full_hi, hi, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, CONVERT_V,
                      WRITE_LSE, num_warps)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready, k_full, v_full, kv_empty, start_m, hi,
                   BLOCK_N, STAGES)),
    ], [1], [24])


@dataclass(frozen=True)
class HopperAttentionConfig:
    block_m: int
    block_n: int
    stages: int
    num_warps: int = 8  # two consumer warpgroups, 64 query rows each

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-S{self.stages}-W{self.num_warps}"


CONFIGS = {64: HopperAttentionConfig(128, 128, 3), 128: HopperAttentionConfig(128, 128, 2),
           256: HopperAttentionConfig(128, 64, 2)}


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
                  *, is_causal: bool, scale: float, recipe: AttentionRecipe, cfg: HopperAttentionConfig) -> None:
    """Same contract as `portable.attention_fwd.attention_fwd`, with the tile config chosen by the dispatcher."""
    bsz, hq, sq, d = q.shape
    grid = (triton.cdiv(sq, cfg.block_m) * bsz * hq,)
    attention_fwd_kernel[grid](
        *runtime_args(q, k, v, out, lse, scale), HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        STAGES=cfg.stages, CAUSAL=is_causal, CONVERT_V=recipe.converts_v, WRITE_LSE=lse is not None,
        num_warps=cfg.num_warps)
