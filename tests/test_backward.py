"""The attention backward through autograd (`xkernels.attention` with inputs that require grad) against float64
autograd on the same quantized q, k, v and dO: rel-RMS and per-row bounds per gradient, non-finite first, NaN-poisoned
gradient buffers. Covers GQA/MQA (dK, dV summed per group), causal with Sq != Skv, tails, Sq = 1, a custom scale,
non-contiguous inputs, a gradient through the LSE, bf16io, torch.compile, and determinism. Each check is shown to
fail on a broken backward."""

import contextlib
import math
import unittest.mock

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes, poisoned_like
from xkernels import backward, ops
from xkernels.recipes import ATTENTION_RECIPES, resolve_attention_recipe
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads


@pytest.fixture(autouse=True)
def poisoned_gradients(monkeypatch):
    """Every gradient buffer the backward allocates starts as NaN: an element it fails to write fails the check."""
    real = backward.grad_like
    monkeypatch.setattr(backward, "grad_like", lambda t: real(t).fill_(float("nan")))


def _grad_out(shape, dtype, device, seed=7):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) - 0.5).to(dtype).to(device)


def _run(q, k, v, do, *, causal, scale=None, precision="auto", dlse=None, backend=None):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = xkernels.attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                                precision=precision, return_lse=True, backend=backend)
    loss = (o.float() * do.float()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse).sum()
    loss.backward()
    return q.grad, k.grad, v.grad


def _check(grads, q, k, v, do, *, causal, scale=None, precision="auto", dlse=None):
    recipe = resolve_attention_recipe(precision, q.dtype)
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, scale=scale, grad_lse=dlse)
    results = {}
    for name, g, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert g.dtype == q.dtype and g.shape == ref.shape, name
        results[name] = compare_grad(g, ref, ATTENTION_RECIPES[recipe.name])
    return results



CASES = [(2, 2, 33, 33), (4, 2, 17, 40), (4, 1, 40, 17), (2, 2, 1, 33), (2, 1, 33, 1)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,sq,skv", CASES)
def test_gradients_match_float64(device, dtype, causal, hq, hkv, sq, skv):
    q, k, v = attention_inputs(1, hq, sq, skv, 64, dtype, device, hkv=hkv, seed=sq + skv)
    do = _grad_out(q.shape, dtype, device)
    assert_passes(_check(_run(q, k, v, do, causal=causal, scale=0.3), q, k, v, do, causal=causal, scale=0.3))


@pytest.mark.parametrize("d", [128, 256])
def test_larger_head_dims(device, d):
    q, k, v = attention_inputs(2, 2, 20, 24, d, torch.float16, device, hkv=1, seed=d)
    do = _grad_out(q.shape, torch.float16, device)
    assert_passes(_check(_run(q, k, v, do, causal=True), q, k, v, do, causal=True))


def test_gradient_through_the_lse(device):
    """d LSE / d S = P: a loss using the LSE (as ring attention's merge does) gets the gradient through it too."""
    q, k, v = attention_inputs(1, 2, 24, 40, 64, torch.float16, device, seed=3)
    do = _grad_out(q.shape, torch.float16, device)
    dlse = _grad_out(q.shape[:3], torch.float32, device, seed=9)
    grads = _run(q, k, v, do, causal=True, dlse=dlse)
    assert_passes(_check(grads, q, k, v, do, causal=True, dlse=dlse))
    # and the check sees it when the LSE term is dropped
    assert not all(c.passed for c in _check(_run(q, k, v, do, causal=True), q, k, v, do, causal=True,
                                            dlse=dlse).values())


def test_bf16io_backward_is_the_bf16_recipes(device):
    q, k, v = attention_inputs(1, 2, 33, 40, 64, torch.bfloat16, device, seed=11)
    do = _grad_out(q.shape, torch.bfloat16, device)
    assert_passes(_check(_run(q, k, v, do, causal=False, precision="bf16io"), q, k, v, do, causal=False,
                          precision="bf16io"))


@pytest.mark.parametrize("precision,dtype", [("fp16-acc16", torch.float16), ("bf16io-acc16", torch.bfloat16)])
def test_acc16_backward_is_the_base_recipes(device, precision, dtype):
    q, k, v = attention_inputs(1, 2, 33, 40, 64, dtype, device, seed=12)
    do = _grad_out(q.shape, dtype, device)
    assert_passes(_check(_run(q, k, v, do, causal=True, precision=precision), q, k, v, do, causal=True,
                          precision=precision))


def test_non_contiguous_inputs_and_grad_out(device):
    """(B, S, H, D) storage seen as (B, H, S, D), and a dO that is a transposed view: gradients come back in the
    inputs' layouts."""
    b, h, s, d = 2, 2, 24, 64
    base = [attention_inputs(b, h, s, s, d, torch.float16, device, seed=20 + i)[0].transpose(1, 2).contiguous()
            for i in range(3)]
    q, k, v = (t.transpose(1, 2) for t in base)
    do = _grad_out((b, s, h, d), torch.float16, device).transpose(1, 2)
    grads = _run(q, k, v, do, causal=True)
    for g, t in zip(grads, (q, k, v), strict=True):
        assert g.stride() == t.stride()
    assert_passes(_check(grads, q, k, v, do, causal=True))


def test_only_requested_inputs_get_gradients(device):
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=5)
    kk = k.clone().requires_grad_()
    o = xkernels.attention(q, kk, v)
    do = _grad_out(o.shape, torch.float16, device)
    (dk,) = torch.autograd.grad(o, (kk,), do)
    ref = reference_attention_grads(q, k, v, do)[1]
    assert compare_grad(dk, ref, ATTENTION_RECIPES["fp16"]).passed
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(xkernels.attention(q, kk, v).float().sum(), (q,))


def test_only_the_lse_in_the_loss(device):
    """A loss on the LSE alone (no gradient reaches O) still gets every gradient right."""
    q, k, v = attention_inputs(1, 2, 20, 24, 64, torch.float16, device, seed=15)
    dlse = _grad_out(q.shape[:3], torch.float32, device, seed=16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = xkernels.attention(*leaves, return_lse=True)
    grads = torch.autograd.grad((lse * dlse).sum(), leaves)
    assert_passes(_check(grads, q, k, v, torch.zeros_like(q), causal=False, dlse=dlse))


def test_double_backward_is_refused(device):
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    (dq,) = torch.autograd.grad(xkernels.attention(*leaves).float().square().sum(), leaves[:1], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.float().square().sum().backward()


def test_plain_eager_backward_runs_the_kernel_function_and_watchers_see_the_op(device, monkeypatch):
    """A backward nothing watches runs the backward op's kernel function without the dispatcher's round trip (the
    dense and the varlen one); under the profiler it goes through the op; the gradients are equal."""
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=5)
    do = _grad_out(q.shape, torch.float16, device)
    direct = []
    for op in (ops.attention_backward_op, ops.attention_varlen_backward_op):
        real, n = ops._NO_GRAD_KERNELS[op]
        monkeypatch.setitem(ops._NO_GRAD_KERNELS, op, (lambda *a, op=op, real=real: direct.append(op) or real(*a), n))

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(xkernels.attention(*leaves, is_causal=True), leaves, do)

    want = grads()
    assert direct == [ops.attention_backward_op]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = grads()
    assert any(e.name == "xkernels::attention_backward" for e in prof.events())
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)) and len(direct) == 1
    cu = torch.tensor([0, 16], dtype=torch.int32, device=device)
    leaves = [t[0].transpose(0, 1).clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention_varlen(*leaves, cu, cu, 16, 16, is_causal=True)
    torch.autograd.grad(o, leaves, do[0].transpose(0, 1))
    assert direct == [ops.attention_backward_op, ops.attention_varlen_backward_op]


def test_backward_is_deterministic(device):
    q, k, v = attention_inputs(1, 4, 40, 40, 64, torch.bfloat16, device, hkv=1, seed=6)
    do = _grad_out(q.shape, torch.bfloat16, device)
    first, second = _run(q, k, v, do, causal=True), _run(q, k, v, do, causal=True)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_the_lse_less_op_recomputes_what_it_needs(device):
    """torch.ops.xkernels.attention saves no LSE; its backward recomputes it and gives the same gradients."""
    q, k, v = attention_inputs(1, 2, 17, 33, 64, torch.float16, device, seed=8)
    do = _grad_out(q.shape, torch.float16, device)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = ops.attention_op(qq, kk, vv, True, None, False, "auto", "auto")
    torch.autograd.backward(o, do)
    for g, want in zip((qq.grad, kk.grad, vv.grad), _run(q, k, v, do, causal=True), strict=True):
        assert torch.equal(g, want)


def test_opcheck_backward_op(device):
    q, k, v = attention_inputs(1, 4, 17, 33, 64, torch.float16, device, hkv=2, seed=1)
    o, lse = ops.attention_lse_op(q, k, v, True, None, True, "auto", "auto")
    do = _grad_out(q.shape, torch.float16, device)
    dlse = _grad_out(lse.shape, torch.float32, device)
    for g in (None, dlse):
        torch.library.opcheck(ops.attention_backward_op, (do, q, k, v, o, lse, g, True, None, True, "auto", "auto"))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    torch.library.opcheck(ops.attention_lse_op, (qq, kk, vv, True, 0.5, True, "auto", "auto"))


def test_compiled_training_step_matches_eager(device):
    """torch.compile(fullgraph=True) of the loss: one forward graph with the op, and AOTAutograd's backward graph
    through its registered autograd; the gradients equal eager's."""
    q, k, v = attention_inputs(1, 4, 24, 24, 64, torch.float16, device, hkv=2, seed=12)
    w = _grad_out((64, 64), torch.float16, device, seed=13)

    def loss(q, k, v):
        return xkernels.attention(q @ w, k, v, is_causal=True, enable_gqa=True).float().square().sum()

    assert_compiled_grads_match(loss, (q, k, v))


def test_bad_backward_arguments_name_the_argument(device):
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=2)
    o, lse = ops.attention_lse_op(q, k, v, False, None, False, "auto", "auto")
    call = ops.attention_backward_op
    with pytest.raises(ValueError, match="grad_out: shape"):
        call(o[:, :, :8], q, k, v, o, lse, None, False, None, False, "auto", "auto")
    with pytest.raises(TypeError, match="grad_out: dtype"):
        call(o.float(), q, k, v, o, lse, None, False, None, False, "auto", "auto")
    with pytest.raises(TypeError, match="lse: dtype"):
        call(o, q, k, v, o, lse.half(), None, False, None, False, "auto", "auto")
    with pytest.raises(ValueError, match="grad_lse: shape"):
        call(o, q, k, v, o, lse, lse[:, :1], False, None, False, "auto", "auto")
    with pytest.raises(ValueError, match="backend"):
        call(o, q, k, v, o, lse, None, False, None, False, "auto", "nope")


def test_calls_with_out_refuse_grad_with_a_reason(device):
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=2)
    with pytest.raises(ValueError, match="q: requires grad, but a call with out= is not differentiable"):
        xkernels.attention(q.clone().requires_grad_(), k, v, out=torch.empty_like(q))
    a = torch.ones(16, 16, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="a: requires grad, but a call with out= is not differentiable"):
        xkernels.matmul(a.clone().requires_grad_(), a, out=torch.empty_like(a))


@pytest.mark.parametrize("broken", ["dropped scale", "dk dv swapped", "gqa not summed", "no causal mask",
                                    "one row wrong", "nan"])
def test_each_check_fails_on_a_broken_backward(device, broken):
    causal = broken == "no causal mask"
    q, k, v = attention_inputs(1, 4, 33, 33, 64, torch.float16, device, hkv=2, seed=5)
    do = _grad_out(q.shape, torch.float16, device, seed=8)
    scale = 1 / math.sqrt(64)
    dq, dk, dv = (g.clone() for g in _run(q, k, v, do, causal=causal, scale=scale))
    if broken == "dropped scale":
        dq = dq / scale
    elif broken == "dk dv swapped":
        dk, dv = dv, dk
    elif broken == "gqa not summed":
        dk = dk / 2
    elif broken == "no causal mask":
        dq, dk, dv = _run(q, k, v, do, causal=False, scale=scale)
    elif broken == "one row wrong":  # one key of 66 (2 kv heads x 33) 15 % off: over the row bound (0.1 for fp16)
        dv[0, 1, 7] *= 1.15
    else:
        dq[0, 0, 3, 5] = float("nan")
    results = _check((dq, dk, dv), q, k, v, do, causal=causal, scale=scale)
    assert not all(c.passed for c in results.values()), {n: (c.rel_rms, c.worst_row_rel) for n, c in results.items()}
    if broken == "one row wrong":  # (tests/testing/test_metrics.py: the row bound alone catches it among 64K rows)
        assert "worst row" in results["dv"].reason


def test_the_poisoned_buffers_are_really_poisoned(device):
    """The fixture's NaN fill reaches the backward: an unwritten gradient element would be NaN."""
    q = attention_inputs(1, 2, 8, 8, 64, torch.float16, device)[0]
    assert torch.isnan(backward.grad_like(q)).all()
    assert torch.isnan(poisoned_like(q)).all()


def test_a_repeated_backward_reuses_its_plan(device):
    """The checks and the kernels' choice run once per (shapes, strides, dtypes, devices, flags) key: a second call
    with the same key makes no plan; one with a gradient on the LSE (another key) does."""
    from xkernels import plans

    q, k, v = attention_inputs(1, 2, 24, 24, 64, torch.float16, device, seed=3)
    o, lse = xkernels.attention(q, k, v, is_causal=True, return_lse=True)
    do = _grad_out(q.shape, torch.float16, device)

    def backward_plans() -> list:
        return [plan for key, plan in plans._PLANS.items() if key[0] == "attention_backward"]

    args = dict(is_causal=True, scale=None, enable_gqa=False, precision="auto", backend="auto")
    plans._PLANS.clear()
    first = backward.attention_backward(do, q, k, v, o, lse, None, **args)
    made = backward_plans()
    second = backward.attention_backward(do.clone(), q, k, v, o, lse, None, **args)
    assert len(made) == 1 and backward_plans()[0] is made[0]  # the same plan object serves the second call
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    backward.attention_backward(do, q, k, v, o, lse, torch.zeros_like(lse), **args)
    assert len(backward_plans()) == 2


@contextlib.contextmanager
def _deterministic_seen():
    """A list of the `deterministic` each backward call receives (backward.attention_backward spied on)."""
    seen, real = [], backward.attention_backward

    def spy(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return real(*args, **kwargs)

    with unittest.mock.patch.object(backward, "attention_backward", spy):
        yield seen


def test_deterministic_false_reaches_the_backward_and_its_plan(device):
    """flash_attn's `deterministic`: the API hands it through the forward op to the backward op, whose plan keys on
    it (a deterministic call after a fused one must not reuse the fused plan); the forward is the same either way,
    and so are the portable backward's gradients (it has no fused variant; the Hopper selection's is in
    tests/hopper/test_configs.py, its kernel's float64 checks in tests/gpu/test_hopper_dq.py); eager and compiled;
    a non-bool is refused by name."""
    from xkernels import plans

    q, k, v = attention_inputs(1, 4, 33, 47, 64, torch.bfloat16, device, hkv=2, seed=12)
    do = _grad_out(q.shape, torch.bfloat16, device)
    def run(det, fn=xkernels.attention):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = fn(*leaves, is_causal=True, enable_gqa=True, deterministic=det)
        return (o, *torch.autograd.grad(o, leaves, do))

    with _deterministic_seen() as seen:
        plans._PLANS.clear()
        fast, exact = run(False), run(True)
    assert seen == [False, True]
    assert sum(key[0] == "attention_backward" and key[-1] is det for key in plans._PLANS for det in (True, False)) == 2
    for a, b in zip(fast, exact, strict=True):
        assert torch.equal(a, b)
    compiled = torch.compile(lambda *t, **kw: xkernels.attention(*t, **kw), fullgraph=True)
    for a, b in zip(run(False, compiled), exact, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="deterministic: expected a Python bool"):
        xkernels.attention(q, k, v, deterministic=1)


def test_deterministic_none_follows_torchs_switch(device):
    """deterministic=None (the default) is torch.are_deterministic_algorithms_enabled(), the switch SDPA's
    backward kernels follow: it reaches the backward as False, or True under torch.use_deterministic_algorithms,
    eager and compiled (torch.compile guards on the switch); a call without gradients passes the ops' defaults."""
    q, k, v = attention_inputs(1, 2, 17, 17, 64, torch.bfloat16, device, seed=3)
    do = _grad_out(q.shape, torch.bfloat16, device)
    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        torch.autograd.grad(fn(*leaves, is_causal=True), leaves, do)

    compiled = torch.compile(lambda *t, **kw: xkernels.attention(*t, **kw), fullgraph=True)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        with _deterministic_seen() as seen:
            for switch in (False, True, False):
                torch.use_deterministic_algorithms(switch)
                run(xkernels.attention), run(compiled)
                assert seen[-2:] == [switch, switch], (switch, seen)
    finally:
        torch.use_deterministic_algorithms(was)
    calls, real_call = [], ops.call_without_grad
    with unittest.mock.patch.object(ops, "call_without_grad", lambda *a: calls.append(a) or real_call(*a)):
        xkernels.attention(q, k, v)
    # (op, q, k, v, is_causal, scale, enable_gqa, precision, backend): no trailing (window, ..., deterministic)
    assert len(calls) == 1 and len(calls[0]) == 9, calls


def test_a_dynamic_sequence_length_compiles_with_the_default_deterministic(device, monkeypatch):
    """The fused-dQ choice reads the sizes only where they are concrete: a key length marked dynamic compiles and
    differentiates with deterministic's default (no shape guard from `select.fused_dq_pays`'s thresholds: the
    traced call leaves them alone, the real one asks with ints). Compile caches are off: an artifact cached by an
    earlier build would bring its own guards."""
    from xkernels import select

    real_pays = select.fused_dq_pays
    asked = []
    monkeypatch.setattr(select, "fused_dq_pays", lambda *a: asked.append(a) or real_pays(*a))
    q, k, v = attention_inputs(1, 2, 17, 17, 64, torch.bfloat16, device, seed=1)
    f = torch.compile(lambda *t: xkernels.attention(*t, is_causal=True), fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    for t in leaves:
        torch._dynamo.mark_dynamic(t, 2, min=17, max=8192)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        f(*leaves).float().sum().backward()
    assert all(type(n) is int for a in asked for n in a[2:]), asked
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_hopper_operands_are_read_in_place_or_copied_into_one_geometry():
    """`backward._readable` (what the Hopper kernels get for Q and dO, or K and V, each pair read through one set of
    coordinates): both as they are where they share a tight view geometry ((B, S, H, D) views, as transformers and
    flash_attn callers hold them; slices of a fused QKV projection; contiguous tensors); a contiguous dO beside a
    sequence-outer q copied into q's layout (q untouched); a slice of a longer buffer (not tight) or a misaligned
    base copied contiguous. Values are kept in every case. The layouts only: runs without a GPU."""
    from xkernels.hopper.views import descriptor_view, tight

    b_, s, h, d = 2, 40, 4, 64

    def bshd():
        return torch.randn(b_, s, h, d, dtype=torch.bfloat16).transpose(1, 2)

    def check(a, b, expect_a, expect_b, geometry, a_kept: bool, b_kept: bool):
        out_a, out_b, g = backward._readable(a, b)
        assert g == geometry
        # what the kernels rely on: both views have that geometry, tight, at 16-byte aligned bases
        for t in (out_a, out_b):
            view = descriptor_view(t)
            assert view is not None and view[2] == g and tight(t, g) and t.data_ptr() % 16 == 0
        assert (out_a is a) is a_kept and (out_b is b) is b_kept
        assert torch.equal(out_a, expect_a) and torch.equal(out_b, expect_b)
        return out_a, out_b

    q, do = bshd(), bshd()
    check(q, do, q, do, (s, 0, d), True, True)
    _, copied = check(q, do.contiguous(), q, do, (s, 0, d), True, False)
    assert copied.stride() == q.stride()  # into q's layout
    qkv = torch.randn(b_, s, 3 * h, d, dtype=torch.bfloat16)
    q3 = qkv[:, :, :h].transpose(1, 2)
    check(q3, do, q3, do, (s, 0, d), True, True)
    flat = torch.randn(b_, h, s, d, dtype=torch.bfloat16)
    check(flat, flat.clone(), flat, flat, (h * s, s, 0), True, True)
    cache = torch.randn(b_, 2 * s, h, d, dtype=torch.bfloat16).transpose(1, 2)[:, :, :s]
    a, b = check(cache, do, cache, do, (h * s, s, 0), False, False)
    assert a.is_contiguous() and b.is_contiguous()
    storage = torch.empty(flat.numel() + 1, dtype=torch.bfloat16)
    misaligned = storage[1:].view(flat.shape).copy_(flat)
    assert misaligned.data_ptr() % 16
    check(misaligned, flat, flat, flat, (h * s, s, 0), False, True)
    # one query row: (B, H, 1, D) contiguous and (B, 1, H, D) transposed are one layout in memory, whatever stride
    # torch gives the size-1 dim; a stride TMA cannot take there is not read
    q1 = torch.randn(b_, h, 1, d, dtype=torch.bfloat16)
    do1 = torch.randn(b_, 1, h, d, dtype=torch.bfloat16).transpose(1, 2)
    check(q1, do1, q1, do1, (1, 0, d), True, True)
    odd = torch.empty_strided(q1.shape, (h * d, d, 7, 1), dtype=torch.bfloat16).copy_(q1)
    check(odd, do1, q1, do1, (1, 0, d), True, True)
