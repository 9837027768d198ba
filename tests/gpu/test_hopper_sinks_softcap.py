"""The Gluon forwards' attention sinks and soft caps (the default on sm_90 in every recipe; mostly forced here) against
float64: the dense kernel at every head dim, causal and not, with a window, GQA, Sq != Skv with rows that see no key
(O = 0, LSE = the sink), fp32 and bf16 sink logits, on NaN-poisoned outputs; the varlen kernel (blocks that see no
key store the sink as their LSE); training steps (sinks: the Hopper backward and the op's dSinks; caps: the
portable backward)."""

import pytest
import torch

import xkernels
from tests.helpers import NEEDS_HOPPER, assert_passes, poison_attention_outputs, poisoned_like
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare,
    compare_attention,
    compare_grad,
    compare_lse,
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen,
    reference_lse,
)
from xkernels.testing.inputs import uniform

pytestmark = NEEDS_HOPPER
BF16 = ATTENTION_RECIPES["bf16"]


def _sinks(hq, dtype=torch.float32, seed=0):
    """Logits around the rows' own LSEs (~log(S)), so each sink takes a real share of every row."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(hq, generator=g) * 4.0 + 4.0).to(dtype).cuda()


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,skv,causal,window", [(1000, 1000, True, (-1, -1)), (700, 1300, False, (-1, -1)),
                                                  (1500, 300, True, (-1, -1)), (1000, 1000, True, (255, 0)),
                                                  (600, 900, False, (100, 60)), (1500, 300, False, (10, 10))])
def test_hopper_sinks_match_float64(d, sq, skv, causal, window):
    """The last case's rows from 311 on see no key (O = 0, LSE = the sink: the masked tile walked for them)."""
    q, k, v = attention_inputs(1, 4, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + d)
    sinks = _sinks(4, seed=d)
    out = poisoned_like(q)
    _, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, window_size=window, sinks=sinks,
                                out=out, return_lse=True, backend="hopper")
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention") and "sinks" in name, name
    ref = dict(is_causal=causal, window=window, sinks=sinks)
    c = compare_attention(out, reference_attention(q, k, v, **ref), BF16)
    assert c.passed, c.reason
    assert torch.isfinite(lse).all(), "every row sees its sink"
    c_lse = compare_lse(lse, reference_lse(q, k, **ref))
    assert c_lse.passed, c_lse.reason


def test_hopper_sinks_in_bf16_and_a_training_step(monkeypatch):
    """bf16 sink logits (gpt-oss's parameters) and a training step through the forced forward: the Hopper
    backward's dQ, dK, dV and the op's dSinks against float64."""
    poison_attention_outputs(monkeypatch)
    q, k, v = attention_inputs(1, 4, 777, 777, 128, torch.bfloat16, "cuda", hkv=2, seed=5)
    g = torch.Generator(device="cuda").manual_seed(6)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(torch.bfloat16)
    sinks = _sinks(4, torch.bfloat16, seed=2)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    o = xkernels.attention(*leaves[:3], is_causal=True, enable_gqa=True, sinks=leaves[3], backend="hopper")
    assert "sinks" in xkernels.last_backend()
    grads = torch.autograd.grad(o, leaves, do)
    assert xkernels.last_backend().startswith("hopper.attention_backward"), xkernels.last_backend()
    ref = dict(is_causal=True, sinks=sinks)
    c = compare_attention(o, reference_attention(q, k, v, **ref), BF16)
    assert c.passed, c.reason
    refs = reference_attention_grads(q, k, v, do, **ref)
    checks = {n: compare_grad(g_, r, BF16) for n, g_, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3], strict=True)}
    assert_passes(checks | {"dsinks": compare(grads[3].float(), refs[3].float(), rel_rms=2e-2)})


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (127, 0))])
def test_hopper_varlen_sinks_match_float64(monkeypatch, causal, window):
    """Packed sequences, bottom-right: one with more queries than keys (causal: whole blocks that see no key store
    O = 0 and the sink as their LSE without starting the pipeline), an empty one and a short one."""
    poison_attention_outputs(monkeypatch)
    lens_q, lens_k = [300, 1000, 0, 17, 500], [300, 1200, 40, 90, 70]
    g = torch.Generator(device="cuda").manual_seed(11)
    q = uniform((sum(lens_q), 4, 128), torch.bfloat16, "cuda", g)
    k, v = (uniform((sum(lens_k), 2, 128), torch.bfloat16, "cuda", g) for _ in range(2))

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")

    cq, ck = cu(lens_q), cu(lens_k)
    sinks = _sinks(4, seed=3)
    o, lse = xkernels.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), is_causal=causal,
                                       window_size=window, sinks=sinks, return_lse=True, backend="hopper")
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention_varlen[") and "sinks" in name, name
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window, sinks=sinks)
    assert torch.isfinite(lse).all(), "every row sees its sink"
    c = compare_attention(o, ref_o, BF16)
    assert c.passed, c.reason
    c_lse = compare_lse(lse, ref_lse)
    assert c_lse.passed, c_lse.reason


def _capped_inputs(sq, skv, d, seed):
    """Inputs whose scaled scores reach well past a cap of a few units: q x 40 (uniform inputs' scaled scores have a
    standard deviation of ~1/12 at any head dim; here ~3.3, tails past 10, so the tanh saturates)."""
    q, k, v = attention_inputs(1, 4, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=seed)
    return (q.float() * 40).to(torch.bfloat16), k, v


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,skv,causal,window,cap,scale", [(1000, 1000, True, (-1, -1), 2.0, None),
                                                            (700, 1300, False, (-1, -1), 5.0, None),
                                                            (1000, 1000, True, (255, 0), 3.0, None),
                                                            (900, 900, True, (-1, -1), 3.0, -0.1)])
def test_hopper_softcap_matches_float64(d, sq, skv, causal, window, cap, scale):
    """Caps on saturating scores; the last case with a negative scale (scores scaled before the cap and the mask,
    as without POSITIVE_SCALE)."""
    q, k, v = _capped_inputs(sq, skv, d, seed=sq + d)
    out = poisoned_like(q)
    _, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, window_size=window, softcap=cap,
                                scale=scale, out=out, return_lse=True, backend="hopper")
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention") and f"softcap={cap:g}" in name, name
    ref = dict(is_causal=causal, window=window, softcap=cap, scale=scale)
    c = compare_attention(out, reference_attention(q, k, v, **ref), BF16)
    assert c.passed, c.reason
    c_lse = compare_lse(lse, reference_lse(q, k, **ref))
    assert c_lse.passed, c_lse.reason
    # a cap 50 % off moves O by less than bf16's bounds (checked on the CPU's draws), the LSE well past its own
    assert not compare_lse(lse, reference_lse(q, k, **(ref | dict(softcap=1.5 * cap)))).passed, "a wrong cap"


@pytest.mark.parametrize("precision", ["fp16", "bf16io", "fp16-acc16", "bf16io-acc16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_hopper_sinks_and_softcap_in_the_other_recipes(precision, d):
    """The other recipes' producers (bf16io converts V in shared memory) and accumulators (acc16: fp16 P.V) with a
    window, sinks and a cap together, on the Gluon forward by default, against float64."""
    recipe = ATTENTION_RECIPES[precision]
    q, k, v = _capped_inputs(900, 900, d, seed=d + 7)
    q, k, v = (t.to(recipe.io_dtype) for t in (q, k, v))
    sinks = _sinks(4, seed=d)
    out = poisoned_like(q)
    _, lse = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(300, 0), softcap=3.0,
                                sinks=sinks, out=out, return_lse=True, precision=precision)
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention") and "sinks" in name and "softcap=3" in name, name
    ref = dict(is_causal=True, window=(300, 0), softcap=3.0, sinks=sinks)
    c = compare_attention(out, reference_attention(q, k, v, **ref), recipe)
    assert c.passed, c.reason
    c_lse = compare_lse(lse, reference_lse(q, k, **ref))
    assert c_lse.passed, c_lse.reason


def test_hopper_softcap_with_sinks_varlen_and_a_training_step(monkeypatch):
    """gpt-oss's and Gemma 2's pieces together on the varlen kernel, then a capped training step (the forward on
    the Gluon kernel, the backward on the portable one, which has the cap's derivative)."""
    poison_attention_outputs(monkeypatch)
    lens = [300, 1000, 17, 500]
    g = torch.Generator(device="cuda").manual_seed(12)
    q = (uniform((sum(lens), 4, 128), torch.bfloat16, "cuda", g).float() * 40).to(torch.bfloat16)
    k, v = (uniform((sum(lens), 2, 128), torch.bfloat16, "cuda", g) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    sinks = _sinks(4, seed=9)
    o, lse = xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True, window_size=(127, 0),
                                       softcap=3.0, sinks=sinks, return_lse=True, backend="hopper")
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention_varlen[") and "softcap=3" in name and "sinks" in name, name
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cu, cu, is_causal=True, window=(127, 0), softcap=3.0,
                                                sinks=sinks)
    c = compare_attention(o, ref_o, BF16)
    assert c.passed, c.reason
    c_lse = compare_lse(lse, ref_lse)
    assert c_lse.passed, c_lse.reason

    q, k, v = _capped_inputs(512, 512, 128, seed=4)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention(*leaves, is_causal=True, enable_gqa=True, softcap=2.0, backend="hopper")
    assert xkernels.last_backend().startswith("hopper.attention"), xkernels.last_backend()
    grads = torch.autograd.grad(o, leaves, do)
    assert xkernels.last_backend().startswith("portable.attention_backward"), xkernels.last_backend()
    refs = reference_attention_grads(q, k, v, do, is_causal=True, softcap=2.0)
    assert_passes({n: compare_grad(g_, r, BF16) for n, g_, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)})
