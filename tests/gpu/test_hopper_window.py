"""The Hopper dense forward's sliding-window band (the default for a window on sm_90) against float64: every head
dim, causal and not, left and right sides, Sq != Skv with row blocks whose window holds no key (O = 0, LSE -inf), on
a NaN-poisoned `out`; the default choice, and the portable band where it is forced or a soft cap comes with it; the
Gluon backward's band (dense and packed) against float64 on NaN-poisoned gradient buffers, bitwise repeatable."""

import pytest
import torch

import xkernels
from tests.helpers import (
    NEEDS_HOPPER,
    assert_passes,
    poison_attention_outputs,
    poison_gradient_buffers,
    poisoned_like,
)
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

pytestmark = NEEDS_HOPPER


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,skv,causal,window", [(1000, 1000, True, (255, 0)), (700, 1300, False, (100, 60)),
                                                  (1500, 300, True, (31, 0)), (512, 512, False, (-1, 130))])
def test_hopper_band_matches_float64(d, sq, skv, causal, window):
    q, k, v = attention_inputs(1, 4, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + d)
    out = poisoned_like(q)
    _, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, window_size=window, out=out,
                                return_lse=True, backend="hopper")
    assert xkernels.last_backend().startswith("hopper.attention"), xkernels.last_backend()
    ref_lse = reference_lse(q, k, is_causal=causal, window=window)
    empty = torch.isinf(ref_lse)
    c = compare_attention(out, reference_attention(q, k, v, is_causal=causal, window=window),
                          ATTENTION_RECIPES["bf16"])
    assert c.passed, c.reason
    assert torch.equal(torch.isinf(lse), empty)
    c_lse = compare_lse(lse[~empty], ref_lse[~empty])
    assert c_lse.passed, c_lse.reason


def test_windows_default_to_the_hopper_band():
    """Windows, capped windows too, run the Gluon band by default; "portable" forces the portable band."""
    q, k, v = attention_inputs(1, 4, 512, 512, 128, torch.bfloat16, "cuda", seed=1)
    recipe = ATTENTION_RECIPES["bf16"]
    for kw, layer in ((dict(), "hopper.attention"), (dict(backend="portable"), "portable.attention"),
                      (dict(softcap=2.0), "hopper.attention")):
        out = xkernels.attention(q, k, v, is_causal=True, window_size=(127, 0), **kw)
        assert xkernels.last_backend().startswith(layer), (kw, xkernels.last_backend())
        ref = reference_attention(q, k, v, is_causal=True, window=(127, 0), softcap=kw.get("softcap", 0.0))
        c = compare_attention(out, ref, recipe)
        assert c.passed, (kw, c.reason)


@pytest.mark.parametrize("precision,scale", [("fp16", None), ("bf16io", None), ("bf16", -0.05), ("fp16-acc16", None)])
def test_hopper_band_in_every_recipe(precision, scale):
    """The band through the other producers and consumers: fp16, bf16io's converting producer, the fp16
    accumulator, and a negative scale (the consumers scale before masking)."""
    recipe = ATTENTION_RECIPES[precision]
    q, k, v = attention_inputs(1, 4, 900, 900, 128, recipe.io_dtype, "cuda", hkv=2, seed=3)
    out = poisoned_like(q)
    xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(200, 0), out=out, scale=scale,
                       precision=precision, backend="hopper")
    assert xkernels.last_backend().startswith("hopper.attention"), xkernels.last_backend()
    ref = reference_attention(q, k, v, is_causal=True, window=(200, 0), scale=scale)
    c = compare_attention(out, ref, recipe)
    assert c.passed, c.reason


def _grad_out(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=g, device="cuda") - 0.5).to(torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,skv,causal,window", [(1000, 1000, True, (255, 0)), (700, 1300, False, (100, 60)),
                                                  (1500, 300, True, (31, 0)), (512, 512, False, (-1, 130)),
                                                  (600, 900, False, (77, -1))])
def test_hopper_band_backward_matches_float64(monkeypatch, d, sq, skv, causal, window):
    """The Gluon dK/dV and dQ kernels' band: key blocks that no query sees (dK = dV = 0), query rows that see no key
    (dQ = 0), both sides, a lower side alone, Sq != Skv, GQA; NaN-poisoned gradient buffers."""
    poison_gradient_buffers(monkeypatch)
    q, k, v = attention_inputs(1, 4, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + d + 1)
    do = _grad_out(q.shape, seed=d)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, window_size=window)
    grads = torch.autograd.grad(o, leaves, do)
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention_backward") and "window=" in name, name
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, window=window)
    checks = {n: compare_grad(g, r, ATTENTION_RECIPES["bf16"]) for n, g, r in zip(("dq", "dk", "dv"), grads, refs,
                                                                                   strict=True)}
    assert_passes(checks)
    again = torch.autograd.grad(xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, window_size=window),
                                leaves, do)
    assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True)), "bitwise repeatable"


def _packed(lens_q, lens_k, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = uniform((sum(lens_q), 4, d), torch.bfloat16, "cuda", g)
    k, v = (uniform((sum(lens_k), 2, d), torch.bfloat16, "cuda", g) for _ in range(2))

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")

    return q, k, v, cu(lens_q), cu(lens_k)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,window", [(True, (127, 0)), (False, (100, 60)), (False, (-1, 33)), (True, (5, 0))])
def test_hopper_band_varlen_forward_matches_float64(monkeypatch, d, causal, window):
    """The varlen forward's band (bottom-right per sequence): sequences with more queries than keys (rows and whole
    blocks that see no key: O = 0, LSE -inf), an empty and a short sequence, on a NaN-poisoned O."""
    poison_attention_outputs(monkeypatch)
    lens_q, lens_k = [300, 1000, 0, 17, 640, 500], [300, 1200, 40, 90, 640, 70]
    q, k, v, cq, ck = _packed(lens_q, lens_k, d, seed=d + window[0])
    o, lse = xkernels.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), is_causal=causal,
                                       window_size=window, return_lse=True)
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention_varlen[") and "window=" in name, name
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window)
    empty = torch.isinf(ref_lse)
    assert empty.any(), "the batch has rows that see no key"
    assert torch.equal(torch.isinf(lse), empty) and (o.transpose(0, 1)[empty] == 0).all()
    c = compare_attention(o, ref_o, ATTENTION_RECIPES["bf16"])
    assert c.passed, c.reason
    c_lse = compare_lse(lse[~empty], ref_lse[~empty])
    assert c_lse.passed, c_lse.reason


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,window", [(True, (127, 0)), (False, (100, 60)), (False, (-1, 33))])
def test_hopper_band_varlen_backward_matches_float64(monkeypatch, d, causal, window):
    """The packed (VARLEN) variants' band, bottom-right per sequence, an empty sequence and a short one among them."""
    poison_gradient_buffers(monkeypatch)
    lens_q, lens_k = [300, 1000, 0, 17, 640], [300, 1200, 40, 90, 640]
    q, k, v, cq, ck = _packed(lens_q, lens_k, d, seed=7)
    do = _grad_out(q.shape, seed=3)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention_varlen(*leaves, cq, ck, max(lens_q), max(lens_k), is_causal=causal, window_size=window)
    grads = torch.autograd.grad(o, leaves, do)
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention_varlen_backward") and "window=" in name, name
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, window=window)
    assert_passes({n: compare_grad(g_, r, ATTENTION_RECIPES["bf16"])
                   for n, g_, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)})


def test_a_windowed_soft_capped_training_step_runs_the_portable_backward():
    """The Gluon band's capped forward, then the portable backward from its O and LSE: float64 gradients."""
    q, k, v = attention_inputs(1, 4, 512, 512, 128, torch.bfloat16, "cuda", seed=4)
    do = attention_inputs(1, 4, 512, 1, 128, torch.bfloat16, "cuda", seed=5)[0]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = xkernels.attention(*leaves, is_causal=True, window_size=(63, 0), softcap=2.0)
    assert xkernels.last_backend().startswith("hopper.attention"), xkernels.last_backend()
    grads = torch.autograd.grad(out, leaves, do)
    assert xkernels.last_backend().startswith("portable.attention_backward"), xkernels.last_backend()
    refs = reference_attention_grads(q, k, v, do, is_causal=True, window=(63, 0), softcap=2.0)
    assert_passes({n: compare_grad(g, r, ATTENTION_RECIPES["bf16"])
                   for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)})
