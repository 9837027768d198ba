"""The one place the portable kernels multiply tiles."""

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, INTERPRET: tl.constexpr):
    """acc + a @ b, accumulated in acc's dtype (fp32, or fp16 for the acc16 recipes).

    Triton 3.6's interpreter computes tl.dot on bf16 operands wrongly (triton issue 11584). Widening bf16/fp16 to
    fp32 is exact, so in the interpreter the upcast product equals the product the GPU's tensor cores accumulate in
    fp32 (up to summation order); every other step of the kernel (masking, softmax, the recipe's roundings of P and V)
    still runs in the kernel's own dtypes. Compiled kernels never take this branch.

    An fp16 `acc` (the acc16 recipes) accumulates in fp16 on the tensor cores; the interpreter rounds each tile's
    fp32 product to fp16 and adds it in fp16.
    """
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if acc.dtype.is_fp16():  # one return per path: a static `if` does not stop the code after it being compiled
        if INTERPRET:
            out = acc + tl.dot(a, b).to(tl.float16)
        else:
            out = tl.dot(a, b, acc, out_dtype=tl.float16)
    else:
        out = tl.dot(a, b, acc)
    return out
