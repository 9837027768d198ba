"""Tile loads and stores of the portable kernels without tensor descriptors: masked pointer loads of one [ROWS, COLS]
tile of a row-major matrix (unit column stride), zero past its bounds, and the matching clipped store.

The kernels use descriptors where Triton has them (TMA on Hopper, bounds-checked block loads elsewhere) and these
where it has not (`runtime.TENSOR_DESCRIPTORS`: the Intel backend, triton-xpu 3.3, for Xe2).
"""

import triton
import triton.language as tl


def __getattr__(name: str):
    """`tiles.make_tensor_descriptor` is `tl.make_tensor_descriptor`, looked up on each use (the interpreter swaps
    triton.language's builtins while a kernel runs), or a constexpr None where Triton lacks it: the kernels call it
    only when their DESCRIPTORS constexpr is set, but older Triton resolves every attribute of a kernel's source
    when hashing it."""
    if name == "make_tensor_descriptor":
        return getattr(tl, name, None) or tl.constexpr(None)
    raise AttributeError(name)


@triton.jit
def load_tile(base, row0, col0, n_rows, n_cols, row_stride, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = row0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, COLS)
    keep = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(base + rows[:, None] * row_stride + cols[None, :], mask=keep, other=0.0)


@triton.jit
def store_tile(base, row0, col0, n_rows, n_cols, row_stride, value, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = row0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, COLS)
    keep = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(base + rows[:, None] * row_stride + cols[None, :], value, mask=keep)
