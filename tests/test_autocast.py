"""torch.autocast: `attention`, `attention_varlen` and `matmul` cast floating inputs to the autocast dtype, as
F.scaled_dot_product_attention and torch.matmul do, so fp32 activations work inside an autocast region and give the
same result as the cast inputs, gradients included (to the fp32 leaves); outside autocast fp32 is still refused, and
as in torch float64 and out= calls are never cast."""

import pytest
import torch

import xkernels


def _autocast(device):
    return torch.autocast(device, dtype=torch.bfloat16)


def _rand(*shape, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) - 0.5).to(device)


def test_attention_casts_to_the_autocast_dtype(device):
    q, k, v = (_rand(1, 2, 24, 64, device=device, seed=i).requires_grad_() for i in range(3))
    with _autocast(device):
        o = xkernels.attention(q, k, v, is_causal=True)
    assert o.dtype == torch.bfloat16
    cast = [t.detach().to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    want = xkernels.attention(*cast, is_causal=True)
    assert torch.equal(o, want)
    do = _rand(*o.shape, device=device, seed=9).to(torch.bfloat16)
    grads = torch.autograd.grad(o, (q, k, v), do)
    want_grads = torch.autograd.grad(want, cast, do)
    for g, w in zip(grads, want_grads, strict=True):
        assert g.dtype == torch.float32 and torch.equal(g, w.float())  # through Tensor.to's backward


def test_varlen_and_matmul_cast_too(device):
    q, k, v = (_rand(30, 2, 64, device=device, seed=i) for i in range(3))
    cu = torch.tensor([0, 10, 30], dtype=torch.int32, device=device)
    a, b = _rand(16, 32, device=device, seed=4), _rand(32, 16, device=device, seed=5)
    with _autocast(device):
        o = xkernels.attention_varlen(q, k, v, cu, cu, 20, 20, is_causal=True)
        c = xkernels.matmul(a, b)
    bf = torch.bfloat16
    assert torch.equal(o, xkernels.attention_varlen(q.to(bf), k.to(bf), v.to(bf), cu, cu, 20, 20, is_causal=True))
    assert torch.equal(c, xkernels.matmul(a.to(bf), b.to(bf)))


def test_fp32_outside_autocast_is_still_refused(device):
    q = _rand(1, 2, 8, 64, device=device)
    with pytest.raises(TypeError, match="q"):
        xkernels.attention(q, q, q)
    with torch.autocast(device, enabled=False):
        with pytest.raises(TypeError, match="a"):
            xkernels.matmul(q[0, 0], q[0, 0].T)


def test_compiled_autocast_region(device):
    """torch.compile(fullgraph=True) traces the cast: the same output as eager inside the region."""
    q = _rand(1, 2, 16, 64, device=device, seed=7)

    def f(q):
        with _autocast(device):
            return xkernels.attention(q, q, q, is_causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    assert torch.equal(compiled(q), f(q))


def test_float64_and_out_calls_are_not_cast(device):
    """As torch: autocast leaves float64 alone (so it is refused by dtype, as outside autocast), and out= calls are
    not cast (a bf16 out with bf16 inputs works; fp32 inputs with out= are refused by dtype)."""
    a64 = _rand(8, 16, device=device).double()
    with _autocast(device):
        with pytest.raises(TypeError, match="a"):
            xkernels.matmul(a64, a64.T)
        a, b = _rand(8, 16, device=device, seed=1), _rand(16, 8, device=device, seed=2)
        out = torch.empty(8, 8, dtype=torch.bfloat16, device=device)
        with pytest.raises(TypeError):
            xkernels.matmul(a, b, out=out)
        assert xkernels.matmul(a.bfloat16(), b.bfloat16(), out=out) is out
    assert torch.equal(out, xkernels.matmul(a.bfloat16(), b.bfloat16()))
