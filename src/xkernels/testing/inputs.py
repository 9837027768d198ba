"""Random non-zero inputs, U(-0.5, 0.5) as in the seeds: zeros hide unwritten outputs and wrong indexing."""

from __future__ import annotations

import torch


def uniform(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """U(-0.5, 0.5) drawn in fp32 and quantized to `dtype` (the reference then upcasts these exact values)."""
    x = torch.rand(shape, dtype=torch.float32, device=device, generator=generator) - 0.5
    return x.to(dtype)


def attention_inputs(b: int, hq: int, sq: int, skv: int, d: int, dtype: torch.dtype, device: torch.device | str,
                     hkv: int | None = None, seed: int | None = None):
    """q (b, hq, sq, d), k and v (b, hkv, skv, d)."""
    g = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    hkv = hq if hkv is None else hkv
    return (uniform((b, hq, sq, d), dtype, device, g), uniform((b, hkv, skv, d), dtype, device, g),
            uniform((b, hkv, skv, d), dtype, device, g))


def gemm_inputs(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device | str, b_layout: str = "kn",
                seed: int | None = None):
    """a (m, k); b (k, n) for "kn" or (n, k) for "nk"."""
    g = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    a = uniform((m, k), dtype, device, g)
    b = uniform((k, n) if b_layout == "kn" else (n, k), dtype, device, g)
    return a, b
