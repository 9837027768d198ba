"""xkernels: attention and GEMM kernels for PyTorch in Triton, with the seeds' correctness and benchmark method."""

from xkernels.api import attention, matmul
from xkernels.dispatch import last_backend

__version__ = "0.1.0"
__all__ = ["attention", "matmul", "last_backend", "__version__"]
