"""Persistent warp-specialized GEMM for Hopper: a TMA producer warp feeding async wgmma through a split-barrier ring.

One CTA per SM walks output tiles in the selectable order (row, grouped, Z-order: `portable/tile_walk.py`, shared with
the portable kernel). Two partitions run concurrently:
  - loader (1 warp, few registers): for every tile and k-step, acquire a free ring stage, TMA A and B into it;
  - MMA + epilogue (2 consumer warpgroups, 64 rows of the 128-row tile each): wait for a stage, issue async wgmma,
    and release the previous stage once its wgmma has retired.
Split-barrier windows (arrive -> independent work -> wait):
  - the loader runs up to STAGES k-steps ahead, so the next tile's loads land during this tile's epilogue;
  - the epilogue's TMA store is waited on only before the next epilogue reuses its buffer (`tma.store_wait`), so
    the store of tile i drains while tile i+1's main loop runs.
B is read as [K, N] or, for the "nk" layout, as [N, K] tiles viewed transposed in shared memory: no copy.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
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
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from xkernels.hopper.pipeline import allocate_ring, consumer_release, consumer_wait, producer_acquire
from xkernels.hopper.runtime import sm_count
from xkernels.portable.tile_walk import tile_coords, zorder_grid


@gluon.jit
def _load_stage(a_desc, b_desc, a_ring, b_ring, full, s, off_m, off_n, k, B_NK: gl.constexpr):
    """Arm stage s's full barrier with the bytes of both tiles, then start their TMA copies onto it."""
    mbarrier.expect(full.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [off_m, k], full.index(s), a_ring.index(s))
    if B_NK:
        tma.async_copy_global_to_shared(b_desc, [off_n, k], full.index(s), b_ring.index(s))
    else:
        tma.async_copy_global_to_shared(b_desc, [k, off_n], full.index(s), b_ring.index(s))


@gluon.jit
def _loader(a_desc, b_desc, a_ring, b_ring, full, empty, K, tiles_m, tiles_n, walk_len, z_bits, z_tall,
            B_NK: gl.constexpr, WALK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_NK else b_desc.block_type.shape[1]
    it = 0
    for tile in range(gl.program_id(0), walk_len, gl.num_programs(0)):
        tile_m, tile_n = tile_coords(tile, tiles_m, tiles_n, z_bits, z_tall, WALK, GROUP_M)
        if (tile_m < tiles_m) & (tile_n < tiles_n):  # Z-order walks a power-of-two grid
            for k in range(0, K, BLOCK_K):
                s = producer_acquire(empty, it, STAGES)
                _load_stage(a_desc, b_desc, a_ring, b_ring, full, s, tile_m * BLOCK_M, tile_n * BLOCK_N, k, B_NK)
                it += 1


@gluon.jit
def _mma_epilogue(a_desc, b_desc, c_desc, a_ring, b_ring, c_smem, full, empty, K, tiles_m, tiles_n, walk_len,
                  z_bits, z_tall, B_NK: gl.constexpr, WALK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                  ACC_FP16: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    it = 0
    for tile in range(gl.program_id(0), walk_len, gl.num_programs(0)):
        tile_m, tile_n = tile_coords(tile, tiles_m, tiles_n, z_bits, z_tall, WALK, GROUP_M)
        if (tile_m < tiles_m) & (tile_n < tiles_n):
            acc = warpgroup_mma_init(gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float16 if ACC_FP16 else gl.float32,
                                              layout=acc_layout))
            first = it
            for _ in range(gl.cdiv(K, BLOCK_K)):
                s = consumer_wait(full, it, STAGES)
                if B_NK:
                    b_tile = b_ring.index(s).permute((1, 0))
                else:
                    b_tile = b_ring.index(s)
                acc = warpgroup_mma(a_ring.index(s), b_tile, acc, is_async=True)
                # keep one wgmma in flight: the one before it has retired, so its stage goes back to the loader
                warpgroup_mma_wait(1, deps=(acc,))
                consumer_release(empty, it + STAGES - 1, STAGES, pred=it > first)
                it += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            consumer_release(empty, it + STAGES - 1, STAGES)
            # the previous tile's TMA store overlapped this tile's main loop; wait for it only now that c_smem is
            # about to be overwritten
            tma.store_wait(0)
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [tile_m * BLOCK_M, tile_n * BLOCK_N], c_smem)
    tma.store_wait(0)


@gluon.jit
def persistent_gemm_kernel(a_desc, b_desc, c_desc, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK: gl.constexpr,
                           WALK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, ACC_FP16: gl.constexpr,
                           num_warps: gl.constexpr):
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    full, empty = allocate_ring(STAGES)
    gl.warp_specialize([
        (_mma_epilogue, (a_desc, b_desc, c_desc, a_ring, b_ring, c_smem, full, empty, K, tiles_m, tiles_n, walk_len,
                         z_bits, z_tall, B_NK, WALK, GROUP_M, STAGES, ACC_FP16, num_warps)),
        (_loader, (a_desc, b_desc, a_ring, b_ring, full, empty, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK,
                   WALK, GROUP_M, STAGES)),
    ], [1], [24])


@dataclass(frozen=True)
class HopperGemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    num_warps: int = 8  # two consumer warpgroups: 64 x 256 fp32 accumulator rows each, 128 registers
    group_m: int = 8
    acc_fp16: bool = False  # the seeds' fp16-accumulate variant (fp16 inputs only): an ablation, off the contract

    def __str__(self) -> str:
        acc = "-acc16" if self.acc_fp16 else ""
        return f"BM{self.block_m}-BN{self.block_n}-BK{self.block_k}-S{self.stages}-W{self.num_warps}{acc}"


CONFIG = HopperGemmConfig()
_GL_DTYPE = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


_DESCS: OrderedDict = OrderedDict()


@functools.cache
def _smem_layout(block: tuple[int, ...], dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPE[dtype])


def _desc(t: torch.Tensor, block: list[int]):
    """A TMA descriptor, cached: it encodes only address, shape, strides, dtype and box, so an equal key gives an equal
    descriptor even for a new tensor at a reused address. Saves host time on every repeated call."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, tuple(block))
    d = _DESCS.get(key)
    if d is None:
        d = TensorDescriptor.from_tensor(t, block, _smem_layout(tuple(block), t.dtype))
        _DESCS[key] = d
        if len(_DESCS) > 64:
            _DESCS.popitem(last=False)
    return d


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, m: int, n: int, k: int, *, b_layout: str, walk: str,
         cfg: HopperGemmConfig = CONFIG) -> HopperGemmConfig:
    """c[:m, :n] = a @ b (or a @ b^T for "nk") on 2-D, descriptor-ready tensors (last dims may be zero-padded)."""
    if cfg.acc_fp16 and a.dtype != torch.float16:
        raise ValueError("acc_fp16: wgmma accumulates bf16 products in fp32 only")
    a_desc = _desc(a[:m, :k] if a.shape[1] != k else a, [cfg.block_m, cfg.block_k])
    b_logical = b[:n, :k] if b_layout == "nk" else b[:k, :n]
    b_desc = _desc(b_logical, [cfg.block_n, cfg.block_k] if b_layout == "nk" else [cfg.block_k, cfg.block_n])
    c_desc = _desc(c[:m, :n], [cfg.block_m, cfg.block_n])
    tiles_m, tiles_n = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    walk_len, z_bits, z_tall = zorder_grid(tiles_m, tiles_n) if walk == "zorder" else (tiles_m * tiles_n, 0, 0)
    persistent_gemm_kernel[(min(sm_count(a.device.index), tiles_m * tiles_n),)](
        a_desc, b_desc, c_desc, k, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK=b_layout == "nk", WALK=walk,
        GROUP_M=cfg.group_m, STAGES=cfg.stages, ACC_FP16=cfg.acc_fp16, num_warps=cfg.num_warps)
    return cfg
