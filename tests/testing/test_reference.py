"""The gradient references' `out`: the exact gradient of the backward given the forward's stored O. It must equal
that formula written out (dense with GQA, a causal mask, dLSE and sinks; packed sequences), be the exact gradient
for the exact O, and measure a backward that is exact to its inputs closer than the exact reference does, while a
wrong row still fails against it."""

import math

import pytest
import torch

from tests.test_varlen_backward import _packed
from tests.testing.test_metrics import _rounded_dq
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_grad,
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen_grads,
)


def _written_out(q, k, v, do, dlse, sinks, out):
    """dS = P (dP - delta), delta = rowsum(dO * out) - dLSE, per (batch, query head), in float64; dK and dV summed
    over each GQA group; dSinks = -sum over rows of P_sink * delta."""
    b, hq, sq, d = q.shape
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(d)
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v))
    dsinks = torch.zeros(hq, dtype=torch.float64)
    keep = torch.arange(k.shape[2])[None] <= torch.arange(sq)[:, None]
    for bi in range(b):
        for h in range(hq):
            qh, kh, vh, doh = q[bi, h].double(), k[bi, h // group].double(), v[bi, h // group].double(), \
                do[bi, h].double()
            s = (qh @ kh.T * scale).masked_fill(~keep, float("-inf"))
            full = torch.softmax(torch.cat([s, sinks[h].double().expand(sq, 1)], -1), -1)
            p, p_sink = full[:, :-1], full[:, -1]
            delta = (doh * out[bi, h].double()).sum(-1) - dlse[bi, h].double()
            ds = p * (doh @ vh.T - delta[:, None])
            dq[bi, h] = scale * ds @ kh
            dk[bi, h // group] += scale * ds.T @ qh
            dv[bi, h // group] += p.T @ doh
            dsinks[h] -= (p_sink * delta).sum()
    return dq, dk, dv, dsinks


@pytest.mark.parametrize("o_dtype", [torch.bfloat16, torch.float16])
def test_given_o_gradient_is_the_written_out_formula(o_dtype):
    q, k, v = attention_inputs(2, 4, 37, 37, 64, torch.bfloat16, "cpu", hkv=2, seed=3)
    g = torch.Generator().manual_seed(4)
    do = (torch.rand(q.shape, generator=g) - 0.5).to(torch.bfloat16)
    dlse = torch.rand(q.shape[:3], generator=g) - 0.5
    sinks = torch.rand(4, generator=g) * 4
    exact_o = reference_attention(q, k, v, is_causal=True, sinks=sinks)
    out = exact_o.to(o_dtype)
    got = reference_attention_grads(q, k, v, do, is_causal=True, grad_lse=dlse, sinks=sinks, out=out)
    want = _written_out(q, k, v, do, dlse, sinks, out)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), (name, (a - b).abs().max())
    exact = reference_attention_grads(q, k, v, do, is_causal=True, grad_lse=dlse, sinks=sinks)
    assert not torch.allclose(got[0], exact[0], rtol=1e-6, atol=1e-9), "O's rounding must show in dQ"
    as_float64 = reference_attention_grads(q, k, v, do, is_causal=True, grad_lse=dlse, sinks=sinks, out=exact_o)
    for a, b in zip(as_float64, exact, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_packed_given_o_gradient_matches_the_dense_one():
    """One packed sequence is the dense problem: the two references agree with `out` too."""
    q, k, v = attention_inputs(1, 4, 50, 50, 64, torch.bfloat16, "cpu", hkv=2, seed=5)
    do = attention_inputs(1, 4, 50, 1, 64, torch.bfloat16, "cpu", seed=6)[0]
    out = reference_attention(q, k, v, is_causal=True).to(torch.bfloat16)
    cu = torch.tensor([0, 50], dtype=torch.int32)
    dense = reference_attention_grads(q, k, v, do, is_causal=True, out=out)
    packed = reference_attention_varlen_grads(*(t[0].transpose(0, 1) for t in (q, k, v, do)), cu, cu,
                                              is_causal=True, out=out[0].transpose(0, 1))
    for a, b in zip(dense, packed, strict=True):
        assert torch.allclose(a[0].transpose(0, 1), b, rtol=1e-10, atol=1e-13)


def test_a_backward_exact_to_its_inputs_is_measured_closer_and_a_wrong_row_still_fails():
    """The emulated exact bf16 kernel (O, P and dS rounded as the kernels round them) on short causal rows: against
    the exact reference its worst row is set by the forward's rounding of O; against the reference given that O the
    share is gone, and a row computed wrong fails there as against the exact one."""
    lens_q, lens_k = [1, 200, 0, 333, 64, 129], [77, 200, 5, 130, 0, 300]
    q, k, v, do, cq, ck = _packed(lens_q, lens_k, 8, 2, 256, torch.bfloat16, "cpu", seed=1)
    recipe = ATTENTION_RECIPES["bf16"]
    exact = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=True)[0]
    dq, out = _rounded_dq(q, k, v, do, lens_q, lens_k, torch.bfloat16, with_o=True)
    rounded = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=True, out=out)[0]
    c_exact, c_rounded = compare_grad(dq, exact, recipe), compare_grad(dq, rounded, recipe)
    assert c_exact.passed and c_rounded.passed
    assert c_rounded.worst_row_rel < c_exact.worst_row_rel / 2, (c_rounded, c_exact)
    dq[150] = -dq[150]
    assert not compare_grad(dq, rounded, recipe).passed and not compare_grad(dq, exact, recipe).passed


def test_a_gradient_case_check_also_checks_the_forward_o(monkeypatch):
    """The gradient cases' references take the forward's O, so their check measures that O against float64 too: a
    forward that fails its check fails the step's."""
    import dataclasses

    from xkernels.testing import cases

    case = cases.AttentionGradCase(1, 2, 2, 24, 24, 64, True, "fp16", step="fwd+bwd")
    inputs = case.inputs("cpu")
    assert case.check(inputs).passed
    real = cases.AttentionCase.check
    monkeypatch.setattr(cases.AttentionCase, "check",
                        lambda self, inputs: dataclasses.replace(real(self, inputs), passed=False, reason="wrong O"))
    c = case.check(inputs)
    assert not c.passed and c.reason.startswith("forward: wrong O"), c.reason
