"""What the portable kernels need from their surroundings: interpreter mode, descriptor scratch, TMA-ready layouts."""

from __future__ import annotations

import functools
import os

import torch
import triton

# triton decides at decoration time whether @triton.jit interprets; read the switch the same way, once.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _install_allocator() -> None:
    # In-kernel tensor descriptors need a little global scratch per program on GPUs that materialize them (Hopper TMA).
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def prepare_device(t: torch.Tensor, name: str) -> None:
    """Fail loudly where the kernels cannot run, rather than fall back to something else."""
    if t.device.type == "cpu":
        if not INTERPRET:
            raise ValueError(f"{name} is on the CPU: xkernels runs CPU tensors only through the Triton interpreter "
                             "(set TRITON_INTERPRET=1 before importing xkernels)")
        return
    if t.device.type == "cuda":
        _install_allocator()


def tma_ready(t: torch.Tensor) -> bool:
    """Descriptors need a 16-byte aligned base, unit last stride and 16-byte aligned other strides."""
    es = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all((s * es) % 16 == 0 for s in t.stride()[:-1]))


def _padded_cols(cols: int, dtype: torch.dtype) -> int:
    mult = 16 // dtype.itemsize
    return -(-cols // mult) * mult


def tma_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy whose last dim is zero-padded to a 16-byte multiple (zeros add nothing to a dot product)."""
    cols = t.shape[-1]
    out = torch.zeros((*t.shape[:-1], _padded_cols(cols, t.dtype)), dtype=t.dtype, device=t.device)
    out[..., :cols] = t
    return out


def tma_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized output with its last dim padded like `tma_copy` (the kernel writes [..., :shape[-1]])."""
    return torch.empty((*shape[:-1], _padded_cols(shape[-1], dtype)), dtype=dtype, device=device)
