"""Programmatic dependent launch in Gluon kernels (sm_90): the two `griddepcontrol` instructions, as
`portable/pdl.py` has them for `tl` kernels. A kernel launched with `launch_pdl` may start while the kernel before it
on the stream is still running (once that one has run `launch_dependents`, or as its CTAs leave): everything up to
`wait_primary` (shared memory and barrier setup, descriptor prefetch) overlaps the other kernel's tail, and nothing
before it may read or write global memory that kernel could touch."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def launch_dependents():
    """Let the next kernel on the stream, launched as a programmatic dependent, be scheduled."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def wait_primary():
    """Wait until the kernel this one depends on has completed and its memory writes are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)
