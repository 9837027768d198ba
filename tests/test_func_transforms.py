"""torch.func's transforms through the ops (`xkernels.func_transforms`): grad, vjp, jacrev and vmap over grad
(per-sample gradients) give what autograd gives on the same calls, bitwise (the same kernels and formulas); a
second derivative is refused by name, and forward mode by the public functions (tests/test_validation.py).
vmap runs each op once on the whole batch (its batching rule, not torch's per-sample fallback: the tests count the
op calls) and gives what a call per sample gives."""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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

    got = _vmap(torch.func.grad(loss, argnums=(0, 1, 2)), q, k, v)
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


class _OpCalls(TorchDispatchMode):
    """Counts the xkernels op calls that reach the kernels (below vmap's batching: one per sample where an op has no
    batching rule)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "xkernels":
            self.calls[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def _vmap(fn, *args, in_dims=0):
    """torch.vmap(fn)(*args), checked to make as many op calls as one sample's call does."""
    dims = (in_dims,) * len(args) if isinstance(in_dims, int) else in_dims
    with _OpCalls() as one:
        fn(*(a if d is None else a.select(d, 0) for a, d in zip(args, dims, strict=True)))
    with _OpCalls() as batched:
        out = torch.vmap(fn, in_dims=in_dims)(*args)
    assert batched.calls == one.calls and one.calls
    return out


def _per_sample(fn, *args, in_dims, size):
    outs = [fn(*(a if d is None else a.select(d, s) for a, d in zip(args, in_dims, strict=True)))
            for s in range(size)]
    return torch.stack(outs) if isinstance(outs[0], torch.Tensor) else tuple(map(torch.stack, zip(*outs, strict=True)))


def _assert_same(got, want, device):
    """Bitwise on the interpreter; on a GPU a folded call may pick another tile or K split (a larger problem)."""
    for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,))), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert not g.isnan().any()
        if device == "cpu":
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=2e-2 * w.float().abs().max().item())


@pytest.mark.parametrize("case", ["batch", "dim1-shared-kv", "sinks"])
def test_vmap_attention(device, case):
    """The samples fold into the batch (or, with vmapped sinks, into the heads: GQA groups kept); with the LSE
    (attention_lse) and without (attention: the shared-K/V case)."""
    q, k, v = (t.unflatten(0, (3, 1)) for t in attention_inputs(3, 4, 9, 11, 64, torch.bfloat16, device, hkv=2,
                                                                  seed=9))
    sinks = torch.randn(3, 4, device=device)

    def fn(q, k, v, s):
        lse = case != "dim1-shared-kv"
        return xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=s, return_lse=lse)

    args, dims = {"batch": ((q, k, v, None), (0, 0, 0, None)),
                  "dim1-shared-kv": ((q.movedim(0, 1), k[0], v[0], None), (1, None, None, None)),
                  "sinks": ((q, k, v, sinks), (0, 0, 0, 0))}[case]
    _assert_same(_vmap(fn, *args, in_dims=dims), _per_sample(fn, *args, in_dims=dims, size=3), device)


@pytest.mark.parametrize("case", ["shared-cu", "per-sample-cu", "sinks"])
def test_vmap_attention_varlen(device, case):
    """The samples' packed tokens laid end to end, their cu_seqlens shifted to match."""
    cu_k = torch.tensor([0, 11, 17], dtype=torch.int32, device=device)
    cu_q = torch.tensor([[0, 4, 9], [0, 9, 9], [0, 0, 9]], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(3, n, h, 64, device=device).half() for n, h in ((9, 4), (17, 2), (17, 2)))
    sinks = torch.randn(3, 4, device=device)

    def fn(q, k, v, cq, s):
        return xkernels.attention_varlen(q, k, v, cq, cu_k, 9, 11, is_causal=True, sinks=s, return_lse=True)

    args, dims = {"shared-cu": ((q, k, v, cu_q[0], None), (0, 0, 0, None, None)),
                  "per-sample-cu": ((q, k, v, cu_q, None), (0, 0, 0, 0, None)),
                  "sinks": ((q, k, v, cu_q[0], sinks), (0, 0, 0, None, 0))}[case]
    _assert_same(_vmap(fn, *args, in_dims=dims), _per_sample(fn, *args, in_dims=dims, size=3), device)


@pytest.mark.parametrize("bad", ["end", "start"])
def test_vmap_attention_varlen_bad_cu_seqlens(device, bad):
    """A sample whose cu_seqlens does not start at 0 or ends short of the packed tokens is refused, as that sample's
    own call would be (the folded cu_seqlens would be valid: a sequence would reach into the next sample); without
    sync_checks every output is NaN, as for a bad call of one sample."""
    cu_q = torch.tensor([[0, 4, 9], [0, 4, 8] if bad == "end" else [1, 4, 9]], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 11, 17], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(2, n, 2, 64, device=device).half() for n in (9, 17, 17))
    with pytest.raises(ValueError, match=r"cu_seqlens_q: must start at 0 and end at .* every vmapped sample"):
        torch.vmap(lambda q, cq: xkernels.attention_varlen(q, k[0], v[0], cq, cu_k, 9, 11))(q, cu_q)
    out = torch.vmap(lambda q, cq: xkernels.attention_varlen(q, k[0], v[0], cq, cu_k, 9, 11, sync_checks=False))(
        q, cu_q)
    assert out.isnan().all()


def test_vmap_over_no_samples(device):
    """A vmapped dim of size 0 gives empty outputs of the per-sample shapes (no fold, no kernel)."""
    q, k, v = (t[:0] for t in attention_inputs(2, 2, 8, 8, 64, torch.float16, device, seed=12))
    o, lse = torch.vmap(lambda q, k, v: xkernels.attention(q[None], k[None], v[None], return_lse=True))(q, k, v)
    assert o.shape == (0, 1, 2, 8, 64) and lse.shape == (0, 1, 2, 8)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    packed = torch.empty(0, 8, 2, 64, device=device).half()
    assert torch.vmap(lambda t: xkernels.attention_varlen(t, t, t, cu, cu, 8, 8))(packed).shape == (0, 8, 2, 64)


@pytest.mark.parametrize("case", ["a", "b", "both", "batched-a-b-2d", "nk"])
def test_vmap_matmul(device, case):
    """The samples become a leading batch dim; each operand's own batch dims still broadcast as in one sample."""
    a = torch.randn(3, 2, 20, 64, device=device).half()
    b = torch.randn(3, 64, 24, device=device).half()
    fn = xkernels.matmul
    args, dims = {"a": ((a, b[0]), (0, None)),  # a weight shared by the samples
                  "b": ((a[0], b), (None, 0)),  # a's batch dim (2) against each sample's 2-D b
                  "both": ((a, b.unsqueeze(1)), (0, 0)),
                  "batched-a-b-2d": ((a[:, 0], b.movedim(0, 2)), (0, 2)),
                  "nk": ((a, b.transpose(1, 2).contiguous()), (0, 0))}[case]
    if case == "nk":
        def fn(x, y):
            return xkernels.matmul(x, y, b_layout="nk")
    _assert_same(_vmap(fn, *args, in_dims=dims), _per_sample(fn, *args, in_dims=dims, size=3), device)


def test_per_sample_gradients_varlen_and_matmul(device):
    """vmap(grad) through the packed op and matmul: one call each, each sample's gradient autograd's."""
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 11, 17], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(3, n, h, 64, device=device).half() for n, h in ((9, 4), (17, 2), (17, 2)))
    w = _loss_weights((9, 4, 64), 10).to(device)
    proj = torch.randn(64, 64, device=device).half()

    def loss(q, k, v, proj):
        o = xkernels.attention_varlen(q, k, v, cu_q, cu_k, 5, 11, is_causal=True)
        return (xkernels.matmul(o, proj).float() * w).sum()

    got = _vmap(torch.func.grad(loss, argnums=(0, 1, 2, 3)), q, k, v, proj, in_dims=(0, 0, 0, None))
    for b in range(3):
        leaves = [t.detach().clone().requires_grad_() for t in (q[b], k[b], v[b], proj)]
        for g, want in zip(got, torch.autograd.grad(loss(*leaves), leaves), strict=True):
            _assert_same(g[b], want, device)
