"""Where the kernels run: interpreter mode, device properties, which Triton releases the fast paths were run on, and
the memory layouts tensor descriptors accept."""

from __future__ import annotations

import functools
import os
import threading

import torch
import triton

# triton decides at decoration time whether @triton.jit interprets; read the switch the same way, once.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# The version policy. Gluon's API and Triton's launcher change between releases, so:
#  - the Hopper (Gluon) kernels run, and the direct launcher (common/launch.py, which calls the launcher Triton
#    generates) is used, only on releases they were run on a GPU with (TESTED_TRITON);
#  - CI compiles every Gluon config on the releases in GLUON_COMPILES (`xkernels inspect`), so a release is added
#    to TESTED_TRITON only after it compiles spill-free and its GPU tests pass on a device.
# Triton 3.9 compiles them through `hopper/tma.py`'s names; no GPU run has covered it (torch pins 3.7 today).
TESTED_TRITON = ("3.6.", "3.7.")
GLUON_COMPILES = ("3.6.", "3.7.", "3.9.")
TRITON_TESTED: bool = triton.__version__.startswith(TESTED_TRITON)
# The portable kernels read tiles through tensor descriptors where Triton has them, else through masked pointers
# (the Intel backend on the package registry, triton-xpu 3.3, has none).
TENSOR_DESCRIPTORS: bool = hasattr(triton.language, "make_tensor_descriptor")
GLUON_COMPILED: bool = triton.__version__.startswith(GLUON_COMPILES)


@functools.cache
def capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def device_index(device: torch.device) -> int:
    """The CUDA device index `device` names (an index-less "cuda" is the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


_THREAD = threading.local()


def side_stream(device_index: int) -> torch.cuda.Stream:
    """The library's own CUDA stream on a device, beside the caller's: for work forked off the current stream and
    joined back (the concurrent dQ kernel) and for buffers allocated outside the current stream's memory pool. One
    per thread: a thread capturing a CUDA graph forks onto a stream no other thread's eager work or capture uses."""
    streams = _THREAD.__dict__.setdefault("side_streams", {})
    stream = streams.get(device_index)
    if stream is None:
        stream = streams[device_index] = torch.cuda.Stream(device=device_index)
    return stream


def hopper_available(device: torch.device) -> bool:
    """The Gluon fast path runs here: compiled (not interpreted) kernels on sm_90 with a tested triton."""
    return (not INTERPRET and device.type == "cuda" and TRITON_TESTED
            and capability(device_index(device)) == (9, 0))


def pdl_available(device: torch.device) -> bool:
    """Kernels can be launched as programmatic dependents here (`griddepcontrol`: CUDA sm_90 and newer, compiled)."""
    return (not INTERPRET and device.type == "cuda" and torch.version.cuda is not None
            and capability(device_index(device)) >= (9, 0))


def check_device(device: torch.device, name: str) -> None:
    """Fail loudly where the kernels cannot run, rather than fall back to something else."""
    if device.type == "cpu" and not INTERPRET:
        raise ValueError(f"{name}: on the CPU; xkernels runs CPU tensors only through the Triton interpreter "
                         "(set TRITON_INTERPRET=1 before importing xkernels)")
    if device.type not in ("cpu", "cuda", "xpu", "meta"):  # meta: shapes only, through the fake kernels
        raise ValueError(f"{name}: device type {device.type!r} is not supported (cuda, xpu, or cpu interpreted)")


def strides_ok(strides: tuple[int, ...], itemsize: int) -> bool:
    """Descriptors need a unit last stride and 16-byte aligned other strides (the base alignment is per call)."""
    return strides[-1] == 1 and all((s * itemsize) % 16 == 0 for s in strides[:-1])


def strides_ready(t: torch.Tensor) -> bool:
    return strides_ok(t.stride(), t.element_size())


def unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a contiguous copy where its last stride is not 1 (the kernels read head-dim rows with unit stride)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def tma_ready(t: torch.Tensor) -> bool:
    """Descriptors need a 16-byte aligned base, unit last stride and 16-byte aligned other strides."""
    return t.data_ptr() % 16 == 0 and strides_ready(t)


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
