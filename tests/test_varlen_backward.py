"""The varlen backward through autograd (`xkernels.attention_varlen` with inputs that require grad) against float64
autograd per sequence on the same quantized q, k, v and dO: rel-RMS and per-row bounds per gradient, non-finite
first, NaN-poisoned gradient buffers. Covers causal bottom-right, GQA/MQA, empty sequences and rows that see no key,
a gradient through the LSE, head dims 128/256, bf16io, packed views of a fused QKV tensor, bad cu_seqlens (NaN
gradients, nothing written outside), the op's registration (opcheck, torch.compile of a training step), and that
each check fails on a broken backward."""

import math

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes
from xkernels import backward, ops
from xkernels.recipes import ATTENTION_RECIPES, resolve_attention_recipe
from xkernels.testing import compare_grad, reference_attention_varlen_grads
from xkernels.testing.inputs import uniform


@pytest.fixture(autouse=True)
def poisoned_gradients(monkeypatch):
    real = backward.grad_like
    monkeypatch.setattr(backward, "grad_like", lambda t: real(t).fill_(float("nan")))


def _cu(lens, device):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _packed(lens_q, lens_k, hq, hkv, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = uniform((sum(lens_q), hq, d), dtype, device, g)
    k = uniform((sum(lens_k), hkv, d), dtype, device, g)
    v = uniform((sum(lens_k), hkv, d), dtype, device, g)
    do = uniform(q.shape, dtype, device, g)
    return q, k, v, do, _cu(lens_q, device), _cu(lens_k, device)


def _run(q, k, v, do, cq, ck, *, causal, scale=None, precision="auto", dlse=None, backend=None):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    max_q, max_k = int((cq[1:] - cq[:-1]).max()), int((ck[1:] - ck[:-1]).max())
    o, lse = xkernels.attention_varlen(*leaves, cq, ck, max_q, max_k, is_causal=causal, scale=scale,
                                       precision=precision, return_lse=True, backend=backend)
    loss = (o.float() * do.float()).sum()
    if dlse is not None:
        loss = loss + (lse.nan_to_num(0.0, 0.0, 0.0) * dlse).sum()  # rows without keys: LSE -inf, no gradient
    return torch.autograd.grad(loss, leaves)


def _check(grads, q, k, v, do, cq, ck, *, causal, scale=None, precision="auto", dlse=None):
    recipe = ATTENTION_RECIPES[resolve_attention_recipe(precision, q.dtype).name]
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, scale=scale, grad_lse=dlse)
    out = {}
    for name, g, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert g.dtype == q.dtype and g.shape == ref.shape, name
        out[name] = compare_grad(g, ref, recipe)
    return out



# tails, an empty query sequence, an empty key sequence, Sq > Sk (causal: leading rows see no key), Sq < Sk
LENS = ([5, 17, 0, 33, 3], [9, 17, 4, 20, 0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_float64_per_sequence(device, dtype, causal):
    q, k, v, do, cq, ck = _packed(*LENS, 4, 2, 64, dtype, device, seed=1)
    assert_passes(_check(_run(q, k, v, do, cq, ck, causal=causal, scale=0.3), q, k, v, do, cq, ck, causal=causal,
                          scale=0.3))


@pytest.mark.parametrize("d", [128, 256])
def test_larger_head_dims_and_mqa(device, d):
    q, k, v, do, cq, ck = _packed([7, 20], [12, 20], 2, 1, d, torch.float16, device, seed=d)
    assert_passes(_check(_run(q, k, v, do, cq, ck, causal=True), q, k, v, do, cq, ck, causal=True))


def test_gradient_through_the_lse(device):
    q, k, v, do, cq, ck = _packed(*LENS, 2, 2, 64, torch.float16, device, seed=3)
    dlse = uniform((2, q.shape[0]), torch.float32, device, torch.Generator(device=device).manual_seed(9))
    assert_passes(_check(_run(q, k, v, do, cq, ck, causal=True, dlse=dlse), q, k, v, do, cq, ck, causal=True,
                          dlse=dlse))
    # the check sees it when the LSE term is dropped
    assert not all(c.passed for c in _check(_run(q, k, v, do, cq, ck, causal=True), q, k, v, do, cq, ck,
                                            causal=True, dlse=dlse).values())


def test_bf16io_backward_is_the_bf16_recipes(device):
    q, k, v, do, cq, ck = _packed([9, 24], [16, 24], 2, 2, 64, torch.bfloat16, device, seed=4)
    assert_passes(_check(_run(q, k, v, do, cq, ck, causal=False, precision="bf16io"), q, k, v, do, cq, ck,
                          causal=False, precision="bf16io"))


def test_one_sequence_equals_the_dense_backward(device):
    """Sq = Skv: bottom-right and top-left causal coincide, so the packed and the dense backward agree bitwise."""
    q, k, v, do, cq, ck = _packed([40], [40], 4, 2, 64, torch.float16, device, seed=5)
    got = _run(q, k, v, do, cq, ck, causal=True)
    dense = [t.transpose(0, 1)[None].detach().clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention(*dense, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(o, dense, do.transpose(0, 1)[None])
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w[0].transpose(0, 1))


def test_views_of_a_fused_qkv_tensor(device):
    """q, k, v as strided views of one (total, 3, H, D) tensor (a fused QKV projection): gradients come back right,
    in contiguous buffers."""
    lens = [11, 30]
    g = torch.Generator(device=device).manual_seed(6)
    qkv = uniform((sum(lens), 3, 2, 64), torch.float16, device, g)
    q, k, v = qkv.unbind(1)
    do = uniform(q.shape, torch.float16, device, g)
    cu = _cu(lens, device)
    assert_passes(_check(_run(q, k, v, do, cu, cu, causal=True), q, k, v, do, cu, cu, causal=True))


def test_bad_cu_seqlens_give_nan_gradients(device, monkeypatch):
    """cu_seqlens that went bad after the forward reach the backward only through the op (autograd refuses changed
    saved tensors): it checks them on the device, hands the kernels empty sequences (so they read and write nothing)
    and answers NaN."""
    q, k, v, do, cq, ck = _packed([5, 9], [5, 9], 2, 2, 64, torch.float16, device, seed=7)
    o, lse = ops.attention_varlen_op(q, k, v, cq, ck, 9, 9, True, None, "auto", True, True, "auto")
    launched = []
    real = backward._varlen_launch
    monkeypatch.setattr(backward, "_varlen_launch", lambda *a, **kw: launched.append(a[10]) or real(*a, **kw))
    for which in ("q", "k"):
        bad_q, bad_k = cq.clone(), ck.clone()
        (bad_q if which == "q" else bad_k)[-1] = 1000  # past the packed total
        # the portable kernels: their launch shows what they were handed (the Hopper plan's direct path launches
        # prepared kernels: tests/gpu/test_varlen_backward_plan.py checks its bad calls)
        grads = ops.attention_varlen_backward_op(do, q, k, v, o, lse, None, bad_q, bad_k, 9, 9, True, None, "auto",
                                                 "portable")
        assert all(torch.isnan(g).all() for g in grads)
        packed = launched.pop()
        assert not packed.cu_seqlens_q.any() and not packed.cu_seqlens_k.any(), "the kernels saw the bad values"
    good = ops.attention_varlen_backward_op(do, q, k, v, o, lse, None, cq, ck, 9, 9, True, None, "auto", "auto")
    assert all(torch.isfinite(g).all() for g in good)


def test_the_op_without_the_lse_says_what_it_needs(device):
    q, k, v, do, cq, ck = _packed([5], [5], 2, 2, 64, torch.float16, device)
    qq = q.clone().requires_grad_()
    o, _ = ops.attention_varlen_op(qq, k, v, cq, ck, 5, 5, False, None, "auto", False, True, "auto")
    with pytest.raises(RuntimeError, match="return_lse=True"):
        o.backward(do)


def test_bad_backward_arguments_name_the_argument(device):
    q, k, v, do, cq, ck = _packed([5, 9], [5, 9], 2, 2, 64, torch.float16, device)
    o, lse = ops.attention_varlen_op(q, k, v, cq, ck, 9, 9, False, None, "auto", True, True, "auto")
    call = ops.attention_varlen_backward_op
    with pytest.raises(ValueError, match="grad_out: shape"):
        call(do[:3], q, k, v, o, lse, None, cq, ck, 9, 9, False, None, "auto", "auto")
    with pytest.raises(ValueError, match=r"lse: shape .* \(Hq, total_q\)"):
        call(do, q, k, v, o, lse.t(), None, cq, ck, 9, 9, False, None, "auto", "auto")
    with pytest.raises(TypeError, match="cu_seqlens_k: dtype"):
        call(do, q, k, v, o, lse, None, cq, ck.long(), 9, 9, False, None, "auto", "auto")


def test_opcheck_and_compiled_training_step(device):
    q, k, v, do, cq, ck = _packed([5, 17], [9, 17], 4, 2, 64, torch.float16, device, seed=8)
    o, lse = ops.attention_varlen_op(q, k, v, cq, ck, 17, 17, True, None, "auto", True, True, "auto")
    for dlse in (None, torch.ones_like(lse)):
        torch.library.opcheck(ops.attention_varlen_backward_op,
                              (do, q, k, v, o, lse, dlse, cq, ck, 17, 17, True, None, "auto", "auto"))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(ops.attention_varlen_op, (*leaves, cq, ck, 17, 17, True, 0.5, "auto", True, True, "auto"))
    w = uniform((64, 64), torch.float16, device, torch.Generator(device=device).manual_seed(9))

    def loss(q, k, v):
        return xkernels.attention_varlen(q @ w, k, v, cq, ck, 17, 17, is_causal=True).float().square().sum()

    assert_compiled_grads_match(loss, (q, k, v))


@pytest.mark.parametrize("broken", ["dropped scale", "dk dv swapped", "gqa not summed", "top-left causal",
                                    "sequences swapped", "nan"])
def test_each_check_fails_on_a_broken_backward(device, broken):
    q, k, v, do, cq, ck = _packed([20, 33], [31, 40], 4, 2, 64, torch.float16, device, seed=10)
    scale = 1 / math.sqrt(64)
    dq, dk, dv = (g.clone() for g in _run(q, k, v, do, cq, ck, causal=True, scale=scale))
    if broken == "dropped scale":
        dq = dq / scale
    elif broken == "dk dv swapped":
        dk, dv = dv, dk
    elif broken == "gqa not summed":
        dk = dk / 2
    elif broken == "top-left causal":  # the dense convention: each sequence's diagonal from its first key
        for b in range(2):
            rq, rk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
            dense = [t[r].transpose(0, 1)[None].detach().clone().requires_grad_()
                     for t, r in ((q, rq), (k, rk), (v, rk))]
            o = xkernels.attention(*dense, is_causal=True, scale=scale, enable_gqa=True)
            g = torch.autograd.grad(o, dense, do[rq].transpose(0, 1)[None])
            dq[rq], dk[rk], dv[rk] = (t[0].transpose(0, 1) for t in g)
    elif broken == "sequences swapped":  # the first sequence's key gradients written at the second's rows
        dv[:31], dv[9:40] = dv[9:40].clone(), dv[:31].clone()
    else:
        dq[3, 1, 5] = float("nan")
    results = _check((dq, dk, dv), q, k, v, do, cq, ck, causal=True, scale=scale)
    assert not all(c.passed for c in results.values()), {n: c.reason for n, c in results.items()}


def test_compiled_step_keeps_its_graph_as_lengths_change(device):
    """Packed batches change their longest sequence (and often their total) every step: after dynamo's automatic
    dynamic shapes kick in, max_seqlen and the totals stay symbolic (the op's fake kernel never reads their values),
    so new lengths reuse the graph instead of recompiling; the gradients equal eager's."""
    from torch._dynamo.utils import counters

    def loss(q, k, v, cu, m):
        return xkernels.attention_varlen(q, k, v, cu, cu, m, m, is_causal=True).float().square().sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(loss, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    batches = [[10, 30], [20, 20], [5, 35], [1, 39], [24, 24], [30, 30], [7, 50, 3]]
    for i, lens in enumerate(batches):
        g = torch.Generator(device=device).manual_seed(i)
        qkv = [uniform((sum(lens), 2, 64), torch.float16, device, g) for _ in range(3)]
        cu = _cu(lens, device)
        # separate leaves: one tensor as q, k and v would sum three gradients, in an order inductor may change
        a, b = ([t.clone().requires_grad_() for t in qkv] for _ in range(2))
        compiled(*a, cu, max(lens)).backward()
        loss(*b, cu, max(lens)).backward()
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    # static; then the longest sequence, the total, the sequence count dynamic: 4 graphs for 7 batches (6 distinct
    # longest sequences: a value read by the fake kernel would compile once per value)
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])


def test_backward_is_deterministic(device):
    """dK and dV sum over the GQA group in registers and each dQ row has one owner: bitwise repeatable."""
    q, k, v, do, cq, ck = _packed(*LENS, 4, 1, 64, torch.bfloat16, device, seed=11)
    first, second = (_run(q, k, v, do, cq, ck, causal=True) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
