"""Tile configs of the portable kernels: a pure function of the problem (and of interpreter mode)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xkernels.common.runtime import INTERPRET


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

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

    def __str__(self) -> str:
        return f"BM{self.block_m}-BN{self.block_n}-BK{self.block_k}-W{self.num_warps}-S{self.num_stages}"


# Compiled: Hopper-sized tiles checked spill-free by `xkernels inspect`. Interpreted: small tiles so the CPU run is
# quick and tests at S = 17, 129 cross several tiles, the diagonal and the tails.
ATTENTION_CONFIGS = {64: AttentionConfig(128, 128, 8, 3), 128: AttentionConfig(128, 128, 8, 3),
                     256: AttentionConfig(128, 64, 8, 2)}
ATTENTION_INTERPRETED = AttentionConfig(32, 16, 4, 1)
# By output element size: a 128x256 fp32 C tile plus three A/B stages would overflow 227 KB of shared memory.
GEMM_CONFIGS = {2: GemmConfig(128, 256, 64, 8, 3), 4: GemmConfig(128, 128, 64, 8, 3)}
GEMM_INTERPRETED = GemmConfig(32, 32, 32, 4, 1, group_m=2)


def attention_config(head_dim: int) -> AttentionConfig:
    return ATTENTION_INTERPRETED if INTERPRET else ATTENTION_CONFIGS[head_dim]


def gemm_config(out_dtype: torch.dtype) -> GemmConfig:
    return GEMM_INTERPRETED if INTERPRET else GEMM_CONFIGS[out_dtype.itemsize]
