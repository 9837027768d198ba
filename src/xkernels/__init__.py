"""xkernels: attention and GEMM kernels for PyTorch in Triton, with the seeds' correctness and benchmark method.

The kernel modules load on first use, so a program (or the `xkernels` CLI) can still choose the Triton interpreter
(TRITON_INTERPRET=1) after `import xkernels.cli`, before any kernel is defined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "matmul", "last_backend", "__version__"]

if TYPE_CHECKING:
    from xkernels.api import attention, attention_varlen, attention_with_kvcache, matmul
    from xkernels.plans import last_backend


def __getattr__(name: str):
    """Load the kernel modules on first use, then bind the name here (later lookups skip this function)."""
    if name in ("attention", "attention_varlen", "attention_with_kvcache", "matmul"):
        from xkernels import api

        value = getattr(api, name)
    elif name == "last_backend":
        from xkernels.plans import last_backend as value
    else:
        raise AttributeError(f"module 'xkernels' has no attribute {name!r}")
    globals()[name] = value
    return value
