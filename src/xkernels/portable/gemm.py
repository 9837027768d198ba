"""Portable GEMM: C = A @ B with B as [K, N] or [N, K] (the seeds' "gather" layout, read without a transpose copy).

One program per output tile, placed by the selectable walk order; fp32 accumulation; tails come from descriptor
bounds (loads past the edge read zeros, stores past it are clipped), or from masks where Triton has no descriptors
(`portable/tiles.py`). A leading batch axis folds into the program id.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.common.tile_walk import tile_coords, zorder_grid
from xkernels.portable import tiles
from xkernels.portable.configs import GemmConfig
from xkernels.portable.dot import mma
from xkernels.portable.tiles import load_tile, store_tile


# M, N and K are specialized (divisible by 16 or not): on targets without TMA the descriptor loads vectorize (16-byte
# loads, cp.async on sm_80) only when the bounds are known to be multiples of 16
@triton.jit(do_not_specialize=["programs"])
def gemm_kernel(A, B, C, M, N, K, a_sb, a_sm, b_sb, b_s0, c_sb, c_sm, programs, z_bits, z_tall,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, B_NK: tl.constexpr,
                WALK: tl.constexpr, GROUP_M: tl.constexpr, DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # one grid axis (CUDA caps the others at 65535): the batch index is the slow part of the program id
    tile_m, tile_n = tile_coords(tl.program_id(0) % programs, tiles_m, tiles_n, z_bits, z_tall, WALK, GROUP_M)
    if (tile_m < tiles_m) & (tile_n < tiles_n):  # Z-order launches a power-of-two grid; the rest do nothing
        batch = (tl.program_id(0) // programs).to(tl.int64)
        off_m = tile_m * BLOCK_M
        off_n = tile_n * BLOCK_N
        a_base, b_base, c_base = A + batch * a_sb, B + batch * b_sb, C + batch * c_sb
        if DESCRIPTORS:
            a_desc = tiles.make_tensor_descriptor(a_base, shape=[M, K], strides=[a_sm, 1],
                                                  block_shape=[BLOCK_M, BLOCK_K])
            if B_NK:
                b_desc = tiles.make_tensor_descriptor(b_base, shape=[N, K], strides=[b_s0, 1],
                                                   block_shape=[BLOCK_N, BLOCK_K])
            else:
                b_desc = tiles.make_tensor_descriptor(b_base, shape=[K, N], strides=[b_s0, 1],
                                                   block_shape=[BLOCK_K, BLOCK_N])
            c_desc = tiles.make_tensor_descriptor(c_base, shape=[M, N], strides=[c_sm, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in tl.range(0, K, BLOCK_K):
            if DESCRIPTORS:
                a = a_desc.load([off_m, k])
                if B_NK:
                    b = tl.trans(b_desc.load([off_n, k]))
                else:
                    b = b_desc.load([k, off_n])
            else:
                a = load_tile(a_base, off_m, k, M, K, a_sm, BLOCK_M, BLOCK_K)
                if B_NK:
                    b = tl.trans(load_tile(b_base, off_n, k, N, K, b_s0, BLOCK_N, BLOCK_K))
                else:
                    b = load_tile(b_base, k, off_n, K, N, b_s0, BLOCK_K, BLOCK_N)
            acc = mma(a, b, acc, INTERPRET)
        c = acc.to(C.dtype.element_ty)
        if DESCRIPTORS:
            c_desc.store([off_m, off_n], c)
        else:
            store_tile(c_base, off_m, off_n, M, N, c_sm, c, BLOCK_M, BLOCK_N)


def launch_spec(batch: int, m: int, n: int, *, b_layout: str, walk: str,
                cfg: GemmConfig) -> tuple[int, tuple[int, int, int], dict[str, object], dict[str, int]]:
    """(grid, (programs, z_bits, z_tall), constexprs, launch options) for `gemm_kernel` with the config `select`
    chose."""
    tiles_m, tiles_n = triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n)
    walk_args = zorder_grid(tiles_m, tiles_n) if walk == "zorder" else (tiles_m * tiles_n, 0, 0)
    return walk_args[0] * batch, walk_args, cfg.constexprs(b_layout, walk), cfg.options()
