"""Portable kernels in plain Triton (`tl` + tensor descriptors): NVIDIA, AMD, Intel XPU and the CPU interpreter."""
