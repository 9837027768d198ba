"""The torch.library ops: opcheck, torch.compile(fullgraph=True), fake and meta tensors, errors at trace time, and
that no call keeps a tensor alive. On CPU the kernels run under the interpreter (compile with backend="aot_eager")."""

import gc
import weakref

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import xkernels
from tests.helpers import poisoned_like
from xkernels import ops
from xkernels.testing import attention_inputs, gemm_inputs, reference_attention, reference_matmul

COMPILE_BACKEND = "inductor" if torch.cuda.is_available() else "aot_eager"


def _attention_args(device, dtype=torch.float16):
    q, k, v = attention_inputs(1, 4, 17, 33, 64, dtype, device, hkv=2, seed=1)
    return q, k, v


@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck_attention(device, return_lse):
    q, k, v = _attention_args(device)
    op = ops.attention_lse_op if return_lse else ops.attention_op
    torch.library.opcheck(op, (q, k, v, True, None, True, "auto", "auto"))
    torch.library.opcheck(ops.attention_out_op, (q, k, v, poisoned_like(q), False, 0.5, True, "fp16", "auto",
                                                 return_lse))


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_opcheck_matmul(device, b_layout):
    a, b = gemm_inputs(40, 24, 32, torch.bfloat16, device, b_layout, seed=2)
    torch.library.opcheck(ops.matmul_op, (a, b, b_layout, "auto", None, "auto"))
    torch.library.opcheck(ops.matmul_op, (a, b, b_layout, "zorder", torch.float32, "auto"))
    torch.library.opcheck(ops.matmul_out_op, (a, b, poisoned_like(a, shape=(40, 24)), b_layout, "row", None, "auto"))


def test_compile_fullgraph_matches_eager(device):
    """One graph, no breaks, through both ops (and the out= variant); the compiled result equals the eager one."""
    q, k, v = _attention_args(device)
    a, b = gemm_inputs(16, 64, 64, torch.float16, device, "nk", seed=3)

    def block(q, k, v, a, b):
        o, lse = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True)
        y = xkernels.matmul(o.flatten(0, 2), b, b_layout="nk")
        out = a.new_empty(a.shape[0], 16)
        xkernels.matmul(a, b[:, :16].contiguous(), b_layout="kn", out=out)
        return y * 2, lse + 1, out

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=COMPILE_BACKEND)
    got = compiled(q, k, v, a[:, :64], b)
    want = block(q, k, v, a[:, :64], b)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=COMPILE_BACKEND)


def test_compile_raises_the_eager_errors_at_trace_time(device):
    """TorchRuntimeError is dynamo's wrapper for an error raised while it propagates fake tensors: the fake kernels
    raised it at trace time (a real kernel failing at run time would raise the bare ValueError)."""
    trace_error = torch._dynamo.exc.TorchRuntimeError
    q, k, v = attention_inputs(1, 2, 8, 8, 32, torch.float16, device, seed=4)  # head dim 32: unsupported
    with pytest.raises(trace_error, match="head dim 32 is not supported"):
        _compiled(lambda q, k, v: xkernels.attention(q, k, v))(q, k, v)
    q, k, v = _attention_args(device)
    with pytest.raises(trace_error, match="enable_gqa=True"):
        _compiled(lambda q, k, v: xkernels.attention(q, k, v))(q, k, v)
    with pytest.raises(trace_error, match="backend: 'hopper' was forced" if device == "cpu" else "consumers=4"):
        _compiled(lambda q, k, v: xkernels.attention(q, k, v, enable_gqa=True, backend="hopper:consumers=4"))(q, k, v)
    a, b = gemm_inputs(16, 24, 32, torch.float16, device, seed=4)
    with pytest.raises(trace_error, match="inner dim"):
        _compiled(lambda a, b: xkernels.matmul(a, b, b_layout="nk"))(a, b)


def test_compile_refuses_an_out_that_aliases_an_input(device):
    """Functionalization would hand the real kernel a copy of `out`; the fake kernel sees the alias and refuses."""
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=14)
    before = q.clone()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="out: overlaps the memory of q"):
        _compiled(lambda q, k, v: xkernels.attention(q, k, v, out=q))(q, k, v)
    assert torch.equal(q, before)
    a = gemm_inputs(32, 32, 32, torch.float16, device, seed=15)[0]
    before = a.clone()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="out: overlaps the memory of a"):
        _compiled(lambda a: xkernels.matmul(a, a, out=a))(a)
    assert torch.equal(a, before)


def test_out_requiring_grad_is_refused_on_every_call(device):
    """Whether `out` requires grad is not in a plan's key: it is checked per call."""
    q, k, v = attention_inputs(1, 2, 16, 16, 64, torch.float16, device, seed=16)
    xkernels.attention(q, k, v, out=torch.empty_like(q))  # builds the plan for this out layout
    with pytest.raises(ValueError, match="out: requires grad"):
        xkernels.attention(q, k, v, out=torch.empty_like(q).requires_grad_())
    a, b = gemm_inputs(16, 16, 16, torch.float16, device, seed=17)
    xkernels.matmul(a, b, out=torch.empty(16, 16, dtype=a.dtype, device=device))
    with pytest.raises(ValueError, match="out: requires grad"):
        xkernels.matmul(a, b, out=torch.empty(16, 16, dtype=a.dtype, device=device).requires_grad_())


def test_xkernels_layer_is_the_default_backend(device):
    """XKERNELS_LAYER is read at import as the default of `backend`; a bad value fails at import, naming it."""
    import os
    import subprocess
    import sys

    code = ("import torch, xkernels; from xkernels.testing import attention_inputs; "
            f"q, k, v = attention_inputs(1, 1, 40, 40, 64, torch.float16, {device!r}, seed=0); "
            "xkernels.attention(q, k, v); print(xkernels.last_backend())")
    env = dict(os.environ, XKERNELS_LAYER="portable", **({"TRITON_INTERPRET": "1"} if device == "cpu" else {}))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith("portable.attention")
    env["XKERNELS_LAYER"] = "gpu"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "XKERNELS_LAYER: backend: 'gpu' is not" in run.stderr


@pytest.mark.parametrize("sq", [40, 3])  # the forward kernels, and the split-KV kernel of few query rows
def test_output_takes_q_layout(device, sq):
    """q, k, v as (B, S, H, D) tensors viewed as (B, H, S, D), as projections make them: O comes back in that
    layout (its transpose contiguous, as SDPA's) with the contiguous call's values, written in place (no copy);
    the fake kernel (meta tensors, torch.compile) gives the same strides; opcheck holds; dQ takes q's layout too."""
    q, k, v = attention_inputs(2, 4, sq, 40, 64, torch.float16, device, hkv=2, seed=9)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    want = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True)
    assert want.is_contiguous()
    o = xkernels.attention(*views, is_causal=True, enable_gqa=True)
    assert o.transpose(1, 2).is_contiguous() and torch.equal(o, want)
    assert "copied" not in xkernels.last_backend(), xkernels.last_backend()
    meta = xkernels.attention(*(t.to("meta") for t in views), is_causal=True, enable_gqa=True)
    assert meta.stride() == o.stride()
    compiled = torch.compile(lambda *t: xkernels.attention(*t, is_causal=True, enable_gqa=True),
                             backend=COMPILE_BACKEND, fullgraph=True)
    got = compiled(*views)
    assert got.stride() == o.stride() and torch.equal(got, o)
    torch.library.opcheck(ops.attention_lse_op, (*views, True, None, True, "auto", "auto"))
    leaf = views[0].detach().requires_grad_()
    xkernels.attention(leaf, *views[1:], is_causal=True, enable_gqa=True).float().sum().backward()
    assert leaf.grad.stride() == leaf.stride()


def test_fake_and_meta_tensors_give_shapes_without_data(device):
    with FakeTensorMode():
        q = torch.empty(2, 8, 100, 128, dtype=torch.bfloat16, device=device)
        k = torch.empty(2, 2, 300, 128, dtype=torch.bfloat16, device=device)
        o, lse = xkernels.attention(q, k, k, enable_gqa=True, return_lse=True)
        assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        c = xkernels.matmul(torch.empty(3, 5, 7, dtype=torch.float16, device=device),
                            torch.empty(11, 7, dtype=torch.float16, device=device), b_layout="nk",
                            out_dtype=torch.float32)
        assert c.shape == (3, 5, 11) and c.dtype == torch.float32
        with pytest.raises(ValueError, match="k: 3 kv heads do not divide"):
            xkernels.attention(q, k[:, :1].expand(2, 3, 300, 128), k[:, :1].expand(2, 3, 300, 128), enable_gqa=True)
    q = torch.empty(1, 4, 10, 64, dtype=torch.float16, device="meta")
    assert xkernels.attention(q, q, q).device.type == "meta"


def _drop_and_check(refs):
    gc.collect()
    alive = [name for name, r in refs.items() if r() is not None]
    assert not alive, f"still alive after the call: {alive}"


def test_calls_keep_no_tensor_alive(device):
    """Plans and descriptor caches hold numbers, never tensors: inputs and outputs die with the caller's references."""
    q, k, v = _attention_args(device)
    a, b = gemm_inputs(64, 48, 32, torch.float16, device, "nk", seed=5)
    out = poisoned_like(q)
    o, lse = xkernels.attention(q, k, v, enable_gqa=True, return_lse=True)
    xkernels.attention(q, k, v, enable_gqa=True, out=out)
    c = xkernels.matmul(a, b, b_layout="nk")
    refs = {name: weakref.ref(t) for name, t in dict(q=q, k=k, v=v, o=o, lse=lse, out=out, a=a, b=b, c=c).items()}
    del q, k, v, o, lse, out, a, b, c
    _drop_and_check(refs)


def test_out_overlapping_an_input_through_another_storage_is_refused(device):
    """Two tensors over one foreign buffer (two numpy views) share memory but not a storage object."""
    if device != "cpu":
        pytest.skip("numpy buffers live on the CPU")
    buf = np.random.default_rng(0).random((1, 2, 16, 64)).astype(np.float16)
    q = torch.from_numpy(buf)
    out = torch.from_numpy(buf.view())
    assert q.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    assert q.untyped_storage() is not out.untyped_storage()
    before = q.clone()
    with pytest.raises(ValueError, match="out: overlaps the memory of q"):
        xkernels.attention(q, before, before, out=out)
    assert torch.equal(q, before)
    part = torch.from_numpy(buf[:, :, 8:])  # a later slice of the same buffer: overlaps only part of q's range
    with pytest.raises(ValueError, match="out: overlaps the memory of q"):
        xkernels.attention(q[:, :, :8], before[:, :, :8], before[:, :, :8], out=part)


def test_out_whose_rows_overlap_is_refused(device):
    q, k, v = attention_inputs(1, 1, 16, 16, 64, torch.float16, device, seed=6)
    base = torch.zeros(16 * 64, dtype=torch.float16, device=device)
    rows_overlap = base.as_strided((1, 1, 16, 64), (1024, 1024, 32, 1))  # row i+1 starts mid-row i
    with pytest.raises(ValueError, match="out: several of its elements share memory"):
        xkernels.attention(q, k, v, out=rows_overlap)
    a, b = gemm_inputs(16, 64, 16, torch.float16, device, seed=7)
    with pytest.raises(ValueError, match="out: several of its elements share memory"):
        xkernels.matmul(a, b, out=rows_overlap[0, 0])


def test_out_with_a_sliced_or_transposed_layout_is_accepted(device):
    """The overlap check is exact enough not to refuse ordinary strided outputs."""
    q, k, v = attention_inputs(1, 2, 17, 17, 64, torch.float16, device, seed=8)
    buf = torch.full((1, 17, 2, 64), float("nan"), dtype=torch.float16, device=device)
    out = buf.transpose(1, 2)  # (B, S, H, D) memory viewed as (B, H, S, D)
    xkernels.attention(q, k, v, out=out)
    ref = reference_attention(q, k, v)
    assert (out.double() - ref).abs().max() < 0.05
    a, b = gemm_inputs(16, 32, 16, torch.float16, device, seed=9)
    wide = torch.full((16, 48), float("nan"), dtype=torch.float16, device=device)
    xkernels.matmul(a, b, out=wide[:, 8:40])
    assert (wide[:, 8:40].double() - reference_matmul(a, b, "kn")).abs().max() < 0.05
    assert torch.isnan(wide[:, :8]).all() and torch.isnan(wide[:, 40:]).all()


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(return_lse="no"), TypeError, "return_lse: expected a Python bool, got str"),
    (dict(return_lse=1), TypeError, "return_lse: expected a Python bool, got int"),
    (dict(is_causal=np.bool_(True)), TypeError, "is_causal: expected a Python bool, got numpy.bool"),
    (dict(precision=["fp16"]), TypeError, "precision: expected a str"),
    (dict(scale=3e38), ValueError, "scale: .* overflows fp32"),
    (dict(scale=-2.5e38), ValueError, "scale: .* overflows fp32"),
    (dict(backend="cuda"), ValueError, "backend: 'cuda' is not"),
    (dict(backend=3), TypeError, "backend: expected a str"),
    (dict(backend="portable:stages=3"), ValueError, "need the 'hopper' layer"),
    (dict(backend="hopper:stages=x"), ValueError, "not field=integer"),
    (dict(backend="hopper:bogus=1"), ValueError, r"\['bogus'\] are not Hopper config fields"),
])
def test_bad_python_arguments_name_the_argument(device, kwargs, exc, match):
    q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=10)
    with pytest.raises(exc, match=match):
        xkernels.attention(q, k, v, **kwargs)


@pytest.mark.parametrize("scale", [1e-36, 1e4, -1e4])
def test_extreme_finite_scales_are_correct(device, scale):
    """A tiny scale gives a uniform softmax, a huge one (scores x scale still inside fp32) a one-hot one."""
    q, k, v = attention_inputs(1, 1, 40, 40, 64, torch.float16, device, seed=11)
    o = xkernels.attention(q, k, v, scale=scale)
    assert torch.isfinite(o).all()
    assert (o.double() - reference_attention(q, k, v, scale=scale)).abs().max() < 1e-2


def test_sparse_inputs_are_refused_by_name(device):
    if device != "cpu":
        pytest.skip("sparse CPU tensors are enough to show the check")
    a = torch.eye(16, dtype=torch.float16).to_sparse()
    with pytest.raises(ValueError, match="a: layout torch.sparse_coo is not supported"):
        xkernels.matmul(a, torch.eye(16, dtype=torch.float16))


def test_backend_argument_forces_the_layer(device):
    from xkernels.common.runtime import hopper_available

    q, k, v = attention_inputs(1, 2, 17, 17, 64, torch.float16, device, seed=12)
    xkernels.attention(q, k, v, backend="portable")
    assert xkernels.last_backend().startswith("portable.attention")
    if hopper_available(q.device):
        xkernels.attention(q, k, v, backend="hopper")
        assert xkernels.last_backend().startswith("hopper.attention")
    else:
        with pytest.raises(ValueError, match="'hopper' was forced"):
            xkernels.attention(q, k, v, backend="hopper")


def test_selection_is_a_pure_function():
    from xkernels import select
    from xkernels.recipes import ATTENTION_RECIPES

    cpu = torch.device("cpu")
    recipe = ATTENTION_RECIPES["bf16"]
    auto = select.parse_backend("auto")
    assert select.select_attention(cpu, 128, recipe, auto) == select.select_attention(cpu, 128, recipe, auto)
    assert select.select_attention(cpu, 128, recipe, auto).layer == "portable"
    assert select.parse_backend("hopper:stages=3,overlap=0") == select.Override("hopper", (("stages", 3),
                                                                                           ("overlap", 0)))
    with pytest.raises(ValueError, match="'hopper' was forced"):
        select.select_attention(cpu, 128, recipe, select.parse_backend("hopper"))
    assert select.select_matmul(cpu, 1, 256, torch.float16, torch.float16, auto, cols=64, depth=64).layer == "portable"


@pytest.mark.parametrize("m,n,k,b_layout,out_cols,direct", [
    (64, 64, 64, "kn", None, True),
    (64, 300, 72, "kn", None, False),  # b's rows (300 halves) and the default output's are not 16-byte multiples
    (64, 296, 72, "nk", None, True),
    (64, 296, 72, "nk", 300, False),  # an out with 300-element rows
    (64, 296, 72, "nk", 304, True),
    (64, 64, 60, "nk", None, False),  # K = 60 halves: a's rows are 120 bytes
])
def test_the_direct_path_needs_descriptor_ready_strides(monkeypatch, device, m, n, k, b_layout, out_cols, direct):
    """The plan's fast path is taken only where every operand and the output are descriptor-ready as they are."""
    from xkernels import plans
    from xkernels.common import launch

    monkeypatch.setattr(launch, "direct_launch_available", lambda device: True)
    monkeypatch.setattr(plans, "_PLANS", {})
    a, b = gemm_inputs(m, n, k, torch.float16, device, b_layout, seed=13)
    out = None if out_cols is None else torch.empty(m, out_cols, dtype=torch.float16, device=device)[:, :n]
    plan = plans.MatmulPlan(a, b, out, b_layout=b_layout, walk="auto", out_dtype=None, backend="auto")
    assert plan.direct == direct


def test_compiled_attention_keeps_its_graph_as_the_length_changes(device):
    """Training at varying sequence lengths: after dynamo's automatic dynamic shapes kick in, Sq and Skv stay
    symbolic (kernel choice reads only how Sq compares with the decode threshold, never its value), so new lengths
    reuse the graph: 2 graphs for 5 lengths (one per length if the fake kernel read the value)."""
    from torch._dynamo.utils import counters

    def loss(q):
        return xkernels.attention(q, q, q, is_causal=True).float().square().sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(loss, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    for s in (40, 48, 56, 64, 72):
        q = attention_inputs(1, 2, s, s, 64, torch.float16, device, seed=s)[0].requires_grad_()
        compiled(q).backward()
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_calls_without_grad_skip_the_autograd_kernel_and_match(device, monkeypatch):
    """Calls that need no gradient (no input requires grad, or grad mode off, or inference mode) and go through the
    op (here: under the profiler, which sees the op) dispatch past the Autograd key (torch.library's autograd kernel,
    which re-dispatches below itself, is never entered) and return what the differentiable call returns, not
    requiring grad; a call that needs gradients still goes through it."""
    q, k, v = _attention_args(device)
    a, b = gemm_inputs(8, 32, 16, torch.float16, device, seed=2)
    want_o, want_c = xkernels.attention(q, k, v, enable_gqa=True), xkernels.matmul(a, b)
    grad_q, grad_a = q.clone().requires_grad_(), a.clone().requires_grad_()
    redispatches = []
    real = torch._ops.OpOverload.redispatch

    def counting(self, *args, **kwargs):
        redispatches.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counting)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for context, queries, a_in in ((torch.no_grad, (q, grad_q), grad_a),
                                       (torch.inference_mode, (q, grad_q), grad_a), (torch.enable_grad, (q,), a)):
            with context():
                for query in queries:
                    o = xkernels.attention(query, k, v, enable_gqa=True)
                    assert torch.equal(o, want_o) and not o.requires_grad
                c = xkernels.matmul(a_in, b)
                assert torch.equal(c, want_c) and not c.requires_grad
        assert not redispatches
        assert xkernels.attention(grad_q, k, v, enable_gqa=True).requires_grad and len(redispatches) == 1
    names = [e.name for e in prof.events()]  # every call went through its op (the differentiable one: the LSE's)
    assert names.count("xkernels::attention") == 5 and names.count("xkernels::attention_lse") == 1


def test_plain_eager_calls_run_the_kernel_function_and_watchers_see_the_op(device, monkeypatch):
    """A call nothing traces or watches runs the op's kernel function without the dispatcher's round trip; under a
    TorchDispatchMode or the profiler the same call goes through the op, which they see; results are equal."""
    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v = _attention_args(device)
    direct = []
    real, tensors = ops._NO_GRAD_KERNELS[ops.attention_op]
    monkeypatch.setitem(ops._NO_GRAD_KERNELS, ops.attention_op, (lambda *a: direct.append(1) or real(*a), tensors))
    want = xkernels.attention(q, k, v, enable_gqa=True)
    assert direct == [1]

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        got = xkernels.attention(q, k, v, enable_gqa=True)
    assert "xkernels.attention.default" in Seen.ops and torch.equal(got, want)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = xkernels.attention(q, k, v, enable_gqa=True)
    assert any(e.name == "xkernels::attention" for e in prof.events()) and torch.equal(got, want)
    assert direct == [1]
    a, b = gemm_inputs(8, 32, 16, torch.float16, device, seed=3)
    real_mm, n = ops._NO_GRAD_KERNELS[ops.matmul_op]
    monkeypatch.setitem(ops._NO_GRAD_KERNELS, ops.matmul_op, (lambda *x: direct.append(2) or real_mm(*x), n))
    through_op = ops.matmul_op(a, b, "kn", "auto", None, "auto")
    assert torch.equal(xkernels.matmul(a, b), through_op) and direct == [1, 2]


def test_jit_trace_records_the_ops_and_negative_views_are_read_as_values(device):
    """torch.jit.trace (and what builds on it) sees the ops, so the traced function computes on new inputs; a
    negative-bit view of K (torch._neg_view) is read as the values it stands for, as through the dispatcher."""
    q, k, v = _attention_args(device)
    traced = torch.jit.trace(lambda q, k, v: xkernels.attention(q, k, v, enable_gqa=True), (q, k, v))
    assert "xkernels::attention" in str(traced.graph)
    q2, k2, v2 = attention_inputs(1, 4, 17, 33, 64, torch.float16, device, hkv=2, seed=9)
    assert torch.equal(traced(q2, k2, v2), xkernels.attention(q2, k2, v2, enable_gqa=True))
    a, b = gemm_inputs(8, 32, 16, torch.float16, device, seed=4)
    traced_mm = torch.jit.trace(lambda a, b: xkernels.matmul(a, b), (a, b))
    assert "xkernels::matmul" in str(traced_mm.graph)
    negative = torch._neg_view(k)
    assert negative.is_neg()
    want = xkernels.attention(q, -k, v, enable_gqa=True)
    assert torch.equal(xkernels.attention(q, negative, v, enable_gqa=True), want)


@pytest.mark.parametrize("a_shape,b_shape", [((40,), (40, 24)), ((40,), (2, 40, 24)), ((3, 40), (40,)),
                                             ((2, 3, 40), (40,)), ((40,), (40,))])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_matmul_vectors_as_torch_matmul(device, a_shape, b_shape, b_layout):
    """1-D operands as torch.matmul takes them (a a row, b a column, the added dims dropped; both: a 0-d dot
    product), into a poisoned `out` of that shape too, with gradients against float64 autograd."""
    from xkernels.testing import compare_gemm

    g = torch.Generator().manual_seed(len(a_shape) * 7 + len(b_shape))
    a = (torch.rand(a_shape, generator=g) - 0.5).half().to(device)
    b = (torch.rand(b_shape, generator=g) - 0.5).half().to(device)
    stored = b if b_layout == "kn" or b.dim() == 1 else b.mT.contiguous()  # "nk": (..., N, K) storage
    want = torch.matmul(a.double(), b.double())
    c = xkernels.matmul(a, stored, b_layout=b_layout)
    assert c.shape == want.shape and c.dtype == a.dtype
    assert compare_gemm(c.reshape(-1, 1).float(), want.reshape(-1, 1), 40).passed
    out = poisoned_like(c)
    assert xkernels.matmul(a, stored, b_layout=b_layout, out=out) is out and torch.equal(out, c)
    with pytest.raises(TypeError, match="out: expected a torch.Tensor"):
        xkernels.matmul(a, stored, b_layout=b_layout, out="c")
    with pytest.raises(ValueError, match="out: shape"):
        xkernels.matmul(a, stored, b_layout=b_layout, out=poisoned_like(c, shape=(*c.shape, 2)))
    leaves = [t.clone().requires_grad_() for t in (a, stored)]
    dc = torch.randn(want.shape, generator=g).half().to(device)
    xkernels.matmul(*leaves, b_layout=b_layout).backward(dc)
    exact = [t.double().requires_grad_() for t in (a, b)]
    torch.matmul(*exact).backward(dc.double())
    want_db = exact[1].grad if b_layout == "kn" or b.dim() == 1 else exact[1].grad.mT
    for got, ref in ((leaves[0].grad, exact[0].grad), (leaves[1].grad, want_db)):
        assert got.shape == ref.shape
        assert compare_gemm(got.reshape(-1, 1).float(), ref.reshape(-1, 1), 24).passed
