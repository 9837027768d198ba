"""The register layouts of a consumer warpgroup's wgmmas, written once for every attention kernel: the accumulator of
an [64, n] wgmma (scores, O, dQ, dK, dV) and the register A operand that P or dS become for the next wgmma."""

from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function


@constexpr_function
def wgmma_acc(n):
    """The accumulator layout of a warpgroup's [64, n] wgmma (4 warps down the rows, n columns per instruction)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@constexpr_function
def wgmma_operand(n):
    """The register A-operand layout of a wgmma accumulating into a [64, n] `wgmma_acc(n)` tile (16-bit inputs)."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_acc(n), k_width=2)
