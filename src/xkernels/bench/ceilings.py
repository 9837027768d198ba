"""Ceilings measured in the same run (copy bandwidth, cuBLAS bf16 at 8192^3) and datasheet peaks per device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xkernels.bench.timing import time_cuda
from xkernels.testing.inputs import uniform

# dense fp16/bf16 tensor-core TFLOP/s, from the vendors' datasheets (SXM parts)
DATASHEET_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "B200": 2250.0, "L40S": 362.0}


def datasheet_tflops(device_name: str) -> float | None:
    for key, peak in DATASHEET_TFLOPS.items():
        if key in device_name:
            return peak
    return None


@dataclass(frozen=True)
class Ceilings:
    device: str
    datasheet_tflops: float | None
    matmul_tflops: float  # torch.matmul bf16 8192^3, random data, this run
    copy_tbps: float  # device-to-device copy, bytes read + written

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def measure_ceilings(iters: int = 50) -> Ceilings:
    name = torch.cuda.get_device_name()
    n = 8192
    a, b = uniform((n, n), torch.bfloat16, "cuda"), uniform((n, n), torch.bfloat16, "cuda")
    mm = time_cuda(lambda ab: ab[0] @ ab[1], [(a, b)], warmup=20, iters=iters)
    src = uniform((1 << 30,), torch.float16, "cuda")  # 2 GiB, far past the L2
    dst = torch.empty_like(src)
    cp = time_cuda(lambda s, d=dst: d.copy_(s), [src], warmup=5, iters=20)
    copy_tbps = 2 * src.numel() * src.element_size() / cp.median_ms / 1e9
    del src, dst
    return Ceilings(name, datasheet_tflops(name), mm.tflops(2 * n**3), copy_tbps)
