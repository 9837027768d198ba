"""Compile targets: what a kernel config must fit (shared memory per block, warp size), for the GPU in hand or for
one named offline (`xkernels inspect --target`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Target:
    name: str  # "sm_90", "gfx942"
    backend: str  # "cuda" or "hip": triton's GPUTarget backend
    arch: int | str  # 90, or "gfx942"
    warp_size: int
    smem: int  # shared memory (LDS) one block may use, bytes
    matrix_op: str  # the matrix instruction a report counts: HGMMA, HMMA (mma.sync) or v_mfma

    @property
    def gpu_target(self) -> tuple[str, int | str, int]:
        return (self.backend, self.arch, self.warp_size)


# per-block opt-in shared memory from the vendors' tables (NVIDIA CUDA C guide, AMD CDNA ISA)
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("sm_90", "cuda", 90, 32, 232448, "HGMMA"),  # H100/H200: 227 KB
    Target("sm_80", "cuda", 80, 32, 166912, "HMMA"),  # A100: 163 KB
    Target("sm_89", "cuda", 89, 32, 101376, "HMMA"),  # L4/L40/RTX 40: 99 KB
    Target("sm_120", "cuda", 120, 32, 101376, "HMMA"),  # RTX 50: 99 KB
    Target("gfx942", "hip", "gfx942", 64, 65536, "v_mfma"),  # MI300: 64 KB LDS
    Target("gfx950", "hip", "gfx950", 64, 163840, "v_mfma"),  # MI350: 160 KB LDS
)}


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
