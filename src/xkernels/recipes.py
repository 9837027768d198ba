"""Precision recipes: the dtype of every attention stage and its accuracy contract, in one place.

The three recipes come from the seeds' Xe2 flash-attention work. Kernels read the stage dtypes from here (as
constexprs), tests and `xkernels check` read the thresholds from here, so a recipe is defined exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionRecipe:
    """Dtypes of each stage of S = QK^T -> P = softmax(S) -> O = P.V, and the accuracy contract."""

    name: str
    io_dtype: torch.dtype  # Q, K, V in memory and O out
    qk_dtype: torch.dtype  # operands of QK^T (accumulated in fp32 always)
    pv_dtype: torch.dtype  # operands of P.V: P is rounded to this, V converted to it in-kernel if needed
    max_abs_diff: float  # seeds' bound, inputs U(-0.5, 0.5)
    rel_rms: float  # ||out - ref|| / ||ref||: rules out the all-zero output the max-diff bound alone lets pass
    summary: str
    # backward: rel-RMS of each of dQ, dK, dV against float64 autograd, the bound on any one row of them, and the
    # share of the RMS row norm below which a row is measured against that share (`testing.compare_grad`)
    grad_rel_rms: float = 0.0
    grad_row_rel: float = 0.0
    grad_row_floor: float = 0.1
    # the P.V accumulator of the dense and varlen forwards: fp32, or fp16 in the seeds' acc16 variants (the split-KV
    # decode kernel accumulates in fp32 for every recipe, inside any contract)
    pv_acc_dtype: torch.dtype = torch.float32

    @property
    def converts_v(self) -> bool:
        return self.pv_dtype != self.io_dtype

    @property
    def row_rel(self) -> float:
        """Bound on any single query row's relative error. At 8K keys every output is < 0.01, so the max-diff bound
        cannot fail and one wrong row in 262k barely moves the global rel-RMS; this catches it."""
        return 5 * self.rel_rms


# Backward bounds (rel-RMS, worst row), inputs and dO uniform in (-0.5, 0.5); benchmarks/results/h200/2026-11-30/
# 9-triton-3.7.1/grad_accuracy.json has ours, SDPA-cuDNN's and FA2's against float64 on the same inputs.
#  - rel-RMS: at most 3.0e-4 (fp16) and 2.4e-3 (bf16) on the H200 for all three; 3.7e-4 and 6.9e-3 under the
#    interpreter, which truncates fp32 -> bf16 where GPUs round.
#  - worst row: fp16 at most 4.4e-3. bf16 causal dQ: 0.19 for all three kernels: the first queries see few keys,
#    and their dS = P (dP - delta) cancels, so the bf16 rounding of P and dO is amplified in rows whose true dQ is
#    small (that table measured rows against at least 5 % of the RMS row norm; `compare_grad` now uses 10 %). The
#    bf16 row bound sits above that, and still fails a row computed wrong (a wrong row is off by its own size, ~1).
#  - The same cancellation in fp16: packed bottom-right causal rows that see a few keys (Sq > Sk) came out 1.25 % off
#    on the H200 (the Gluon dQ, D256), and a kernel exact up to the rounding of O, P and dS reaches 3.5 % on them
#    (tests/testing/test_metrics.py emulates it), all in rows of 0.08-0.14x the RMS row norm; rows at or above half
#    of it stay under 0.7 %. So fp16 measures rows against at least half the RMS row norm, with a 2 % bound: the
#    emulation passes (worst 0.72 %), and a dQ that drops one key of a sequence's last row (8 % off) fails, where a
#    10 % bound at a 10 % floor let it pass (a reviewer's case, in the same test file).
GRAD_BOUNDS = {"fp16": dict(grad_rel_rms=2e-3, grad_row_rel=0.02, grad_row_floor=0.5),
               "bf16": dict(grad_rel_rms=2e-2, grad_row_rel=0.3, grad_row_floor=0.1)}

# P.V accumulates in fp32 except in the "-acc16" variants, the seeds' fp16 accumulator (it saved registers on Xe2).
# Their bounds: the seeds' fp16-accumulator figures (rel-RMS 1.2e-3 fp16, 2.1e-3 bf16io) and the H200's fp16 wgmma
# accumulator, which drifts with the number of keys a row sums: full rows at 8K / 16K keys measured 3.3e-3 / 4.9e-3
# (fp16-acc16) and 3.7e-3 / 5.2e-3 (bf16io-acc16), causal rows about a third of that (benchmarks/results/h200/
# 2026-11-30/32-acc16-recipes). The bounds hold to 16K keys; longer rows were not measured. 2-8 % faster than
# their bases on the H200, but fp16-acc16 fails fp16's bound on full rows, so neither is a default.
ATTENTION_RECIPES: dict[str, AttentionRecipe] = {
    "fp16": AttentionRecipe(
        "fp16", torch.float16, torch.float16, torch.float16, max_abs_diff=0.05, rel_rms=2e-3,
        summary="fp16 I/O; S in fp32; P and V fp16; P.V accumulated in fp32", **GRAD_BOUNDS["fp16"],
    ),
    "bf16": AttentionRecipe(
        "bf16", torch.bfloat16, torch.bfloat16, torch.bfloat16, max_abs_diff=0.15, rel_rms=1e-2,
        summary="bf16 I/O; S in fp32; P and V bf16; P.V accumulated in fp32", **GRAD_BOUNDS["bf16"],
    ),
    "bf16io": AttentionRecipe(
        "bf16io", torch.bfloat16, torch.bfloat16, torch.float16, max_abs_diff=0.15, rel_rms=5e-3,
        summary="bf16 I/O; QK^T from bf16 (fp32 acc); P fp16, V bf16->fp16 (in-kernel, or on Hopper by one pass before "
        "the kernel on long rows); P.V accumulated in fp32. "
        "Needs |V| <= 65504 (fp16 range): larger V gives inf/NaN in the output, never a finite wrong value. "
        "Its backward is the bf16 recipe's (bf16 operands, fp32 accumulation)", **GRAD_BOUNDS["bf16"],
    ),
    "fp16-acc16": AttentionRecipe(
        "fp16-acc16", torch.float16, torch.float16, torch.float16, max_abs_diff=0.05, rel_rms=6e-3,
        summary="the fp16 recipe with P.V accumulated in fp16 (seeds' variant; half the accumulator registers). "
        "Its backward is the fp16 recipe's", **GRAD_BOUNDS["fp16"],
        pv_acc_dtype=torch.float16,
    ),
    "bf16io-acc16": AttentionRecipe(
        "bf16io-acc16", torch.bfloat16, torch.bfloat16, torch.float16, max_abs_diff=0.15, rel_rms=1e-2,
        summary="the bf16io recipe with P.V accumulated in fp16 (the seeds' bf16 flash attention). Needs |V| <= 65504 "
        "and row sums of P.V within fp16's range. Its backward is the bf16 recipe's",
        **GRAD_BOUNDS["bf16"], pv_acc_dtype=torch.float16,
    ),
}

# "auto" for bf16 inputs. bf16io is the seeds' winner on Xe2, where bf16 ALU work is slow. On Hopper the tensor cores
# and the fp32 softmax cost the same for both, bf16io adds the V conversion, and it narrows V's range to fp16's, so
# auto keeps the plain bf16 recipe; see README "Precision recipes" and benchmarks/results for the measured ratio.
AUTO_RECIPE = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class GemmContract:
    """The seeds' GEMM bound: rel-RMS < 0.5 % and no element off by > 5 % where |ref| >= 1e-3.

    The seeds set the 1e-3 floor at M=N=K=256. Any fp32 accumulation of K products of U(-0.5, 0.5) values leaves an
    absolute error that grows like sqrt(K) (a random walk of roundings of a running sum whose size also grows like
    sqrt(K)), so at K=4096 a few of the ~2500 elements with |ref| near 1e-3 land over 5 % for an fp32-accumulating
    GEMM (scripts/gemm_floor_probe.py measures ours and cuBLAS; results in benchmarks/results). The floor therefore
    scales as 1e-3 * sqrt(K / 256) past K=256: the seeds' rule where they defined it, the same strictness beyond.
    """

    rel_rms: float = 5e-3
    elem_rel: float = 5e-2
    elem_floor_at_256: float = 1e-3

    def elem_floor(self, k: int) -> float:
        return self.elem_floor_at_256 * max(1.0, (k / 256) ** 0.5)


GEMM_CONTRACT = GemmContract()


def resolve_attention_recipe(precision: str, dtype: torch.dtype) -> AttentionRecipe:
    """Pick the recipe for `precision` and check it matches the input dtype (never a silent cast)."""
    if precision == "auto":
        if dtype not in AUTO_RECIPE:
            raise TypeError(f"q: dtype {dtype} is not supported; use torch.float16 or torch.bfloat16")
        precision = AUTO_RECIPE[dtype]
    recipe = ATTENTION_RECIPES.get(precision)
    if recipe is None:
        raise ValueError(f"precision: {precision!r} is not one of 'auto', {', '.join(map(repr, ATTENTION_RECIPES))}")
    if recipe.io_dtype != dtype:
        raise TypeError(f"precision={precision!r} needs {recipe.io_dtype} inputs, got q of dtype {dtype}")
    return recipe
