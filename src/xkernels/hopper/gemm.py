"""Persistent warp-specialized GEMM for Hopper: a TMA producer warp feeding async wgmma through a split-barrier ring.

One CTA per SM walks output tiles in the selectable order (row, grouped, Z-order: `common/tile_walk.py`, shared with
the portable kernel). Its partitions run concurrently:
  - loader (1 warp, few registers): for every tile and k-step, acquire a free ring stage, TMA A and B into it;
  - MMA + epilogue (2 consumer warpgroups, 64 rows of the 128-row tile each, or one on a 64-row tile): wait for a
    stage, issue async wgmma, and release the previous stage once its wgmma has retired.
  - row split (ROW_WGS > 1): ROW_WGS such partitions of one warpgroup share each tile, 64 rows each (3: 192-row
    tiles, which Gluon's power-of-two tensor shapes allow only as separate partitions); a stage holds ROW_WGS A boxes
    and one B box, and is free once every partition's wgmma reading it retired.
  - ping-pong (CONSUMERS == 2): two such partitions take the CTA's work units in turn; while one converts and stores
    its tile (or sums split-K partials), the other's main loop keeps the tensor cores busy.
Split-barrier windows (arrive -> independent work -> wait):
  - the loader runs up to STAGES k-steps ahead, so the next tile's loads land during this tile's epilogue;
  - the epilogue's TMA store is waited on only before the next epilogue reuses its buffer (`tma.store_wait`), so
    the store of tile i drains while tile i+1's main loop runs.
B is read as [K, N] or, for the "nk" layout, as [N, K] tiles viewed transposed in shared memory: no copy. The
barriers are listed in `hopper/barriers.py`.

Split-K (SPLIT_K > 1, for outputs of too few tiles to fill the SMs, e.g. a few hundred rows against a Llama weight):
each output tile is SPLIT_K work units over consecutive K ranges, whose fp32 partials `partials.reduce_parts` sums
in split order (bitwise repeatable) in the unit that arrives last, which writes C. The last arriver stores and
reloads nothing of its own: half the fix-up's traffic at two splits (2560^3 on 128 x 256 tiles: 97 us against 153
when every unit stored and the last reloaded all, benchmarks/results/h100/2026-12-07/37-views-bwd-split-fixup).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from xkernels.common.dtypes import smem_layout
from xkernels.common.runtime import sm_count
from xkernels.common.tile_walk import tile_coords, zorder_grid
from xkernels.hopper import tma
from xkernels.hopper.barriers import gemm_barriers
from xkernels.hopper.configs import HopperGemmConfig
from xkernels.hopper.partials import reduce_parts

# registers per thread of the second consumer partition (a 64 x 128 fp32 accumulator is 64 of them); the first
# consumer gets what the loader and this one leave of the register file
PINGPONG_WORKER_REGS = gl.constexpr(232)
# registers per thread of the two worker partitions of a 3-warpgroup row split (a 64 x 128 fp32 accumulator is 64 of
# them): 3 x 128 threads x 160 and the loader's warp fit the 64K register file
ROW_WG_WORKER_REGS = gl.constexpr(160)


@gluon.jit
def _load_stage(a_desc, b_desc, a_bufs, ring, s, off_m, off_n, k, B_NK: gl.constexpr, ROW_WGS: gl.constexpr):
    """Arm stage s's ready barrier with the bytes of its ROW_WGS A boxes and its B box, then start their TMA copies
    onto it."""
    A_ROWS: gl.constexpr = a_desc.block_type.shape[0]
    bar = ring.ready.index(s)
    mbarrier.expect(bar, ROW_WGS * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    for w in gl.static_range(ROW_WGS):
        tma.async_load(a_desc, [off_m + w * A_ROWS, k], bar, a_bufs.index(s * ROW_WGS + w))
    if B_NK:
        tma.async_load(b_desc, [off_n, k], bar, ring.bufs.index(s))
    else:
        tma.async_load(b_desc, [k, off_n], bar, ring.bufs.index(s))


@gluon.jit
def _k_range(unit, K, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr):
    """(output tile's walk index, split, first K, end K) of a work unit: split j of a tile covers k-steps
    [j * per, (j + 1) * per) with per = ceil(k-steps / SPLIT_K) (`launch_spec` keeps every split non-empty)."""
    if SPLIT_K == 1:
        return unit, 0, 0, K
    per = gl.cdiv(gl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    split = unit % SPLIT_K
    k_lo = split * per
    return unit // SPLIT_K, split, k_lo, gl.minimum(K, k_lo + per)


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, ring, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK: gl.constexpr,
            WALK: gl.constexpr, GROUP_M: gl.constexpr, SPLIT_K: gl.constexpr, ROW_WGS: gl.constexpr):
    BLOCK_M: gl.constexpr = ROW_WGS * a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_NK else b_desc.block_type.shape[1]
    it = 0
    for unit in range(gl.program_id(0), walk_len * SPLIT_K, gl.num_programs(0)):
        tile, _, k_lo, k_hi = _k_range(unit, K, BLOCK_K, SPLIT_K)
        tile_m, tile_n = tile_coords(tile, tiles_m, tiles_n, z_bits, z_tall, WALK, GROUP_M)
        if (tile_m < tiles_m) & (tile_n < tiles_n):  # Z-order walks a power-of-two grid
            for k in range(k_lo, k_hi, BLOCK_K):
                s = ring.acquire(it)
                _load_stage(a_desc, b_desc, a_bufs, ring, s, tile_m * BLOCK_M, tile_n * BLOCK_N, k, B_NK, ROW_WGS)
                it += 1


@gluon.jit
def _mma_epilogue(a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len, z_bits,
                  z_tall, B_NK: gl.constexpr, WALK: gl.constexpr, GROUP_M: gl.constexpr, ACC_FP16: gl.constexpr,
                  SPLIT_K: gl.constexpr, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr, ROW_WG: gl.constexpr,
                  ROW_WGS: gl.constexpr, WARPS: gl.constexpr):
    """Consumer partition CONSUMER of CONSUMERS: the work units n of this CTA with n % CONSUMERS == CONSUMER (main
    loop, then epilogue), rows [ROW_WG * A_ROWS, (ROW_WG + 1) * A_ROWS) of each tile (every row with ROW_WGS == 1).
    Every consumer counts every unit's k-steps, so it knows the ring positions of its own.
    With two, the main loops take turns (`turns`): a ring wait tells its stage's laps apart by parity only, so a
    consumer may wait for a stage only within one lap of what the loader has filled, that is, after the other
    consumer's waits for the unit before have passed."""
    STAGES: gl.constexpr = ring.bufs.shape[0]
    A_ROWS: gl.constexpr = c_desc.block_type.shape[0]  # this partition's rows of a tile
    BLOCK_M: gl.constexpr = ROW_WGS * A_ROWS
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    out = c_smem.index(CONSUMER * ROW_WGS + ROW_WG)
    it = 0  # ring position of the next unit's first k-step (the loader's count)
    n = 0  # this CTA's units so far
    for unit in range(gl.program_id(0), walk_len * SPLIT_K, gl.num_programs(0)):
        tile, split, k_lo, k_hi = _k_range(unit, K, BLOCK_K, SPLIT_K)
        tile_m, tile_n = tile_coords(tile, tiles_m, tiles_n, z_bits, z_tall, WALK, GROUP_M)
        if (tile_m < tiles_m) & (tile_n < tiles_n):
            steps = gl.cdiv(k_hi - k_lo, BLOCK_K)
            if n % CONSUMERS == CONSUMER:
                if (CONSUMERS == 2) & (n > 0):
                    mbarrier.wait(turns.index(CONSUMER), ((n - 1) // 2) & 1)  # the other's unit n - 1 has waited
                acc = warpgroup_mma_init(gl.zeros((A_ROWS, BLOCK_N), dtype=gl.float16 if ACC_FP16 else gl.float32,
                                                  layout=acc_layout))
                for j in range(steps):
                    s = ring.wait(it + j)
                    if B_NK:
                        b_tile = ring.bufs.index(s).permute((1, 0))
                    else:
                        b_tile = ring.bufs.index(s)
                    acc = warpgroup_mma(a_bufs.index(s * ROW_WGS + ROW_WG), b_tile, acc, is_async=True)
                    # keep one wgmma in flight: the one before it has retired, so its stage goes back to the loader
                    # (once every row partition has released it)
                    warpgroup_mma_wait(1, deps=(acc,))
                    ring.release(it + j + STAGES - 1, pred=j > 0)
                if CONSUMERS == 2:
                    # every stage of this unit has landed: the other consumer's next unit may wait for its stages;
                    # its main loop runs from here on while this one retires its wgmmas and stores the tile
                    mbarrier.arrive(turns.index(1 - CONSUMER))
                acc = warpgroup_mma_wait(0, deps=(acc,))
                ring.release(it + steps + STAGES - 1)
                write = True
                if SPLIT_K > 1:
                    write, acc = reduce_parts(acc, WS, CNT, tile_m * tiles_n + tile_n, split, SPLIT_K)
                if write:
                    # this consumer's previous TMA store overlapped the main loops since; wait for it only now
                    # that its buffer is about to be overwritten
                    tma.store_wait(0)
                    out.store(acc.to(c_desc.dtype))
                    fence_async_shared()
                    tma.async_store(c_desc, [tile_m * BLOCK_M + ROW_WG * A_ROWS, tile_n * BLOCK_N], out)
            it += steps
            n += 1
    tma.store_wait(0)


@gluon.jit
def persistent_gemm_kernel(a_desc, b_desc, c_desc, WS, CNT, K, tiles_m, tiles_n, walk_len, z_bits, z_tall,
                           B_NK: gl.constexpr, WALK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                           ACC_FP16: gl.constexpr, SPLIT_K: gl.constexpr, CONSUMERS: gl.constexpr,
                           ROW_WGS: gl.constexpr, num_warps: gl.constexpr):
    """WS, CNT: the split-K workspace (fp32 partials, int32 arrival counters at zero); unread when SPLIT_K == 1.
    CONSUMERS == 2 (ping-pong): two consumer partitions of num_warps warps take this CTA's work units in turn, so
    one's epilogue (and split-K fix-up) runs under the other's main loop. ROW_WGS > 1: that many one-warpgroup
    partitions share each tile, a_desc's and c_desc's box rows each."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * ROW_WGS] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS * ROW_WGS] + c_desc.block_type.shape, c_desc.layout)
    ring, turns = gemm_barriers(b_bufs, ROW_WGS)  # one ring (A and B boxes share its barriers); consumers' turns
    # the partitions are spelled out per consumer and row-warpgroup count: warp_specialize takes a literal list (and
    # a tuple cannot carry the string constexpr WALK)
    if ROW_WGS == 3:
        gl.static_assert(CONSUMERS == 1, "row-split tiles have one consumer per row warpgroup")
        gl.warp_specialize([
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, 0, 1, 0, 3, num_warps)),
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, 0, 1, 1, 3, num_warps)),
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, 0, 1, 2, 3, num_warps)),
            (_loader, (a_desc, b_desc, a_bufs, ring, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK, WALK,
                       GROUP_M, SPLIT_K, ROW_WGS)),
        ], [num_warps, num_warps, 1], [ROW_WG_WORKER_REGS, ROW_WG_WORKER_REGS, 24])
    elif CONSUMERS * ROW_WGS == 2:  # two partitions: ping-pong consumers, or two row warpgroups of each tile
        gl.warp_specialize([
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, 0, CONSUMERS, 0, ROW_WGS,
                             num_warps)),
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, CONSUMERS - 1, CONSUMERS,
                             ROW_WGS - 1, ROW_WGS, num_warps)),
            (_loader, (a_desc, b_desc, a_bufs, ring, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK, WALK,
                       GROUP_M, SPLIT_K, ROW_WGS)),
        ], [num_warps, 1], [PINGPONG_WORKER_REGS, 24])
    else:
        gl.static_assert((CONSUMERS == 1) & (ROW_WGS == 1), "1 or 2 consumers, 1 to 3 row warpgroups, not both")
        gl.warp_specialize([
            (_mma_epilogue, (a_desc, c_desc, a_bufs, ring, c_smem, turns, WS, CNT, K, tiles_m, tiles_n, walk_len,
                             z_bits, z_tall, B_NK, WALK, GROUP_M, ACC_FP16, SPLIT_K, 0, 1, 0, 1, num_warps)),
            (_loader, (a_desc, b_desc, a_bufs, ring, K, tiles_m, tiles_n, walk_len, z_bits, z_tall, B_NK, WALK,
                       GROUP_M, SPLIT_K, ROW_WGS)),
        ], [1], [24])


def launch_spec(m: int, n: int, k: int, *, b_layout: str, walk: str, cfg: HopperGemmConfig,
                device_index: int) -> tuple[int, tuple[int, ...], dict[str, object], dict[str, int]]:
    """(grid, runtime ints after the three descriptors and the split-K workspace, constexprs, launch options): one
    CTA per SM at most."""
    tiles_m, tiles_n = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    walk_len, z_bits, z_tall = zorder_grid(tiles_m, tiles_n) if walk == "zorder" else (tiles_m * tiles_n, 0, 0)
    k_steps = triton.cdiv(k, cfg.block_k)
    if cfg.split_k > 1 and (triton.cdiv(k_steps, cfg.split_k) * (cfg.split_k - 1) >= k_steps):
        raise ValueError(f"config: split_k={cfg.split_k} leaves a split of K={k} empty "
                         f"({k_steps} steps of {cfg.block_k})")
    grid = min(sm_count(device_index), tiles_m * tiles_n * cfg.split_k)
    constexprs = cfg.constexprs(b_layout, walk)
    return grid, (k, tiles_m, tiles_n, walk_len, z_bits, z_tall), constexprs, {}


def descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, b_layout: str, cfg: HopperGemmConfig) -> list:
    """Host TMA descriptors of the logical 2-D A, B and C, to compile against (launches re-encode only the address:
    `common.launch.DescriptorSlot`)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return [TensorDescriptor.from_tensor(t, block, smem_layout(tuple(block), t.dtype))
            for t, block in zip((a, b, c), cfg.blocks(b_layout), strict=True)]
