"""Portable flash-attention backward (plain `tl`, pointer loads with masks): preprocess, dK/dV, dQ.

Given the forward's O and natural-log LSE, recompute P = exp(S * scale - LSE) tile by tile (never the S x S matrix):
  delta_i = sum_d dO_id O_id - dLSE_i                  (preprocess, fp32; dLSE when the LSE output has a gradient)
  dV_j = sum_i P_ij dO_i;  dP = dO V^T;  dS = P * (dP - delta);  dK_j = scale * sum_i dS_ij Q_i;  dQ_i = scale * dS K
One program of the dK/dV kernel owns BLOCK_N keys of one kv head and walks every query head of its GQA group, so dK
and dV are summed over the group in registers (no atomics, deterministic); one program of the dQ kernel owns BLOCK_M
query rows of one head. The LSE term: d LSE_i / d S_ij = P_ij, so a gradient on the LSE output adds dLSE_i P_ij to
dS_ij, which is the same as subtracting it from delta_i.

Two layouts, one set of kernels (`VARLEN`): dense (B, H, S, D) tensors, causal top-left as in the forward; and packed
variable-length batches (total, H, D) as `attention_varlen`'s, where batch entry b is the sequence between
cu_seqlens[b] and cu_seqlens[b + 1] (the batch stride is 0 and rows start at the sequence's first row), causal
bottom-right, and the grid covers the longest sequence (programs past their sequence's end do nothing). The LSE, its
gradient and delta are (B, Hq, Sq) contiguous dense, (Hq, total_q) packed (`_row_base`).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from xkernels.common.seqlen import Band, kv_band_start, kv_bounds_shifted, q_bounds, sequence
from xkernels.portable.dot import mma
from xkernels.portable.softmax import cap_tanh


@triton.jit
def _row_base(b, h, q0, HQ, SQ, lse_sh, VARLEN: tl.constexpr):
    """Where head h of batch entry b starts in the LSE, its gradient and delta: contiguous (B, Hq, Sq) dense,
    (Hq, total_q) with head stride `lse_sh` packed."""
    if VARLEN:
        return h * lse_sh + q0
    else:
        return (b * HQ + h) * SQ


@triton.jit
def preprocess_kernel(O, DO, DLSE, DELTA, DQ_ACC, CU_Q, o_sb, o_sh, o_ss, do_sb, do_sh, do_ss, lse_sh, HQ, SQ,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
                      VARLEN: tl.constexpr):
    """delta = rowsum(dO * O) - dLSE per query row; with ZERO_DQ (dense only) also zeroes the rows of the fp32 dQ
    buffer (contiguous (B * Hq * Sq, D)) that the fused Hopper backward reduces into."""
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)
    b, h = bh // HQ, bh % HQ
    q0, sq, _, _, _ = sequence(CU_Q, CU_Q, b, SQ, SQ, VARLEN)
    rows = (tl.program_id(0) % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    keep = rows[:, None] < sq
    o = tl.load(O + b * o_sb + h * o_sh + (q0 + rows[:, None]) * o_ss + cols[None, :], mask=keep, other=0.0)
    do = tl.load(DO + b * do_sb + h * do_sh + (q0 + rows[:, None]) * do_ss + cols[None, :], mask=keep, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_offs = _row_base(b, h, q0, HQ, SQ, lse_sh, VARLEN) + rows
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_offs, mask=rows < sq, other=0.0)
    tl.store(DELTA + row_offs, delta, mask=rows < sq)
    if ZERO_DQ:
        tl.store(DQ_ACC + (bh * SQ + rows[:, None]) * HEAD_DIM + cols[None, :],
                 tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), mask=keep)


@triton.jit
def _row_block(HQ, SQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's BLOCK_M query rows of one dense (batch, head): (bh, b, h, rows, cols, rows-inside mask)."""
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)
    rows = (tl.program_id(0) % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    return bh, bh // HQ, bh % HQ, rows, tl.arange(0, HEAD_DIM), rows[:, None] < SQ


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
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                do_sb, do_sh, do_ss, dk_sb, dk_sh, dk_ss, dv_sb, dv_sh, dv_ss, lse_sh, HQ, HKV, GROUP, SQ,
                SKV, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                INTERPRET: tl.constexpr, VARLEN: tl.constexpr, SHIFT: tl.constexpr = 0, BAND: tl.constexpr = -1,
                SOFTCAP: tl.constexpr = 0.0):
    """Works on transposed scores, S^T = K Q^T (keys on rows): P^T and dS^T come out of one product as the left
    operand of the next (dV += P^T dO, dK += dS^T Q), so nothing is transposed in registers."""
    n_blocks = tl.cdiv(SKV, BLOCK_N)
    bhk = (tl.program_id(0) // n_blocks).to(tl.int64)
    b, hk = bhk // HKV, bhk % HKV
    q0, sq, k0, skv, offset = sequence(CU_Q, CU_K, b, SQ, SKV, VARLEN)
    offset += SHIFT
    start_n = (tl.program_id(0) % n_blocks) * BLOCK_N
    # a program past its sequence's last key walks no query and stores nothing (its loads and stores are masked)
    lo, q_end = q_bounds(start_n, offset, sq, skv, BLOCK_M, CAUSAL, VARLEN, BLOCK_N, BAND)
    keys = start_n + tl.arange(0, BLOCK_N)
    k_base = K + b * k_sb + hk * k_sh + k0 * k_ss
    v_base = V + b * v_sb + hk * v_sh + k0 * v_ss
    k = _tile(k_base, k_ss, start_n, skv, HEAD_DIM, BLOCK_N)
    v = _tile(v_base, v_ss, start_n, skv, HEAD_DIM, BLOCK_N)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    qk_scale = scale * 1.4426950408889634
    for g in range(GROUP):
        h = (hk * GROUP + g).to(tl.int64)
        q_base = Q + b * q_sb + h * q_sh + q0 * q_ss
        do_base = DO + b * do_sb + h * do_sh + q0 * do_ss
        row_base = _row_base(b, h, q0, HQ, SQ, lse_sh, VARLEN)
        for start_m in range(lo, q_end, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q_t = _tile_t(q_base, q_ss, start_m, sq, HEAD_DIM, BLOCK_M)
            do = _tile(do_base, do_ss, start_m, sq, HEAD_DIM, BLOCK_M)
            lse = tl.load(LSE + row_base + rows, mask=rows < sq, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=rows < sq, other=0.0)
            s_t = mma(k, q_t, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
            keep = (keys[:, None] < skv) & (rows[None, :] < sq)
            if CAUSAL:
                keep = keep & (keys[:, None] <= rows[None, :] + offset)
            if BAND >= 0:
                keep = keep & (keys[:, None] >= rows[None, :] + offset - BAND)
            if SOFTCAP > 0:
                t_t = cap_tanh(s_t, qk_scale, SOFTCAP)
                s_t = SOFTCAP * t_t
            else:
                s_t = s_t * qk_scale
            p_t = tl.where(keep, tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634), 0.0)
            dv = mma(p_t.to(do.dtype), do, dv, INTERPRET)
            dp_t = mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), INTERPRET)
            ds_t = p_t * (dp_t - delta[None, :])
            if SOFTCAP > 0:  # dS through the cap: its derivative 1 - tanh^2
                ds_t = ds_t * (1.0 - t_t * t_t)
            dk = mma(ds_t.to(q_t.dtype), tl.trans(q_t), dk, INTERPRET)
    cols = tl.arange(0, HEAD_DIM)
    keep_n = keys[:, None] < skv
    tl.store(DK + b * dk_sb + hk * dk_sh + (k0 + keys[:, None]) * dk_ss + cols[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=keep_n)
    tl.store(DV + b * dv_sb + hk * dv_sh + (k0 + keys[:, None]) * dv_ss + cols[None, :],
             dv.to(DV.dtype.element_ty), mask=keep_n)


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
              do_sb, do_sh, do_ss, dq_sb, dq_sh, dq_ss, lse_sh, HQ, GROUP, SQ, SKV, scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              INTERPRET: tl.constexpr, VARLEN: tl.constexpr, SHIFT: tl.constexpr = 0, BAND: tl.constexpr = -1,
              SOFTCAP: tl.constexpr = 0.0):
    m_blocks = tl.cdiv(SQ, BLOCK_M)
    bh = (tl.program_id(0) // m_blocks).to(tl.int64)
    b, h = bh // HQ, bh % HQ
    hk = h // GROUP
    q0, sq, k0, skv, offset = sequence(CU_Q, CU_K, b, SQ, SKV, VARLEN)
    offset += SHIFT
    start_m = (tl.program_id(0) % m_blocks) * BLOCK_M
    if start_m < sq:
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _tile(Q + b * q_sb + h * q_sh + q0 * q_ss, q_ss, start_m, sq, HEAD_DIM, BLOCK_M)
        do = _tile(DO + b * do_sb + h * do_sh + q0 * do_ss, do_ss, start_m, sq, HEAD_DIM, BLOCK_M)
        row_base = _row_base(b, h, q0, HQ, SQ, lse_sh, VARLEN)
        lse = tl.load(LSE + row_base + rows, mask=rows < sq, other=0.0)
        delta = tl.load(DELTA + row_base + rows, mask=rows < sq, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        _, hi = kv_bounds_shifted(start_m, offset, skv, BLOCK_M, BLOCK_N, CAUSAL)
        lo = 0
        if BAND >= 0:
            lo, _ = kv_band_start(start_m, offset, BLOCK_M, BLOCK_N, BAND)
        k_base = K + b * k_sb + hk * k_sh + k0 * k_ss
        v_base = V + b * v_sb + hk * v_sh + k0 * v_ss
        qk_scale = scale * 1.4426950408889634
        for step in range(0, hi - lo, BLOCK_N):  # counted from 0: from `lo`, ptxas keeps 8 bytes of stack (sm_120)
            start_n = lo + step
            keys = start_n + tl.arange(0, BLOCK_N)
            k = _tile(k_base, k_ss, start_n, skv, HEAD_DIM, BLOCK_N)
            v = _tile(v_base, v_ss, start_n, skv, HEAD_DIM, BLOCK_N)
            s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
            keep = (rows[:, None] < sq) & (keys[None, :] < skv)
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None] + offset)
            if BAND >= 0:
                keep = keep & (keys[None, :] >= rows[:, None] + offset - BAND)
            if SOFTCAP > 0:
                t = cap_tanh(s, qk_scale, SOFTCAP)
                s = SOFTCAP * t
            else:
                s = s * qk_scale
            p = tl.where(keep, tl.math.exp2(s - lse[:, None] * 1.4426950408889634), 0.0)
            dp = mma(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
            ds = p * (dp - delta[:, None])
            if SOFTCAP > 0:  # dS through the cap: its derivative 1 - tanh^2
                ds = ds * (1.0 - t * t)
            dq = mma(ds.to(k.dtype), k, dq, INTERPRET)
        cols = tl.arange(0, HEAD_DIM)
        tl.store(DQ + b * dq_sb + h * dq_sh + (q0 + rows[:, None]) * dq_ss + cols[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None] < sq)


@dataclass(frozen=True)
class Packed:
    """A packed variable-length batch (`attention_varlen`'s layout): the cu_seqlens (int32, contiguous) and the longest
    sequences, which size the grids."""

    cu_seqlens_q: object
    cu_seqlens_k: object
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


def _strides(t, packed: Packed | None) -> tuple[int, int, int]:
    """(batch, head, row) strides of a dense (B, H, S, D) tensor, or of a packed (total, H, D) one (batch stride 0:
    rows are counted from each sequence's first row)."""
    return tuple(t.stride()[:3]) if packed is None else (0, t.stride(1), t.stride(0))


def _sizes(q, k, packed: Packed | None) -> tuple[int, int, int, int, int, int]:
    """(batch, Hq, Hkv, Sq, Skv, D): the grids' extents (the longest sequences when packed)."""
    if packed is None:
        b, hq, sq, d = q.shape
        return b, hq, k.shape[1], sq, k.shape[2], d
    return packed.batch, q.shape[1], k.shape[1], packed.max_seqlen_q, packed.max_seqlen_k, q.shape[2]


def _lse_head_stride(lse, packed: Packed | None) -> int:
    """The head stride of a packed (Hq, total_q) LSE, its gradient and delta (dense ones are contiguous
    (B, Hq, Sq): the kernels address them from Hq and Sq)."""
    return 0 if packed is None else lse.shape[1]


def _cu(q, packed: Packed | None):
    """The cu_seqlens arguments (any pointer for dense calls, which never read them)."""
    return (q, q) if packed is None else (packed.cu_seqlens_q, packed.cu_seqlens_k)


def preprocess(o, do, grad_lse, *, block_m: int, num_warps: int = 4, dq_accum=None, packed: Packed | None = None):
    """delta = rowsum(dO * O) - dLSE, fp32 in the LSE's layout ((B, Hq, Sq), or (Hq, total_q) packed): the
    backward's one workspace; `dq_accum` (the fused Hopper backward's contiguous fp32 dQ buffer, dense only), if
    given, is zeroed in the same pass."""
    import torch

    from xkernels.common.launch import run as run_kernel

    b, hq, _, sq, _, d = _sizes(o, o, packed)
    shape = (b, hq, sq) if packed is None else (hq, o.shape[0])
    delta = torch.empty(shape, dtype=torch.float32, device=o.device)
    run_kernel(preprocess_kernel, triton.cdiv(sq, block_m) * b * hq,
               (o, do, delta if grad_lse is None else grad_lse, delta, delta if dq_accum is None else dq_accum,
                _cu(o, packed)[0], *_strides(o, packed), *_strides(do, packed), _lse_head_stride(delta, packed),
                hq, sq),
               dict(HEAD_DIM=d, BLOCK_M=block_m, HAS_DLSE=grad_lse is not None, ZERO_DQ=dq_accum is not None,
                    VARLEN=packed is not None),
               dict(num_warps=num_warps))
    return delta


def finish_dq(dq_accum, dq, *, scale: float, block_m: int, num_warps: int = 4) -> None:
    """dq = scale * dq_accum (the fused Hopper backward's fp32 sums), in dq's dtype and layout."""
    from xkernels.common.launch import run as run_kernel

    b, hq, sq, d = dq.shape
    run_kernel(dq_finish_kernel, triton.cdiv(sq, block_m) * b * hq,
               (dq_accum, dq, *dq.stride()[:3], hq, sq, scale), dict(HEAD_DIM=d, BLOCK_M=block_m),
               dict(num_warps=num_warps))


def launch_dq(q, k, v, do, lse, delta, dq, *, is_causal: bool, scale: float, cfg,
              packed: Packed | None = None, band: Band | None = None, softcap: float = 0.0) -> None:
    from xkernels.common.launch import run as run_kernel

    b, hq, hkv, sq, skv, d = _sizes(q, k, packed)
    run_kernel(dq_kernel, triton.cdiv(sq, cfg.q_m) * b * hq,
               (q, k, v, do, lse, delta, dq, *_cu(q, packed), *_strides(q, packed), *_strides(k, packed),
                *_strides(v, packed), *_strides(do, packed), *_strides(dq, packed), _lse_head_stride(lse, packed),
                hq, hq // hkv, sq, skv, scale),
               cfg.dq_constexprs(d, causal=is_causal, varlen=packed is not None, band=band, softcap=softcap),
               cfg.options())


def launch(q, k, v, o, lse, do, dq, dk, dv, grad_lse, *, is_causal: bool, scale: float, cfg,
           packed: Packed | None = None, band: Band | None = None, softcap: float = 0.0) -> None:
    """Gradients of O = attention(q, k, v) given dO (and dLSE, or None), written into dq, dk, dv (allocated by the
    caller, any strides with a unit last stride, like every input): dense (B, H, S, D) tensors with `lse` and
    `grad_lse` (B, Hq, Sq) contiguous fp32, or with `packed` a varlen batch, (total, H, D) tensors with `lse` and
    `grad_lse` (Hq, total_q); `band` a sliding window, `softcap` the scores' soft cap. Workspace: delta, one fp32
    per query row and head."""
    from xkernels.common.launch import run as run_kernel

    b, hq, hkv, sq, skv, d = _sizes(q, k, packed)
    delta = preprocess(o, do, grad_lse, block_m=cfg.q_m, num_warps=cfg.num_warps, packed=packed)
    run_kernel(dkdv_kernel, triton.cdiv(skv, cfg.kv_n) * b * hkv,
               (q, k, v, do, lse, delta, dk, dv, *_cu(q, packed), *_strides(q, packed), *_strides(k, packed),
                *_strides(v, packed), *_strides(do, packed), *_strides(dk, packed), *_strides(dv, packed),
                _lse_head_stride(lse, packed), hq, hkv, hq // hkv, sq, skv, scale),
               cfg.dkdv_constexprs(d, causal=is_causal, varlen=packed is not None, band=band, softcap=softcap),
               cfg.options())
    launch_dq(q, k, v, do, lse, delta, dq, is_causal=is_causal, scale=scale, cfg=cfg, packed=packed, band=band,
              softcap=softcap)
