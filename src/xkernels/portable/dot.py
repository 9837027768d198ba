"""The one place the portable kernels multiply tiles."""

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation.

    Triton 3.6's interpreter computes tl.dot on bf16 operands wrongly (triton issue 11584). Widening bf16/fp16 to
    fp32 is exact, so in the interpreter the upcast product equals the product the GPU's tensor cores accumulate in
    fp32 (up to summation order); every other step of the kernel (masking, softmax, the recipe's roundings of P and V)
    still runs in the kernel's own dtypes. Compiled kernels never take this branch.
    """
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)
