"""torch.func's reverse-mode transforms through the ops (`xkernels.func_transforms`): grad, vjp, jacrev and vmap over
grad (per-sample gradients) give what autograd gives on the same calls, bitwise (the same kernels and formulas);
a second derivative is refused by name, and forward mode by the public functions (tests/test_validation.py)."""

import pytest
import torch

import xkernels
from xkernels.testing import attention_inputs


def _loss_weights(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) - 0.5


def _attention_loss(q, k, v, sinks, w_o, w_lse):
    o, lse = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=sinks, return_lse=True)
    return (o.float() * w_o).sum() + (lse * w_lse).sum()


def _varlen_loss(q, k, v, cu_q, cu_k, w_o):
    return (xkernels.attention_varlen(q, k, v, cu_q, cu_k, 9, 11, is_causal=True).float() * w_o).sum()


def _matmul_loss(a, b, w):
    return (xkernels.matmul(a, b).float() * w).sum()


def _cases(device):
    q, k, v = attention_inputs(1, 4, 9, 11, 64, torch.bfloat16, device, hkv=2, seed=5)
    sinks = torch.randn(4, device=device)
    yield "attention", _attention_loss, (q, k, v, sinks), (_loss_weights(q.shape, 1).to(device),
                                                           _loss_weights(q.shape[:3], 2).to(device))
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 11, 17], dtype=torch.int32, device=device)
    pq, pk, pv = (torch.randn(n, h, 64, device=device).half() for n, h in ((9, 4), (17, 2), (17, 2)))
    yield "varlen", _varlen_loss, (pq, pk, pv), (cu_q, cu_k, _loss_weights(pq.shape, 3).to(device))
    a, b = torch.randn(2, 3, 20, 64, device=device).half(), torch.randn(64, 24, device=device).half()
    yield "matmul", _matmul_loss, (a, b), (_loss_weights((2, 3, 20, 24), 4).to(device),)


@pytest.mark.parametrize("transform", ["grad", "vjp"])
def test_transforms_match_autograd(device, transform):
    for name, loss, inputs, constants in _cases(device):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        want = torch.autograd.grad(loss(*leaves, *constants), leaves)
        argnums = tuple(range(len(inputs)))
        if transform == "grad":
            got = torch.func.grad(loss, argnums=argnums)(*inputs, *constants)
        else:
            value, pullback = torch.func.vjp(lambda *x, c=constants, f=loss: f(*x, *c), *inputs)
            got = pullback(torch.ones_like(value))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and torch.equal(g, w), f"{name}: gradient {i}"


def test_per_sample_gradients(device):
    """vmap(grad): each sample's gradient is the one autograd gives that sample alone."""
    q, k, v = attention_inputs(3, 2, 8, 8, 64, torch.float16, device, seed=6)
    w = _loss_weights((2, 8, 64), 7).to(device)

    def loss(qs, ks, vs):  # one sample: (H, S, D)
        return (xkernels.attention(qs[None], ks[None], vs[None], is_causal=True)[0].float() * w).sum()

    got = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for b in range(3):
        leaves = [t[b].detach().clone().requires_grad_() for t in (q, k, v)]
        for g, want in zip(got, torch.autograd.grad(loss(*leaves), leaves), strict=True):
            assert torch.equal(g[b], want), b


def test_jacrev_of_matmul(device):
    """dC/dA of C = A B is B^T on the diagonal blocks: exact, as torch.matmul's."""
    a, b = torch.randn(3, 64, device=device).half(), torch.randn(64, 5, device=device).half()
    got = torch.func.jacrev(lambda x: xkernels.matmul(x, b))(a)
    assert torch.equal(got, torch.func.jacrev(lambda x: torch.matmul(x, b))(a))


def test_second_derivative_is_refused(device):
    q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=8)

    def loss(q):
        return xkernels.attention(q, k, v).float().square().sum()

    with pytest.raises(RuntimeError, match="double backward"):
        torch.func.grad(lambda q: torch.func.grad(loss)(q).float().sum())(q)
