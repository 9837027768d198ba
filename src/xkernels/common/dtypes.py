"""The dtype maps every layer uses: torch -> Triton `tl`, torch -> Gluon `gl`, and short names for reports."""

from __future__ import annotations

import functools

import torch
import triton.language as tl

SHORT_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
POINTER_TYPE = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def gl_dtype(dtype: torch.dtype):
    """The Gluon dtype (imported on use: Gluon exists only in triton >= 3.5)."""
    from triton.experimental.gluon import language as gl

    return {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[dtype]


@functools.cache
def smem_layout(block: tuple[int, ...], dtype: torch.dtype):
    """The default NVMMA shared layout of a TMA box of `dtype`, for host descriptors: built once per (box, dtype)
    (`get_default_for` costs ~5 us of host time, and a backward call builds eight descriptors)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(dtype))
