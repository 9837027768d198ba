"""Test helpers: poisoned outputs and input snapshots (shared by the CPU and GPU suites)."""

import torch


def poisoned_like(t: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    """NaN-filled output: any element the kernel fails to write fails the non-finite check."""
    return torch.full(t.shape if shape is None else shape, float("nan"), dtype=dtype or t.dtype, device=t.device)


def snapshot(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


def assert_unchanged(before: list[torch.Tensor], *ts: torch.Tensor) -> None:
    for b, t in zip(before, ts, strict=True):
        assert torch.equal(b, t), "an input was modified"
