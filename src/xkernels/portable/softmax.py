"""The online softmax of the portable kernels, in base-2 units with the scale folded into the scores: the scores'
scale and soft cap, one update step per key tile and the final normalization, written once for the dense, varlen,
decode and backward kernels.

Soft-capping (Gemma 2, flash_attn's `softcap`) bounds each scaled score x = q.k * scale to cap * tanh(x / cap). The
kernels take it as the compile-time SOFTCAP = cap * log2(e) (0.0: off), the cap in their base-2 units, so the capped
score in those units is SOFTCAP * tanh(s * qk_scale / SOFTCAP) for a raw product s.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
LOG2E = 1.4426950408889634


def softcap_constexpr(softcap: float) -> float:
    """The kernels' SOFTCAP for the API's `softcap` (0.0: off)."""
    return softcap * LOG2E if softcap else 0.0


def softcap_name(softcap: float) -> str:
    """' softcap=<cap>' for a kernel's name in `last_backend()`, '' without one."""
    return f" softcap={softcap:g}" if softcap else ""


@triton.jit
def _tanh(x):
    """tanh from exp2 (every backend and the interpreter have it; libdevice's tanh is CUDA's only): saturates to
    +-1 for large |x|, absolute error ~1e-7 near 0."""
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def cap_tanh(s, qk_scale, SOFTCAP: tl.constexpr):
    """tanh(x / cap) of the raw products `s` (x = s * scale): the capped score is SOFTCAP times it, and the cap's
    derivative 1 - tanh^2 (the backward keeps it)."""
    return _tanh(s * (qk_scale / SOFTCAP))


@triton.jit
def scores(s, qk_scale, SOFTCAP: tl.constexpr):
    """The raw products `s` as scaled scores in base-2 units, soft-capped when SOFTCAP > 0."""
    if SOFTCAP > 0:
        out = SOFTCAP * cap_tanh(s, qk_scale, SOFTCAP)
    else:
        out = s * qk_scale
    return out


@triton.jit
def start_rows(sinks, BLOCK_M: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The running (row max, row sum) before the first key tile: empty, or with attention sinks (gpt-oss; `sinks`
    the rows' natural-log sink logits, in fp32) a key of its own per row whose value is 0, counted once: max = the
    sink in base-2 units, sum = 1. A sink is not scaled by the softmax scale (as in gpt-oss) and takes part in the
    LSE, so a row that sees no key gets O = 0 and LSE = its sink."""
    if HAS_SINKS:
        m_i = sinks * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
    return m_i, l_i


@triton.jit
def online_step(s, m_i, l_i, acc, EMPTY_ROWS: tl.constexpr):
    """Fold one tile of scaled scores `s` [M, N] (masked keys at -inf) into the running row max `m_i`, row sum `l_i`
    and accumulator `acc`. Returns (p, m_new, l_i, acc): p = exp2(s - m_new) for the P.V product the caller adds to
    the rescaled `acc`. EMPTY_ROWS: a row may have seen no key yet (its max is -inf); the exponents then use 0 in
    its place so nothing turns NaN, while the max carried on stays the true one (a stand-in would underflow every
    later exponent of a row whose scores all sit far below 0). Dense calls see key 0 in their first tile, so their
    max is always finite."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = m_new
    if EMPTY_ROWS:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    return p, m_new, l_i * alpha + tl.sum(p, 1), (acc * alpha[:, None]).to(acc.dtype)


@triton.jit
def finish(acc, l_i, m_i, EMPTY_ROWS: tl.constexpr):
    """(O in fp32, natural-log LSE of the scaled scores). EMPTY_ROWS: rows that saw no key (row sum exactly 0) get
    O = 0, LSE = -inf; a NaN row sum (a NaN or infinite score) stays NaN in O and the LSE, as in SDPA."""
    if EMPTY_ROWS:
        seen = l_i != 0
        o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
        return o, lse
    return acc / l_i[:, None], (m_i + tl.math.log2(l_i)) * LN2
