"""Sliding windows (`window_size`, FlashAttention's) in `attention` (top-left, as its causal mask) and
`attention_varlen` (bottom-right), forward and backward, against float64 references on the same quantized inputs:
left and right sides alone and together, with and without causal, Sq != Skv, rows whose window holds no key (O = 0,
LSE -inf), GQA, the few-row split-KV path (and a growing cache whose capacity crosses the window), NaN-poisoned
outputs and gradient buffers, bad windows, torch.compile, and that the checks fail on a window off by one."""

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes, poison_attention_outputs, poisoned_like
from xkernels import ops
from xkernels.common.runtime import hopper_available
from xkernels.common.seqlen import Band
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_grad,
    compare_lse,
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen,
    reference_attention_varlen_grads,
    reference_lse,
)
from xkernels.testing.inputs import uniform

FP16 = ATTENTION_RECIPES["fp16"]


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    poison_attention_outputs(monkeypatch)


def _grad_out(shape, device, seed=5):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) - 0.5).to(torch.float16).to(device)


def _dense_checks(o, lse, grads, q, k, v, do, *, causal, window) -> dict:
    """Forward (O, LSE, empty rows) and backward (dQ, dK, dV) against float64, every check by name."""
    ref_o = reference_attention(q, k, v, is_causal=causal, window=window)
    ref_lse = reference_lse(q, k, is_causal=causal, window=window)
    empty = torch.isinf(ref_lse)
    checks = {"o": compare_attention(o, ref_o, FP16), "lse": compare_lse(lse[~empty], ref_lse[~empty])}
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, window=window)
    checks |= {name: compare_grad(g, r, FP16) for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)}
    assert torch.equal(torch.isinf(lse), empty), "rows that see no key have LSE -inf, and only they"
    return checks


def _dense(q, k, v, do, *, causal, window, backend=None):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, window_size=window, return_lse=True,
                                backend=backend)
    return o, lse, torch.autograd.grad(o, leaves, do)


# (Sq, Skv, causal, window): sides alone and together; Sq < Skv and Sq > Skv (rows past the keys' window see none)
# wide bands (left + right past the interpreter's 32 x 16 tiles) walk `_band`'s unmasked middle and its jump over it
DENSE = [(70, 70, True, (5, 0)), (70, 70, True, (33, -1)), (70, 90, False, (10, 7)), (70, 40, False, (3, -1)),
         (90, 40, True, (2, 0)), (70, 70, False, (-1, 3)), (50, 130, False, (20, 20)), (33, 33, False, (0, 0)),
         (100, 100, True, (50, 0)), (96, 120, False, (60, 20))]


@pytest.mark.parametrize("sq,skv,causal,window", DENSE)
def test_dense_window_matches_float64(device, sq, skv, causal, window):
    q, k, v = attention_inputs(1, 4, sq, skv, 64, torch.float16, device, hkv=2, seed=sq + skv)
    do = _grad_out(q.shape, device)
    o, lse, grads = _dense(q, k, v, do, causal=causal, window=window)
    assert "window=" in xkernels.last_backend()
    assert_passes(_dense_checks(o, lse, grads, q, k, v, do, causal=causal, window=window))


@pytest.mark.parametrize("sq,skv,causal,window", [(8, 40, True, (3, 0)), (8, 40, False, (2, 5)),
                                                  (8, 40, False, (-1, 1)), (12, 6, True, (2, 0)),
                                                  (12, 6, False, (3, 1))])
def test_few_rows_take_the_split_kv_kernel_with_the_window(device, sq, skv, causal, window):
    """Sq <= 16 rows run the split-KV kernel, top-left as the dense API; with Sq > Skv the last rows' windows lie
    past every key (O = 0, LSE -inf)."""
    q, k, v = attention_inputs(2, 4, sq, skv, 64, torch.float16, device, hkv=1, seed=11)
    out = poisoned_like(q)
    lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, window_size=window, out=out,
                             return_lse=True)[1]
    assert "decode" in xkernels.last_backend() and "window=" in xkernels.last_backend()
    do = _grad_out(q.shape, device)
    _, _, grads = _dense(q, k, v, do, causal=causal, window=window)
    assert_passes(_dense_checks(out, lse, grads, q, k, v, do, causal=causal, window=window))


def test_a_growing_cache_crosses_its_window(device):
    """A dense call over K/V that grow by a few keys per call keeps one plan (keyed without the key count): while
    the window reaches past every key the unwindowed variant runs, then the windowed one cuts it; each matches
    float64. The dense API aligns top-left, so one query row (row 0) with window (-1, 12) sees keys 0..12."""
    q, k, v = attention_inputs(1, 2, 1, 40, 64, torch.float16, device, seed=2)
    names = {}
    for n in (3, 10, 13, 14, 40):
        o = xkernels.attention(q, k[:, :, :n].contiguous(), v[:, :, :n].contiguous(), window_size=(-1, 12))
        names[n] = xkernels.last_backend()
        ref = reference_attention(q, k[:, :, :n], v[:, :, :n], window=(-1, 12))
        c = compare_attention(o, ref, FP16)
        assert c.passed, (n, c.reason)
    assert "window" not in names[3] and "window=-1,12" in names[40], names
    for n in (3, 10, 13, 14, 40):  # bottom-right through the cache API: the step's row is the newest key
        kc, vc = k[:, :, :n].transpose(1, 2).contiguous(), v[:, :, :n].transpose(1, 2).contiguous()
        o = xkernels.attention_with_kvcache(q.transpose(1, 2), kc, vc, window_size=(12, 0),
                                            cache_seqlens=torch.full((1,), n, dtype=torch.int32, device=device))
        ref = reference_attention(q, k[:, :, max(0, n - 13):n], v[:, :, max(0, n - 13):n])
        c = compare_attention(o.transpose(1, 2), ref, FP16)
        assert c.passed, (n, c.reason)


def _packed(lens_q, lens_k, hq, hkv, d, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (uniform((sum(lens), h, d), torch.float16, device, g) for lens, h in ((lens_q, hq), (lens_k, hkv),
                                                                                     (lens_k, hkv)))
    do = uniform(q.shape, torch.float16, device, g)

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    return q, k, v, do, cu(lens_q), cu(lens_k)


@pytest.mark.parametrize("causal,window", [(True, (6, 0)), (False, (4, 9)), (False, (-1, 2)), (True, (0, 0)),
                                           (True, (50, 0)), (False, (40, 30))])
def test_varlen_window_matches_float64_bottom_right(device, causal, window):
    lens_q, lens_k = [5, 40, 0, 33, 20, 100], [9, 40, 7, 20, 64, 100]
    q, k, v, do, cq, ck = _packed(lens_q, lens_k, 4, 2, 64, device, seed=len(window))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention_varlen(*leaves, cq, ck, max(lens_q), max(lens_k), is_causal=causal,
                                       window_size=window, return_lse=True)
    assert "window=" in xkernels.last_backend()
    grads = torch.autograd.grad(o, leaves, do)
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window)
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty) and (o.transpose(0, 1)[empty] == 0).all()
    checks = {"o": compare_attention(o, ref_o, FP16), "lse": compare_lse(lse[~empty], ref_lse[~empty])}
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, window=window)
    checks |= {name: compare_grad(g, r, FP16) for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)}
    assert_passes(checks)


def test_a_window_off_by_one_fails_the_checks(device):
    """The checks above see a kernel that cuts one key too many or too few on either side, or ignores the window."""
    q, k, v = attention_inputs(1, 2, 48, 48, 64, torch.float16, device, seed=4)
    do = _grad_out(q.shape, device)
    for wrong in ((7, 3), (9, 3), (8, 2), (8, 4), (-1, -1)):
        o, lse, grads = _dense(q, k, v, do, causal=False, window=wrong)
        ref_lse = reference_lse(q, k, window=(8, 3))
        checks = {"o": compare_attention(o, reference_attention(q, k, v, window=(8, 3)), FP16),
                  "lse": compare_lse(lse, ref_lse)}
        refs = reference_attention_grads(q, k, v, do, window=(8, 3))
        checks |= {n: compare_grad(g, r, FP16) for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)}
        failed = {n for n, c in checks.items() if not c.passed}
        assert failed == {"o", "lse", "dq", "dk", "dv"}, (wrong, failed)


def test_a_causal_window_of_right_zero_alone_is_the_causal_mask(device):
    """window_size=(-1, 0) without is_causal is the causal mask: the same kernel variant and bitwise the same O."""
    q, k, v = attention_inputs(1, 2, 40, 40, 64, torch.float16, device, seed=6)
    a = xkernels.attention(q, k, v, window_size=(-1, 0))
    assert "window" not in xkernels.last_backend()
    assert torch.equal(a, xkernels.attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("window,error", [((3,), TypeError), ([2.0, 1], TypeError), ((-2, 0), ValueError),
                                          ((4, 2), ValueError)])
def test_bad_windows_raise_naming_the_argument(device, window, error):
    q, k, v = attention_inputs(1, 2, 20, 20, 64, torch.float16, device, seed=1)
    with pytest.raises(error, match="window_size"):
        xkernels.attention(q, k, v, is_causal=True, window_size=window)
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    with pytest.raises(error, match="window_size"):
        xkernels.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 20, 20,
                                  is_causal=True, window_size=window)
    if error is ValueError:  # the op checks the values a direct caller passes (the schema checks their types)
        with pytest.raises(error, match="window_size"):
            ops.attention_op(q, k, v, True, None, False, "auto", "auto", *window)


def test_forcing_hopper_with_a_window_runs_the_band_or_raises(device):
    """The dense and varlen forwards' Gluon band serves a forced "hopper" window on sm_90; elsewhere both raise."""
    q, k, v = attention_inputs(1, 2, 64, 64, 64, torch.float16, device, seed=1)
    cu = torch.tensor([0, 64], dtype=torch.int32, device=device)
    calls = (lambda: xkernels.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu,
                                               cu, 64, 64, is_causal=True, window_size=(8, 0), backend="hopper"),
             lambda: xkernels.attention(q, k, v, is_causal=True, window_size=(8, 0), backend="hopper"))
    for call in calls:
        if hopper_available(torch.device(device)):
            call()
            assert xkernels.last_backend().startswith("hopper."), xkernels.last_backend()
        else:
            with pytest.raises(ValueError, match="backend: 'hopper'"):  # no Gluon kernels on this machine at all
                call()


def test_band_constexprs():
    """How (is_causal, window_size) maps to the kernels' CAUSAL, SHIFT and BAND."""
    assert Band.of(True, (-1, 0)) == Band(True) and not Band(True).windowed
    assert Band.of(False, (-1, 0)) == Band(True)  # the causal mask
    assert Band.of(True, (5, 0)).constexprs() == dict(CAUSAL=True, SHIFT=0, BAND=5)
    assert Band.of(False, (5, 3)).constexprs() == dict(CAUSAL=True, SHIFT=3, BAND=8)
    assert Band.of(False, (5, -1)).constexprs() == dict(CAUSAL=False, SHIFT=0, BAND=5)
    assert Band.of(False, (-1, 3)).constexprs() == dict(CAUSAL=True, SHIFT=3, BAND=-1)
    assert str(Band.of(False, (5, 3))) == " window=5,3" and str(Band.of(False, (5, -1))) == " window=5,-1"


def test_compiled_training_step_with_a_window(device):
    q, k, v = attention_inputs(1, 4, 24, 24, 64, torch.float16, device, hkv=2, seed=8)

    def loss(q, k, v):
        return xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(6, 0)).float().sum()

    assert_compiled_grads_match(loss, (q, k, v))


def test_opcheck_with_a_window(device):
    q, k, v = attention_inputs(1, 2, 20, 24, 64, torch.float16, device, seed=3)
    torch.library.opcheck(ops.attention_lse_op, (q, k, v, False, None, False, "auto", "auto", 4, 2))
    cu = torch.tensor([0, 9, 20], dtype=torch.int32, device=device)
    ck = torch.tensor([0, 13, 24], dtype=torch.int32, device=device)
    qq, kk, vv = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
    torch.library.opcheck(ops.attention_varlen_op, (qq, kk, vv, cu, ck, 11, 13, True, None, "auto", True, True,
                                                    "auto", 3, 0))


@pytest.mark.parametrize("causal,window", [(False, (-1, 2**31 - 1)), (True, (2**31 - 1, 0)), (False, (3, 2**31 - 5)),
                                           (True, (2**40, 0)), (True, (2**64, 0)), (False, (5, 2**70))])
def test_windows_longer_than_the_keys_cut_nothing(device, causal, window):
    """A side at least Sq + Skv long is unbounded (as flash_attn makes it): no int32 position wraps, the result and
    the gradients are those of the window's other side alone; past int64 too (the ops' schema type)."""
    q, k, v = attention_inputs(1, 2, 40, 40, 64, torch.float16, device, seed=12)
    do = _grad_out(q.shape, device)
    o, lse, grads = _dense(q, k, v, do, causal=causal, window=window)
    plain = tuple(-1 if side >= 80 else side for side in window)
    assert_passes(_dense_checks(o, lse, grads, q, k, v, do, causal=causal, window=plain))
    cu = torch.tensor([0, 40], dtype=torch.int32, device=device)
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]
    o_var = xkernels.attention_varlen(*packed, cu, cu, 40, 40, is_causal=causal, window_size=window)
    assert compare_attention(o_var.transpose(0, 1)[None], reference_attention(q, k, v, is_causal=causal,
                                                                              window=plain), FP16).passed
