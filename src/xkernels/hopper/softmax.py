"""Online softmax for the Hopper attention consumers: one K/V tile's scores in, P and the running statistics out.

Scores stay unscaled until the exponent: with a positive scale (folded with log2 e on the host) the row maximum of the
raw scores times the scale is the maximum of the scaled scores, so `exp2(s * scale - m)` is one FFMA + one MUFU.EX2
per element. A scale <= 0 (legal in SDPA, never the default) breaks that identity: the consumer then scales the scores
before masking and calls `softmax_step` with a scale of 1; so does a soft cap (`cap_scores`: scaled, then capped).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def mask_scores(qk, start_n, offs_m, SKV, CAUSAL: gl.constexpr, cols_layout: gl.constexpr, BAND: gl.constexpr = -1,
                fill: gl.constexpr = float("-inf")):
    """`fill` (-inf for scores, 0 for probabilities) for keys past the sequence end and, when causal, keys after the
    query: key j is kept for row i when j <= offs_m[i] (top-left aligned; callers shift offs_m for bottom-right and a
    window's right side); with a window's lower side (BAND >= 0, `common.seqlen.Band`) also keys j < offs_m[i] -
    BAND."""
    keys = gl.expand_dims(start_n + gl.arange(0, qk.shape[1], cols_layout), 0)
    if CAUSAL and BAND < 0:
        # one bound a row (j < min(i + 1, Skv)): one compare and one select an element, where two bounds
        # compared and combined separately cost a second select
        keep = keys < gl.expand_dims(gl.minimum(offs_m + 1, SKV), 1)
    else:
        keep = keys < SKV
        if CAUSAL:
            keep = keep & (keys <= gl.expand_dims(offs_m, 1))
        if BAND >= 0:
            keep = keep & (keys >= gl.expand_dims(offs_m - BAND, 1))
    return gl.where(keep, qk, fill)


@gluon.jit
def log2_approx(x):
    """log2 by the MUFU unit (`lg2.approx.f32`, relative error ~2^-22): `gl.log2` lowers to a ~15-instruction
    polynomial with range checks. For the epilogue's LSE of a row sum >= 1 (or 0: -inf, NaN: NaN)."""
    return gl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def cap_scores(qk, qk_scale, SOFTCAP: gl.constexpr):
    """Soft-capped scaled scores in base-2 units: SOFTCAP * tanh(qk * qk_scale / SOFTCAP), SOFTCAP the cap times
    log2(e) (`portable.softmax.softcap_constexpr`); tanh from exp2, as the portable kernels (saturates to +-1)."""
    return SOFTCAP * (1.0 - 2.0 / (gl.exp2(qk * (qk_scale / SOFTCAP * 2.8853900817779268)) + 1.0))


@gluon.jit
def softmax_step(qk, m_i, l_i, qk_scale, EMPTY_ROWS: gl.constexpr):
    """P = exp2(qk * qk_scale - new row max), the new max, the new row sum and alpha = exp2(old max - new max);
    qk_scale must be > 0.

    Dense calls: every row has a finite score in the first tile it sees (key 0 is never masked), so after that m is
    finite and alpha is never NaN; a fully masked row of a later tile gives p = 0 and alpha = 1. EMPTY_ROWS (varlen
    causal with more queries than keys): a row may see no key at all; its exponents use 0 for the -inf max (p = 0,
    alpha = 0), and the max carried on stays the true one, as in the portable `softmax.online_step`.
    """
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    m_use = m_new
    if EMPTY_ROWS:
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(qk * qk_scale - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha
