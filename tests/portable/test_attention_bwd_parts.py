"""The backward's helper passes on their own: delta = rowsum(dO * O) - dLSE (zeroing the fused dQ buffer on the way)
and the fused dQ's finish (scale and cast into dQ's layout), against torch on the same inputs."""

import torch

from xkernels.portable import attention_bwd
from xkernels.testing import attention_inputs


def test_preprocess_zeroes_the_dq_buffer_and_computes_delta(device):
    o, do, _ = attention_inputs(2, 3, 37, 37, 64, torch.float16, device, seed=4)
    dlse = torch.rand(o.shape[:3], device=device)
    acc = torch.full(o.shape, float("nan"), dtype=torch.float32, device=device)
    delta = attention_bwd.preprocess(o, do, dlse, block_m=16, dq_accum=acc)
    want = (o.float() * do.float()).sum(-1) - dlse
    assert torch.allclose(delta, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(acc, torch.zeros_like(acc))


def test_finish_dq_scales_and_casts_into_any_layout(device):
    acc = torch.randn(2, 3, 37, 64, device=device)
    dq = torch.full((2, 37, 3, 64), float("nan"), dtype=torch.bfloat16, device=device).transpose(1, 2)
    attention_bwd.finish_dq(acc, dq, scale=0.125, block_m=16)
    # within one bf16 step (the interpreter's fp32 -> bf16 cast may round toward zero where a GPU rounds to nearest)
    assert torch.allclose(dq.float(), acc * 0.125, rtol=2**-7, atol=0)
