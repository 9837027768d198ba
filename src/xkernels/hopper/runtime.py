"""When the Gluon fast path may run: a Hopper GPU, compiled (not interpreted) kernels, a Gluon version we tested."""

from __future__ import annotations

import functools

import torch
import triton

from xkernels.portable.runtime import INTERPRET

# Gluon's API changed between triton 3.5, 3.6 and later; these are the releases the Hopper kernels were run on.
TESTED_TRITON = ("3.6.",)


@functools.cache
def _is_sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def available(t: torch.Tensor) -> bool:
    return (not INTERPRET and t.is_cuda and triton.__version__.startswith(TESTED_TRITON)
            and _is_sm90(t.device.index if t.device.index is not None else torch.cuda.current_device()))
