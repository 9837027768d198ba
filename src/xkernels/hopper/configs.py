"""Tile configs of the Hopper kernels and the checks that refuse configs a kernel cannot run.

`constexprs` maps a config to the kernel's compile-time arguments: the launch and `xkernels inspect` both read it, so
no constexpr is spelled twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from xkernels.common.seqlen import Band, band_constexprs
from xkernels.recipes import AttentionRecipe

SHARED_BYTES = 232448  # an sm_90 CTA's dynamic shared memory (227 KB)
WG_ROWS = 64  # query rows per attention consumer warpgroup: S and O accumulators of 64 x N fit its registers
L2_BUDGET_KIB = 32 << 10  # K/V of the heads the persistent walk runs together: about two thirds of an H100/H200 L2
# Full (non-causal) MHA at D128 walks fewer heads together: every CTA streams its heads' whole K/V, and with 32 MiB
# in flight the L2 hit rate fell to 59 % (cuDNN's: 74 %) and the SM clock with the DRAM traffic
# (benchmarks/results/h200/2026-12-01/07-ncu-persistent). 8 MiB measured 5-9 % ahead of 32 on the 1K-4K rows in run
# 09 (where it ran second, after 32), within noise in runs 10 and 15 (the A/B's noise reaches 10 %): a small gain
# at best, with the profile's reason; causal, GQA and D64 rows lost 2-13 % with it in run 09 and keep 32 MiB.
FULL_MHA_L2_BUDGET_KIB = 8 << 10


def l2_budget_kib(head_dim: int, *, causal: bool, group: int) -> int:
    """The persistent walk's K/V budget (KiB) for a call whose config leaves `l2_budget_kib` at 0 (the default)."""
    return FULL_MHA_L2_BUDGET_KIB if head_dim == 128 and not causal and group == 1 else L2_BUDGET_KIB


@dataclass(frozen=True)
class HopperAttentionConfig:
    block_n: int
    stages: int
    overlap: int = 1  # the split-barrier window: softmax of tile j while P.V of tile j-1 runs
    consumers: int = 2  # consumer warpgroups of 64 query rows each (3: 192-row tiles, D64 only: registers)
    acc16: int = 0  # fp16 P.V accumulator on an fp32-accumulator recipe: an ablation (the acc16 recipes set it)
    convert_steps: int = 8  # bf16io only (other recipes ignore it): V conversion steps, each load, barrier, store
    persistent: int = 0  # one CTA per SM walking tiles (`attention_persistent.py`): 1 where measured faster, 2 always
    chained: int = 0  # the next tile's first QK^T issued with this tile's last P.V (two Q slots; the dense kernel,
    # with one tile per CTA, ignores it, as recipes other than bf16io ignore convert_steps)
    l2_budget_kib: int = 0  # L2-chunk walk: K/V KiB of the heads walked together; 0: `l2_budget_kib()`; set, it
    # implies that walk (walk=2 resolves to 0)
    # the persistent kernel's O path (`epilogue.store_tile`): 0, O buffers and TMA stores; 1, from the
    # accumulator's registers; 2, through the tile's Q slot and TMA; 3, through the V ring and TMA (64-key tiles,
    # not chained); 1-3: no O buffers in shared memory
    o_store: int = 0
    # bf16io only: 1, V converted to fp16 by one elementwise pass before the kernel, which then reads fp16 V as the
    # fp16 recipe's kernel does (no producer conversion; a temporary fp16 copy of V, the same bits); 0, the producer
    # converts each V tile in shared memory
    v_pass: int = 0
    # the persistent kernels' tile walk (`common/tile_scheduler.py`): 1, head-major, a head's query blocks side by
    # side on its K/V (dense causal: the longest paired with the shortest; packed: units of real tiles); 0, L2-sized
    # head chunks with the longest query blocks first (the packed one's: heads fastest inside a sequence), which
    # reread a head's K/V rounds later: 1.46x cuDNN's DRAM reads at 512 causal D128, 2.1x at 1K causal D256
    # (benchmarks/results/h100/2026-12-06/01-walk); 2 (the default), the measured rule per shape
    # (`attention_persistent.preferred_walk`; the packed kernel: `attention_varlen_persistent.packed_walk`)
    walk: int = 2
    # the chained persistent kernel's two consumer warpgroups issue their per-step products in turns
    # (`named_barrier.py`, FlashAttention-3's warp-scheduler barrier): one's softmax under the other's products
    pingpong: int = 0
    # the chained persistent kernel's consumer with a program's tiles in one loop, one copy of the key step in its
    # code (`attention_persistent_flat.py`): the same products and barriers, fewer hot instructions; 2 (the
    # default), the measured rule per shape (`attention_persistent.preferred_flat`: causal rows of up to 512 keys)
    flat: int = 2

    def converts_in_kernel(self, recipe: AttentionRecipe) -> bool:
        """Whether the kernel's producer converts V (bf16io without `v_pass`)."""
        return recipe.converts_v and not self.v_pass

    def kernel_v(self, v: torch.Tensor, recipe: AttentionRecipe) -> torch.Tensor:
        """V as this config's kernels read it: for bf16io its bf16 bits viewed as fp16 (the producer converts them),
        or with `v_pass` V converted to fp16 by one op (a dense layout keeps its strides); else V itself."""
        if not recipe.converts_v:
            return v
        return v.to(torch.float16) if self.v_pass else v.view(torch.float16)

    def check(self, head_dim: int, recipe: AttentionRecipe, kernel: str = "dense") -> None:
        """ValueError naming the field for a config that `kernel` ("dense", "persistent" or "varlen_persistent")
        cannot run (compile error, spills, shared memory, or a recipe the switch does not apply to); the shipped
        configs pass, and `xkernels inspect` compiles them."""
        if self.persistent not in (0, 1, 2):
            raise ValueError(f"config: persistent={self.persistent} needs 0, 1 or 2")
        if self.chained not in (0, 1) or self.o_store not in (0, 1, 2, 3):
            raise ValueError(f"config: chained={self.chained} must be 0 or 1, o_store={self.o_store} 0 to 3")
        if self.walk not in (0, 1, 2):
            raise ValueError(f"config: walk={self.walk} must be 0, 1 or 2")
        if self.pingpong not in (0, 1) or (kernel == "persistent" and self.pingpong
                                           and not (self.chained and self.consumers == 2)):
            raise ValueError(f"config: pingpong={self.pingpong} must be 0, or 1 with chained=1 and consumers=2 "
                             f"(the chained persistent kernel's two warpgroups; {self})")
        if self.flat not in (0, 1, 2) or (kernel == "persistent" and self.flat == 1
                                           and not (self.chained and self.consumers == 2)):
            raise ValueError(f"config: flat={self.flat} must be 0, 2 (by shape), or 1 with chained=1 and consumers=2 "
                             f"(the chained persistent kernel's consumer, as measured; {self})")
        # (the dense kernel stores O through its Q buffer and ignores o_store, as it ignores chained)
        if self.v_pass not in (0, 1) or (self.v_pass and not recipe.converts_v):
            raise ValueError(f"config: v_pass={self.v_pass} must be 0, or 1 with a recipe that converts V "
                             f"(bf16io; recipe {recipe.name})")
        if kernel == "persistent" and self.o_store == 3 and recipe.converts_v:
            raise ValueError(f"config: o_store=3 (O through the V ring) needs the V ring in O's dtype: recipe "
                             f"{recipe.name} reads V as fp16 (converted in place or by v_pass) and needs o_store 0-2")
        if kernel == "persistent" and self.o_store == 3 and (self.block_n != WG_ROWS or self.chained
                                                             or self.stages < self.consumers):
            raise ValueError(f"config: o_store=3 (O through the V ring) needs block_n={WG_ROWS} (a warpgroup's O tile "
                             f"per V stage), chained=0 and stages >= consumers ({self})")
        if kernel == "varlen_persistent" and (self.pingpong or self.flat == 1):
            raise ValueError(f"config: pingpong={self.pingpong}, flat={self.flat} are the dense persistent kernel's "
                             "consumers; the packed (varlen) persistent kernel has neither")
        if kernel == "varlen_persistent" and self.o_store:
            raise ValueError(f"config: o_store={self.o_store} is the dense persistent kernel's; the packed (varlen) "
                             "persistent kernel stores O through its O buffers")
        if self.shared_bytes(head_dim, kernel) > SHARED_BYTES:
            raise ValueError(f"config: {self} needs {self.shared_bytes(head_dim, kernel)} bytes of shared memory at "
                             f"head dim {head_dim} in the {kernel} kernel (sm_90 has {SHARED_BYTES}; the persistent "
                             "kernels' O buffers come on top of Q's unless o_store=1-3, and chained tiles hold "
                             "two Q slots)")
        if self.l2_budget_kib < 0:
            raise ValueError(f"config: l2_budget_kib={self.l2_budget_kib} must be positive (or 0: by the shape)")
        if self.l2_budget_kib and self.walk == 1:
            raise ValueError(f"config: l2_budget_kib={self.l2_budget_kib} sizes the L2-chunk walk's chunks; walk=1 "
                             "(head-major) has none")
        if self.consumers not in (2, 3) or (self.consumers == 3 and head_dim != 64):
            raise ValueError(f"config: consumers={self.consumers} needs 2, or 3 with head dim 64 (registers)")
        if self.acc16 and recipe.pv_dtype != torch.float16:
            raise ValueError(f"config: acc16 needs fp16 P.V (recipe {recipe.name} multiplies P.V in bf16)")
        if self.convert_steps not in (2, 4, 8):
            raise ValueError(f"config: convert_steps={self.convert_steps} must be 2, 4 or 8")
        if self.converts_in_kernel(recipe) and self.block_n // self.convert_steps < 8:
            raise ValueError(f"config: convert_steps={self.convert_steps} with block_n={self.block_n} gives steps of "
                             "fewer than 8 rows, which cut the shared-memory swizzle pattern")
        if self.converts_in_kernel(recipe) and self.convert_steps == 2 and head_dim == 256:
            raise ValueError("config: convert_steps=2 at head dim 256 spills registers (the producer's gain is "
                             "consumer 0's loss)")

    @property
    def block_m(self) -> int:
        return self.consumers * WG_ROWS

    def shared_bytes(self, head_dim: int, kernel: str = "dense") -> int:
        """Shared memory of `kernel`'s buffers (16-bit elements; barriers aside): Q (the dense kernel's one slot, also
        O's; the persistent kernel's two when chained, the packed one's always two), the persistent kernels' O
        buffers (none with o_store 1-3 in the dense persistent kernel), and the K and V rings."""
        tile = self.block_m * head_dim * 2
        q_slots, o_bufs = {"dense": (1, 0), "persistent": (1 + self.chained, 0 if self.o_store else tile),
                           "varlen_persistent": (2, tile)}[kernel]
        return q_slots * tile + o_bufs + 2 * self.stages * self.block_n * head_dim * 2

    def constexprs(self, head_dim: int, recipe: AttentionRecipe, *, causal: bool, positive_scale: bool,
                   write_lse: bool, persistent: bool = False) -> dict[str, object]:
        """The kernel's compile-time arguments for this config (`persistent`: of the persistent kernel, which takes
        CHAINED too): one mapping for the launch and for `inspect`."""
        if persistent and (self.walk not in (0, 1) or self.flat not in (0, 1)):
            raise ValueError(f"config: walk={self.walk}, flat={self.flat}: the kernel takes them resolved, 0 or 1 "
                             "(the launch spec's)")
        extra = dict(CHAINED=bool(self.chained), O_STORE=self.o_store, WALK=self.walk,
                     PINGPONG=bool(self.pingpong), FLAT=bool(self.flat)) if persistent else {}
        return dict(HEAD_DIM=head_dim, BLOCK_N=self.block_n, STAGES=self.stages, CAUSAL=causal,
                    CONVERT_V=self.converts_in_kernel(recipe), POSITIVE_SCALE=positive_scale,
                    OVERLAP=bool(self.overlap), NUM_WG=self.consumers,
                    ACC16=bool(self.acc16) or recipe.pv_acc_dtype == torch.float16,
                    CONVERT_STEPS=self.convert_steps, WRITE_LSE=write_lse, **extra)

    def __str__(self) -> str:
        return (f"BM{self.block_m}-BN{self.block_n}-S{self.stages}" + "-ov" * self.overlap + "-acc16" * self.acc16
                + (f"-cs{self.convert_steps}" if self.convert_steps != 8 else "")
                + (f"-p{self.persistent}" if self.persistent else "") + "-ch" * self.chained
                + "-pp" * self.pingpong + "-fl" * (self.flat == 1)
                + (f"-l2c{self.l2_budget_kib}" if self.l2_budget_kib else "")
                + ("", "-or", "-oq", "-ovs")[self.o_store] + "-vp" * self.v_pass
                + (("-l2", "-hm", "")[self.walk] if self.persistent else ""))


# The dense kernel's configs per head dim: the largest ring that fits shared memory. D64: three consumer warpgroups
# (192-row tiles) and the window closed; bf16io at D256: 4 conversion steps per V tile (benchmarks/README.md has
# the measurements).
ATTENTION_CONFIGS = {64: HopperAttentionConfig(128, 3, overlap=0, consumers=3, convert_steps=4),
                     128: HopperAttentionConfig(128, 2),
                     256: HopperAttentionConfig(64, 2, convert_steps=4)}

# The persistent kernel's configs, used where `attention_persistent.eligible` says (persistent=1: the measured rule).
# Tiles chained; at D64 two consumer warpgroups with the window open: chained, they measured 0.89-1.01x cuDNN at
# 512-4K keys against 0.61-0.96x for three with the window closed (the dense kernel's choice; run 34 of
# 2026-11-30). Two Q slots + O buffers + the K/V ring fill 224 KB at D128.
# D256: one Q slot (not chained) and O stored through it (o_store=2), so the dense kernel's 64-key tiles in 2
# stages fit (192 KB; with O buffers only 32-key tiles did, and they lost 15-25 % from 1K keys:
# benchmarks/results/h200/2026-12-01/16-*); 0.83-0.95x cuDNN at 512-2K keys against the dense kernel's 0.64-0.94x,
# O from registers 0.71-0.91x (2026-12-03/73-persistent-d256-o-store).
PERSISTENT_ATTENTION_CONFIGS = {
    64: HopperAttentionConfig(128, 3, consumers=2, convert_steps=4, persistent=1, chained=1),
    128: HopperAttentionConfig(128, 2, persistent=1, chained=1),
    256: HopperAttentionConfig(64, 2, convert_steps=4, persistent=1, o_store=2)}


@dataclass(frozen=True)
class HopperAttentionBwdConfig:
    """The dK/dV kernel's tiles: BLOCK_N keys per program (two consumer warpgroups of 64 keys each, or with split_d
    64 keys shared by both), BLOCK_M queries per step, a ring of `stages` Q/dO tiles."""

    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    # dQ from this kernel too (TMA reduce-add into fp32; not bitwise repeatable): 1, dK's wgmma issued before the
    # dS^T handshake and dQ's after it; 2, dQ's issued first and dK's left in flight while dQ's partial is staged;
    # 3 (D64), as 1 with the warpgroups taking turns by step at the whole [BLOCK_M, D] dQ partial
    fused_dq: int = 0
    # both warpgroups on BLOCK_N = 64 keys, each owning half of dK's and dV's columns: 1, each computes S^T and dP^T;
    # 2, one computes S^T, the other dP^T, exchanged through shared memory (`attention_bwd._exchange_step`)
    split_d: int = 0
    # K and V of a consumer's 64 keys held in registers as the A operands of S^T = K Q^T and dP^T = V dO^T (not with
    # split_d): those wgmmas then read only Q and dO from shared memory, half the bytes per product (D64: 32 more
    # registers a thread)
    kv_regs: int = 0
    # the query walk in two loops: the steps that need the mask (causal diagonal, key tail, window edges), then the
    # rest with no compares or selects (`attention_bwd._mask_end`)
    mask_split: int = 0
    # a dense call with a full mask over whole key blocks (Skv a multiple of BLOCK_N) walks one loop with no step
    # masked (EVEN_KEYS); opt-in until measured (`scripts/bwd_ab.py --even-keys`): D128's fused kernel with its
    # unmasked steps in a second loop measured 5 % slower on full rows (spilling; this one loop does not)
    even_keys: int = 0
    # the fused kernel's dense full walk (one loop) starts each key block's query walk at its own block index, so a
    # head's programs reduce dQ into different rows at a time (ROTATE); opt-in until measured
    # (`scripts/bwd_ab.py --rotate`)
    rotate: int = 0
    # programs per key block, each walking that share of the GQA group's query heads, their dK and dV partials summed
    # in a fixed order by the last to finish (`attention_bwd` GROUP_PARTS; dense, unfused, D64/D128): a shape rule
    # (`select.group_parts`) sets it where a causal call has too few programs to fill the SMs
    group_parts: int = 1

    def constexprs(self, head_dim: int, *, causal: bool, varlen: bool = False, band: Band | None = None,
                   whole_key_blocks: bool = False) -> dict[str, object]:
        """The kernel's compile-time values; `whole_key_blocks`: a dense call whose key count is a multiple of
        BLOCK_N (with `even_keys` and a full mask, EVEN_KEYS: no step needs the mask)."""
        mask = band_constexprs(band, causal)
        full = not mask["CAUSAL"] and mask["BAND"] < 0  # (a causal or windowed walk ignores it: not compiled twice)
        even = bool(self.even_keys) and whole_key_blocks and full and not varlen
        return dict(HEAD_DIM=head_dim, BLOCK_M=self.block_m, BLOCK_N=self.block_n, STAGES=self.stages,
                    FUSED_DQ=self.fused_dq, SPLIT_D=self.split_d, KV_REGS=bool(self.kv_regs),
                    MASK_SPLIT=bool(self.mask_split), VARLEN=varlen,
                    EVEN_KEYS=even,
                    ROTATE=bool(self.rotate) and bool(self.fused_dq) and full and not self.mask_split and not varlen
                    and not self.split_d and not even, GROUP_PARTS=self.group_parts) | mask

    def __str__(self) -> str:
        return (f"BM{self.block_m}-BN{self.block_n}-S{self.stages}" + f"-dq{self.fused_dq}" * bool(self.fused_dq)
                + (f"-sd{self.split_d}" if self.split_d else "") + "-kvr" * bool(self.kv_regs)
                + "-ms" * bool(self.mask_split) + "-ek" * bool(self.even_keys) + "-rot" * bool(self.rotate)
                + f"-gp{self.group_parts}" * (self.group_parts > 1))


# D256: 64 x 256 fp32 dK and dV do not fit one warpgroup's registers, so the two warpgroups split their columns over
# 64 keys (split_d), with 32-query steps in a 3-deep ring (64-query steps spill, or overflow shared memory with the
# exchange); S^T and dP^T exchanged rather than computed twice: 0.90-1.07x cuDNN against 0.80-0.87x
# (benchmarks/results/h200/2026-12-01/11-bwd-d256-exchange)
# D64 and D128 walk their unmasked query steps in a loop of their own (mask_split): causal 2-4 % faster, full level;
# D256's exchange steps lost 2-3 % on causal rows with it (benchmarks/results/h100/2026-12-06/16-bwd-mask-split).
ATTENTION_BWD_CONFIGS = {64: HopperAttentionBwdConfig(mask_split=1), 128: HopperAttentionBwdConfig(mask_split=1),
                         256: HopperAttentionBwdConfig(block_m=32, block_n=64, stages=3, split_d=2)}
# The dK/dV kernel with dQ fused in (not bitwise repeatable; `select.fused_dq_pays` says where it is faster than the
# split pair above). D64: the warpgroups take turns at the whole dQ partial (64 x 64 wgmmas) and hold K and V as
# register operands, so a step reads a third less shared memory: B4 H32 4K D64 full 0.98x cuDNN, causal 1.00x,
# against 0.89 / 0.92 for fused_dq=1 from shared memory and 0.92 / 0.94 for the split pair
# (benchmarks/results/h100/2026-12-05/01-candidates-bwd-d64-pdl, H100).
# mask_split at D64 (causal +3 %); not at D128, whose fused variant spills 32 bytes and more with it and lost 1-5 %.
FUSED_BWD_CONFIGS = {64: HopperAttentionBwdConfig(fused_dq=3, kv_regs=1, mask_split=1),
                     128: HopperAttentionBwdConfig(fused_dq=1)}


@dataclass(frozen=True)
class HopperAttentionDqConfig:
    """The dQ kernel's tiles (`attention_dq.py`): 128 query rows per program (two consumer warpgroups of 64),
    BLOCK_N keys per step, rings of `stages` K and V tiles."""

    block_n: int = 64
    stages: int = 2

    def constexprs(self, head_dim: int, *, causal: bool, varlen: bool = False,
                   band: Band | None = None) -> dict[str, object]:
        return dict(HEAD_DIM=head_dim, BLOCK_N=self.block_n, STAGES=self.stages, CAUSAL=causal,
                    VARLEN=varlen) | band_constexprs(band, causal)

    def __str__(self) -> str:
        return f"BM128-BN{self.block_n}-S{self.stages}"


# run on the H200 (runs 20, 21, 26 of 2026-11-30): passes its float64 tests, 3-29 % faster than the portable dQ
# D256: 32-key tiles (64 x 256 Q and dO of two warpgroups take 128 KB of shared memory; 64-key tiles spill)
ATTENTION_DQ_CONFIGS = {64: HopperAttentionDqConfig(128, 2), 128: HopperAttentionDqConfig(64, 2),
                        256: HopperAttentionDqConfig(32, 2)}


@dataclass(frozen=True)
class HopperGemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    num_warps: int = 8  # two consumer warpgroups: 64 x 256 fp32 accumulator rows each, 128 registers
    group_m: int = 8
    acc_fp16: bool = False  # the seeds' fp16-accumulate variant (fp16 inputs only): an ablation, off the contract
    split_k: int = 1  # work units per output tile over consecutive K ranges (`hopper/gemm.py`)
    consumers: int = 1  # 2: two consumer partitions of num_warps warps take the work units in turn (ping-pong)
    row_wgs: int = 1  # 2 or 3: one-warpgroup partitions splitting each tile's rows, 64 each (3: 192-row tiles)

    def check(self, dtype: torch.dtype) -> None:
        if self.acc_fp16 and dtype != torch.float16:
            raise ValueError("config: acc_fp16 needs fp16 inputs (wgmma accumulates bf16 products in fp32 only)")
        if not 1 <= self.split_k <= 8:
            raise ValueError(f"config: split_k={self.split_k} must be 1 to 8")
        if self.split_k > 1 and self.acc_fp16:
            raise ValueError("config: split_k > 1 sums fp32 partials; acc_fp16 has none")
        if self.stages < 2:
            raise ValueError(f"config: stages={self.stages} must be at least 2 (a stage is released only once the "
                             f"next one's wgmma is issued)")
        if self.consumers not in (1, 2) or (self.consumers == 2 and self.num_warps != 4):
            raise ValueError(f"config: consumers={self.consumers} must be 1, or 2 with num_warps=4 (two 4-warp "
                             f"partitions; num_warps={self.num_warps})")
        if self.row_wgs != 1 and (self.row_wgs not in (2, 3) or self.num_warps != 4 or self.consumers != 1
                                  or self.split_k != 1 or self.block_m != 64 * self.row_wgs):
            raise ValueError(f"config: row_wgs={self.row_wgs} must be 1, or 2 or 3 with num_warps=4, consumers=1, "
                             f"split_k=1 and block_m=64 * row_wgs ({self})")
        if self.shared_bytes(dtype) > SHARED_BYTES:
            raise ValueError(f"config: {self} needs {self.shared_bytes(dtype)} bytes of shared memory "
                             f"(sm_90 has {SHARED_BYTES})")

    def shared_bytes(self, dtype: torch.dtype) -> int:
        """The ring's A and B stages and the consumers' output tiles (barriers aside)."""
        size = dtype.itemsize
        return (self.stages * (self.block_m + self.block_n) * self.block_k * size
                + self.consumers * self.block_m * self.block_n * size)

    def blocks(self, b_layout: str) -> tuple[list[int], list[int], list[int]]:
        """Descriptor boxes of A, B and C (A and C: one row warpgroup's rows of a tile)."""
        b_block = [self.block_n, self.block_k] if b_layout == "nk" else [self.block_k, self.block_n]
        rows = self.block_m // self.row_wgs
        return [rows, self.block_k], b_block, [rows, self.block_n]

    def constexprs(self, b_layout: str, walk: str) -> dict[str, object]:
        return dict(B_NK=b_layout == "nk", WALK=walk, GROUP_M=self.group_m, STAGES=self.stages,
                    ACC_FP16=self.acc_fp16, SPLIT_K=self.split_k, CONSUMERS=self.consumers,
                    ROW_WGS=self.row_wgs, num_warps=self.num_warps)

    def __str__(self) -> str:
        acc = "-acc16" if self.acc_fp16 else ""
        split = f"-SK{self.split_k}" if self.split_k > 1 else ""
        pingpong = "-PP" if self.consumers == 2 else ""
        rows = f"-R{self.row_wgs}" if self.row_wgs > 1 else ""
        return (f"BM{self.block_m}-BN{self.block_n}-BK{self.block_k}-S{self.stages}-W{self.num_warps}{acc}{split}"
                f"{pingpong}{rows}")


GEMM_CONFIG = HopperGemmConfig()
# Smaller tiles for the shapes where GEMM_CONFIG's would leave SMs idle or end on a thin last wave:
MID_GEMM_CONFIG = HopperGemmConfig(block_n=128, stages=6)  # two warpgroups, half the columns, a deeper ring
# one warpgroup on a 64 x 128 tile; 8 stages keep 192 KB of A and B in flight per SM, which the few-row shapes need
# to stream a weight at HBM speed from the SMs they occupy (Little's law: 8 stages beat 6 by up to 13 %)
SMALL_GEMM_CONFIG = HopperGemmConfig(block_m=64, block_n=128, stages=8, num_warps=4)
# 64 x 64, one warpgroup: twice the CTAs of 64 x 128 for outputs of at most a wave of them (a few hundred rows)
TINY_GEMM_CONFIG = HopperGemmConfig(block_m=64, block_n=64, stages=8, num_warps=4)
# 64 x 32 with 128-deep k-steps: 64 rows against a weight of at most a wave of 32-column tiles (cuBLAS's tile at
# 64 x 4096 x 4096 is 64 x 32): twice the SMs of 64 x 64 tiles streaming the weight, 24 KB per k-step
NARROW_GEMM_CONFIG = HopperGemmConfig(block_m=64, block_n=32, block_k=128, stages=6, num_warps=4)
# throughput at whole waves relative to 128 x 256 tiles: 128 x 128 0.98 (2048^3 and 1024 x 4096 x 4096, run 10 of
# 2026-12-01, H200); 64 x 128 0.82 (H100, every tile timed in interleaved rounds: 0.77 at 2048^3, 0.82 at 1024 x
# 4096 x 4096; it reads twice the operand bytes per product, and its rate falls with size: 2560^3 and 3072^3, where
# it filled the waves best, ran 0.76x torch against 0.88-0.89 for 128 x 256 or 128 x 128, run 25 of 2026-12-06;
# the H200's 0.92 in run 10 was timed config after config)
# 192 x 128 over three row warpgroups (`row_wgs`, a 64-row slice each, sharing B's tile): one wave of 96 tiles at
# 1536^3 and 3 of 384 at 3072^3, where the other tiles need 2-3 and 5 waves of less work; 0.96 (H100, run 28 of
# 2026-12-07, `scripts/gemm_tiles.py --configs rows`: 0.96x torch at 3072^3, 0.92 at 1536^3 where the ranked tiles
# gave 0.88 and 0.87; 0.84 at 4096^3, 6 waves of 704 tiles, against 128 x 256's 0.97-1.00 at 4)
ROWS3_GEMM_CONFIG = HopperGemmConfig(block_m=192, block_n=128, stages=4, num_warps=4, row_wgs=3)
TILE_RATES = ((GEMM_CONFIG, 1.0), (MID_GEMM_CONFIG, 0.98), (ROWS3_GEMM_CONFIG, 0.96), (SMALL_GEMM_CONFIG, 0.82))
FULL_WAVE = 0.8  # outputs of at least this share of a wave of 128 x 128 tiles take the best-filling big tile
MAX_SPLIT_K = 2  # 4 splits never beat 2 where measured
MIN_SPLIT_STEPS = 64  # k-steps per split at least: shorter splits lose more to the partials' traffic than they gain


def wave_fill(units: int, sms: int) -> float:
    """Share of the SM-slots of the waves `units` work units take that hold work (1.0: whole waves)."""
    return units / (-(-units // sms) * sms)


def gemm_config(m: int, n: int, k: int, sms: int) -> HopperGemmConfig:
    """The Hopper GEMM config for an M x N x K problem on `sms` SMs:
      - outputs of about a wave of 128 x 128 tiles or more: of 128 x 256, 128 x 128, 192 x 128 and 64 x 128, the
        tile with the best wave fill times its whole-wave rate (`TILE_RATES`) times the share of its products inside
        the output (a 192-row tile over 1024 rows computes 1152; ties to the larger tile): 1024 x 6144 x 4096 fills
        1.45 waves of 128 x 256 tiles, 0.79x torch.matmul, and 2.9 of 128 x 128, 0.99x; 1536^3 and 3072^3 take
        192 x 128 (0.92-0.93x and 0.96x on the H100, where 64 x 128 gave 0.87 and 128 x 128 0.88), 2560^3
        128 x 256 (0.89; 64 x 128 0.76);
      - one full row block (M = 64) whose 64 x 32 tiles fit one wave: NARROW_GEMM_CONFIG (0.84-1.07x torch.matmul
        on five such shapes, where 64 x 64 gave 0.72-0.91x and split-K 64 x 128 0.98x at K = 14336); at 40-48 rows
        64 x 64 is ahead (0.82-0.89x against 0.70-0.81x: both lose time to the partial row block, 64 x 32 more);
      - smaller outputs: where even SMALL_GEMM_CONFIG's tiles fill at most half the SMs and K is long, those tiles
        with K split in two (each split at least MIN_SPLIT_STEPS k-steps: 64-128 rows against a 4096 x 14336
        weight, 0.95-0.99x); else TINY_GEMM_CONFIG (64 x 64) where its tiles fit one wave (512^3, 64-128 rows
        against 4096 x 4096: 0.77-1.21x where 64 x 128 tiles gave 0.58-1.02x), else SMALL_GEMM_CONFIG.
    Measured on the H200: benchmarks/results/h200/2026-12-01/09-l2chunk-gemm-tiles-bwd and 10-*/gemm_tiles.md, and
    (the 64 x 32 tiles) 2026-12-03/68-*/gemm_narrow.md and 69-*/gemm_narrow_rule.md; the 64 x 128 rate on the H100:
    benchmarks/results/h100/2026-12-06/25-gemm-tiles-bwd-even-keys, the 192 x 128 one: h100/2026-12-07/28-*."""
    def tiles(cfg: HopperGemmConfig) -> int:
        return -(-m // cfg.block_m) * -(-n // cfg.block_n)

    def useful(cfg: HopperGemmConfig) -> float:  # the share of the tiles' products inside the output
        return m * n / (tiles(cfg) * cfg.block_m * cfg.block_n)

    if tiles(MID_GEMM_CONFIG) >= FULL_WAVE * sms:
        return max(TILE_RATES, key=lambda c: wave_fill(tiles(c[0]), sms) * c[1] * useful(c[0]))[0]
    if m == NARROW_GEMM_CONFIG.block_m and tiles(NARROW_GEMM_CONFIG) <= sms:
        return NARROW_GEMM_CONFIG
    split = min(sms // tiles(SMALL_GEMM_CONFIG), MAX_SPLIT_K, -(-k // SMALL_GEMM_CONFIG.block_k) // MIN_SPLIT_STEPS)
    if split >= 2:
        return dataclasses.replace(SMALL_GEMM_CONFIG, split_k=split)
    return TINY_GEMM_CONFIG if tiles(TINY_GEMM_CONFIG) <= sms else SMALL_GEMM_CONFIG
