"""Compile targets: what a kernel config must fit (shared memory per block, warp size), for the GPU in hand or for
one named offline (`xkernels inspect --target`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Target:
    name: str  # "sm_90", "gfx942", "xe2"
    backend: str  # "cuda", "hip" or "xpu": triton's GPUTarget backend
    arch: int | str | tuple  # 90, "gfx942", or the Intel backend's device properties as (key, value) pairs
    warp_size: int
    smem: int  # shared memory (LDS, SLM) one block may use, bytes
    matrix_op: str  # the matrix instruction a report counts: HGMMA, HMMA (mma.sync), v_mfma or matrix_mad (DPAS)

    @property
    def gpu_target(self) -> tuple[str, int | str | dict, int]:
        if isinstance(self.arch, tuple):  # the Intel backend reads a dict (and lists where a device gives lists)
            arch = {k: list(v) if isinstance(v, tuple) else v for k, v in self.arch}
            return (self.backend, arch, self.warp_size)
        return (self.backend, self.arch, self.warp_size)


# Intel Xe2 (Battlemage B580; Lunar Lake differs only in counts) as the Intel backend reads a device: the flags that
# change code generation are the DPAS, 2D-block-IO and sub-group-size ones; `architecture` is SYCL's enum value.
# Not read from a device (none is reachable here): the values Xe2 reports per Intel's SYCL architecture table.
XE2_PROPERTIES = (
    ("name", "Intel(R) Arc(TM) B580 Graphics"), ("architecture", 0x0000000500400400), ("version", "20.1.4"),
    ("sub_group_sizes", (16, 32)), ("has_subgroup_matrix_multiply_accumulate", True),
    ("has_subgroup_matrix_multiply_accumulate_tensor_float32", False), ("has_subgroup_2d_block_io", True),
    ("has_bfloat16_conversions", True), ("has_fp64", True), ("max_work_group_size", 1024),
    ("max_num_sub_groups", 64), ("gpu_eu_count", 160), ("gpu_subslice_count", 20),
)


# per-block opt-in shared memory from the vendors' tables (NVIDIA CUDA C guide, AMD CDNA ISA)
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("sm_90", "cuda", 90, 32, 232448, "HGMMA"),  # H100/H200: 227 KB
    Target("sm_80", "cuda", 80, 32, 166912, "HMMA"),  # A100: 163 KB
    Target("sm_89", "cuda", 89, 32, 101376, "HMMA"),  # L4/L40/RTX 40: 99 KB
    Target("sm_120", "cuda", 120, 32, 101376, "HMMA"),  # RTX 50: 99 KB
    Target("gfx942", "hip", "gfx942", 64, 65536, "v_mfma"),  # MI300: 64 KB LDS
    Target("gfx950", "hip", "gfx950", 64, 163840, "v_mfma"),  # MI350: 160 KB LDS
    Target("xe2", "xpu", XE2_PROPERTIES, 16, 131072, "matrix_mad"),  # Xe2: 128 KB SLM per Xe-core; DPAS, SIMD16
)}
# compiled by the Intel backend (triton-xpu), which cannot share an environment with the CUDA/ROCm triton
INTEL_TARGETS = frozenset({"xe2"})


@functools.cache
def device_target(device_index: int) -> Target:
    """The target of a visible GPU, with its shared memory read from the device."""
    props = torch.cuda.get_device_properties(device_index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 49152
    if torch.version.hip is not None:
        arch = props.gcnArchName.split(":")[0]
        return Target(arch, "hip", arch, 64, smem, "v_mfma")
    major, minor = props.major, props.minor
    return Target(f"sm_{major}{minor}", "cuda", major * 10 + minor, 32, smem, "HGMMA" if major == 9 else "HMMA")
