"""The dK/dV kernel with each key block's GQA group split over programs (`group_parts`, `partials.reduce_parts`) on
an H100/H200: dQ, dK and dV within the recipe's bounds against float64 autograd (tails, causal with Sq != Skv, the
whole group over 2 and 4 programs), NaN-poisoned gradient buffers, bitwise repeatable across calls, the counters back
at zero after each call, and the API's pick at a small causal GQA grid (the rule `select.group_parts`)."""

import dataclasses

import pytest
import torch

from xkernels import backward, select
from xkernels.common import scratch
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]


def _grads(q, k, v, do, *, causal: bool, parts: int):
    import xkernels

    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="auto")
    cfg = choice.config
    cfg = dataclasses.replace(cfg, dkdv=dataclasses.replace(cfg.dkdv, group_parts=parts))
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=q.shape[-1] ** -0.5, cfg=cfg)
    return grads


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("sq, skv, causal", [(300, 777, True), (777, 777, True), (130, 65, False), (1000, 1000, True)])
def test_group_parts_against_float64(d, parts, sq, skv, causal):
    """Every part's queries reach dK and dV once: a dropped or doubled part, a partial summed from the wrong tile or
    a row the last arriver does not store fails here."""
    q, k, v = attention_inputs(2, 8, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + skv + parts)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    grads = _grads(q, k, v, do, causal=causal, parts=parts)
    for name, g, ref in zip("qkv", grads, reference_attention_grads(q, k, v, do, is_causal=causal), strict=True):
        c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, (name, c.reason)


@pytest.mark.parametrize("parts", [2, 4])
def test_group_parts_bitwise_repeatable_and_counters_reset(parts):
    """The parts are summed in part order whatever order they finish in: calls agree bit for bit; and the last
    arriver of every tile puts its counter back to zero (the kept counters serve the next launch)."""
    q, k, v = attention_inputs(1, 8, 2048, 2048, 128, torch.bfloat16, "cuda", hkv=2, seed=parts)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    first = _grads(q, k, v, do, causal=True, parts=parts)
    for _ in range(3):
        again = _grads(q, k, v, do, causal=True, parts=parts)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)
    torch.cuda.synchronize()
    kept = [s for key, s in scratch._SETS.items() if key[0] == q.device.index]
    assert kept and all(int(s.counters.abs().sum()) == 0 for s in kept)


def test_api_splits_a_small_causal_gqa_grid():
    """B1 Hq16/Hkv4 at 4K keys, D128 causal: 128 dK/dV programs, fewer than the SMs; the API's backward takes two
    parts per group (its name says -gp2) and passes against float64, deterministic included."""
    import xkernels

    q, k, v = attention_inputs(1, 16, 4096, 4096, 128, torch.bfloat16, "cuda", hkv=4, seed=7)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = select.group_parts(128, 1, 16, 4, 4096, 4096, sms)
    if want == 1:
        pytest.skip(f"{sms} SMs: the rule keeps one part at this shape")
    results = []
    for deterministic in (True, True, False):
        o = xkernels.attention(*leaves, is_causal=True, enable_gqa=True, deterministic=deterministic)
        results.append(torch.autograd.grad(o, leaves, do))
        assert f"-gp{want}" in xkernels.last_backend(), xkernels.last_backend()
    for a, b in zip(results[0], results[1], strict=True):
        assert torch.equal(a, b)
    for g, ref in zip(results[0], reference_attention_grads(q, k, v, do, is_causal=True), strict=True):
        c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, c.reason
