"""The packed backward's direct path (`backward.VarlenBackwardPlan`: the cu_seqlens check, the preprocess and the
Gluon dK/dV and dQ kernels prepared once per key) against its general path (`backward._varlen_general`, launched
through `launch.run`) on an H100/H200: bitwise equal gradients, each also within the recipe's bounds against
float64 autograd per sequence, over head dims, causal and windowed batches with empty sequences and tails, GQA, a
gradient through the LSE, fused-QKV views, a second call on other tensors, a misaligned call (the general path
serves it), bad cu_seqlens (NaN gradients through the direct path) and CUDA-graph capture; every gradient buffer
NaN-poisoned."""

import pytest
import torch

from tests.helpers import NEEDS_HOPPER, assert_passes, poison_gradient_buffers
from tests.test_varlen_backward import _cu, _packed
from xkernels import backward, ops, plans
from xkernels.common.seqlen import Band
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_grad, reference_attention_varlen_grads
from xkernels.testing.inputs import uniform

pytestmark = NEEDS_HOPPER

GENERAL = backward._varlen_general
LENS = ([1, 200, 0, 333, 64, 129], [77, 200, 5, 130, 0, 300])


@pytest.fixture(autouse=True)
def poisoned_gradients(monkeypatch):
    poison_gradient_buffers(monkeypatch)


@pytest.fixture(autouse=True)
def direct_only(monkeypatch):
    """A plan call that falls back to the general path fails the test; a test that expects it says so."""

    def refuse(*args, **kwargs):
        raise AssertionError("the plan took the general path")

    monkeypatch.setattr(backward, "_varlen_general", refuse)


def _lengths(cq, ck):
    return int((cq[1:] - cq[:-1]).max()), int((ck[1:] - ck[:-1]).max())


def _forward(q, k, v, cq, ck, causal, window):
    max_q, max_k = _lengths(cq, ck)
    return ops.attention_varlen_op(q, k, v, cq, ck, max_q, max_k, causal, None, "auto", True, True, "auto", *window)


def _plan_grads(do, q, k, v, o, lse, dlse, cq, ck, causal, window=(-1, -1), lengths=None):
    grads = ops.attention_varlen_backward_op(do, q, k, v, o, lse, dlse, cq, ck, *(lengths or _lengths(cq, ck)),
                                             causal, None, "auto", "auto", *window)
    return grads, plans.last_backend()


def _general_grads(do, q, k, v, o, lse, dlse, cq, ck, causal, window=(-1, -1)):
    max_q, max_k = _lengths(cq, ck)
    _, choice = backward.select.resolve_attention_varlen_backward(do, q, k, v, o, lse, dlse, cq, ck, max_q, max_k,
                                                                  precision="auto", backend="auto")
    grads = tuple(backward.grad_like(t) for t in (q, k, v))
    GENERAL(do, q, k, v, o, lse, dlse, cq, ck, max_q, max_k, *grads, empty=False, scale=q.shape[-1] ** -0.5,
            choice=choice, band=Band.of(causal, window), softcap=0.0)
    return grads


def _check(grads, q, k, v, do, cq, ck, causal, dlse=None, window=(-1, -1)):
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, grad_lse=dlse, window=window)
    recipe = ATTENTION_RECIPES["fp16" if q.dtype == torch.float16 else "bf16"]
    return {n: compare_grad(g, r, recipe) for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)}


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,window,dlse", [(False, (-1, -1), False), (True, (-1, -1), True),
                                                (True, (100, 0), False), (False, (50, 30), True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_direct_path_matches_general_path_and_float64(d, causal, window, dlse, dtype):
    q, k, v, do, cq, ck = _packed(*LENS, 8, 2, d, dtype, "cuda", seed=d + causal)
    o, lse = _forward(q, k, v, cq, ck, causal, window)
    grad_lse = torch.rand(lse.shape, device="cuda") - 0.5 if dlse else None
    direct, name = _plan_grads(do, q, k, v, o, lse, grad_lse, cq, ck, causal, window)
    assert name.startswith("hopper.attention_varlen_backward"), name
    general = _general_grads(do, q, k, v, o, lse, grad_lse, cq, ck, causal, window)
    for a, b in zip(direct, general, strict=True):
        assert torch.equal(a, b)
    # rows that see no key have LSE -inf: no gradient reaches them through it
    dlse_ref = None if grad_lse is None else torch.where(torch.isinf(lse), 0.0, grad_lse)
    assert_passes(_check(direct, q, k, v, do, cq, ck, causal, dlse_ref, window))


def test_fused_qkv_views_a_second_call_and_a_misaligned_call(monkeypatch):
    """Views of a fused QKV tensor take the direct path; a second call with the same key on other tensors gives that
    call's gradients; a call whose q starts 2 bytes into its storage takes the general path and is right too."""
    lens = [100, 257, 31]
    cu = _cu(lens, "cuda")
    calls = []
    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v = uniform((sum(lens), 3, 4, 128), torch.bfloat16, "cuda", g).unbind(1)
        do = uniform(q.shape, torch.bfloat16, "cuda", g)
        o, lse = _forward(q, k, v, cu, cu, True, (-1, -1))
        grads, _ = _plan_grads(do, q, k, v, o, lse, None, cu, cu, True)
        assert all(torch.equal(a, b) for a, b in zip(grads, _general_grads(do, q, k, v, o, lse, None, cu, cu, True),
                                                     strict=True))
        calls.append(((do, q, k, v, o, lse), grads))
    assert not torch.equal(calls[0][1][0], calls[1][1][0])
    (do, q, k, v, o, lse), want = calls[1]
    assert_passes(_check(want, q, k, v, do, cu, cu, True))
    storage = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    q_off = storage[1:].view(q.shape).copy_(q)
    assert q_off.data_ptr() % 16
    fallbacks = []
    monkeypatch.setattr(backward, "_varlen_general", lambda *a, **kw: fallbacks.append(1) or GENERAL(*a, **kw))
    got, _ = _plan_grads(do, q_off, k, v, o, lse, None, cu, cu, True)
    assert fallbacks == [1] and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_bad_cu_seqlens_give_nan_through_the_direct_path():
    q, k, v, do, cq, ck = _packed(*LENS, 4, 2, 128, torch.bfloat16, "cuda", seed=3)
    o, lse = _forward(q, k, v, cq, ck, True, (-1, -1))
    good, _ = _plan_grads(do, q, k, v, o, lse, None, cq, ck, True)
    assert all(torch.isfinite(t).all() for t in good)
    for edit in ("last", "decreasing", "long"):
        bad_q = cq.clone()
        if edit == "last":
            bad_q[-1] += 1
        elif edit == "decreasing":
            bad_q[2] = bad_q[1] - 1
        else:  # sequences 3 and 4 as one, past max_seqlen_q (the same key: the lengths are the good call's)
            bad_q[4] = bad_q[3]
        grads = ops.attention_varlen_backward_op(do, q, k, v, o, lse, None, bad_q, ck, *_lengths(cq, ck), True, None,
                                                 "auto", "auto")
        assert all(torch.isnan(t).all() for t in grads), edit
    again, _ = _plan_grads(do, q, k, v, o, lse, None, cq, ck, True)
    assert all(torch.equal(a, b) for a, b in zip(good, again, strict=True))


def test_captured_backward_replays_the_direct_path():
    q, k, v, do, cq, ck = _packed(*LENS, 8, 2, 128, torch.bfloat16, "cuda", seed=4)
    o, lse = _forward(q, k, v, cq, ck, True, (-1, -1))
    lengths = _lengths(cq, ck)  # read before the capture
    eager, _ = _plan_grads(do, q, k, v, o, lse, None, cq, ck, True, lengths=lengths)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _plan_grads(do, q, k, v, o, lse, None, cq, ck, True, lengths=lengths)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = _plan_grads(do, q, k, v, o, lse, None, cq, ck, True, lengths=lengths)
    for t in captured:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, captured, strict=True))
