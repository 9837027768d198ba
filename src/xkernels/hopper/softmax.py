"""Online softmax for the Hopper attention consumers: one K/V tile's scores in, P and the running statistics out.

Scores stay unscaled until the exponent: with a positive scale (folded with log2 e on the host) the row maximum of the
raw scores times the scale is the maximum of the scaled scores, so `exp2(s * scale - m)` is one FFMA + one MUFU.EX2
per element. A scale <= 0 (legal in SDPA, never the default) breaks that identity: the consumer then scales the scores
before masking and calls `softmax_step` with a scale of 1.

MUFU.EX2 issues 16 exponentials per clock per SM, the FMA pipe 128 FP32 ops. At head dim 64 the exponentials of a
tile take as long as its two wgmmas, so `FMA_EXP` moves 1 in 2 or 1 in 4 of them onto the FMA pipe (a Cody-Waite
range reduction and a cubic, about 7 FP32 ops each; FlashAttention-4's trick). The split is register-local: the
wgmma accumulator layout keeps adjacent column pairs, and 8-column groups, in one thread.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def mask_scores(qk, start_n, offs_m, SKV, CAUSAL: gl.constexpr, cols_layout: gl.constexpr):
    """-inf for keys past the sequence end and, when causal, keys after the query (top-left aligned)."""
    keys = gl.expand_dims(start_n + gl.arange(0, qk.shape[1], cols_layout), 0)
    keep = keys < SKV
    if CAUSAL:
        keep = keep & (keys <= gl.expand_dims(offs_m, 1))
    return gl.where(keep, qk, float("-inf"))


@gluon.jit
def exp2_fma(x):
    """2**x for x <= 0 on the FMA pipe: round x to j with the 1.5 * 2**23 trick, a cubic for 2**(x - j) on
    [-0.5, 0.5] (relative error 8e-5, below fp16's and bf16's rounding of P), then add j to the exponent bits.
    x is clamped at -126 so the exponent never wraps: 2**-126 (1.2e-38) stands in for 0 (0 in fp16 P, negligible in
    bf16 P and in the row sum). A NaN score stays NaN (the clamp alone would turn it into 1.2e-38)."""
    xc = gl.maximum(x, -126.0)
    t = xc + 12582912.0
    f = xc - (t - 12582912.0)
    p = 0.05508868396282196 * f + 0.24260404706001282
    p = p * f + 0.6932762265205383
    p = p * f + 0.9999289512634277
    # the low mantissa bits of t hold j (two's complement), so t's bits << 23 are j << 23
    y = (p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)).to(gl.float32, bitcast=True)
    return gl.where(x == x, y, x)


@gluon.jit
def exp2_mixed(x, FMA_EXP: gl.constexpr):
    """exp2 of a [M, N] wgmma-layout tile with 1 in FMA_EXP elements (0: none, 2 or 4) on the FMA pipe."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    if FMA_EXP == 2:  # split each thread's adjacent column pair
        a, b = gl.split(gl.reshape(x, [M, N // 2, 2]))
        y = gl.reshape(gl.join(gl.exp2(a), exp2_fma(b)), [M, N])
    elif FMA_EXP == 4:  # split each thread's pair of 8-column groups, then the pairs of one group
        a, b = gl.split(gl.permute(gl.reshape(x, [M, N // 16, 2, 8]), [0, 1, 3, 2]))
        b0, b1 = gl.split(gl.reshape(b, [M, N // 16, 4, 2]))
        b = gl.convert_layout(gl.reshape(gl.join(gl.exp2(b0), exp2_fma(b1)), [M, N // 16, 8]), a.type.layout)
        y = gl.reshape(gl.permute(gl.join(gl.exp2(a), b), [0, 1, 3, 2]), [M, N])
    else:
        gl.static_assert(FMA_EXP == 0, "FMA_EXP: 0, 2 or 4")
        y = gl.exp2(x)
    return gl.convert_layout(y, x.type.layout)  # the same register mapping under another name: no data moves


@gluon.jit
def softmax_step(qk, m_i, l_i, qk_scale, FMA_EXP: gl.constexpr = 0):
    """P = exp2(qk * qk_scale - new row max), the new max, the new row sum and alpha = exp2(old max - new max);
    qk_scale must be > 0.

    Every row has a finite score in the first tile it sees (key 0 is never masked), so after that m is finite and
    alpha is never NaN; a fully masked row of a later tile gives p = 0 (1.2e-38 on the FMA_EXP lanes) and
    alpha = 1.
    """
    m_new = gl.maximum(m_i, gl.max(qk, 1) * qk_scale)
    p = exp2_mixed(qk * qk_scale - gl.expand_dims(m_new, 1), FMA_EXP)
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha
