"""The portable attention backward kernels against float64 autograd on the same quantized q, k, v and dO (under the
interpreter on CPU): dQ, dK, dV with GQA (dK, dV summed over each group), causal with Sq != Skv, tails, any scale.
Each check is shown to fail on a broken backward."""

import math

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels.common.runtime import INTERPRET
from xkernels.portable.attention_bwd import attention_bwd
from xkernels.testing import attention_inputs


def _reference_grads(q, k, v, do, causal, scale):
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    s = (q64 @ kk.transpose(-1, -2)) * scale
    if causal:
        sq, skv = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ vv
    return torch.autograd.grad(o, (q64, k64, v64), do.double())


def _rel_rms(x, ref):
    """||x - ref|| / ||ref||; where the true gradient is exactly zero (one visible key: dS = 0), the plain norm."""
    diff = (x.double() - ref).norm().item()
    return diff / ref.norm().item() if ref.norm() > 0 else diff


def _ours(q, k, v, do, causal, scale):
    with torch.no_grad():
        o, lse = xkernels.attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                                    return_lse=True, backend="portable")
    dq, dk, dv = poisoned_like(q), poisoned_like(k), poisoned_like(v)
    attention_bwd(q, k, v, o, lse, do, dq, dk, dv, is_causal=causal, scale=scale, interpret=INTERPRET)
    return dq, dk, dv


# rel-RMS per gradient, set from measurement under the interpreter (max fp16 3.7e-4, bf16 6.9e-3: the interpreter
# truncates fp32 -> bf16 where GPUs round)
BOUND = {torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,sq,skv", [(2, 2, 33, 33), (4, 2, 17, 40), (4, 1, 40, 17), (2, 2, 1, 33)])
def test_backward_matches_float64(device, dtype, causal, hq, hkv, sq, skv):
    q, k, v = attention_inputs(1, hq, sq, skv, 64, dtype, device, hkv=hkv, seed=sq + skv)
    do = (torch.rand(q.shape, generator=torch.Generator().manual_seed(7)) - 0.5).to(dtype).to(device)
    scale = 0.3
    ours = _ours(q, k, v, do, causal, scale)
    for name, g, ref in zip("q k v".split(), ours, _reference_grads(q, k, v, do, causal, scale), strict=True):
        assert torch.isfinite(g).all(), f"d{name}: non-finite (an element left unwritten?)"
        err = _rel_rms(g, ref)
        assert err < BOUND[dtype], f"d{name}: rel-RMS {err:.2e}"


@pytest.mark.parametrize("broken", ["dropped scale", "dk dv swapped", "gqa not summed", "no causal mask"])
def test_each_check_fails_on_a_broken_backward(device, broken):
    causal = broken == "no causal mask"
    q, k, v = attention_inputs(1, 4, 33, 33, 64, torch.float16, device, hkv=2, seed=5)
    do = (torch.rand(q.shape, generator=torch.Generator().manual_seed(8)) - 0.5).to(torch.float16).to(device)
    scale = 1 / math.sqrt(64)
    dq, dk, dv = _ours(q, k, v, do, causal, scale)
    if broken == "dropped scale":
        dq = dq / scale
    elif broken == "dk dv swapped":
        dk, dv = dv, dk
    elif broken == "gqa not summed":
        dk = dk / 2
    else:
        dq, dk, dv = _ours(q, k, v, do, False, scale)
    errs = [_rel_rms(g, r) for g, r in zip((dq, dk, dv), _reference_grads(q, k, v, do, causal, scale), strict=True)]
    assert max(errs) > BOUND[torch.float16], errs
