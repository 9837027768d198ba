"""SDP forward against the float64 reference: recipes x head dims x causal x GQA x tails, outputs poisoned."""

import pytest
import torch

import xkernels
from tests.helpers import assert_unchanged, poisoned_like, snapshot
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, compare_lse, reference_attention, reference_lse

SEQS = [(1, 1), (17, 17), (129, 129), (17, 129), (129, 17), (1, 33)]
HEADS = [(2, 2), (4, 2), (3, 1)]  # MHA, GQA, MQA


def run_case(device, recipe, d, causal, hq, hkv, sq, skv, b=1, seed=0):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(b, hq, sq, skv, d, rec.io_dtype, device, hkv=hkv, seed=seed)
    before = snapshot(q, k, v)
    out = poisoned_like(q)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, precision=recipe,
                                return_lse=True, out=out)
    assert o is out
    assert f"[{recipe} " in xkernels.last_backend()  # portable, decode (Sq = 1), or the Hopper layer on an H100/H200
    assert_unchanged(before, q, k, v)
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c
    cl = compare_lse(lse, reference_lse(q, k, is_causal=causal))
    assert cl.passed, cl
    return c


@pytest.mark.parametrize("sq,skv", SEQS)
@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("recipe", list(ATTENTION_RECIPES))
def test_attention_matrix(device, recipe, d, causal, hq, hkv, sq, skv):
    run_case(device, recipe, d, causal, hq, hkv, sq, skv)


@pytest.mark.parametrize("recipe", list(ATTENTION_RECIPES))
def test_attention_batch_and_scale(device, recipe):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(3, 2, 40, 50, 64, rec.io_dtype, device, seed=1)
    o = xkernels.attention(q, k, v, scale=0.3, precision=recipe)
    assert compare_attention(o, reference_attention(q, k, v, scale=0.3), rec).passed


def test_strided_views_and_copies(device):
    """(B, S, H, D) storage viewed as (B, H, S, D) runs in place; a non-unit last stride is copied, visibly."""
    rec = ATTENTION_RECIPES["fp16"]
    base = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in attention_inputs(2, 2, 33, 33, 64, torch.float16,
                                                                                      device, seed=2)]
    o = xkernels.attention(*base)
    assert "copied" not in xkernels.last_backend()
    assert compare_attention(o, reference_attention(*base), rec).passed
    q, k, v = base
    q_odd = torch.empty(*q.shape[:3], 2 * q.shape[3], dtype=q.dtype, device=device)[..., ::2]
    q_odd.copy_(q)
    o2 = xkernels.attention(q_odd, k, v)
    assert "copied:q" in xkernels.last_backend()
    assert torch.equal(o, o2)


def test_deterministic(device):
    q, k, v = attention_inputs(1, 2, 65, 65, 64, torch.bfloat16, device, seed=3)
    assert torch.equal(xkernels.attention(q, k, v, is_causal=True), xkernels.attention(q, k, v, is_causal=True))


def test_auto_precision(device):
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = attention_inputs(1, 1, 16, 16, 64, dtype, device, seed=4)
        xkernels.attention(q, k, v, precision="auto")
        assert {torch.float16: "[fp16 ", torch.bfloat16: "[bf16 "}[dtype] in xkernels.last_backend()


@pytest.mark.parametrize("acc16,base", [("fp16-acc16", "fp16"), ("bf16io-acc16", "bf16io")])
def test_acc16_recipes_accumulate_in_fp16(device, acc16, base):
    """The acc16 variants really sum P.V in fp16: their error against float64 is larger than their fp32-accumulator
    recipe's on the same inputs (and within their own, wider contract), and their backward is the base's."""
    rec, rec_base = ATTENTION_RECIPES[acc16], ATTENTION_RECIPES[base]
    assert rec.pv_acc_dtype == torch.float16 and rec_base.pv_acc_dtype == torch.float32
    q, k, v = attention_inputs(1, 2, 64, 1024, 64, rec.io_dtype, device, seed=9)
    ref = reference_attention(q, k, v)
    o16 = xkernels.attention(q, k, v, precision=acc16)
    assert f"[{acc16} " in xkernels.last_backend()
    o32 = xkernels.attention(q, k, v, precision=base)
    c16, c32 = compare_attention(o16, ref, rec), compare_attention(o32, ref, rec_base)
    assert c16.passed, c16
    assert c16.rel_rms > 1.05 * c32.rel_rms, (c16, c32)
    assert (rec.grad_rel_rms, rec.grad_row_rel) == (rec_base.grad_rel_rms, rec_base.grad_row_rel)
