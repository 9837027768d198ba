"""Tile configs of the portable kernels: a pure function of the problem (and of interpreter mode)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xkernels.common.dtypes import TL_DTYPE
from xkernels.common.runtime import INTERPRET
from xkernels.recipes import AttentionRecipe


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def constexprs(self, head_dim: int, recipe: AttentionRecipe, *, causal: bool, write_lse: bool,
                   interpret: bool = INTERPRET) -> dict[str, object]:
        """`attention_fwd_kernel`'s compile-time arguments: one mapping for the launch and for `inspect`."""
        return dict(HEAD_DIM=head_dim, BLOCK_M=self.block_m, BLOCK_N=self.block_n, CAUSAL=causal,
                    PV_DTYPE=TL_DTYPE[recipe.pv_dtype], WRITE_LSE=write_lse, INTERPRET=interpret)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-W{self.num_warps}-S{self.num_stages}"


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
                    WALK=walk, GROUP_M=self.group_m, INTERPRET=interpret)

    def options(self) -> dict[str, int]:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-BK{self.block_k}-W{self.num_warps}-S{self.num_stages}"


# Compiled: Hopper-sized tiles checked spill-free by `xkernels inspect`. Interpreted: small tiles so the CPU run is
# quick and tests at S = 17, 129 cross several tiles, the diagonal and the tails.
ATTENTION_CONFIGS = {64: AttentionConfig(128, 128, 8, 3), 128: AttentionConfig(128, 128, 8, 3),
                     256: AttentionConfig(128, 64, 8, 2)}
# Recipes that convert V in-kernel (bf16io) hold the converted tile too: at D256 a 64-key tile spills under triton
# 3.7 (8-16 bytes of stack), a 32-key one compiles spill-free under 3.6 and 3.7.
CONVERTING_V_CONFIGS = {256: AttentionConfig(128, 32, 8, 2)}
ATTENTION_INTERPRETED = AttentionConfig(32, 16, 4, 1)
# By output element size: a 128x256 fp32 C tile plus three A/B stages would overflow 227 KB of shared memory.
GEMM_CONFIGS = {2: GemmConfig(128, 256, 64, 8, 3), 4: GemmConfig(128, 128, 64, 8, 3)}
GEMM_INTERPRETED = GemmConfig(32, 32, 32, 4, 1, group_m=2)


def attention_config(head_dim: int, recipe: AttentionRecipe) -> AttentionConfig:
    if INTERPRET:
        return ATTENTION_INTERPRETED
    if recipe.converts_v and head_dim in CONVERTING_V_CONFIGS:
        return CONVERTING_V_CONFIGS[head_dim]
    return ATTENTION_CONFIGS[head_dim]


def gemm_config(out_dtype: torch.dtype) -> GemmConfig:
    return GEMM_INTERPRETED if INTERPRET else GEMM_CONFIGS[out_dtype.itemsize]
