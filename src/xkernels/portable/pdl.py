"""Programmatic dependent launch (CUDA, sm_90+): the two `griddepcontrol` instructions as jit functions of our own,
so every backend's JIT can resolve them (triton's `extra.cuda.gdc_*` are missing from some releases and backends;
kernels call these only under a constexpr that is False off CUDA)."""

import triton
import triton.language as tl


@triton.jit
def launch_dependents():
    """Let the next kernel on the stream, launched as a programmatic dependent, be scheduled."""
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def wait_primary():
    """Wait until the kernel this one depends on has completed and its memory writes are visible."""
    tl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
