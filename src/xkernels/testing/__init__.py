"""The seeds' correctness method, shared by the test suite and `xkernels check`."""

from xkernels.testing.inputs import attention_inputs, gemm_inputs
from xkernels.testing.metrics import (
    Comparison,
    compare,
    compare_attention,
    compare_gemm,
    compare_grad,
    compare_lse,
    compare_ring_grad,
)
from xkernels.testing.reference import (
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen,
    reference_attention_varlen_grads,
    reference_lse,
    reference_matmul,
)

__all__ = [
    "Comparison", "compare", "compare_attention", "compare_gemm", "compare_grad", "compare_lse",
    "compare_ring_grad", "attention_inputs",
    "gemm_inputs", "reference_attention", "reference_attention_grads", "reference_attention_varlen",
    "reference_attention_varlen_grads", "reference_lse", "reference_matmul",
]
