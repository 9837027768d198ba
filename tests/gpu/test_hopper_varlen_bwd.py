"""The Hopper varlen backward (the Gluon dK/dV and dQ kernels' VARLEN variants, the default on sm_90) on an
H100/H200, against float64 autograd per sequence: tails of every size, empty sequences, Sq > Sk and Sq < Sk (causal
rows that see no key), GQA, D64/128/256, the LSE's gradient, fused-QKV views; NaN-poisoned gradient buffers. One
sequence of a whole number of tiles must equal the dense Hopper backward bitwise (same tiles, same arithmetic)."""

import pytest
import torch

import xkernels
from tests.helpers import NEEDS_HOPPER, assert_passes, poison_gradient_buffers
from tests.test_varlen_backward import _check, _cu, _packed, _run
from xkernels.bench.timing import capture
from xkernels.testing.inputs import uniform

pytestmark = NEEDS_HOPPER


@pytest.fixture(autouse=True)
def poisoned_gradients(monkeypatch):
    poison_gradient_buffers(monkeypatch)


LENS = ([1, 200, 0, 333, 64, 129], [77, 200, 5, 130, 0, 300])


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_float64(d, causal, dtype):
    q, k, v, do, cq, ck = _packed(*LENS, 8, 2, d, dtype, "cuda", seed=d)
    grads = _run(q, k, v, do, cq, ck, causal=causal, backend="hopper")
    assert xkernels.last_backend().startswith("hopper.attention_varlen_backward"), xkernels.last_backend()
    assert_passes(_check(grads, q, k, v, do, cq, ck, causal=causal))


def test_lse_gradient_and_fused_qkv_views():
    lens = [100, 257, 31]
    g = torch.Generator(device="cuda").manual_seed(3)
    qkv = uniform((sum(lens), 3, 4, 128), torch.bfloat16, "cuda", g)
    q, k, v = qkv.unbind(1)
    do = uniform(q.shape, torch.bfloat16, "cuda", g)
    dlse = uniform((4, q.shape[0]), torch.float32, "cuda", g)
    cu = _cu(lens, "cuda")
    grads = _run(q, k, v, do, cu, cu, causal=True, dlse=dlse, backend="hopper")
    assert_passes(_check(grads, q, k, v, do, cu, cu, causal=True, dlse=dlse))


@pytest.mark.parametrize("d", [64, 128, 256])
def test_one_sequence_equals_the_dense_hopper_backward(d):
    """The two backward ops on the same O and LSE (one forward's), so only the backward kernels are compared."""
    from xkernels import ops

    q, k, v, do, cq, ck = _packed([512], [512], 8, 2, d, torch.bfloat16, "cuda", seed=5)
    dense = [t.transpose(0, 1)[None].contiguous() for t in (q, k, v, do)]
    o, lse = ops.attention_lse_op(*dense[:3], True, None, True, "auto", "auto")
    want = ops.attention_backward_op(dense[3], *dense[:3], o, lse, None, True, None, True, "auto", "auto")
    assert xkernels.last_backend().startswith("hopper.attention_backward"), xkernels.last_backend()
    got = ops.attention_varlen_backward_op(do, q, k, v, o[0].transpose(0, 1).contiguous(), lse[0].contiguous(), None,
                                           cq, ck, 512, 512, True, None, "auto", "hopper")
    assert xkernels.last_backend().startswith("hopper.attention_varlen_backward"), xkernels.last_backend()
    for g, w in zip(got, want, strict=True):
        w = w[0].transpose(0, 1)
        assert torch.equal(g, w), (g.float() - w.float()).abs().max()


def test_hopper_is_the_default_and_portable_can_be_forced():
    q, k, v, do, cq, ck = _packed([100, 257], [100, 257], 4, 2, 128, torch.bfloat16, "cuda", seed=1)
    _run(q, k, v, do, cq, ck, causal=True)
    assert xkernels.last_backend().startswith("hopper.attention_varlen_backward"), xkernels.last_backend()
    grads = _run(q, k, v, do, cq, ck, causal=True, backend="portable")
    assert xkernels.last_backend().startswith("portable.attention_varlen_backward"), xkernels.last_backend()
    assert_passes(_check(grads, q, k, v, do, cq, ck, causal=True))


def test_a_training_step_captures_in_a_cuda_graph():
    """Forward and backward of the packed op captured together (torch.cuda.make_graphed_callables' pattern; no
    checks read during capture) and replayed give the eager gradients, for the default and the portable kernels.
    (A backward-only capture after an eager forward fails as a process's first capture for any op, a torch matmul
    included: scripts/capture_probe.py.)"""
    q, k, v, do, cq, ck = _packed([100, 257, 31], [100, 257, 31], 4, 2, 128, torch.bfloat16, "cuda", seed=2)
    for backend in ("auto", "portable"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def step(backend=backend, leaves=leaves):
            o = xkernels.attention_varlen(*leaves, cq, ck, 257, 257, is_causal=True, backend=backend)
            return torch.autograd.grad(o, leaves, do)

        want = step()
        graph, got = capture(step)
        graph.replay()
        torch.cuda.synchronize()
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), backend
