"""float64 references on the kernel's (already quantized) inputs: the seeds' rule, usable on CPU and GPU.

The inputs arrive in the kernel's dtype, so upcasting them gives exactly the values the kernel saw. Attention is
computed one (batch, head) at a time to bound the S x S score matrix's memory at the bench shapes.
"""

from __future__ import annotations

import math

import torch

NO_WINDOW = (-1, -1)


def visible(sq: int, skv: int, *, is_causal: bool, window: tuple[int, int] = NO_WINDOW, offset: int = 0,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """(Sq, Skv) bool: key j visible from query i, whose diagonal is at i + offset (0: top-left, as
    F.scaled_dot_product_attention(is_causal=True); Skv - Sq: bottom-right, as flash_attn): causal keeps j <= i +
    offset, a window (left, right) keeps i + offset - left <= j <= i + offset + right, -1 unbounded."""
    i = torch.arange(sq, device=device)[:, None] + offset
    j = torch.arange(skv, device=device)[None, :]
    keep = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if is_causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    return keep


def _scores(q, k, is_causal: bool, scale: float | None, window: tuple[int, int] = NO_WINDOW, offset: int = 0,
            softcap: float = 0.0):
    """Scaled scores, soft-capped to softcap * tanh(s / softcap) when softcap > 0, masked to -inf."""
    d = q.shape[-1]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d) if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if is_causal or window != NO_WINDOW:
        s = s.masked_fill(~visible(q.shape[-2], k.shape[-2], is_causal=is_causal, window=window, offset=offset,
                                   device=q.device), float("-inf"))
    return s


def _softmax(s: torch.Tensor) -> torch.Tensor:
    """Row softmax; a row that sees no key (all -inf) is 0, as the kernels return it."""
    return torch.softmax(s, -1).nan_to_num(0.0)


def _per_head(q, k, v, fn):
    b, hq = q.shape[:2]
    group = hq // k.shape[1]
    outs = []
    for bi in range(b):
        outs.append(torch.stack([fn(q[bi, h].double(), k[bi, h // group].double(), v[bi, h // group].double())
                                 for h in range(hq)]))
    return torch.stack(outs)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                        scale: float | None = None, window: tuple[int, int] = NO_WINDOW,
                        softcap: float = 0.0) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64; GQA by head-index mapping (head h uses kv head h // (Hq / Hkv)); causal
    and `window` top-left (`visible`), a row that sees no key 0; `softcap` as flash_attn's."""
    return _per_head(q, k, v, lambda qh, kh, vh: _softmax(_scores(qh, kh, is_causal, scale, window,
                                                                  softcap=softcap)) @ vh)


def reference_lse(q: torch.Tensor, k: torch.Tensor, *, is_causal: bool = False,
                  scale: float | None = None, window: tuple[int, int] = NO_WINDOW,
                  softcap: float = 0.0) -> torch.Tensor:
    """Natural-log log-sum-exp of the scaled scores, (B, Hq, Sq), float64 (-inf where a row sees no key)."""
    return _per_head(q, k, k, lambda qh, kh, _: torch.logsumexp(_scores(qh, kh, is_causal, scale, window,
                                                                        softcap=softcap), -1))


def reference_attention_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, *,
                              is_causal: bool = False, scale: float | None = None,
                              grad_lse: torch.Tensor | None = None, window: tuple[int, int] = NO_WINDOW,
                              softcap: float = 0.0) -> tuple[torch.Tensor, ...]:
    """(dQ, dK, dV) in float64 by autograd through the float64 attention (and the LSE when `grad_lse` is given), on
    the same quantized q, k, v and dO, one (batch, query head) at a time; GQA gradients sum over each group. Rows
    that see no key (a window past the keys) are constants (O = 0, LSE = -inf): no gradient flows through them."""
    b, hq = q.shape[:2]
    group = hq // k.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    for bi in range(b):
        for h in range(hq):
            qh, kh, vh = (t.detach().double().requires_grad_() for t in (q[bi, h], k[bi, h // group],
                                                                         v[bi, h // group]))
            s = _scores(qh, kh, is_causal, scale, window, softcap=softcap)
            seen = (s > float("-inf")).any(-1)
            s = s[seen]
            loss = ((torch.softmax(s, -1) @ vh) * grad_out[bi, h].double()[seen]).sum()
            if grad_lse is not None:
                loss = loss + (torch.logsumexp(s, -1) * grad_lse[bi, h].double()[seen]).sum()
            gq, gk, gv = torch.autograd.grad(loss, (qh, kh, vh), allow_unused=True)
            for full, at, g in ((dq, (bi, h), gq), (dk, (bi, h // group), gk), (dv, (bi, h // group), gv)):
                if g is not None:  # None: no row saw a key
                    full[at] += g
    return dq, dk, dv


def reference_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, *, is_causal: bool = False, scale: float | None = None,
                               window: tuple[int, int] = (-1, -1),
                               softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (total_q, Hq, D), LSE (Hq, total_q)) in float64 for packed sequences, causal aligned bottom-right (query
    i sees keys j <= i + Sk - Sq); `window` (left, right), -1 unbounded, keeps keys i + Sk - Sq - left .. + right;
    rows that see no key give O = 0 and LSE = -inf."""
    hq = q.shape[1]
    group = hq // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].double().transpose(0, 1)
        ks = k[ck[b]:ck[b + 1]].double().transpose(0, 1).repeat_interleave(group, 0)
        vs = v[ck[b]:ck[b + 1]].double().transpose(0, 1).repeat_interleave(group, 0)
        sq, sk = qs.shape[1], ks.shape[1]
        if sq == 0 or sk == 0:
            continue
        s = _scores(qs, ks, is_causal, scale, window, sk - sq, softcap)  # bottom-right
        out[cq[b]:cq[b + 1]] = (_softmax(s) @ vs).transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = torch.logsumexp(s, -1)
    return out, lse


def reference_attention_varlen_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                                     is_causal: bool = False, scale: float | None = None,
                                     grad_lse: torch.Tensor | None = None, window: tuple[int, int] = NO_WINDOW,
                                     softcap: float = 0.0) -> tuple[torch.Tensor, ...]:
    """(dQ, dK, dV) of packed sequences in float64 by autograd, one sequence at a time (causal bottom-right); dO
    (total_q, Hq, D) and dLSE (Hq, total_q). Rows that see no key have O = 0 and LSE = -inf as constants: no gradient
    flows through them (their dLSE is ignored), as in the kernel."""
    hq = q.shape[1]
    group = hq // k.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        rows_q, rows_k = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        qs, ks, vs = (t.detach().double().requires_grad_() for t in (q[rows_q], k[rows_k], v[rows_k]))
        sq, sk = qs.shape[0], ks.shape[0]
        if sq == 0 or sk == 0:
            continue
        s = _scores(qs.transpose(0, 1), ks.transpose(0, 1).repeat_interleave(group, 0), is_causal, scale, window,
                    sk - sq, softcap)  # (Hq, sq, sk), bottom-right
        seen = visible(sq, sk, is_causal=is_causal, window=window, offset=sk - sq, device=q.device).any(-1)
        s = s[:, seen]  # rows that see a key; the others contribute nothing
        o = torch.softmax(s, -1) @ vs.transpose(0, 1).repeat_interleave(group, 0)
        loss = (o * grad_out[rows_q].double().transpose(0, 1)[:, seen]).sum()
        if grad_lse is not None:
            loss = loss + (torch.logsumexp(s, -1) * grad_lse[:, rows_q].double()[:, seen]).sum()
        grads = torch.autograd.grad(loss, (qs, ks, vs), allow_unused=True)  # None: no row saw a key
        for full, rows, g in ((dq, rows_q, grads[0]), (dk, rows_k, grads[1]), (dv, rows_k, grads[2])):
            if g is not None:
                full[rows] = g
    return dq, dk, dv


def reference_matmul(a: torch.Tensor, b: torch.Tensor, b_layout: str = "kn") -> torch.Tensor:
    """a @ b (or a @ b^T for the [N, K] layout) in float64, so the reference adds no rounding of its own."""
    bb = b.double()
    return a.double() @ (bb.transpose(-1, -2) if b_layout == "nk" else bb)
