"""Error metrics with the seeds' order: non-finite values first, then rel-RMS, max-abs-diff and outliers.

A NaN makes every norm NaN, and `NaN < bound` is False but `not (NaN > bound)` is True: checking finiteness first
keeps a NaN from ever passing through a badly written comparison. A pass needs every bound, never one alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from xkernels.recipes import GEMM_CONTRACT, AttentionRecipe


@dataclass(frozen=True)
class Comparison:
    nonfinite: int  # NaN/Inf in the output (unwritten poisoned elements show up here)
    rel_rms: float
    max_abs_diff: float
    outliers: int  # elements outside the per-element bound
    worst_row_rel: float  # max over rows (last dim) of ||out_row - ref_row|| / ||ref_row||; 0 when not asked
    rel_rms_bound: float
    max_abs_bound: float | None
    passed: bool
    reason: str

    def row(self) -> dict[str, object]:
        return {"rel_rms": self.rel_rms, "max_abs_diff": self.max_abs_diff, "outliers": self.outliers,
                "worst_row_rel": self.worst_row_rel, "nonfinite": self.nonfinite, "passed": self.passed,
                "reason": self.reason}


def compare(out: torch.Tensor, ref: torch.Tensor, *, rel_rms: float, max_abs: float | None = None,
            elem_rel: float | None = None, elem_floor: float = 0.0, row_rel: float | None = None,
            row_floor: float = 0.0, abs_floor: float = 0.0) -> Comparison:
    """Compare `out` with a higher-precision `ref` of the same shape.

    `max_abs` bounds |out - ref| everywhere; `elem_rel` bounds |out - ref| / |ref| where |ref| >= elem_floor;
    `row_rel` bounds each row's (last dim's) relative error, so a few wrong rows cannot hide in a global norm; a row
    whose reference norm is below `row_floor` times the RMS row norm is measured against that instead (a gradient row
    that is zero in exact arithmetic comes out as rounding noise). `abs_floor` is an RMS per element below which
    the reference counts as zero: norms are measured against at least that (a gradient that is exactly zero).
    """
    if out.shape != ref.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != ref shape {tuple(ref.shape)}")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    nonfinite = int((~torch.isfinite(o)).sum().item())
    if nonfinite:
        return Comparison(nonfinite, float("nan"), float("nan"), 0, float("nan"), rel_rms, max_abs, False,
                          f"{nonfinite} non-finite elements")
    if o.numel() == 0:
        return Comparison(0, 0.0, 0.0, 0, 0.0, rel_rms, max_abs, True, "empty")
    err = o - r
    ref_norm = max(r.norm().item(), abs_floor * o.numel() ** 0.5)
    rr = err.norm().item() / ref_norm if ref_norm > 0 else (0.0 if err.norm().item() == 0 else float("inf"))
    mad = err.abs().max().item()
    if elem_rel is not None:
        big = r.abs() >= elem_floor
        outliers = int((err.abs() > elem_rel * r.abs()).logical_and(big).sum().item())
    elif max_abs is not None:
        outliers = int((err.abs() >= max_abs).sum().item())
    else:
        outliers = 0
    worst_row = 0.0
    if row_rel is not None:
        ref_rows = r.norm(dim=-1)
        floor = max(row_floor * ref_rows.square().mean().sqrt().item(), abs_floor * o.shape[-1] ** 0.5)
        rows = err.norm(dim=-1) / ref_rows.clamp_min(max(floor, torch.finfo(torch.float64).tiny))
        worst_row = rows.max().item()
    fails = []
    if not rr < rel_rms:
        fails.append(f"rel_rms {rr:.3g} >= {rel_rms:g}")
    if max_abs is not None and not mad < max_abs:
        fails.append(f"max_abs_diff {mad:.3g} >= {max_abs:g}")
    if elem_rel is not None and outliers:
        fails.append(f"{outliers} elements off by > {elem_rel:.0%}")
    if row_rel is not None and not worst_row < row_rel:
        fails.append(f"worst row off by {worst_row:.3g} >= {row_rel:g}")
    return Comparison(0, rr, mad, outliers, worst_row, rel_rms, max_abs, not fails, "; ".join(fails) or "ok")


def compare_attention(out: torch.Tensor, ref: torch.Tensor, recipe: AttentionRecipe) -> Comparison:
    return compare(out, ref, rel_rms=recipe.rel_rms, max_abs=recipe.max_abs_diff, row_rel=recipe.row_rel)


def compare_grad(grad: torch.Tensor, ref: torch.Tensor, recipe: AttentionRecipe) -> Comparison:
    """A gradient of the attention backward (dQ, dK or dV) against float64 autograd: rel-RMS and per-row bounds.
    Rows under `recipe.grad_row_floor` of the RMS row norm (fp16 half, bf16 a tenth) are measured against that
    share: a dQ row of a query seeing one key is zero, one seeing a few is small, and dS = P (dP - delta) cancels
    there, so its error is set by the rounding of O (in delta = rowsum(dO * O)), P and dS, not by its own size
    (`recipes.GRAD_BOUNDS`). A gradient that is zero in exact arithmetic is measured against an RMS of 1e-4 (with
    inputs and dO of magnitude ~0.5, real gradients have RMS 1e-2 to 1 at the test shapes and ~3e-4 for dQ and dK
    at 8K keys, shrinking as 1/sqrt(S): past ~64K keys the floor would dominate and loosen the check; a zero
    gradient computed as rounding noise has 1e-8)."""
    return compare(grad, ref, rel_rms=recipe.grad_rel_rms, row_rel=recipe.grad_row_rel,
                   row_floor=recipe.grad_row_floor, abs_floor=1e-4)


def compare_ring_grad(grad: torch.Tensor, ref: torch.Tensor, recipe: AttentionRecipe, steps: int) -> Comparison:
    """A ring-attention rank's gradient: the fp32 sum of `steps` block gradients, each rounded to the I/O dtype by
    the attention backward (as in torch's context_parallel and ring-flash-attention), so rounding errors add up
    like a random walk: `compare_grad`'s bounds times sqrt(steps)."""
    widen = math.sqrt(max(steps, 1))
    return compare(grad, ref, rel_rms=recipe.grad_rel_rms * widen, row_rel=recipe.grad_row_rel * widen,
                   row_floor=recipe.grad_row_floor, abs_floor=1e-4)


def compare_gemm(out: torch.Tensor, ref: torch.Tensor, k: int) -> Comparison:
    """The seeds' GEMM contract for an inner dimension of k (see GemmContract for the floor)."""
    c = GEMM_CONTRACT
    return compare(out, ref, rel_rms=c.rel_rms, elem_rel=c.elem_rel, elem_floor=c.elem_floor(k))


def compare_lse(lse: torch.Tensor, ref: torch.Tensor) -> Comparison:
    """The log-sum-exp is fp32 from fp32 row maxima and sums: it must match to near fp32 precision."""
    return compare(lse, ref, rel_rms=1e-5, max_abs=1e-3)
