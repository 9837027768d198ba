"""Tile configs of the portable kernels: a pure function of the problem and the target (and interpreter mode)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from xkernels.common.dtypes import TL_DTYPE
from xkernels.common.runtime import INTERPRET, TENSOR_DESCRIPTORS
from xkernels.common.seqlen import Band, band_constexprs
from xkernels.common.targets import Target
from xkernels.portable.softmax import softcap_constexpr
from xkernels.recipes import AttentionRecipe


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def constexprs(self, head_dim: int, recipe: AttentionRecipe, *, causal: bool, write_lse: bool,
                   interpret: bool = INTERPRET, band: Band | None = None, softcap: float = 0.0,
                   sinks: bool = False) -> dict[str, object]:
        """`attention_fwd_kernel`'s (and the varlen kernel's) compile-time arguments: one mapping for the launch and
        for `inspect`. A windowed `band` sets SHIFT and BAND (and CAUSAL from its upper side); `softcap` SOFTCAP;
        `sinks` HAS_SINKS."""
        out = dict(HEAD_DIM=head_dim, BLOCK_M=self.block_m, BLOCK_N=self.block_n, CAUSAL=causal,
                   PV_DTYPE=TL_DTYPE[recipe.pv_dtype], WRITE_LSE=write_lse, DESCRIPTORS=TENSOR_DESCRIPTORS,
                   INTERPRET=interpret, ACC_DTYPE=TL_DTYPE[recipe.pv_acc_dtype])
        return out | band_constexprs(band, causal) | dict(SOFTCAP=softcap_constexpr(softcap), HAS_SINKS=sinks)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-W{self.num_warps}-S{self.num_stages}"


@dataclass(frozen=True)
class AttentionBwdConfig:
    """Tiles of the two backward kernels: dK/dV holds `kv_n` keys and walks queries `kv_m` at a time; dQ holds `q_m`
    queries and walks keys `q_n` at a time (the tile each program keeps in registers is the larger one)."""

    kv_m: int
    kv_n: int
    q_m: int
    q_n: int
    num_warps: int
    num_stages: int

    def dkdv_constexprs(self, head_dim: int, *, causal: bool, varlen: bool = False, interpret: bool = INTERPRET,
                        band: Band | None = None, softcap: float = 0.0) -> dict[str, object]:
        out = dict(HEAD_DIM=head_dim, BLOCK_M=self.kv_m, BLOCK_N=self.kv_n, CAUSAL=causal, INTERPRET=interpret,
                   VARLEN=varlen)
        return out | band_constexprs(band, causal) | dict(SOFTCAP=softcap_constexpr(softcap))

    def dq_constexprs(self, head_dim: int, *, causal: bool, varlen: bool = False, interpret: bool = INTERPRET,
                      band: Band | None = None, softcap: float = 0.0) -> dict[str, object]:
        out = dict(HEAD_DIM=head_dim, BLOCK_M=self.q_m, BLOCK_N=self.q_n, CAUSAL=causal, INTERPRET=interpret,
                   VARLEN=varlen)
        return out | band_constexprs(band, causal) | dict(SOFTCAP=softcap_constexpr(softcap))

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return (f"KV{self.kv_m}x{self.kv_n}-Q{self.q_m}x{self.q_n}-W{self.num_warps}-S{self.num_stages}")


@dataclass(frozen=True)
class DecodeConfig:
    """Tiles of the split-KV kernel (`attention_decode.py`): keys per tile, warps, pipeline stages. Its row block
    follows the call (`block_m`), its key splits the grid (`decode.num_splits`)."""

    block_n: int
    num_warps: int
    num_stages: int
    max_block_m: int = 64
    programs_per_sm: int = 1  # resident programs per SM that the key splits aim for (`decode.num_splits`)
    # the last split of a row block merges the splits (no combine kernel launch); not yet timed on a GPU
    fused_combine: bool = False
    # pages of at most block_n keys: a split's block ids read once before its key loop (at most this many; 0: each
    # tile's ids one tile ahead, in the loop)
    preload_ids: int = 0
    # CUDA sm_90+ only (a plan elsewhere drops it): the combine kernel launched as a programmatic dependent of the
    # split kernel, whose programs let it be scheduled as they start; it waits for the split kernel's writes
    # (griddepcontrol), so its launch and prologue overlap the split kernel's tail instead of following it. On the
    # H100, D128: 0-1 % off every decode row, the same bits (benchmarks/results/h100/2026-12-05/01-*/pdl.md)
    pdl: bool = False

    def page_ids(self, page: int, split_keys: int) -> int:
        """PAGE_IDS of a split of `split_keys` keys on pages of `page` keys: the power of two that holds its ids,
        where that is at most `preload_ids` (else 0: read in the loop)."""
        if not 0 < page <= self.block_n or not self.preload_ids:
            return 0
        ids = 1 << max(-(-split_keys // page) - 1, 0).bit_length()
        return ids if ids <= self.preload_ids else 0

    def block_m(self, rows: int) -> int:
        """Packed query rows per program: the smallest power of two >= rows, from 16 (the dot's minimum) up to
        `max_block_m`."""
        return min(max(16, 1 << max(rows - 1, 0).bit_length()), self.max_block_m)

    def constexprs(self, head_dim: int, recipe: AttentionRecipe, *, rows: int, page: int, seq_lengths: bool,
                   causal: bool, bottom_right: bool, write_lse: bool, split: bool, key_starts: bool = False,
                   windowed: bool = False, wide_rows: bool = False, softcap: float = 0.0, sinks: bool = False,
                   page_ids: int = 0, interpret: bool = INTERPRET) -> dict[str, object]:
        return dict(HEAD_DIM=head_dim, BLOCK_M=self.block_m(rows), BLOCK_N=self.block_n, PAGE=page,
                    SEQ_LENGTHS=seq_lengths, KEY_STARTS=key_starts, CAUSAL=causal, BOTTOM_RIGHT=bottom_right,
                    WINDOWED=windowed, PV_DTYPE=TL_DTYPE[recipe.pv_dtype], WRITE_LSE=write_lse, SPLIT=split,
                    FUSED_COMBINE=split and self.fused_combine, WIDE_ROWS=wide_rows, INTERPRET=interpret,
                    SOFTCAP=softcap_constexpr(softcap), HAS_SINKS=sinks, PAGE_IDS=page_ids,
                    LAUNCH_DEPENDENTS=split and self.pdl and not self.fused_combine and not interpret)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        per_sm = f"-P{self.programs_per_sm}" if self.programs_per_sm > 1 else ""
        return (f"BN{self.block_n}-W{self.num_warps}-S{self.num_stages}{per_sm}" + "-fc" * self.fused_combine
                + (f"-ids{self.preload_ids}" if self.preload_ids else "") + "-pdl" * self.pdl)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    def constexprs(self, b_layout: str, walk: str, interpret: bool = INTERPRET) -> dict[str, object]:
        """`gemm_kernel`'s compile-time arguments: one mapping for the launch and for `inspect`."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, B_NK=b_layout == "nk",
                    WALK=walk, GROUP_M=self.group_m, DESCRIPTORS=TENSOR_DESCRIPTORS, INTERPRET=interpret)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-BK{self.block_k}-W{self.num_warps}-S{self.num_stages}"


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """`gemm_skinny`'s tiles: BLOCK_N columns by BLOCK_K per step (rows: a power of two >= M), and how the K slices
    are chosen: `programs_per_sm` programs per SM, slices of at least `min_k_steps` steps, at most `max_slices`."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2
    min_k_steps: int = 4
    max_slices: int = 16
    # the weight's tile as the product's first operand (C^T = B^T A^T): on sm_90, with BLOCK_N a multiple of 64, a
    # wgmma reads it from shared memory, the rows as its N side (16-32), where the rows-first product is an mma.sync
    # of 16-32 rows whose warps each load the weight columns they need into registers
    swap: bool = False

    def constexprs(self, block_m: int, slices: int, b_layout: str, interpret: bool = INTERPRET) -> dict[str, object]:
        return dict(BLOCK_M=block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k, SLICES=slices,
                    B_NK=b_layout == "nk", DESCRIPTORS=TENSOR_DESCRIPTORS, INTERPRET=interpret, SWAP=self.swap)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def slices(self, n: int, k: int, sms: int) -> int:
        """K slices per column block: as many as keep every (column block, slice) program resident at once
        (`programs_per_sm` per SM: a second, partial wave would leave most SMs idle at the end), each slice at least
        `min_k_steps` BLOCK_K steps, at most `max_slices`; 1 when the column blocks alone fill the SMs."""
        blocks = -(-n // self.block_n)
        fit = (self.programs_per_sm * sms) // blocks
        most = max(1, -(-k // self.block_k) // self.min_k_steps)
        return int(max(1, min(fit, most, self.max_slices)))

    def __str__(self) -> str:
        return f"skinny-BN{self.block_n}-BK{self.block_k}-W{self.num_warps}-S{self.num_stages}{'-T' * self.swap}"


# Calls with at most this many rows (after folding a's batch) run `gemm_skinny` (decode-time linear layers). Timed on
# the H200 (scripts/skinny_tiles.py, run 23 of 2026-11-30): 0.91-0.95x torch.matmul's device time at 1 and 16 rows
# with the best tile, 0.49-0.99x at 128 rows, where the K-slice partials and one warpgroup per tile cost too much.
SKINNY_MAX_M = 32
SKINNY_FEW_ROWS = 8  # up to this many rows `skinny` serves the weights `skinny_wide_rows` cannot fill the SMs with
SKINNY_WIDE_FILL = 0.9  # `skinny_wide_rows` where its column blocks number at least this share of the SMs


@dataclass(frozen=True)
class ConfigTable:
    """The portable configs of one family of targets, each checked by `xkernels inspect --target` (CI): spill-free
    and within the family's shared memory for every recipe, head dim, mask, dtype and layout."""

    attention: dict[int, AttentionConfig]  # by head dim
    converting_v: dict[int, AttentionConfig]  # by head dim, where bf16io's in-kernel V conversion needs its own
    gemm: dict[int, GemmConfig]  # by output element size
    attention_bwd: dict[int, AttentionBwdConfig] = dataclasses.field(default_factory=dict)  # by head dim
    decode: dict[int, DecodeConfig] = dataclasses.field(default_factory=dict)  # by head dim
    # by head dim: calls with more (sequence, kv head) pairs than `decode`'s config has resident programs (one key
    # split each, several waves), where smaller tiles with more programs per SM keep more loads in flight
    decode_many: dict[int, DecodeConfig] = dataclasses.field(default_factory=dict)
    # few-row GEMMs; the default's ring (2 stages of a 32 x 64 A tile and a 64 x 64 B tile) fits every family
    skinny: SkinnyGemmConfig = SkinnyGemmConfig(64, 64, 4, 2)
    # few-row GEMMs of more than SKINNY_FEW_ROWS rows where `skinny` would split K (`skinny_gemm_config`); None: skinny
    skinny_rows: SkinnyGemmConfig | None = None
    # of those, the ones whose weight has enough columns for this config's blocks to fill the SMs unsplit
    # (SKINNY_WIDE_FILL of them); None: skinny_rows
    skinny_wide_rows: SkinnyGemmConfig | None = None
    # configs that spill a little on this family and ship anyway (the report still says SPILLS): "<kernel>-<head
    # dim>" (attention, attention_acc16, attention_varlen, attention_bwd, attention_bwd_varlen, attention_bwd_softcap:
    # the soft-capped backward's variants), "gemm-<output element size>" or "gemm_skinny-2"
    tolerated_spills: frozenset[str] = frozenset()

    def spill_free(self, kernel: str, key: int) -> bool:
        return f"{kernel}-{key}" not in self.tolerated_spills


# sm_90 (227 KB): Hopper-sized tiles. bf16io at D256 holds the converted V tile too: a 64-key tile spills under
# triton 3.7 (8-16 bytes of stack), a 32-key one does not. A 128x256 fp32 C tile plus three A/B stages would
# overflow 227 KB, so fp32 outputs take 128x128. The backward's tiles were timed on the H200 (scripts/bwd_tiles.py,
# benchmarks/results/h200/2026-11-30/8 and 10): at D128 the dK/dV kernel holding 128 keys reloads 56-112 bytes of
# stack per thread and is still the fastest tile measured (517 TFLOP/s for its four matmuls, against 346-470 for the
# spill-free ones), so that spill is tolerated; at D256 every dK/dV tile that keeps wgmma (64 keys) reloads 96-128
# bytes, tolerated too (32-key tiles fall back to mma.sync); 4 warps at D64. The packed varlen variants of those
# tiles (a sequence's bounds and offsets live too) reload 96-280 bytes; with a window and a soft cap (the band's
# bounds, the cap's tanh tile) the packed D64 dK/dV tile too (24-56 bytes), the portable backward on Hopper only
# serving windows, caps and sinks.
HOPPER = ConfigTable(
    attention={64: AttentionConfig(128, 128, 8, 3), 128: AttentionConfig(128, 128, 8, 3),
               256: AttentionConfig(128, 64, 8, 2)},
    converting_v={256: AttentionConfig(128, 32, 8, 2)},
    gemm={2: GemmConfig(128, 256, 64, 8, 3), 4: GemmConfig(128, 128, 64, 8, 3)},
    attention_bwd={64: AttentionBwdConfig(64, 64, 64, 64, 4, 2), 128: AttentionBwdConfig(64, 128, 128, 64, 8, 2),
                   256: AttentionBwdConfig(32, 64, 128, 32, 8, 1)},
    decode={64: DecodeConfig(128, 8, 3, programs_per_sm=2, pdl=True),
            128: DecodeConfig(128, 8, 3, preload_ids=4096, pdl=True), 256: DecodeConfig(64, 8, 3, pdl=True)},
    decode_many={64: DecodeConfig(64, 4, 3, programs_per_sm=3, pdl=True),
                 128: DecodeConfig(64, 4, 4, programs_per_sm=2, preload_ids=1024, pdl=True)},
    skinny=SkinnyGemmConfig(128, 128, 4, 3, programs_per_sm=2),
    skinny_rows=SkinnyGemmConfig(64, 256, 4, 3, programs_per_sm=2),
    # 9-32 rows against 4096+ columns: 32-column blocks over all of K, one program per SM (no K split, no partials
    # and, under CUDA-graph capture, no counter fill)
    skinny_wide_rows=SkinnyGemmConfig(32, 256, 4, 4, programs_per_sm=1),
    tolerated_spills=frozenset({"attention_bwd-128", "attention_bwd-256", "attention_bwd_varlen-128",
                                "attention_bwd_varlen-256", "attention_bwd_softcap-64", "attention_bwd_softcap-128",
                                "attention_bwd_softcap-256", "gemm_skinny-2", "decode-128", "decode-256"}))
# The split-KV decode tiles were timed on the H200 (scripts/decode_sweep.py, run 15 of 2026-11-30): 128 keys x 3
# stages (one ~140 KB program per SM) with one wave of splits matched SDPA's default on the four anchor rows, where
# 64-key tiles and more programs per SM lost 1-15 %. At D64 the same tile is ~70 KB and 97 registers, so two programs
# fit an SM, and splitting for two per SM won 0-9 % on the anchor rows (dense and paged; run 25 of 2026-12-01): one
# program's loop latency hides under the other's. At D128 a split's block ids are read once before its key loop (up to
# 4096 of them, then gathered per tile from registers): page 16 0.92-0.95x SDPA -> 0.93-0.98x, page 64 level (run 49
# of 2026-12-02); the in-loop read made each tile's K/V copies wait on a table load. The few-row GEMM's split variant
# at 16 rows with B as [K, N] keeps 8 bytes of stack under triton 3.7.1 (one store, two reloads; 72 registers), none
# under 3.6: tolerated. The split-KV kernel's left-padded D128 variant, with its checks of the cache values, reloads 3
# values under triton 3.9 (none under 3.6 and 3.7), and its windowed paged D256 variant one value under 3.7 (kept for
# the scan of the page table after the key loops), all before, between or after its two key loops: tolerated.
# sm_80 (163 KB) and sm_89 / sm_120 (99 KB per block): mma.sync keeps Q and the S and O tiles in registers, so the
# register file limits first: 128-row blocks spill at D128 unless the key tiles are 32 wide, and D256 takes
# 64-row blocks; on 99 KB a D256 block also needs 32-key tiles.
AMPERE = ConfigTable(
    attention={64: AttentionConfig(128, 64, 8, 2), 128: AttentionConfig(128, 32, 8, 2),
               256: AttentionConfig(64, 64, 8, 2)},
    converting_v={},
    gemm={2: GemmConfig(128, 128, 64, 8, 3), 4: GemmConfig(128, 128, 64, 8, 3)},
    attention_bwd={64: AttentionBwdConfig(32, 32, 64, 32, 4, 2), 128: AttentionBwdConfig(64, 64, 64, 64, 8, 1),
                   256: AttentionBwdConfig(16, 32, 32, 16, 4, 1)},
    decode={64: DecodeConfig(64, 4, 2), 128: DecodeConfig(64, 4, 2), 256: DecodeConfig(32, 4, 2)},
    skinny=SkinnyGemmConfig(64, 128, 4, 3),
    # the causal varlen D256 tile reloads 8 bytes; the packed D64 dK/dV tile (a sequence's bounds live too) 5 values,
    # 8 bytes with a window and a soft cap under 3.7; the paged split-KV variants one value, kept across the key loops
    # for the page-table scan after them
    tolerated_spills=frozenset({"attention_varlen-256", "attention_bwd_varlen-64", "attention_bwd_softcap-64",
                                "decode-128", "decode-256"}))
# fp32-output GEMMs on sm_89: ptxas keeps 128 registers per thread and reloads one or two values from local memory
# in some walk orders, for every tile shape tried (128x128, 128x64, 64x128); tolerated rather than shrunk further.
# The packed D64 dK/dV tile reloads 3-4 values under triton 3.6, as on sm_80; the packed D256 dQ tile with a window
# and a soft cap 8 bytes under 3.7.
ADA = ConfigTable(
    attention={64: AttentionConfig(128, 64, 8, 2), 128: AttentionConfig(128, 32, 8, 2),
               256: AttentionConfig(64, 32, 8, 2)},
    converting_v={},
    gemm={2: GemmConfig(128, 128, 32, 8, 3), 4: GemmConfig(128, 128, 32, 8, 2)},
    attention_bwd=AMPERE.attention_bwd,
    decode=AMPERE.decode,
    tolerated_spills=frozenset({"gemm-4", "attention_bwd_varlen-64", "attention_bwd_softcap-256"}))
# sm_120 (99 KB): as sm_89, but triton 3.6 spills hundreds of bytes at D256 with 64-row blocks (and 32-row blocks
# with 32-key tiles); 32 x 16 tiles in one stage leave one local reload in the causal fp16/bf16 variants (and in the
# varlen kernel's causal variant), 32 bytes of stack in bf16io-acc16's. The D64 backward spills with 64-key dK/dV
# tiles there; the packed D256 dK/dV tile reloads 2 values, the soft-capped one (the cap's tanh, a tile more, live
# through both products) 8 bytes. The split-KV kernel's paged D64 variant, with its checks of the cache values,
# reloads one value under triton 3.6, before and after its key loop.
BLACKWELL_CONSUMER = dataclasses.replace(
    ADA, attention={**ADA.attention, 256: AttentionConfig(32, 16, 4, 1)},
    attention_bwd={**ADA.attention_bwd, 64: AttentionBwdConfig(32, 32, 32, 32, 4, 2)},
    tolerated_spills=frozenset({"gemm-4", "attention-256", "attention_acc16-256", "attention_varlen-256",
                                "attention_bwd_varlen-256", "attention_bwd_softcap-256", "decode-64"}))
# AMD CDNA (wave64): 4 warps keep 512 VGPRs per thread available (8 warps halve it and spill); gfx942's 64 KB of
# LDS holds a 64-row D256 block with 32-key tiles, not 64-key ones. MFMA accumulates in fp32 only, so the acc16
# recipes convert their fp16 accumulator every tile there (no gain; they exist for Hopper and the seeds' Xe2), and
# bf16io-acc16's causal D256 variant reloads one VGPR on gfx950: tolerated; so is the soft-capped D256 dK/dV tile's
# spill on gfx942 under triton 3.7 (9 VGPRs: the cap's derivative is a tile more).
CDNA = ConfigTable(
    attention={64: AttentionConfig(128, 64, 4, 2), 128: AttentionConfig(128, 32, 4, 2),
               256: AttentionConfig(64, 32, 4, 2)},
    converting_v={},
    gemm={2: GemmConfig(128, 128, 64, 4, 2), 4: GemmConfig(128, 128, 32, 4, 2)},
    attention_bwd={64: AttentionBwdConfig(32, 64, 64, 64, 4, 2), 128: AttentionBwdConfig(32, 64, 64, 32, 4, 1),
                   256: AttentionBwdConfig(32, 32, 32, 32, 4, 1)},
    decode={64: DecodeConfig(64, 4, 2), 128: DecodeConfig(64, 4, 2), 256: DecodeConfig(32, 4, 2)},
    tolerated_spills=frozenset({"attention_acc16-256", "attention_bwd_softcap-256"}))
# Intel Xe2 (SIMD16 sub-groups, DPAS 8x16x16, 128 KB SLM): the masked-pointer path of triton-xpu 3.3 has no 2D
# block loads, so operands go through registers (256 GRF in large-GRF mode); moderate tiles. Compiled offline only:
# no Xe2 device is reachable to time them.
XE2 = ConfigTable(
    attention={64: AttentionConfig(64, 64, 4, 1), 128: AttentionConfig(64, 32, 4, 1),
               256: AttentionConfig(32, 32, 4, 1)},
    converting_v={},
    gemm={2: GemmConfig(128, 128, 32, 8, 1), 4: GemmConfig(128, 128, 32, 8, 1)},
    attention_bwd={64: AttentionBwdConfig(32, 64, 64, 32, 4, 1), 128: AttentionBwdConfig(32, 32, 32, 32, 4, 1),
                   256: AttentionBwdConfig(16, 32, 32, 16, 4, 1)},
    decode={64: DecodeConfig(32, 4, 1), 128: DecodeConfig(32, 4, 1), 256: DecodeConfig(16, 4, 1)})
# Interpreted: small tiles so the CPU run is quick and tests at S = 17, 129 cross several tiles, the diagonal and
# the tails.
ATTENTION_INTERPRETED = AttentionConfig(32, 16, 4, 1)
ATTENTION_BWD_INTERPRETED = AttentionBwdConfig(16, 32, 32, 16, 4, 1)
GEMM_INTERPRETED = GemmConfig(32, 32, 32, 4, 1, group_m=2)
DECODE_INTERPRETED = DecodeConfig(32, 4, 1, max_block_m=32, preload_ids=1024)
# several K slices per column block even at the tests' small K, so the arrival counter and the sum run in CI
SKINNY_INTERPRETED = SkinnyGemmConfig(32, 32, 4, 1, programs_per_sm=8, min_k_steps=1)


def table_for(target: Target | None) -> ConfigTable:
    """The family a target belongs to, by backend and shared memory; no target (XPU, or unknown): Hopper's."""
    if target is None:
        return HOPPER
    if target.backend == "hip":
        return CDNA
    if target.backend == "xpu":
        return XE2
    if target.smem >= 200 * 1024:
        return HOPPER
    if target.smem >= 160 * 1024:
        return AMPERE
    return BLACKWELL_CONSUMER if isinstance(target.arch, int) and target.arch >= 120 else ADA


def attention_config(head_dim: int, recipe: AttentionRecipe, target: Target | None = None,
                     interpret: bool = INTERPRET) -> AttentionConfig:
    if interpret:
        return ATTENTION_INTERPRETED
    table = table_for(target)
    if recipe.converts_v and head_dim in table.converting_v:
        return table.converting_v[head_dim]
    return table.attention[head_dim]


def attention_bwd_config(head_dim: int, target: Target | None = None,
                         interpret: bool = INTERPRET) -> AttentionBwdConfig:
    return ATTENTION_BWD_INTERPRETED if interpret else table_for(target).attention_bwd[head_dim]


def decode_config(head_dim: int, target: Target | None = None, interpret: bool = INTERPRET, *, pairs: int = 0,
                  sms: int = 0) -> DecodeConfig:
    """The split-KV kernel's config for a call over `pairs` (sequence, kv head) pairs on a GPU of `sms` SMs: the
    table's `decode_many` one where there are more pairs than the `decode` one has resident programs (so each pair
    takes one key split, in several waves; row blocks are not counted), else the `decode` one."""
    if interpret:
        return DECODE_INTERPRETED
    table = table_for(target)
    cfg = table.decode[head_dim]
    many = table.decode_many.get(head_dim)
    return many if many is not None and 0 < sms * cfg.programs_per_sm < pairs else cfg


def skinny_gemm_config(target: Target | None = None, interpret: bool = INTERPRET, *, rows: int = 1, n: int = 0,
                       k: int = 0, sms: int = 0) -> SkinnyGemmConfig:
    """The few-row GEMM's config for a `rows` x `n` x `k` call on `sms` SMs: where `skinny` would split K (the
    weight's column blocks alone do not fill the SMs), the table's `skinny_wide_rows` if its narrower blocks fill
    them unsplit (no partials, no counters, so no counter fill under CUDA-graph capture), else its `skinny_rows`
    for more than SKINNY_FEW_ROWS rows; otherwise `skinny`. Measured on the H100, CUDA-graph replay with the
    weights rotated through 4x the L2 (as a decode step's layers read theirs), x torch.matmul: unsplit 32 x
    256-deep steps 1.02 / 1.04 / 0.90 at 1 / 16 / 32 rows on Llama-8B's 4096 x 4096 weight (split 128 x 128 with
    its fill: 0.91 at 1 row), 0.90 / 0.94 / 0.92 on 6144 x 4096 (0.87 at 1 row), 0.98-1.00 on 4096 x 14336
    (benchmarks/results/h100/2026-12-06/22-even-keys-skinny-l2). With one 4096 x 4096 weight left in L2 between
    replays, the 1-row split is ahead (0.88 against 0.74): a microbenchmark's case, not a model's. The 28672-wide
    weight needs no K split: 128 x 128 (run 19: 0.97 against the unsplit 0.93). Symbolic sizes (a traced call)
    take `skinny`; the real call resolves again."""
    if interpret:
        return SKINNY_INTERPRETED
    table = table_for(target)
    concrete = all(type(x) is int for x in (rows, n, k))  # a traced call's symbolic sizes add no guard here
    if table.skinny_rows is not None and concrete and sms > 0 and table.skinny.slices(n, k, sms) > 1:
        wide = table.skinny_wide_rows
        if wide is not None and -(-n // wide.block_n) >= SKINNY_WIDE_FILL * sms:
            return wide
        if rows > SKINNY_FEW_ROWS:
            return table.skinny_rows
    return table.skinny


def gemm_config(out_dtype: torch.dtype, target: Target | None = None, interpret: bool = INTERPRET) -> GemmConfig:
    return GEMM_INTERPRETED if interpret else table_for(target).gemm[out_dtype.itemsize]
