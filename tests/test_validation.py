"""Bad input gets an error naming the argument, or a correct (empty) result; inputs are never modified."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xkernels
from xkernels.testing import attention_inputs


@pytest.fixture
def qkv(device):
    return attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=0)


def test_attention_bad_inputs(qkv, device):
    q, k, v = qkv
    cases = [
        (dict(q=q.float()), TypeError, "q: dtype"),
        (dict(k=k.bfloat16()), TypeError, "k: dtype"),
        (dict(q=q[0, 0]), ValueError, r"q: expected \(B, H, S, D\) or SDPA's"),
        (dict(q=q[0]), ValueError, r"k: leading dims \(1,\) do not match q's \(\)"),
        (dict(q=q[None], k=k[None], v=v[None], out=torch.empty(1, 1, 2, 8, 32, device=device).half()),
         ValueError, r"out: shape .* \(shapes with the 2 leading dims folded into one; as passed: q \(1, 1, 2, 8"),
        (dict(q=q[0], k=k[0, :, :4], v=v[0]), ValueError, r"v: shape .*\(shapes with a batch dim of 1 added"),
        (dict(q=q.expand(2, 2, 2, 8, 64), k=k.expand(2, 2, 2, 8, 64), v=v.expand(2, 2, 2, 8, 64),
              out=torch.empty(2, 2, 2, 8, 64, device=device).half().transpose(0, 1)), ValueError,
         "out: its 2 leading dims cannot be viewed"),
        (dict(v=v[:, :, :4]), ValueError, "v: shape"),
        (dict(k=k[:, :1], v=v[:, :1]), ValueError, "enable_gqa"),
        (dict(q=torch.cat([q, q]), ), ValueError, "batch"),
        (dict(q=q[..., :32], k=k[..., :32], v=v[..., :32]), ValueError, "head dim 32"),
        (dict(k=k[..., :32], v=v[..., :32]), ValueError, "k: head dim"),
        (dict(q="q"), TypeError, "q: expected a torch.Tensor"),
        (dict(precision="fp8"), ValueError, "precision"),
        (dict(precision="bf16"), TypeError, "precision='bf16' needs"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(is_causal=1), TypeError, "is_causal"),
        (dict(out=q), ValueError, "out: overlaps the memory of q"),
        (dict(out=torch.empty(1, 2, 8, 32, dtype=q.dtype, device=device)), ValueError, "out: shape"),
    ]
    for over, exc, msg in cases:
        args = dict(q=q, k=k, v=v) | over
        kwargs = {n: args.pop(n) for n in list(args) if n not in ("q", "k", "v")}
        with pytest.raises(exc, match=msg):
            xkernels.attention(args["q"], args["k"], args["v"], **kwargs)


def test_attention_takes_sdpa_calls(qkv):
    """SDPA's signature, positional order included: attn_mask None and dropout_p 0 run unchanged; anything else is
    refused by name (a mask or dropout never passes silently)."""
    q, k, v = qkv
    want = xkernels.attention(q, k, v, is_causal=True, scale=0.3)
    assert torch.equal(xkernels.attention(q, k, v, None, 0.0, True, 0.3), want)
    assert torch.equal(xkernels.attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=True, scale=0.3), want)
    mask = torch.ones(8, 8, dtype=torch.bool, device=q.device)
    for kwargs, exc, msg in [(dict(attn_mask=mask), ValueError, "attn_mask: only None"),
                             (dict(dropout_p=0.1), ValueError, "dropout_p: attention dropout"),
                             (dict(dropout_p=float("nan")), ValueError, "dropout_p"),
                             (dict(dropout_p="0"), TypeError, "dropout_p: expected a float"),
                             (dict(dropout_p=False), TypeError, "dropout_p: expected a float")]:
        with pytest.raises(exc, match=msg):
            xkernels.attention(q, k, v, **kwargs)


def test_attention_takes_sdpa_ranks(device):
    """SDPA's (..., H, S, D): a 3-D call and one with two leading dims give the 4-D call's O, LSE and gradients,
    with q's leading dims (out= too)."""
    q, k, v = attention_inputs(6, 4, 9, 11, 64, torch.float16, device, hkv=2, seed=11)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention(*leaves, is_causal=True, enable_gqa=True, return_lse=True)
    grads = torch.autograd.grad((o.float().square().sum() + lse.sum()), leaves)
    for lead in ((6,), (2, 3)):
        shaped = [t.detach().reshape(*lead, *t.shape[1:]).requires_grad_() for t in (q, k, v)]
        if lead == (6,):  # one batch of 3-D calls: each is (H, S, D)
            got = [xkernels.attention(*(t[b] for t in shaped), is_causal=True, enable_gqa=True, return_lse=True)
                   for b in range(6)]
            o2, lse2 = torch.stack([g[0] for g in got]), torch.stack([g[1] for g in got])
        else:
            o2, lse2 = xkernels.attention(*shaped, is_causal=True, enable_gqa=True, return_lse=True)
        assert o2.shape == (*lead, 4, 9, 64) and lse2.shape == (*lead, 4, 9)
        assert torch.equal(o2.reshape(o.shape), o) and torch.equal(lse2.reshape(lse.shape), lse)
        got = torch.autograd.grad((o2.float().square().sum() + lse2.sum()), shaped)
        for g, want in zip(got, grads, strict=True):
            assert torch.equal(g.reshape(want.shape), want)
    out = torch.full((2, 3, 4, 9, 64), float("nan"), dtype=q.dtype, device=device)
    r = xkernels.attention(*(t.reshape(2, 3, *t.shape[1:]) for t in (q, k, v)), is_causal=True, enable_gqa=True,
                           out=out)
    assert r is out and torch.equal(out.reshape(o.shape), o.detach())


def _forward_ad_calls(device):
    """(name of the refused input, a call of one public op on a given tensor) for each op."""
    q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=3)
    a, b = torch.randn(16, 64, device=device).half(), torch.randn(64, 32, device=device).half()
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    packed = q[0].transpose(0, 1).contiguous()
    cache = torch.zeros(1, 16, 2, 64, dtype=torch.float16, device=device)
    lens = torch.tensor([8], dtype=torch.int32, device=device)
    return [
        ("q", q, lambda t: xkernels.attention(t, k, v, is_causal=True)),
        ("v", v, lambda t: xkernels.attention(q, k, t, return_lse=True)[0]),
        ("k", packed, lambda t: xkernels.attention_varlen(packed, t, packed, cu, cu, 8, 8)),
        ("q", q[:, :, :1].transpose(1, 2),
         lambda t: xkernels.attention_with_kvcache(t, cache, cache, cache_seqlens=lens)),
        ("a", a, lambda t: xkernels.matmul(t, b)),
        ("b", b, lambda t: xkernels.matmul(a, t)),
    ]


@pytest.mark.parametrize("mode", ["forward_ad", "jvp"])
def test_forward_mode_ad_is_refused(device, mode):
    """No op has a forward-mode derivative: an input carrying a tangent is refused by name (torch would run the
    kernel and drop the tangent: a zero derivative), and inside a dual level, inputs without one still run."""
    fwad = torch.autograd.forward_ad
    for name, x, call in _forward_ad_calls(device):
        with pytest.raises(NotImplementedError, match=f"{name}: carries a forward-mode AD tangent"):
            if mode == "jvp":
                torch.func.jvp(call, (x,), (torch.ones_like(x),))
            else:
                with fwad.dual_level():
                    call(fwad.make_dual(x, torch.ones_like(x)))
        with fwad.dual_level():
            assert torch.equal(call(x), call(x.clone()))


def test_attention_gqa_indivisible(device):
    q, k, v = attention_inputs(1, 3, 8, 8, 64, torch.float16, device, hkv=2, seed=0)
    with pytest.raises(ValueError, match="do not divide"):
        xkernels.attention(q, k, v, enable_gqa=True)


def test_attention_empty_gives_empty(device):
    q, k, v = attention_inputs(0, 2, 8, 8, 64, torch.float16, device)
    assert xkernels.attention(q, k, v).shape == (0, 2, 8, 64)
    q, k, v = attention_inputs(1, 2, 0, 8, 64, torch.float16, device)
    o, lse = xkernels.attention(q, k, v, return_lse=True)
    assert o.shape == (1, 2, 0, 64) and lse.shape == (1, 2, 0)


@pytest.mark.parametrize("sq", [3, 40])  # the split-KV kernel's few rows, the forward kernels' many
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_without_keys(device, sq, with_sinks):
    """Skv = 0: every row sees no key, so O is 0 and the LSE its sink (or -inf), as SDPA and the varlen op give
    such a row, into a poisoned `out` too; dQ is 0, dK and dV empty, and a sink's gradient is its rows' dLSE (each
    row's whole softmax is the sink's)."""
    q, k, v = attention_inputs(2, 4, sq, 0, 64, torch.bfloat16, device, hkv=2, seed=1)
    sinks = torch.randn(4, device=device) if with_sinks else None
    want_lse = (sinks[None, :, None].expand(2, 4, sq) if with_sinks
                else torch.full((2, 4, sq), float("-inf"), device=device))
    out = torch.full_like(q, float("nan"))
    o, lse = xkernels.attention(q, k, v, enable_gqa=True, is_causal=True, sinks=sinks, return_lse=True, out=out)
    assert o is out and torch.equal(o, torch.zeros_like(q)) and torch.equal(lse, want_lse)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sinks.clone().requires_grad_()] if with_sinks else [])
    o, lse = xkernels.attention(*leaves[:3], enable_gqa=True, sinks=leaves[3] if with_sinks else None,
                                return_lse=True)
    grad_lse = torch.randn_like(lse)
    torch.autograd.backward([o, lse], [torch.randn_like(o), grad_lse if with_sinks else torch.zeros_like(lse)])
    assert torch.equal(leaves[0].grad, torch.zeros_like(q))
    assert leaves[1].grad.shape == k.shape and leaves[2].grad.shape == v.shape
    if with_sinks:
        torch.testing.assert_close(leaves[3].grad, grad_lse.sum((0, 2)))


def test_out_requiring_grad_is_refused(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="out: requires grad"):
        xkernels.attention(q, k, v, out=torch.empty_like(q).requires_grad_())


def test_flag_and_scale_types(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match="enable_gqa"):
        xkernels.attention(q, k, v, enable_gqa="no")
    with pytest.raises(TypeError, match="scale"):
        xkernels.attention(q, k, v, scale=True)
    np = pytest.importorskip("numpy")
    ref = xkernels.attention(q, k, v, scale=0.25)
    assert torch.equal(xkernels.attention(q, k, v, scale=np.float32(0.25)), ref)


def test_self_overlapping_out_is_refused(qkv, device):
    q, k, v = qkv
    with pytest.raises(ValueError, match="out: several of its elements"):
        xkernels.attention(q, k, v, out=torch.zeros(1, 1, 8, 64, dtype=q.dtype, device=device).expand(1, 2, 8, 64))
    a = torch.rand(8, 16, device=device).half()
    with pytest.raises(ValueError, match="out: several"):
        xkernels.matmul(a, a.t().contiguous(), out=torch.zeros(1, 8, dtype=a.dtype, device=device).expand(8, 8))


def test_matmul_bad_inputs(device):
    a = torch.rand(8, 16, device=device).half()
    b = torch.rand(16, 8, device=device).half()
    cases = [
        (dict(b=b.bfloat16()), TypeError, "b: dtype"),
        (dict(a=a.float(), b=b.float()), TypeError, "a: dtype"),
        (dict(b=b[:8]), ValueError, "b: inner dim"),
        (dict(a=a[0, 0]), ValueError, "a: expected a vector or a matrix"),
        (dict(b=b[0, 0]), ValueError, "b: expected a vector or a matrix"),
        (dict(a=a[0], b=b[:8, 0]), ValueError, "b: inner dim"),  # vectors: K must match too
        (dict(b_layout="tn"), ValueError, "b_layout"),
        (dict(walk="hilbert"), ValueError, "walk"),
        (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
        (dict(a=a.expand(2, 8, 16), b=b.expand(3, 16, 8)), ValueError, "do not broadcast"),
        (dict(out=a[:, :8]), ValueError, "out: overlaps the memory of a"),
    ]
    for over, exc, msg in cases:
        args = dict(a=a, b=b) | over
        kwargs = {n: args.pop(n) for n in list(args) if n not in ("a", "b")}
        with pytest.raises(exc, match=msg):
            xkernels.matmul(args["a"], args["b"], **kwargs)


def test_matmul_strided_out_with_folded_batch(device):
    """a's batch folds into M against a 2-D b; a strided `out` must be written through its own strides only."""
    g = torch.Generator(device=device).manual_seed(3)
    a = (torch.rand(2, 32, 64, device=device, generator=g) - 0.5).half()
    b = (torch.rand(64, 64, device=device, generator=g) - 0.5).half()
    buf = torch.full((2, 40, 64), float("nan"), dtype=torch.float16, device=device)
    out = buf[:, :32]
    xkernels.matmul(a, b, out=out)
    assert "copied:out" in xkernels.last_backend()
    assert torch.isnan(buf[:, 32:]).all(), "wrote outside out"
    torch.testing.assert_close(out.double(), a.double() @ b.double(), atol=2e-2, rtol=1e-2)


def test_folded_copy_is_reported(device):
    a = torch.rand(2, 64, 32, device=device).half().transpose(1, 2)  # (2, 32, 64), not foldable without a copy
    xkernels.matmul(a, torch.rand(64, 16, device=device).half())
    assert "copied:a" in xkernels.last_backend()


def test_matmul_empty(device):
    a = torch.rand(0, 16, device=device).half()
    b = torch.rand(16, 8, device=device).half()
    assert xkernels.matmul(a, b).shape == (0, 8)
    assert xkernels.last_backend() == "empty"


def test_cpu_without_interpreter_is_refused(monkeypatch, device):
    if device != "cpu":
        pytest.skip("the refusal is for CPU tensors")
    from xkernels.common import runtime
    monkeypatch.setattr(runtime, "INTERPRET", False)
    a = torch.rand(8, 16).half()
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        xkernels.matmul(a, a.t().contiguous())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 12)), min_size=1, max_size=4))
def test_self_overlap_check_is_sound(dims):
    """Whenever the check says a layout does not overlap, every element has its own address (brute force)."""
    import itertools

    from xkernels.validation import self_overlaps

    sizes, strides = zip(*dims, strict=True)
    base = torch.zeros(1 + sum((s - 1) * st for s, st in dims))
    t = base.as_strided(sizes, strides)
    offsets = [sum(i * st for i, st in zip(idx, strides, strict=True))
               for idx in itertools.product(*(range(s) for s in sizes))]
    if not self_overlaps(t):
        assert len(set(offsets)) == len(offsets), (sizes, strides)
    if any(st == 0 and s > 1 for s, st in dims):
        assert self_overlaps(t)


def test_self_overlap_check_accepts_ordinary_layouts():
    from xkernels.validation import self_overlaps

    x = torch.empty(2, 3, 5, 8)
    for t in (x, x.transpose(1, 2), x[:, :, 1:4], x.permute(3, 0, 2, 1), x[..., ::2]):
        assert not self_overlaps(t)
    assert self_overlaps(x[:1].expand(3, 3, 5, 8))


def _packed(t):  # (1, H, S, D) -> (S, H, D)
    return t[0].transpose(0, 1).contiguous()


def test_a_non_finite_score_gives_nan_on_every_path(device):
    """A NaN in k (or an inf in q) makes the rows that see it NaN in O and the LSE, as SDPA does, on every kernel:
    the dense one, the split-KV one (few query rows), a window's band, varlen and the KV cache; a row that sees no
    key still gets O = 0 and LSE -inf. (These kernels mark a row that saw no key by its row sum: a NaN sum must not
    count as empty.)"""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 20, 64, generator=g).half().to(device)
    k = torch.randn(1, 1, 30, 64, generator=g).half().to(device)
    v = torch.randn(1, 1, 30, 64, generator=g).half().to(device)
    k[0, 0, 2, 5] = float("nan")
    cu = lambda n: torch.tensor([0, n], dtype=torch.int32, device=device)  # noqa: E731
    calls = {"dense": lambda: xkernels.attention(q, k, v, return_lse=True),
             "few rows": lambda: xkernels.attention(q[:, :, :4], k, v, return_lse=True),
             "window": lambda: xkernels.attention(q, k, v, window_size=(40, 40), return_lse=True),
             "varlen": lambda: xkernels.attention_varlen(_packed(q), _packed(k), _packed(v), cu(20), cu(30), 20, 30,
                                                         return_lse=True),
             "kvcache": lambda: xkernels.attention_with_kvcache(q[:, :, :2].transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2), return_lse=True,
                                                                cache_seqlens=cu(30)[1:])}
    for name, call in calls.items():
        o, lse = call()
        assert o.isnan().all() and lse.isnan().all(), name
    q_inf = q.clone()
    q_inf[0, 0, 1, 0] = float("inf")  # one row's scores infinite: that row NaN, the others finite
    k[0, 0, 2, 5] = 0.0
    for o in (xkernels.attention(q_inf[:, :, :4], k, v), xkernels.attention(q_inf, k, v, window_size=(40, 40))):
        assert o[0, 0, 1].isnan().all() and not o[0, 0, [0, 2, 3]].isnan().any()
    o, lse = xkernels.attention(q[:, :, :4], k, v, window_size=(0, 0), return_lse=True, is_causal=False)
    assert not o.isnan().any()  # windows that hold a key are finite
    empty, lse = xkernels.attention_varlen(_packed(q), _packed(k)[:0], _packed(v)[:0], cu(20),
                                           torch.tensor([0, 0], dtype=torch.int32, device=device), 20, 0,
                                           return_lse=True)
    assert torch.equal(empty, torch.zeros_like(empty)) and torch.isinf(lse).all()  # no key: 0 and -inf


def test_sinks_are_inputs_too(device):
    """`out` may not overlap the sinks (they are read while O is written); a sparse sinks tensor is refused by name
    on every API."""
    q = torch.randn(1, 2, 20, 64).half().to(device)
    k, v = torch.randn(1, 2, 30, 64).half().to(device), torch.randn(1, 2, 30, 64).half().to(device)
    buf = torch.zeros(1, 2, 20, 64, dtype=torch.float16, device=device)
    sinks = buf.view(-1).view(torch.float32)[:2]
    with pytest.raises(ValueError, match="out: overlaps the memory of sinks"):
        xkernels.attention(q, k, v, sinks=sinks, out=buf)
    sparse = torch.tensor([1.0, 2.0]).to_sparse().to(device)
    cu = lambda n: torch.tensor([0, n], dtype=torch.int32, device=device)  # noqa: E731
    for call in (lambda: xkernels.attention(q, k, v, sinks=sparse),
                 lambda: xkernels.attention(q[:, :, :2], k, v, sinks=sparse),
                 lambda: xkernels.attention_varlen(_packed(q), _packed(k), _packed(v), cu(20), cu(30), 20, 30,
                                                   sinks=sparse),
                 lambda: xkernels.attention_with_kvcache(q[:, :, :1].transpose(1, 2), k.transpose(1, 2),
                                                         v.transpose(1, 2), cache_seqlens=cu(30)[1:],
                                                         sinks=sparse)):
        with pytest.raises(ValueError, match="sinks: layout"):
            call()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 12)), min_size=1, max_size=3), st.integers(0, 40),
       st.integers(0, 40))
def test_share_elements_never_misses_a_shared_element(dims, off_a, off_b):
    """Two views of one layout (shape, strides) at element offsets: `_share_elements` may only answer False when no
    element of one is an element of the other (checked against the sets of element offsets)."""
    from itertools import product

    from xkernels.validation import _share_elements

    shape, stride = [n for n, _ in dims], [st_ for _, st_ in dims]
    buf = torch.zeros(512)
    a, b = buf.as_strided(shape, stride, off_a), buf.as_strided(shape, stride, off_b)
    offsets = [sum(i * s for i, s in zip(idx, stride, strict=True)) for idx in product(*map(range, shape))]
    if {off_a + o for o in offsets} & {off_b + o for o in offsets}:
        assert _share_elements(a, b)
    kv = torch.zeros(2, 8, 2, 3, 16)
    assert not _share_elements(kv[:, :, 0], kv[:, :, 1]) and _share_elements(kv[:, 1:, 0], kv[:, :-1, 0])
