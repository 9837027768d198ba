"""Portable GEMM for few rows (M <= 32: decode-time linear layers): stream B once, at HBM speed, over every SM.

With few rows the product is bound by reading B (the weight), and the tiled kernel's 128 x 256 output tiles leave
most SMs idle (N = 4096: 16 programs). Here a program owns BLOCK_N output columns (all rows) and one slice of K;
there are enough (column block, K slice) programs to keep every SM streaming. Each slice's fp32 partial goes to a
workspace; the program that finishes a column block last (a per-block arrival counter) sums the partials in slice
order, so the result is bitwise repeatable, and writes C. The last arriver also puts its counter back to zero, so
the workspace is zeroed once and kept across calls, one per stream (`common.scratch`; under CUDA-graph capture a
per-call zeroed one from the graph's pool). With one slice the program writes C directly.

Memory order of the arrival: every thread's partial stores, then a CTA barrier, then one acq_rel atomic at GPU scope
(release of the stores the barrier ordered before it); the last arriver's acquire, then a barrier, orders its reads
of the other partials after their stores. Partials are read through L2 (`.cg`), never a stale L1 line.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.portable import tiles
from xkernels.portable.configs import SkinnyGemmConfig
from xkernels.portable.dot import mma
from xkernels.portable.tiles import load_tile, store_tile


@triton.jit
def skinny_gemm_kernel(A, B, C, PARTIALS, ARRIVALS, M, N, K, a_sm, b_s0, c_sm, k_slice,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SLICES: tl.constexpr,
                       B_NK: tl.constexpr, DESCRIPTORS: tl.constexpr, INTERPRET: tl.constexpr,
                       SWAP: tl.constexpr = False):
    # the slices of one column block are adjacent programs: they run together and share A's rows in L2
    tile_n = tl.program_id(0) // SLICES
    part = tl.program_id(0) % SLICES
    off_n = tile_n * BLOCK_N
    k_lo = part * k_slice
    k_hi = tl.minimum(K, k_lo + k_slice)
    if DESCRIPTORS:
        a_desc = tiles.make_tensor_descriptor(A, shape=[M, K], strides=[a_sm, 1], block_shape=[BLOCK_M, BLOCK_K])
        if B_NK:
            b_desc = tiles.make_tensor_descriptor(B, shape=[N, K], strides=[b_s0, 1], block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_desc = tiles.make_tensor_descriptor(B, shape=[K, N], strides=[b_s0, 1], block_shape=[BLOCK_K, BLOCK_N])
    if SWAP:  # C^T = B^T A^T: the weight's columns are the product's rows
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(k_lo, k_hi, BLOCK_K):
        # slices end on BLOCK_K multiples (the last at K, where the bounds give zeros): no step crosses a slice's end
        if DESCRIPTORS:
            a = a_desc.load([0, k])
            if B_NK:
                b = tl.trans(b_desc.load([off_n, k]))
            else:
                b = b_desc.load([k, off_n])
        else:
            a = load_tile(A, 0, k, M, K, a_sm, BLOCK_M, BLOCK_K)
            if B_NK:
                b = tl.trans(load_tile(B, off_n, k, N, K, b_s0, BLOCK_N, BLOCK_K))
            else:
                b = load_tile(B, k, off_n, K, N, b_s0, BLOCK_K, BLOCK_N)
        if SWAP:
            acc = mma(tl.trans(b), tl.trans(a), acc, INTERPRET)
        else:
            acc = mma(a, b, acc, INTERPRET)
    if SWAP:
        acc = tl.trans(acc)
    if SLICES == 1:
        store_tile(C, 0, off_n, M, N, c_sm, acc.to(C.dtype.element_ty), BLOCK_M, BLOCK_N)
    else:
        rows = tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        keep = (rows[:, None] < M) & (cols[None, :] < N)
        at = rows[:, None] * N + cols[None, :]  # PARTIALS: (SLICES, M, N) fp32
        tl.store(PARTIALS + part * M * N + at, acc, mask=keep)
        tl.debug_barrier()
        arrived = tl.atomic_add(ARRIVALS + tile_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SLICES - 1:  # the last slice of this column block: sum all of them in slice order
            tl.debug_barrier()
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in tl.static_range(SLICES):
                total += tl.load(PARTIALS + s * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            tl.store(C + rows[:, None] * c_sm + cols[None, :], total.to(C.dtype.element_ty), mask=keep)
            tl.atomic_xchg(ARRIVALS + tile_n, 0, sem="relaxed", scope="gpu")  # reusable workspace


def block_m(m: int) -> int:
    """The rows' tile: a power of two >= M, at least 16 (a tensor-core product's smallest M)."""
    return max(16, triton.next_power_of_2(m))


def slices(n: int, k: int, cfg: SkinnyGemmConfig, sms: int) -> int:
    """K slices per column block (`SkinnyGemmConfig.slices`)."""
    return cfg.slices(n, k, sms)


def launch_spec(m: int, n: int, k: int, *, b_layout: str, cfg: SkinnyGemmConfig,
                sms: int) -> tuple[int, int, int, dict[str, object], dict[str, int]]:
    """(grid, slices, k_slice, constexprs, launch options) of `skinny_gemm_kernel`; k_slice is a BLOCK_K multiple."""
    parts = slices(n, k, cfg, sms)
    steps = triton.cdiv(triton.cdiv(k, cfg.block_k), parts)
    parts = triton.cdiv(triton.cdiv(k, cfg.block_k), steps)  # no empty slice
    grid = triton.cdiv(n, cfg.block_n) * parts
    return grid, parts, steps * cfg.block_k, cfg.constexprs(block_m(m), parts, b_layout), cfg.options()
