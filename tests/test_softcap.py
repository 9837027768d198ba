"""Soft-capped scores (`softcap`, flash_attn's and Gemma 2's: x -> cap * tanh(x / cap)) in `attention`,
`attention_varlen` and `attention_with_kvcache`, forward and backward, against float64 references on the same
quantized inputs, with windows and causal masks, NaN-poisoned outputs and gradient buffers; bad caps raise naming
the argument; the checks fail on a wrong cap, on no cap, and on a backward that drops the cap's derivative."""

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes, poison_attention_outputs, poisoned_like
from xkernels import ops
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_grad,
    compare_lse,
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen,
    reference_attention_varlen_grads,
    reference_lse,
)
from xkernels.testing.inputs import uniform

FP16 = ATTENTION_RECIPES["fp16"]


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    poison_attention_outputs(monkeypatch)


def _inputs(sq, skv, device, seed, *, hq=4, hkv=2):
    """Inputs whose scaled scores reach well past a cap of a few units (x4: |x| up to ~4)."""
    q, k, v = attention_inputs(1, hq, sq, skv, 64, torch.float16, device, hkv=hkv, seed=seed)
    q = (q.float() * 4).half()
    g = torch.Generator().manual_seed(seed + 1)
    do = (torch.rand(q.shape, generator=g) - 0.5).half().to(device)
    return q, k, v, do


def _run(q, k, v, do, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention(*leaves, enable_gqa=True, return_lse=True, **kw)
    return o, lse, torch.autograd.grad(o, leaves, do)


def _checks(o, lse, grads, refs_o, refs_lse, refs_grads) -> dict:
    seen = ~torch.isinf(refs_lse)
    out = {"o": compare_attention(o, refs_o, FP16), "lse": compare_lse(lse[seen], refs_lse[seen])}
    return out | {n: compare_grad(g, r, FP16) for n, g, r in zip(("dq", "dk", "dv"), grads, refs_grads, strict=True)}


@pytest.mark.parametrize("sq,skv,causal,window,cap", [(70, 70, True, (-1, -1), 2.0), (70, 90, False, (-1, -1), 1.0),
                                                      (50, 70, True, (9, 0), 3.5), (8, 40, True, (-1, -1), 2.0),
                                                      (8, 40, False, (3, 4), 1.5)])
def test_dense_softcap_matches_float64(device, sq, skv, causal, window, cap):
    q, k, v, do = _inputs(sq, skv, device, seed=sq + skv)
    o, lse, grads = _run(q, k, v, do, is_causal=causal, window_size=window, softcap=cap)
    assert f"softcap={cap:g}" in xkernels.last_backend()
    ref = dict(is_causal=causal, window=window, softcap=cap)
    assert_passes(_checks(o, lse, grads, reference_attention(q, k, v, **ref), reference_lse(q, k, **ref),
                          reference_attention_grads(q, k, v, do, **ref)))


def test_the_checks_see_a_wrong_cap_and_a_dropped_derivative(device):
    """Against a cap 50 % off or no cap the O, LSE, dQ and dK checks fail (a cap 10 % off moves O by about the
    per-row bound: it failed on one device's draw of these inputs and passed on another's); against a backward that
    treats the cap's derivative as 1 (straight through) dQ and dK fail."""
    q, k, v, do = _inputs(64, 64, device, seed=3)
    o, lse, grads = _run(q, k, v, do, is_causal=True, softcap=2.0)
    for cap in (3.0, 0.0):
        ref = dict(is_causal=True, softcap=cap)
        checks = _checks(o, lse, grads, reference_attention(q, k, v, **ref), reference_lse(q, k, **ref),
                         reference_attention_grads(q, k, v, do, **ref))
        failed = {n for n, c in checks.items() if not c.passed}
        assert failed >= {"o", "lse", "dq", "dk"}, (cap, failed)
    # straight-through: the capped forward with the uncapped scores' gradient
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves
    s = (qq[0] @ kk[0].repeat_interleave(2, 0).transpose(-1, -2)) / 8.0
    s = s + (2.0 * torch.tanh(s / 2.0) - s).detach()
    s = s.masked_fill(torch.ones(64, 64, dtype=torch.bool, device=device).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ vv[0].repeat_interleave(2, 0)
    straight = torch.autograd.grad((out * do[0].double()).sum(), leaves)
    failed = {n for n, g, r in zip(("dq", "dk"), grads, straight, strict=False) if not compare_grad(g, r, FP16).passed}
    assert failed == {"dq", "dk"}, failed


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (5, 3))])
def test_varlen_softcap_matches_float64(device, causal, window):
    lens_q, lens_k = [5, 40, 0, 33], [9, 40, 7, 20]
    g = torch.Generator(device=device).manual_seed(7)
    q = (uniform((sum(lens_q), 4, 64), torch.float16, device, g).float() * 8).half()
    k, v = (uniform((sum(lens_k), 2, 64), torch.float16, device, g) for _ in range(2))
    do = uniform(q.shape, torch.float16, device, g)
    cq, ck = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for n in (lens_q, lens_k))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention_varlen(*leaves, cq, ck, 40, 40, is_causal=causal, window_size=window, softcap=1.5,
                                       return_lse=True)
    grads = torch.autograd.grad(o, leaves, do)
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window, softcap=1.5)
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, window=window, softcap=1.5)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    assert_passes(_checks(o, lse, grads, ref_o, ref_lse, refs))


def test_kvcache_softcap_matches_float64(device):
    """A decode step and a speculative 3-row step over a paged cache."""
    g = torch.Generator(device=device).manual_seed(11)
    b, hq, hkv, d, page = 2, 4, 2, 64, 16
    kc = uniform((8, page, hkv, d), torch.float16, device, g)
    vc = uniform((8, page, hkv, d), torch.float16, device, g)
    table = torch.tensor([[3, 1, 6, 0], [2, 7, 5, 4]], dtype=torch.int32, device=device)
    lengths = torch.tensor([37, 50], dtype=torch.int32, device=device)
    for sq in (1, 3):
        q = (uniform((b, sq, hq, d), torch.float16, device, g).float() * 8).half()
        out = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table, softcap=2.5)
        assert "softcap=2.5" in xkernels.last_backend()
        for i in range(b):
            n = int(lengths[i])
            keys = torch.cat([kc[int(p)] for p in table[i]])[:n].transpose(0, 1)[None]
            values = torch.cat([vc[int(p)] for p in table[i]])[:n].transpose(0, 1)[None]
            ref = reference_attention(q[i:i + 1].transpose(1, 2), keys, values, softcap=2.5,
                                      window=(-1, n - sq) if sq > 1 else (-1, -1), is_causal=False)
            # bottom-right causal for sq > 1: row t sees keys < n - sq + t + 1 (the window's right side above is
            # top-left from row 0: keys <= t + n - sq)
            c = compare_attention(out[i:i + 1].transpose(1, 2), ref, FP16)
            assert c.passed, (sq, i, c.reason)


@pytest.mark.parametrize("cap,error", [(-1.0, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
                                       ("2", TypeError), (True, TypeError)])
def test_bad_caps_raise_naming_the_argument(device, cap, error):
    q, k, v = attention_inputs(1, 2, 20, 20, 64, torch.float16, device, seed=1)
    with pytest.raises(error, match="softcap"):
        xkernels.attention(q, k, v, softcap=cap)
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    with pytest.raises(error, match="softcap"):
        xkernels.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 20, 20,
                                  softcap=cap)
    with pytest.raises(error, match="softcap"):
        xkernels.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softcap=cap,
                                        cache_seqlens=torch.full((1,), 20, dtype=torch.int32, device=device))
    if error is ValueError:  # the op checks what a direct caller passes
        with pytest.raises(error, match="softcap"):
            ops.attention_op(q, k, v, False, None, False, "auto", "auto", -1, -1, cap)


def test_a_softcap_runs_the_gluon_kernel_on_hopper_and_forcing_it_elsewhere_raises(device):
    """Soft caps run the Gluon forward on sm_90 (tests/gpu/test_hopper_sinks_softcap.py checks it), in every
    recipe, the portable one where forced or elsewhere; forcing "hopper" raises where no Gluon kernel runs."""
    q, k, v = attention_inputs(1, 2, 64, 64, 64, torch.bfloat16, device, seed=1)
    xkernels.attention(q, k, v, softcap=30.0, backend="portable")
    assert xkernels.last_backend().startswith("portable."), xkernels.last_backend()
    xkernels.attention(q, k, v, softcap=30.0)
    on_hopper = hopper_available(torch.device(device))
    assert xkernels.last_backend().startswith("hopper." if on_hopper else "portable."), xkernels.last_backend()
    xkernels.attention(q.half(), k.half(), v.half(), softcap=30.0)  # every recipe's
    assert xkernels.last_backend().startswith("hopper." if on_hopper else "portable."), xkernels.last_backend()
    if on_hopper:
        xkernels.attention(q, k, v, softcap=30.0, backend="hopper")
        assert xkernels.last_backend().startswith("hopper.") and "softcap=30" in xkernels.last_backend()
    else:
        with pytest.raises(ValueError, match="backend: 'hopper'"):
            xkernels.attention(q, k, v, softcap=30.0, backend="hopper")


def test_softcap_through_out_compile_and_opcheck(device):
    q, k, v, _ = _inputs(24, 24, device, seed=5)
    out = poisoned_like(q)
    xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, softcap=2.0, out=out)
    assert compare_attention(out, reference_attention(q, k, v, is_causal=True, softcap=2.0), FP16).passed
    torch.library.opcheck(ops.attention_lse_op, (q, k, v, True, None, True, "auto", "auto", -1, -1, 2.0))

    def loss(q, k, v):
        return xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, softcap=2.0).float().sum()

    assert_compiled_grads_match(loss, (q, k, v))
