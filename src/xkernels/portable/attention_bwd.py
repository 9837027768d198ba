"""Portable flash-attention backward (plain `tl`, pointer loads with masks): preprocess, dK/dV, dQ.

Given the forward's O and natural-log LSE, recompute P = exp(S * scale - LSE) tile by tile (never the S x S matrix):
  delta_i = sum_d dO_id O_id - dLSE_i                  (preprocess, fp32; dLSE when the LSE output has a gradient)
  dV_j = sum_i P_ij dO_i;  dP = dO V^T;  dS = P * (dP - delta);  dK_j = scale * sum_i dS_ij Q_i;  dQ_i = scale * dS K
One program of the dK/dV kernel owns BLOCK_N keys of one kv head and walks every query head of its GQA group, so dK
and dV are summed over the group in registers (no atomics, deterministic); one program of the dQ kernel owns BLOCK_M
query rows of one head. Causal is top-left aligned, as in the forward. The LSE term: d LSE_i / d S_ij = P_ij, so
a gradient on the LSE output adds dLSE_i P_ij to dS_ij, which is the same as subtracting it from delta_i.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.portable.dot import mma


@triton.jit
def _row_block(HQ, SQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's BLOCK_M query rows of one (batch, head): (bh, b, h, rows, cols, rows-inside mask)."""
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)
    rows = (tl.program_id(0) % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    return bh, bh // HQ, bh % HQ, rows, tl.arange(0, HEAD_DIM), rows[:, None] < SQ


@triton.jit
def preprocess_kernel(O, DO, DLSE, DELTA, DQ_ACC, o_sb, o_sh, o_ss, do_sb, do_sh, do_ss, HQ, SQ,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr):
    """delta = rowsum(dO * O) - dLSE per query row; with ZERO_DQ also zeroes the rows of the fp32 dQ buffer
    (contiguous (B * Hq * Sq, D)) that the fused Hopper backward reduces into."""
    bh, b, h, rows, cols, keep = _row_block(HQ, SQ, HEAD_DIM, BLOCK_M)
    o = tl.load(O + b * o_sb + h * o_sh + rows[:, None] * o_ss + cols[None, :], mask=keep, other=0.0)
    do = tl.load(DO + b * do_sb + h * do_sh + rows[:, None] * do_ss + cols[None, :], mask=keep, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
    tl.store(DELTA + bh * SQ + rows, delta, mask=rows < SQ)
    if ZERO_DQ:
        tl.store(DQ_ACC + (bh * SQ + rows[:, None]) * HEAD_DIM + cols[None, :],
                 tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), mask=keep)


@triton.jit
def dq_finish_kernel(ACC, DQ, dq_sb, dq_sh, dq_ss, HQ, SQ, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """dQ = scale * the fp32 buffer (contiguous (B * Hq * Sq, D)), in dQ's dtype and strides: one read, one write."""
    bh, b, h, rows, cols, keep = _row_block(HQ, SQ, HEAD_DIM, BLOCK_M)
    acc = tl.load(ACC + (bh * SQ + rows[:, None]) * HEAD_DIM + cols[None, :], mask=keep, other=0.0)
    tl.store(DQ + b * dq_sb + h * dq_sh + rows[:, None] * dq_ss + cols[None, :],
             (acc * scale).to(DQ.dtype.element_ty), mask=keep)


@triton.jit
def _tile(base, s_s, start, rows_len, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """A [ROWS, HEAD_DIM] tile of rows start..start+ROWS of a (S, D) head, zero past the sequence end."""
    rows = start + tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    return tl.load(base + rows[:, None] * s_s + cols[None, :], mask=rows[:, None] < rows_len, other=0.0)


@triton.jit
def _tile_t(base, s_s, start, rows_len, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr):
    """The transpose [HEAD_DIM, ROWS] of `_tile`, read transposed from memory (no register transpose)."""
    rows = start + tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    return tl.load(base + rows[None, :] * s_s + cols[:, None], mask=rows[None, :] < rows_len, other=0.0)


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                do_sb, do_sh, do_ss, dk_sb, dk_sh, dk_ss, dv_sb, dv_sh, dv_ss, HQ, HKV, GROUP, SQ, SKV, scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Works on transposed scores, S^T = K Q^T (keys on rows): P^T and dS^T come out of one product as the left
    operand of the next (dV += P^T dO, dK += dS^T Q), so nothing is transposed in registers."""
    n_blocks = tl.cdiv(SKV, BLOCK_N)
    bhk = (tl.program_id(0) // n_blocks).to(tl.int64)
    b, hk = bhk // HKV, bhk % HKV
    start_n = (tl.program_id(0) % n_blocks) * BLOCK_N
    keys = start_n + tl.arange(0, BLOCK_N)
    k = _tile(K + b * k_sb + hk * k_sh, k_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
    v = _tile(V + b * v_sb + hk * v_sh, v_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # causal: earlier queries see none of these keys
    qk_scale = scale * 1.4426950408889634
    for g in range(GROUP):
        h = (hk * GROUP + g).to(tl.int64)
        bh = b * HQ + h
        for start_m in range(lo, SQ, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q_t = _tile_t(Q + b * q_sb + h * q_sh, q_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
            do = _tile(DO + b * do_sb + h * do_sh, do_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
            lse = tl.load(LSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
            delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
            s_t = mma(k, q_t, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
            keep = (keys[:, None] < SKV) & (rows[None, :] < SQ)
            if CAUSAL:
                keep = keep & (keys[:, None] <= rows[None, :])
            p_t = tl.where(keep, tl.math.exp2(s_t * qk_scale - lse[None, :] * 1.4426950408889634), 0.0)
            dv = mma(p_t.to(do.dtype), do, dv, INTERPRET)
            dp_t = mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = mma(ds_t.to(q_t.dtype), tl.trans(q_t), dk, INTERPRET)
    cols = tl.arange(0, HEAD_DIM)
    keep_n = keys[:, None] < SKV
    tl.store(DK + b * dk_sb + hk * dk_sh + keys[:, None] * dk_ss + cols[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=keep_n)
    tl.store(DV + b * dv_sb + hk * dv_sh + keys[:, None] * dv_ss + cols[None, :], dv.to(DV.dtype.element_ty),
             mask=keep_n)


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
              do_sb, do_sh, do_ss, dq_sb, dq_sh, dq_ss, HQ, GROUP, SQ, SKV, scale, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, INTERPRET: tl.constexpr):
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)
    b, h = bh // HQ, bh % HQ
    hk = h // GROUP
    start_m = (tl.program_id(0) % m_blocks) * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    q = _tile(Q + b * q_sb + h * q_sh, q_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
    do = _tile(DO + b * do_sb + h * do_sh, do_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
    lse = tl.load(LSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
    delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(SKV, start_m + BLOCK_M) if CAUSAL else SKV
    qk_scale = scale * 1.4426950408889634
    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        k = _tile(K + b * k_sb + hk * k_sh, k_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
        v = _tile(V + b * v_sb + hk * v_sh, v_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
        s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
        keep = (rows[:, None] < SQ) & (keys[None, :] < SKV)
        if CAUSAL:
            keep = keep & (keys[None, :] <= rows[:, None])
        p = tl.where(keep, tl.math.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634), 0.0)
        dp = mma(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq, INTERPRET)
    cols = tl.arange(0, HEAD_DIM)
    tl.store(DQ + b * dq_sb + h * dq_sh + rows[:, None] * dq_ss + cols[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] < SQ)


def preprocess(o, do, grad_lse, *, block_m: int, num_warps: int = 4, dq_accum=None):
    """delta = rowsum(dO * O) - dLSE, (B, Hq, Sq) fp32: the backward's one workspace; `dq_accum` (the fused Hopper
    backward's contiguous fp32 dQ buffer), if given, is zeroed in the same pass."""
    import torch

    from xkernels.common.launch import generic_launch

    b, hq, sq, d = o.shape
    delta = torch.empty((b, hq, sq), dtype=torch.float32, device=o.device)
    generic_launch(preprocess_kernel, triton.cdiv(sq, block_m) * b * hq,
                   (o, do, delta if grad_lse is None else grad_lse, delta, delta if dq_accum is None else dq_accum,
                    *o.stride()[:3], *do.stride()[:3], hq, sq),
                   dict(HEAD_DIM=d, BLOCK_M=block_m, HAS_DLSE=grad_lse is not None, ZERO_DQ=dq_accum is not None),
                   dict(num_warps=num_warps))
    return delta


def finish_dq(dq_accum, dq, *, scale: float, block_m: int, num_warps: int = 4) -> None:
    """dq = scale * dq_accum (the fused Hopper backward's fp32 sums), in dq's dtype and layout."""
    from xkernels.common.launch import generic_launch

    b, hq, sq, d = dq.shape
    generic_launch(dq_finish_kernel, triton.cdiv(sq, block_m) * b * hq,
                   (dq_accum, dq, *dq.stride()[:3], hq, sq, scale), dict(HEAD_DIM=d, BLOCK_M=block_m),
                   dict(num_warps=num_warps))


def launch_dq(q, k, v, do, lse, delta, dq, *, is_causal: bool, scale: float, cfg) -> None:
    from xkernels.common.launch import generic_launch

    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    generic_launch(dq_kernel, triton.cdiv(sq, cfg.q_m) * b * hq,
                   (q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                    *do.stride()[:3], *dq.stride()[:3], hq, hq // hkv, sq, skv, scale),
                   cfg.dq_constexprs(d, causal=is_causal), cfg.options())


def launch(q, k, v, o, lse, do, dq, dk, dv, grad_lse, *, is_causal: bool, scale: float, cfg) -> None:
    """Gradients of O = attention(q, k, v) given dO (and dLSE, or None), written into dq, dk, dv (allocated by the
    caller, any (B, H, S) strides with a unit last stride, like every input). `lse` and `grad_lse` are (B, Hq, Sq)
    contiguous fp32. Workspace: delta, (B, Hq, Sq) fp32."""
    from xkernels.common.launch import generic_launch

    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    delta = preprocess(o, do, grad_lse, block_m=cfg.q_m, num_warps=cfg.num_warps)
    generic_launch(dkdv_kernel, triton.cdiv(skv, cfg.kv_n) * b * hkv,
                   (q, k, v, do, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                    *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], hq, hkv, hq // hkv, sq, skv, scale),
                   cfg.dkdv_constexprs(d, causal=is_causal), cfg.options())
    launch_dq(q, k, v, do, lse, delta, dq, is_causal=is_causal, scale=scale, cfg=cfg)
