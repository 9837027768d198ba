"""When the Gluon fast path may run: a Hopper GPU, compiled (not interpreted) kernels, a Gluon version we tested."""

from __future__ import annotations

import torch
import triton

from xkernels.portable.runtime import INTERPRET

# Gluon's API changed between triton 3.5, 3.6 and later; these are the releases the Hopper kernels were run on.
TESTED_TRITON = ("3.6.",)


def available(t: torch.Tensor) -> bool:
    return (not INTERPRET and t.is_cuda and triton.__version__.startswith(TESTED_TRITON)
            and torch.cuda.get_device_capability(t.device) == (9, 0))
