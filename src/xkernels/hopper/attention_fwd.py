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
OVERLAP=False waits for both wgmmas before the softmax (the window closed) for the ablation. PINGPONG orders the
warpgroups' wgmma issue through a ring of mbarriers (Gluon 3.6 has no named barriers), so one warpgroup's softmax runs
while the other's wgmmas own the tensor cores.

Causal is top-left aligned as in the portable kernel: fully masked tiles are never loaded, only the diagonal and tail
tiles are masked, and row blocks run longest first. O leaves through the Q buffers and a TMA store.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xkernels.hopper.pipeline import allocate_ring, consumer_release, consumer_wait, producer_acquire
from xkernels.hopper.softmax import mask_scores, softmax_step
from xkernels.portable.attention_fwd import runtime_args
from xkernels.recipes import AttentionRecipe

WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup: S and O accumulators of 64 x N fit its registers


@gluon.jit
def _kv_bounds(start_m, SKV, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """[0, full_hi) needs no mask; [full_hi, hi) holds the tail and diagonal tiles; keys >= hi are never visited.
    Causal: a tile is mask-free only if it ends at or before the block's first query, and BLOCK_M need not be a
    multiple of BLOCK_N (192-row blocks start mid-tile), so full_hi rounds start_m down to a tile boundary."""
    full_hi = (SKV // BLOCK_N) * BLOCK_N
    hi = SKV
    if CAUSAL:
        full_hi = min(full_hi, (start_m // BLOCK_N) * BLOCK_N)
        hi = min(SKV, start_m + BLOCK_M)
    return full_hi, hi


@gluon.jit
def _convert_v(v_ring, v_landed, v_full, it, STAGES: gl.constexpr, STEPS: gl.constexpr):
    """bf16io: rewrite V tile `it` in place from bf16 to fp16 (the ring is typed fp16 and TMA copied the bf16 bits),
    then hand it to the consumers. Runs in the producer warpgroup, so the consumers' registers and issue slots stay
    with the wgmma/softmax loop; its latency still adds to V's (benchmarks/NOTES.md, bf16io)."""
    s = consumer_wait(v_landed, it, STAGES)
    tile = v_ring.index(s)
    rows: gl.constexpr = tile.shape[0]
    td: gl.constexpr = tile.shape[1] // 8  # threads along a row, 8 elements (16 bytes) each
    chunk: gl.constexpr = rows // STEPS  # rows per step; fewer steps, fewer barriers (below), more registers
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // td, td], [4, 1], [1, 0])
    for r in gl.static_range(0, rows, chunk):
        part = tile.slice(r, chunk)
        part.store(part.load(layout).to(gl.bfloat16, bitcast=True).to(gl.float16))
    fence_async_shared()  # generic-proxy stores -> visible to the consumers' wgmma (async proxy)
    mbarrier.arrive(v_full.index(s))


@gluon.jit
def _producer(loads, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONVERT_V: gl.constexpr, NUM_WG: gl.constexpr,
              CONVERT_STEPS: gl.constexpr):
    """TMA loads (one warp, or with CONVERT_V a warpgroup that also converts V tile j-1 after issuing K tile j)."""
    (q_desc, k_desc, v_desc, q_bufs, k_ring, v_ring, q_ready, k_full, k_empty, v_landed, v_full, v_empty, start_m,
     hi) = loads
    mbarrier.expect(q_ready, NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(q_desc, [start_m + w * WG_ROWS, 0], q_ready, q_bufs.index(w))
    it = 0
    for start_n in range(0, hi, BLOCK_N):
        s = producer_acquire(k_empty, it, STAGES)
        mbarrier.expect(k_full.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [start_n, 0], k_full.index(s), k_ring.index(s))
        if CONVERT_V:
            if it > 0:
                # V(it-1) was issued a tile ago: converting it before waiting for V(it)'s stage starts it as early as
                # the ring allows (the consumers need it right after issuing QK^T(it))
                _convert_v(v_ring, v_landed, v_full, it - 1, STAGES, CONVERT_STEPS)
        s = producer_acquire(v_empty, it, STAGES)
        mbarrier.expect(v_landed.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [start_n, 0], v_landed.index(s), v_ring.index(s))
        it += 1
    if CONVERT_V:
        _convert_v(v_ring, v_landed, v_full, it - 1, STAGES, CONVERT_STEPS)


@gluon.jit
def _scores(qk, start_n, full_hi, offs_m, SKV, qk_scale, CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr,
            cols_layout: gl.constexpr):
    if not POSITIVE_SCALE:
        qk = qk * qk_scale  # the softmax's max-then-scale identity needs a scale > 0: scale first, then mask
    if start_n >= full_hi:  # tail or diagonal tile
        qk = mask_scores(qk, start_n, offs_m, SKV, CAUSAL, cols_layout)
    return qk


@gluon.jit
def _take_turn(turn, slot, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the previous warpgroup in the ring has issued its wgmmas of this slot (warpgroup 0: the
    last one's of the previous slot; its first wait passes at once)."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (slot & 1) ^ (1 if WG == 0 else 0))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index((WG + 1) % NUM_WG))


@gluon.jit
def _consumer(WG: gl.constexpr, shared, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
              NUM_WG: gl.constexpr, FMA_EXP: gl.constexpr, ACC16: gl.constexpr, WRITE_LSE: gl.constexpr):
    """One warpgroup's 64 query rows against every key tile: the pipelined loop of the module docstring. `shared`
    holds the runtime arguments common to all consumers (a tuple: Gluon 3.6 keeps constexprs only when passed alone)."""
    (o_desc, q_bufs, k_ring, v_ring, q_ready, k_full, k_empty, v_full, v_empty, turn, LSE, lse_row0, start_m, full_hi,
     hi, SQ, SKV, qk_scale) = shared
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    pv_dtype: gl.constexpr = v_ring.dtype  # bf16io: fp16, converted in place by the producer
    acc_dtype: gl.constexpr = gl.float16 if ACC16 else gl.float32  # ACC16: the seeds' fp16 P.V accumulator
    step_scale = qk_scale if POSITIVE_SCALE else 1.0
    q = q_bufs.index(WG)
    row0 = start_m + WG * WG_ROWS
    offs_m = row0 + gl.arange(0, WG_ROWS, rows_s)
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)

    # tile 0: scores and softmax only; its P.V is issued together with tile 1's QK^T
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([WG_ROWS], gl.float32, rows_s)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
    mbarrier.wait(q_ready, 0)
    _take_turn(turn, 0, WG, PINGPONG)
    s = consumer_wait(k_full, 0, STAGES)
    qk = warpgroup_mma(q, k_ring.index(s).permute((1, 0)), zero_s, use_acc=False)
    _pass_turn(turn, WG, NUM_WG, PINGPONG)
    consumer_release(k_empty, 0, STAGES)
    qk = _scores(qk, 0, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
    p, m_i, l_i, alpha = softmax_step(qk, m_i, l_i, step_scale, FMA_EXP)
    p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
    it = 1
    for start_n in range(BLOCK_N, hi, BLOCK_N):
        _take_turn(turn, it, WG, PINGPONG)
        s = consumer_wait(k_full, it, STAGES)
        qk_tok = warpgroup_mma(q, k_ring.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        v = v_ring.index(consumer_wait(v_full, it - 1, STAGES))
        acc_tok = warpgroup_mma(p_op, v, acc, is_async=True)
        _pass_turn(turn, WG, NUM_WG, PINGPONG)
        # arrive -> independent work -> wait: P.V(it-1) stays in flight while this warpgroup masks and exponentiates
        # tile it; with OVERLAP off, both wgmmas retire first (the window closed)
        qk = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[qk_tok])
        consumer_release(k_empty, it, STAGES)
        qk = _scores(qk, start_n, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
        p, m_new, l_i, alpha = softmax_step(qk, m_i, l_i, step_scale, FMA_EXP)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc_tok, p_op])
        consumer_release(v_empty, it - 1, STAGES)
        # deferred rescale: P.V(it-1) has landed
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1).to(acc_dtype)
        p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
        m_i = m_new
        it += 1
    _take_turn(turn, it, WG, PINGPONG)
    v = v_ring.index(consumer_wait(v_full, it - 1, STAGES))
    acc = warpgroup_mma(p_op, v, acc)
    _pass_turn(turn, WG, NUM_WG, PINGPONG)
    consumer_release(v_empty, it - 1, STAGES)

    out = acc.to(gl.float32) / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q.store(out.to(q.dtype))  # this warpgroup's Q buffer is free: every wgmma reading it has retired
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0, 0], q)
    if WRITE_LSE:
        gl.store(LSE + lse_row0 + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_m < SQ)
    tma.store_wait(0)


@gluon.jit
def attention_fwd_kernel(Q, K, V, O, LSE, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss,
                         HQ, GROUP, SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr,
                         POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                         NUM_WG: gl.constexpr, FMA_EXP: gl.constexpr, ACC16: gl.constexpr, CONVERT_STEPS: gl.constexpr,
                         WRITE_LSE: gl.constexpr):
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

    q_bufs = gl.allocate_shared_memory(Q.dtype.element_ty, [NUM_WG, WG_ROWS, HEAD_DIM], q_layout)
    k_ring = gl.allocate_shared_memory(K.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_ring = gl.allocate_shared_memory(V.dtype.element_ty, [STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    k_full, k_empty = allocate_ring(STAGES, NUM_WG)
    v_landed, v_empty = allocate_ring(STAGES, NUM_WG)
    v_full = v_landed
    if CONVERT_V:  # TMA lands on v_landed, the producer's conversion arrives on v_full
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(v_full.index(s), count=1)
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(NUM_WG):
        mbarrier.init(turn.index(w), count=1)
    full_hi, hi = _kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    shared = (o_desc, q_bufs, k_ring, v_ring, q_ready, k_full, k_empty, v_full, v_empty, turn, LSE, bh * SQ, start_m,
              full_hi, hi, SQ, SKV, qk_scale)
    loads = (q_desc, k_desc, v_desc, q_bufs, k_ring, v_ring, q_ready, k_full, k_empty, v_landed, v_full, v_empty,
             start_m, hi)
    # registers per thread of the worker consumers and of the producer (1 warp, or a warpgroup converting V); the
    # default partition (consumer 0) gets what is left of the register file
    regs: gl.constexpr = 160 if NUM_WG == 3 else (232 if CONVERT_V else 240)
    producer_warps: gl.constexpr = 4 if CONVERT_V else 1
    # a converting producer holds 1/CONVERT_STEPS of a V tile in registers (D128, 2 steps: 32 registers of data;
    # consumer 0 gives up the difference, which is why HopperAttentionConfig.check refuses 2 steps at D256)
    convert_regs: gl.constexpr = 72 if CONVERT_STEPS <= 2 else 40
    producer_regs: gl.constexpr = (32 if NUM_WG == 3 else convert_regs) if CONVERT_V else 24
    if NUM_WG == 2:
        gl.warp_specialize([
            (_consumer, (0, shared, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, POSITIVE_SCALE, OVERLAP, PINGPONG, NUM_WG,
                         FMA_EXP, ACC16, WRITE_LSE)),
            (_consumer, (1, shared, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, POSITIVE_SCALE, OVERLAP, PINGPONG, NUM_WG,
                         FMA_EXP, ACC16, WRITE_LSE)),
            (_producer, (loads, BLOCK_N, STAGES, CONVERT_V, NUM_WG, CONVERT_STEPS))], [4, producer_warps],
            [regs, producer_regs])
    else:
        gl.static_assert(NUM_WG == 3, "2 or 3 consumer warpgroups")
        gl.warp_specialize([
            (_consumer, (0, shared, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, POSITIVE_SCALE, OVERLAP, PINGPONG, NUM_WG,
                         FMA_EXP, ACC16, WRITE_LSE)),
            (_consumer, (1, shared, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, POSITIVE_SCALE, OVERLAP, PINGPONG, NUM_WG,
                         FMA_EXP, ACC16, WRITE_LSE)),
            (_consumer, (2, shared, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, POSITIVE_SCALE, OVERLAP, PINGPONG, NUM_WG,
                         FMA_EXP, ACC16, WRITE_LSE)),
            (_producer, (loads, BLOCK_N, STAGES, CONVERT_V, NUM_WG, CONVERT_STEPS))], [4, 4, producer_warps],
            [regs, regs, producer_regs])


@dataclass(frozen=True)
class HopperAttentionConfig:
    block_n: int
    stages: int
    overlap: int = 1  # the split-barrier window: softmax of tile j while P.V of tile j-1 runs
    pingpong: int = 0  # order the consumer warpgroups' wgmma issue through mbarriers
    consumers: int = 2  # consumer warpgroups of 64 query rows each (3: 192-row tiles, D64 only: registers)
    fma_exp: int = 0  # 1 in fma_exp exponentials (2 or 4) on the FMA pipe instead of MUFU (softmax.exp2_mixed)
    acc16: int = 0  # the seeds' fp16 P.V accumulator (fp16 P.V recipes only): half the O registers
    convert_steps: int = 8  # bf16io only (other recipes ignore it): V conversion steps, each load, barrier, store

    def check(self, head_dim: int, recipe: AttentionRecipe) -> None:
        """ValueError naming the field for a config this kernel cannot run (compile error, spills, or a recipe the
        switch does not apply to); the shipped CONFIGS pass, and `xkernels inspect` compiles them."""
        if self.consumers not in (2, 3) or (self.consumers == 3 and head_dim != 64):
            raise ValueError(f"config: consumers={self.consumers} needs 2, or 3 with head dim 64 (registers)")
        if self.fma_exp not in (0, 2, 4):
            raise ValueError(f"config: fma_exp={self.fma_exp} must be 0, 2 or 4")
        if self.acc16 and recipe.pv_dtype != torch.float16:
            raise ValueError(f"config: acc16 needs fp16 P.V (recipe {recipe.name} multiplies P.V in bf16)")
        if self.convert_steps not in (2, 4, 8):
            raise ValueError(f"config: convert_steps={self.convert_steps} must be 2, 4 or 8")
        if recipe.converts_v and self.block_n // self.convert_steps < 8:
            raise ValueError(f"config: convert_steps={self.convert_steps} with block_n={self.block_n} gives steps of "
                             "fewer than 8 rows, which cut the shared-memory swizzle pattern")
        if recipe.converts_v and self.convert_steps == 2 and head_dim == 256:
            raise ValueError("config: convert_steps=2 at head dim 256 spills registers (the producer's gain is "
                             "consumer 0's loss)")

    @property
    def block_m(self) -> int:
        return self.consumers * WG_ROWS.value

    def constexprs(self, head_dim: int, recipe: AttentionRecipe, *, causal: bool, positive_scale: bool,
                   write_lse: bool) -> dict[str, object]:
        """The kernel's compile-time arguments for this config: one mapping for the launch and for `inspect`."""
        return dict(HEAD_DIM=head_dim, BLOCK_N=self.block_n, STAGES=self.stages, CAUSAL=causal,
                    CONVERT_V=recipe.converts_v, POSITIVE_SCALE=positive_scale, OVERLAP=bool(self.overlap),
                    PINGPONG=bool(self.pingpong), NUM_WG=self.consumers, FMA_EXP=self.fma_exp, ACC16=bool(self.acc16),
                    CONVERT_STEPS=self.convert_steps, WRITE_LSE=write_lse)

    def __str__(self) -> str:
        return (f"BM{self.block_m}-BN{self.block_n}-S{self.stages}" + "-ov" * self.overlap + "-pp" * self.pingpong
                + (f"-fx{self.fma_exp}" if self.fma_exp else "") + "-acc16" * self.acc16
                + (f"-cs{self.convert_steps}" if self.convert_steps != 8 else ""))


# per head dim: the largest ring that fits shared memory. D64: three consumer warpgroups (192-row tiles) measured
# 0.94x cuDNN against 0.85x with two, and the window 3 % slower (runs 8, 14); fma_exp lost everywhere (run 14).
# bf16io at D256: 4 conversion steps per V tile, 499 -> 555 TFLOP/s; at D128 steps made no difference (run 19)
CONFIGS = {64: HopperAttentionConfig(128, 3, overlap=0, consumers=3, convert_steps=4),
           128: HopperAttentionConfig(128, 2), 256: HopperAttentionConfig(64, 2, convert_steps=4)}


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
                  *, is_causal: bool, scale: float, recipe: AttentionRecipe, cfg: HopperAttentionConfig) -> None:
    """Same contract as `portable.attention_fwd.attention_fwd`, with the tile config chosen by the dispatcher."""
    bsz, hq, sq, d = q.shape
    cfg.check(d, recipe)
    grid = (triton.cdiv(sq, cfg.block_m) * bsz * hq,)
    if recipe.converts_v:
        v = v.view(torch.float16)  # the bf16 bits, converted in shared memory by the producer warpgroup
    attention_fwd_kernel[grid](
        *runtime_args(q, k, v, out, lse, scale), num_warps=4,
        **cfg.constexprs(d, recipe, causal=is_causal, positive_scale=scale > 0, write_lse=lse is not None))
