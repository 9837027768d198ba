"""The Gluon dQ kernel (`hopper/attention_dq.py`) on an H100/H200, before the backward selects it: the Hopper
backward run with it in place of the portable dQ kernel gives the same dK and dV, and dQ within the recipe's bounds
against float64 autograd, with tails, causal with Sq != Skv, GQA and the LSE's gradient; the gradient buffers are
NaN-poisoned so a row the kernel skips fails."""

import pytest
import torch

from xkernels import backward, select
from xkernels.common.runtime import hopper_available
from xkernels.hopper.configs import ATTENTION_DQ_CONFIGS
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]


def _run(q, k, v, do, dlse, *, causal, gluon_dq):
    import xkernels

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, dlse, enable_gqa=True, precision="auto",
                                                  backend="auto")
    cfg = choice.config
    if gluon_dq:
        cfg = select.HopperBackward(cfg.dkdv, cfg.portable, ATTENTION_DQ_CONFIGS[q.shape[-1]])
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o.detach(), lse.detach(), do, *grads, dlse, is_causal=causal,
                     scale=q.shape[-1] ** -0.5, cfg=cfg)
    return grads


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal,sq,skv", [(False, 1000, 1000), (True, 1000, 1000), (True, 300, 777),
                                           (False, 130, 65), (True, 1, 200)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gluon_dq_matches_float64_and_leaves_dk_dv_alone(d, causal, sq, skv, dtype):
    q, k, v = attention_inputs(2, 8, sq, skv, d, dtype, "cuda", hkv=2, seed=sq + skv)
    g = torch.Generator(device="cuda").manual_seed(7)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    dlse = torch.rand(q.shape[:3], generator=g, device="cuda") - 0.5
    dq, dk, dv = _run(q, k, v, do, dlse, causal=causal, gluon_dq=True)
    _, dk_portable, dv_portable = _run(q, k, v, do, dlse, causal=causal, gluon_dq=False)
    assert torch.equal(dk, dk_portable) and torch.equal(dv, dv_portable)
    ref = reference_attention_grads(q, k, v, do, is_causal=causal, grad_lse=dlse)[0]
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    c = compare_grad(dq, ref, recipe)
    assert c.passed, c.reason
