"""The packed batches' cu_seqlens checked on the device, in one launch: what `validation.check_cu_seqlens` checks on
the host (0 first, non-decreasing, the packed total last, no sequence longer than its max_seqlen), for calls that
read nothing back (`attention_varlen(sync_checks=False)`, the varlen backward, CUDA-graph capture).

Every program checks both cu_seqlens (a few hundred bytes, from L2 after the first program), so no program waits on
another. Program 0 writes the copies the kernels then read: the values themselves, or all zeros where a check
fails, so every sequence is empty and the attention kernels read and write nothing. Where a check fails, the
programs also fill the call's outputs with NaN (before the attention kernels, which then leave them as they are):
a bad call answers NaN everywhere and never touches memory outside its tensors. A good call costs one small launch
where the same checks as torch ops cost some twenty.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xkernels.common.launch import run

_BLOCK = 256  # cu_seqlens entries per step of the check
_FILL_BLOCK = 1024  # elements per step of the NaN fill
_MAX_PROGRAMS = 128  # the fill's programs (a grid-stride loop): the check is redone by each, so few suffice


@triton.jit
def _bad(CU, N, TOTAL, MAX_SEQLEN, BLOCK: tl.constexpr):
    """1 where cu (N entries) breaks a check, else 0 (an int32 scalar). Lengths are taken in int64: an int32
    difference wraps (2^31 - 1 then -2^31 would read as a step of 1)."""
    bad = ((tl.load(CU) != 0) | (tl.load(CU + N - 1) != TOTAL)).to(tl.int32)
    for start in range(1, N, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i < N
        length = (tl.load(CU + i, mask=inside, other=0).to(tl.int64)
                  - tl.load(CU + i - 1, mask=inside, other=0).to(tl.int64))
        bad = tl.maximum(bad, tl.max(((length < 0) | (length > MAX_SEQLEN)).to(tl.int32), 0))
    return bad


@triton.jit
def _fill_nan(F, numel, FILL_BLOCK: tl.constexpr):
    nan = tl.full([FILL_BLOCK], float("nan"), tl.float32).to(F.dtype.element_ty)
    step = tl.num_programs(0).to(tl.int64) * FILL_BLOCK
    for start in range(tl.program_id(0).to(tl.int64) * FILL_BLOCK, numel, step):
        offs = start + tl.arange(0, FILL_BLOCK)
        tl.store(F + offs, nan, mask=offs < numel)


@triton.jit
def cu_seqlens_check_kernel(CU_Q, CU_K, CHECKED, N, TOTAL_Q, TOTAL_K, MAX_Q, MAX_K, F0, N0, F1, N1, F2, N2,
                            BLOCK: tl.constexpr, FILL_BLOCK: tl.constexpr):
    """CHECKED (2, N): cu_seqlens_q and cu_seqlens_k, or zeros where either breaks a check; F0..F2 (dense buffers
    of N0..N2 elements, 0 for none) are filled with NaN where one does."""
    bad = _bad(CU_Q, N, TOTAL_Q, MAX_Q, BLOCK) | _bad(CU_K, N, TOTAL_K, MAX_K, BLOCK)
    if tl.program_id(0) == 0:
        for start in range(0, N, BLOCK):
            i = start + tl.arange(0, BLOCK)
            inside = i < N
            keep = bad == 0
            tl.store(CHECKED + i, tl.where(keep, tl.load(CU_Q + i, mask=inside, other=0), 0), mask=inside)
            tl.store(CHECKED + N + i, tl.where(keep, tl.load(CU_K + i, mask=inside, other=0), 0), mask=inside)
    if bad != 0:
        _fill_nan(F0, N0, FILL_BLOCK)
        _fill_nan(F1, N1, FILL_BLOCK)
        _fill_nan(F2, N2, FILL_BLOCK)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill the `numel` slots from its data pointer (contiguous, or permuted as
    `torch.empty_like` gives), so a flat fill covers exactly it."""
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def launch_spec(n: int, numels: tuple[int, ...]) -> tuple[int, dict[str, int], dict[str, int]]:
    """(grid, constexprs, launch options) of `cu_seqlens_check_kernel` for cu_seqlens of `n` entries and outputs of
    these sizes (plans launch it themselves)."""
    grid = max(1, min(_MAX_PROGRAMS, triton.cdiv(max(numels, default=0), _FILL_BLOCK)))
    return grid, dict(BLOCK=_BLOCK, FILL_BLOCK=_FILL_BLOCK), dict(num_warps=4)


def check_args(cu_seqlens_q, cu_seqlens_k, checked, total_q: int, total_k: int, max_seqlen_q: int,
               max_seqlen_k: int, fills: tuple[torch.Tensor, ...]) -> tuple:
    """The kernel's runtime arguments; unused output slots are an empty floating-point view of `checked` (the fill
    is typed by its buffer's dtype)."""
    slots = [(t, t.numel()) for t in fills] + [(checked.view(torch.float32), 0)] * (3 - len(fills))
    return (cu_seqlens_q, cu_seqlens_k, checked, checked.shape[1], total_q, total_k, max_seqlen_q, max_seqlen_k,
            *(x for slot in slots for x in slot))


def checked_on_device(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                      max_seqlen_q: int, max_seqlen_k: int,
                      fills: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens_q, cu_seqlens_k) for the kernels to read: copies of the inputs (contiguous int32), all zeros
    where either breaks a check, and then NaN in each of `fills` (at most three dense floating-point tensors: the
    call's outputs, which the kernels leave untouched on empty sequences). Nothing is read to the host."""
    if len(fills) > 3 or not all(t.is_floating_point() and _dense(t) for t in fills):
        raise ValueError("checked_on_device: at most three dense floating-point outputs to fill")
    n = cu_seqlens_q.shape[0]
    checked = torch.empty((2, n), dtype=torch.int32, device=cu_seqlens_q.device)
    if n == 0:  # no sequence (check_attention_varlen refuses it; a direct op caller may not)
        return checked[0], checked[1]
    grid, constexprs, options = launch_spec(n, tuple(t.numel() for t in fills))
    run(cu_seqlens_check_kernel, grid,
        check_args(cu_seqlens_q, cu_seqlens_k, checked, total_q, total_k, max_seqlen_q, max_seqlen_k, fills),
        constexprs, options)
    return checked[0], checked[1]
