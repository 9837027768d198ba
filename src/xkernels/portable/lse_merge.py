"""Merging partial attention outputs through their LSEs: the ring's per-step accumulation, one pass in place.

A partial (O_b, LSE_b) over some keys and the running (O_a, LSE_a) over others combine as
  LSE = log(exp(LSE_a) + exp(LSE_b)),  O = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b.
A side that saw no key (LSE = -inf) weighs 0 and its O is never read into the sum, so the running buffer may start
uninitialized (torch.empty) with LSE = -inf; a row neither side saw keeps LSE = -inf and O = 0. A NaN LSE makes the
row's O and LSE NaN (as the unsharded attention would be), never "unseen".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def merge_kernel(ACC, ACC_LSE, O, LSE, a_sb, a_sh, a_ss, al_sb, al_sh, o_sb, o_sh, o_ss, l_sb, l_sh, H, ROWS, D,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program per BLOCK_M rows of one (batch, head): ACC, ACC_LSE <- merge(ACC, ACC_LSE; O, LSE), fp32."""
    m_blocks = tl.cdiv(ROWS, BLOCK_M)
    bh = tl.program_id(0) // m_blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = (tl.program_id(0) % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    inside = rows < ROWS
    keep = inside[:, None] & (cols[None, :] < D)
    la = tl.load(ACC_LSE + b * al_sb + h * al_sh + rows, mask=inside, other=float("-inf"))
    lb = tl.load(LSE + b * l_sb + h * l_sh + rows, mask=inside, other=float("-inf"))
    m = tl.maximum(la, lb, propagate_nan=tl.PropagateNan.ALL)  # a NaN partial makes the row NaN, never unseen
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(la - m_safe)
    wb = tl.exp(lb - m_safe)
    total = wa + wb
    inv = 1.0 / tl.where(m == float("-inf"), 1.0, total)
    # a side is left out only when its LSE is -inf (it saw no key): its O, possibly uninitialized, is never read in
    r64 = rows.to(tl.int64)[:, None]
    acc_ptr = ACC + b * a_sb + h * a_sh + r64 * a_ss + cols[None, :]
    acc = tl.load(acc_ptr, mask=keep, other=0.0)
    o = tl.load(O + b * o_sb + h * o_sh + r64 * o_ss + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    merged = (tl.where((la == float("-inf"))[:, None], 0.0, acc * (wa * inv)[:, None])
              + tl.where((lb == float("-inf"))[:, None], 0.0, o * (wb * inv)[:, None]))
    tl.store(acc_ptr, merged, mask=keep)
    tl.store(ACC_LSE + b * al_sb + h * al_sh + rows, tl.where(m == float("-inf"), float("-inf"),
                                                             m_safe + tl.log(total)), mask=inside)


def merge_into(acc: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """acc (B, H, R, D) fp32 and acc_lse (B, H, R) fp32 <- their merge with the partial (out, lse) of the same shapes
    (out in any float dtype), in place; any strides with a unit last one (views into larger buffers are fine)."""
    from xkernels.common.launch import run as run_kernel

    b, h, rows, d = acc.shape
    if out.shape != acc.shape or lse.shape != acc_lse.shape or acc_lse.shape != acc.shape[:3]:
        raise ValueError(f"merge_into: shapes {tuple(acc.shape)}, {tuple(acc_lse.shape)}, {tuple(out.shape)}, "
                         f"{tuple(lse.shape)} do not match")
    if any(t.device != acc.device for t in (acc_lse, out, lse)):
        raise ValueError(f"merge_into: acc, acc_lse, out and lse must be on one device, got {acc.device}, "
                         f"{acc_lse.device}, {out.device}, {lse.device}")
    if acc.dtype != torch.float32 or acc_lse.dtype != torch.float32 or lse.dtype != torch.float32:
        raise TypeError("merge_into: acc, acc_lse and lse must be float32")
    if any(t.stride(-1) != 1 and t.shape[-1] > 1 for t in (acc, acc_lse, out, lse)):
        raise ValueError("merge_into: the last dims must be contiguous")
    head_dim = triton.next_power_of_2(d)
    block_m = max(1, min(64, 4096 // head_dim))
    run_kernel(merge_kernel, triton.cdiv(rows, block_m) * b * h,
               (acc, acc_lse, out, lse, *acc.stride()[:3], *acc_lse.stride()[:2], *out.stride()[:3],
                *lse.stride()[:2], h, rows, d),
               dict(HEAD_DIM=head_dim, BLOCK_M=block_m), dict(num_warps=4))
