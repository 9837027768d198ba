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


def _softmax(s: torch.Tensor, sink=None) -> torch.Tensor:
    """Row softmax; a row that sees no key (all -inf) is 0, as the kernels return it. `sink`: a logit that joins
    every row as a key of value 0 (gpt-oss's attention sinks): the probabilities of the real keys."""
    if sink is not None:
        return torch.softmax(torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1), -1)[..., :-1]
    return torch.softmax(s, -1).nan_to_num(0.0)


def _logsumexp(s: torch.Tensor, sink=None) -> torch.Tensor:
    if sink is not None:
        return torch.logsumexp(torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1), -1)
    return torch.logsumexp(s, -1)


def _sink(sinks, h: int):
    return None if sinks is None else sinks[h].double().reshape(1)


def _per_head(q, k, v, fn):
    """fn(q, k, v, head) in float64 for every (batch, query head), stacked."""
    b, hq = q.shape[:2]
    group = hq // k.shape[1]
    outs = []
    for bi in range(b):
        outs.append(torch.stack([fn(q[bi, h].double(), k[bi, h // group].double(), v[bi, h // group].double(), h)
                                 for h in range(hq)]))
    return torch.stack(outs)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                        scale: float | None = None, window: tuple[int, int] = NO_WINDOW,
                        softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v in float64; GQA by head-index mapping (head h uses kv head h // (Hq / Hkv)); causal
    and `window` top-left (`visible`), a row that sees no key 0; `softcap` as flash_attn's; `sinks` (Hq,) as
    gpt-oss's."""
    return _per_head(q, k, v, lambda qh, kh, vh, h: _softmax(_scores(qh, kh, is_causal, scale, window,
                                                                     softcap=softcap), _sink(sinks, h)) @ vh)


def reference_lse(q: torch.Tensor, k: torch.Tensor, *, is_causal: bool = False,
                  scale: float | None = None, window: tuple[int, int] = NO_WINDOW,
                  softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Natural-log log-sum-exp of the scaled scores (and the sink), (B, Hq, Sq), float64 (-inf where a row sees no
    key and there is no sink)."""
    return _per_head(q, k, k, lambda qh, kh, _, h: _logsumexp(_scores(qh, kh, is_causal, scale, window,
                                                                      softcap=softcap), _sink(sinks, h)))


def _given_o_term(o: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor, given) -> torch.Tensor:
    """The loss term that turns the exact gradient into the backward's given the forward's stored O (None: 0).

    Autograd's softmax backward computes dS = P (dP - delta) with delta = rowsum(dO * O) of the exact O. Every
    FlashAttention-style backward reads O as the forward stored it (fp16/bf16, from P rounded before P.V), so its
    delta carries the forward's rounding; where a row's exact dQ cancels (its probability on a few keys) that
    rounding, not the backward, sets the row's error, and it does not shrink with the sequence length as the
    gradients' RMS does. Since d LSE / d s = P, adding c * LSE with the constant c = rowsum(dO * (O - O_given)) per
    row gives dS = P (dP - rowsum(dO * O_given)): the exact gradient of the backward given its inputs (the sinks'
    too: d LSE / d sink = P_sink)."""
    if given is None:
        return lse.new_zeros(())
    c = (grad_out * (o - given)).sum(-1).detach()
    return (lse * c).sum()


def reference_attention_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, *,
                              is_causal: bool = False, scale: float | None = None,
                              grad_lse: torch.Tensor | None = None, window: tuple[int, int] = NO_WINDOW,
                              softcap: float = 0.0, sinks: torch.Tensor | None = None,
                              out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """(dQ, dK, dV) in float64 by autograd through the float64 attention (and the LSE when `grad_lse` is given), on
    the same quantized q, k, v and dO, one (batch, query head) at a time; GQA gradients sum over each group. Rows
    that see no key (a window past the keys) are constants (O = 0, LSE = -inf): no gradient flows through them.
    With `sinks` (Hq,), (dQ, dK, dV, dSinks). `out`: the forward's O as the backward reads it, for the exact
    gradient of the backward given its inputs (`_given_o_term`), where the exact one would measure the forward's
    rounding (rows that cancel, at long sequences)."""
    b, hq = q.shape[:2]
    group = hq // k.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float64, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    dsinks = None if sinks is None else torch.zeros(hq, dtype=torch.float64, device=q.device)
    for bi in range(b):
        for h in range(hq):
            qh, kh, vh = (t.detach().double().requires_grad_() for t in (q[bi, h], k[bi, h // group],
                                                                         v[bi, h // group]))
            leaves = (qh, kh, vh)
            s = _scores(qh, kh, is_causal, scale, window, softcap=softcap)
            sink = None
            if sinks is None:  # rows that see a key; the others contribute nothing
                rows = (s > float("-inf")).any(-1)
                s = s[rows]
            else:  # every row sees its sink
                rows = torch.ones(s.shape[0], dtype=torch.bool, device=s.device)
                sink = sinks[h].detach().double().reshape(1).requires_grad_()
                leaves += (sink,)
            o, do = _softmax(s, sink) @ vh, grad_out[bi, h].double()[rows]
            given = None if out is None else out[bi, h].double()[rows]
            loss = (o * do).sum() + _given_o_term(o, do, _logsumexp(s, sink), given)
            if grad_lse is not None:
                loss = loss + (_logsumexp(s, sink) * grad_lse[bi, h].double()[rows]).sum()
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            for full, at, g in ((dq, (bi, h), grads[0]), (dk, (bi, h // group), grads[1]),
                                (dv, (bi, h // group), grads[2])):
                if g is not None:  # None: no row saw a key
                    full[at] += g
            if sink is not None:
                dsinks[h] += grads[3][0]
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def reference_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, *, is_causal: bool = False, scale: float | None = None,
                               window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                               sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (total_q, Hq, D), LSE (Hq, total_q)) in float64 for packed sequences, causal aligned bottom-right (query
    i sees keys j <= i + Sk - Sq); `window` (left, right), -1 unbounded, keeps keys i + Sk - Sq - left .. + right;
    rows that see no key give O = 0 and LSE = -inf (with `sinks`, LSE = the head's sink)."""
    sink = None if sinks is None else sinks.double()[:, None, None]
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
        if sq == 0 or (sk == 0 and sink is None):
            continue
        s = _scores(qs, ks, is_causal, scale, window, sk - sq, softcap)  # bottom-right
        out[cq[b]:cq[b + 1]] = (_softmax(s, sink) @ vs).transpose(0, 1)
        lse[:, cq[b]:cq[b + 1]] = _logsumexp(s, sink)
    return out, lse


def reference_attention_varlen_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                                     is_causal: bool = False, scale: float | None = None,
                                     grad_lse: torch.Tensor | None = None, window: tuple[int, int] = NO_WINDOW,
                                     softcap: float = 0.0, sinks: torch.Tensor | None = None,
                                     out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """(dQ, dK, dV) of packed sequences in float64 by autograd, one sequence at a time (causal bottom-right); dO
    (total_q, Hq, D) and dLSE (Hq, total_q). Rows that see no key have O = 0 and LSE = -inf as constants: no gradient
    flows through them (their dLSE is ignored), as in the kernel. With `sinks` (Hq,) every row sees its sink, and
    the result is (dQ, dK, dV, dSinks). `out` (total_q, Hq, D) as in `reference_attention_grads`."""
    dsinks = None if sinks is None else torch.zeros(sinks.shape, dtype=torch.float64, device=q.device)
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
        if sq == 0 or (sk == 0 and sinks is None):
            continue
        s = _scores(qs.transpose(0, 1), ks.transpose(0, 1).repeat_interleave(group, 0), is_causal, scale, window,
                    sk - sq, softcap)  # (Hq, sq, sk), bottom-right
        leaves, sink = (qs, ks, vs), None
        if sinks is None:  # rows that see a key; the others contribute nothing
            seen = visible(sq, sk, is_causal=is_causal, window=window, offset=sk - sq, device=q.device).any(-1)
        else:  # every row sees its sink
            seen = torch.ones(sq, dtype=torch.bool, device=q.device)
            sink = sinks.detach().double().requires_grad_()
            leaves += (sink,)
        s = s[:, seen]
        o = _softmax(s, None if sink is None else sink[:, None, None]) @ \
            vs.transpose(0, 1).repeat_interleave(group, 0)
        do = grad_out[rows_q].double().transpose(0, 1)[:, seen]
        given = None if out is None else out[rows_q].double().transpose(0, 1)[:, seen]
        loss = (o * do).sum() + _given_o_term(o, do, _logsumexp(s, None if sink is None else sink[:, None, None]),
                                              given)
        if grad_lse is not None:
            loss = loss + (_logsumexp(s, None if sink is None else sink[:, None, None])
                           * grad_lse[:, rows_q].double()[:, seen]).sum()
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)  # None: no row saw a key
        for full, rows, g in ((dq, rows_q, grads[0]), (dk, rows_k, grads[1]), (dv, rows_k, grads[2])):
            if g is not None:
                full[rows] = g
        if sink is not None:
            dsinks += grads[3]
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def reference_matmul(a: torch.Tensor, b: torch.Tensor, b_layout: str = "kn") -> torch.Tensor:
    """a @ b (or a @ b^T for the [N, K] layout) in float64, so the reference adds no rounding of its own."""
    bb = b.double()
    return a.double() @ (bb.transpose(-1, -2) if b_layout == "nk" else bb)
