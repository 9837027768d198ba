"""The Hopper dense forward's sliding-window band (the default for a window on sm_90) against float64: every head
dim, causal and not, left and right sides, Sq != Skv with row blocks whose window holds no key (O = 0, LSE -inf), on
a NaN-poisoned `out`; the default choice, and the portable band where it is forced or a soft cap comes with it."""

import pytest
import torch

import xkernels
from tests.helpers import NEEDS_HOPPER, poisoned_like
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, compare_lse, reference_attention, reference_lse

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
    q, k, v = attention_inputs(1, 4, 512, 512, 128, torch.bfloat16, "cuda", seed=1)
    ref = reference_attention(q, k, v, is_causal=True, window=(127, 0))
    recipe = ATTENTION_RECIPES["bf16"]
    for kw, layer in ((dict(), "hopper.attention"), (dict(backend="portable"), "portable.attention"),
                      (dict(softcap=30.0), "portable.attention")):
        out = xkernels.attention(q, k, v, is_causal=True, window_size=(127, 0), **kw)
        assert xkernels.last_backend().startswith(layer), (kw, xkernels.last_backend())
        if "softcap" not in kw:
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


def test_a_forced_hopper_windowed_training_step_runs_the_portable_backward():
    q, k, v = (t.requires_grad_() for t in attention_inputs(1, 4, 512, 512, 128, torch.bfloat16, "cuda", seed=4))
    xkernels.attention(q, k, v, is_causal=True, window_size=(63, 0), backend="hopper").float().sum().backward()
    assert xkernels.last_backend().startswith("portable.attention_backward"), xkernels.last_backend()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
