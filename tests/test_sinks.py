"""Attention sinks (`sinks`, gpt-oss's: one logit per query head that joins every row's softmax as a key of value 0)
in `attention`, `attention_varlen` and `attention_with_kvcache`, forward and backward (dQ, dK, dV and dSinks)
against float64 references on the same quantized inputs, with windows, rows that see no key (O = 0, LSE = the sink),
split decode (the sink counted once across the splits), NaN-poisoned outputs and gradient buffers; bad sinks raise
naming the argument; the checks fail on sinks counted twice, ignored, or given the wrong head."""

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes, poison_attention_outputs, poisoned_like
from xkernels import ops
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare,
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


def _sinks(hq, device, seed=0):
    """Logits around the rows' own LSEs (~log(S)), so each sink takes a real share of every row."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(hq, generator=g) * 4.0 + 1.0).to(device)


def _sink_check(got, want) -> object:
    """dSinks (Hq,) against float64: relative RMS 1e-2 (the sum over every row of fp16-rounded O and dO)."""
    return compare(got, want, rel_rms=1e-2)


def _dense(q, k, v, do, sinks, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = xkernels.attention(*leaves[:3], enable_gqa=True, return_lse=True, sinks=leaves[3], **kw)
    assert "sinks" in xkernels.last_backend()
    return o, lse, torch.autograd.grad(o, leaves, do)


def _checks(o, lse, grads, q, k, v, do, sinks, **ref) -> dict:
    out = {"o": compare_attention(o, reference_attention(q, k, v, sinks=sinks, **ref), FP16),
           "lse": compare_lse(lse, reference_lse(q, k, sinks=sinks, **ref))}
    refs = reference_attention_grads(q, k, v, do, sinks=sinks, **ref)
    out |= {n: compare_grad(g, r, FP16) for n, g, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3], strict=True)}
    return out | {"dsinks": _sink_check(grads[3], refs[3])}


@pytest.mark.parametrize("sq,skv,causal,window", [(70, 70, True, (-1, -1)), (40, 90, False, (-1, -1)),
                                                  (90, 40, True, (3, 0)), (8, 40, True, (-1, -1)),
                                                  (8, 40, False, (5, 2))])
def test_dense_sinks_match_float64(device, sq, skv, causal, window):
    """Full, causal, windowed (rows past the keys' window see only their sink), and the few-row split-KV path."""
    q, k, v = attention_inputs(1, 4, sq, skv, 64, torch.float16, device, hkv=2, seed=sq + skv)
    do = attention_inputs(1, 4, sq, 1, 64, torch.float16, device, seed=3)[0]
    sinks = _sinks(4, device)
    o, lse, grads = _dense(q, k, v, do, sinks, is_causal=causal, window_size=window)
    assert_passes(_checks(o, lse, grads, q, k, v, do, sinks, is_causal=causal, window=window))


def test_the_checks_see_a_sink_ignored_doubled_or_misplaced(device):
    q, k, v = attention_inputs(1, 4, 48, 48, 64, torch.float16, device, hkv=2, seed=9)
    do = attention_inputs(1, 4, 48, 1, 64, torch.float16, device, seed=4)[0]
    sinks = _sinks(4, device, seed=2)
    o, lse, grads = _dense(q, k, v, do, sinks, is_causal=True)
    wrong = {"none": torch.full_like(sinks, -1e4), "twice": sinks + 0.6931471805599453,
             "heads swapped": sinks.flip(0)}
    for name, ref_sinks in wrong.items():
        checks = _checks(o, lse, grads, q, k, v, do, ref_sinks, is_causal=True)
        failed = {n for n, c in checks.items() if not c.passed}
        assert {"o", "lse", "dsinks"} <= failed, (name, failed)


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (4, 9))])
def test_varlen_sinks_match_float64(device, causal, window):
    """Packed sequences, an empty one and one without keys (its rows: O = 0, LSE = the sink)."""
    lens_q, lens_k = [5, 40, 0, 33, 6], [9, 40, 7, 20, 0]
    g = torch.Generator(device=device).manual_seed(5)
    q = uniform((sum(lens_q), 4, 64), torch.float16, device, g)
    k, v = (uniform((sum(lens_k), 2, 64), torch.float16, device, g) for _ in range(2))
    do = uniform(q.shape, torch.float16, device, g)
    cq, ck = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for n in (lens_q, lens_k))
    sinks = _sinks(4, device, seed=1)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = xkernels.attention_varlen(*leaves[:3], cq, ck, 40, 40, is_causal=causal, window_size=window,
                                       sinks=leaves[3], return_lse=True)
    grads = torch.autograd.grad(o, leaves, do)
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, window=window, sinks=sinks)
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal, window=window, sinks=sinks)
    assert torch.isfinite(lse).all(), "every row sees its sink"
    checks = {"o": compare_attention(o, ref_o, FP16), "lse": compare_lse(lse, ref_lse)}
    checks |= {n: compare_grad(g_, r, FP16) for n, g_, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3], strict=True)}
    assert_passes(checks | {"dsinks": _sink_check(grads[3], refs[3])})


@pytest.mark.parametrize("splits", [1, 2])
def test_kvcache_sinks_count_once_across_splits(device, splits):
    """A decode step over a paged cache, unsplit and in two key splits (split 0 alone carries the sink). The
    sequences span more than two key tiles of every target's config (128 keys on a GPU), so two splits are two."""
    g = torch.Generator(device=device).manual_seed(13)
    b, hq, hkv, d, page = 2, 4, 2, 64, 16
    kc, vc = (uniform((2 * 20, page, hkv, d), torch.float16, device, g) for _ in range(2))
    table = torch.randperm(2 * 20, generator=torch.Generator().manual_seed(2)).view(b, 20).to(torch.int32).to(device)
    lengths = torch.tensor([263, 317], dtype=torch.int32, device=device)
    q = uniform((b, 1, hq, d), torch.float16, device, g)
    sinks = _sinks(hq, device, seed=3)
    out, lse = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table, sinks=sinks,
                                               num_splits=splits, return_lse=True)
    assert f"splits={splits}" in xkernels.last_backend() and "sinks" in xkernels.last_backend()
    for i in range(b):
        n = int(lengths[i])
        keys, values = (torch.cat([c[int(p)] for p in table[i]])[:n].transpose(0, 1)[None] for c in (kc, vc))
        ref = dict(sinks=sinks)
        c = compare_attention(out[i:i + 1].transpose(1, 2), reference_attention(q[i:i + 1].transpose(1, 2), keys,
                                                                                  values, **ref), FP16)
        c_lse = compare_lse(lse[i:i + 1], reference_lse(q[i:i + 1].transpose(1, 2), keys, **ref))
        assert c.passed and c_lse.passed, (i, c.reason, c_lse.reason)


@pytest.mark.parametrize("sinks,error", [(torch.zeros(3), ValueError), (torch.zeros(4, dtype=torch.int32), TypeError),
                                         (torch.zeros(2, 2), ValueError), ([0.0] * 4, TypeError)])
def test_bad_sinks_raise_naming_the_argument(device, sinks, error):
    q, k, v = attention_inputs(1, 4, 20, 20, 64, torch.float16, device, seed=1)
    sinks = sinks.to(device) if isinstance(sinks, torch.Tensor) else sinks
    for rows in (20, 1):  # after a good call made the plan (the dense and the few-row path), the bad one still raises
        xkernels.attention(q[:, :, :rows], k, v, sinks=torch.zeros(4, device=device))
        with pytest.raises(error, match="sinks"):
            xkernels.attention(q[:, :, :rows], k, v, sinks=sinks)
    cu = torch.tensor([0, 20], dtype=torch.int32, device=device)
    with pytest.raises(error, match="sinks"):
        xkernels.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 20, 20,
                                  sinks=sinks)
    with pytest.raises(error, match="sinks"):
        xkernels.attention_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks=sinks,
                                        cache_seqlens=torch.full((1,), 20, dtype=torch.int32, device=device))


def test_sinks_run_the_gluon_kernel_on_hopper_and_forcing_it_elsewhere_raises(device):
    """Sinks run the Gluon forward on sm_90 (tests/gpu/test_hopper_sinks_softcap.py checks it), in every recipe,
    the portable one where forced or elsewhere; forcing "hopper" raises where no Gluon kernel runs."""
    q, k, v = attention_inputs(1, 2, 64, 64, 64, torch.bfloat16, device, seed=1)
    sinks = torch.zeros(2, device=device)
    xkernels.attention(q, k, v, sinks=sinks, backend="portable")
    assert xkernels.last_backend().startswith("portable."), xkernels.last_backend()
    xkernels.attention(q, k, v, sinks=sinks)
    on_hopper = hopper_available(torch.device(device))
    assert xkernels.last_backend().startswith("hopper." if on_hopper else "portable."), xkernels.last_backend()
    xkernels.attention(q.half(), k.half(), v.half(), sinks=sinks)  # every recipe's
    assert xkernels.last_backend().startswith("hopper." if on_hopper else "portable."), xkernels.last_backend()
    if on_hopper:
        xkernels.attention(q, k, v, sinks=sinks, backend="hopper")
        assert xkernels.last_backend().startswith("hopper.") and "sinks" in xkernels.last_backend()
    else:
        with pytest.raises(ValueError, match="backend: 'hopper'"):
            xkernels.attention(q, k, v, sinks=sinks, backend="hopper")


def test_sinks_through_out_the_lse_less_op_compile_and_opcheck(device):
    """`out=`; the op without an LSE output (its backward recomputes the forward with the sinks); torch.compile of a
    loss whose gradient reaches the sinks; opcheck of the op with sinks."""
    q, k, v = attention_inputs(1, 4, 24, 24, 64, torch.float16, device, hkv=2, seed=5)
    sinks = _sinks(4, device)
    out = poisoned_like(q)
    xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=sinks, out=out)
    assert compare_attention(out, reference_attention(q, k, v, is_causal=True, sinks=sinks), FP16).passed
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    o = ops.attention_op(*leaves[:3], True, None, True, "auto", "auto", -1, -1, 0.0, leaves[3])
    do = attention_inputs(1, 4, 24, 1, 64, torch.float16, device, seed=6)[0]
    grads = torch.autograd.grad(o, leaves, do)
    refs = reference_attention_grads(q, k, v, do, is_causal=True, sinks=sinks)
    assert_passes({n: compare_grad(g, r, FP16) for n, g, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3],
                                                                   strict=True)} | {"dsinks": _sink_check(grads[3],
                                                                                                          refs[3])})
    torch.library.opcheck(ops.attention_lse_op, (q, k, v, True, None, True, "auto", "auto", -1, -1, 0.0, sinks))

    def loss(q, k, v, sinks):
        return xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=sinks).float().sum()

    assert_compiled_grads_match(loss, (q, k, v, sinks))


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_sinks_gradient_whatever_deterministic_says(device, deterministic):
    """dSinks through each op that takes sinks, with `deterministic` passed explicitly after them (an op call that
    leaves a trailing argument at its default gives autograd fewer inputs: the sinks' entry is found from the
    front): the dense LSE op, the LSE-less one (its backward recomputes the forward), the packed one."""
    q, k, v = attention_inputs(1, 4, 24, 24, 64, torch.float16, device, hkv=2, seed=5)
    do = attention_inputs(1, 4, 24, 1, 64, torch.float16, device, seed=6)[0]
    sinks = _sinks(4, device, seed=7)
    want = reference_attention_grads(q, k, v, do, is_causal=True, sinks=sinks)[3]
    flags = (True, None, True, "auto", "auto", -1, -1, 0.0)
    for op in (ops.attention_lse_op, ops.attention_op):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        out = op(*leaves[:3], *flags, leaves[3], deterministic)
        o = out[0] if isinstance(out, tuple) else out
        got = torch.autograd.grad(o, leaves, do)[3]
        assert _sink_check(got, want).passed, op
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v, do)]
    cu = torch.tensor([0, 24], dtype=torch.int32, device=device)
    leaves = [t.clone().requires_grad_() for t in (*packed[:3], sinks)]
    o, _ = ops.attention_varlen_op(*leaves[:3], cu, cu, 24, 24, True, None, "auto", True, True, "auto", -1, -1, 0.0,
                                   leaves[3], deterministic)
    assert _sink_check(torch.autograd.grad(o, leaves, packed[3])[3], want).passed, "varlen"


def test_sink_gradient_through_the_lse_too(device):
    """A loss on O and on the LSE: dSinks takes the LSE's term (each row's sink share times dLSE) as dQ, dK, dV do."""
    q, k, v = attention_inputs(1, 4, 40, 40, 64, torch.float16, device, hkv=2, seed=21)
    do = attention_inputs(1, 4, 40, 1, 64, torch.float16, device, seed=22)[0]
    dlse = torch.rand(1, 4, 40, generator=torch.Generator().manual_seed(5)).to(device) - 0.5
    sinks = _sinks(4, device, seed=4)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = xkernels.attention(*leaves[:3], is_causal=True, enable_gqa=True, return_lse=True, sinks=leaves[3])
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (lse * dlse).sum(), leaves)
    refs = reference_attention_grads(q, k, v, do, is_causal=True, grad_lse=dlse, sinks=sinks)
    checks = {n: compare_grad(g, r, FP16) for n, g, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3], strict=True)}
    without_lse_term = reference_attention_grads(q, k, v, do, is_causal=True, sinks=sinks)[3]
    assert not _sink_check(grads[3], without_lse_term).passed, "the LSE's term must show in dSinks"
    assert_passes(checks | {"dsinks": _sink_check(grads[3], refs[3])})


@pytest.mark.parametrize("dtype,strided", [(torch.bfloat16, False), (torch.float16, True)])
def test_sinks_in_other_dtypes_and_layouts(device, dtype, strided):
    """bf16 / fp16 sinks (read as fp32 in the kernels), a strided view: O against float64, dSinks in their dtype."""
    q, k, v = attention_inputs(1, 4, 33, 33, 64, torch.float16, device, hkv=2, seed=23)
    do = attention_inputs(1, 4, 33, 1, 64, torch.float16, device, seed=24)[0]
    base = _sinks(8 if strided else 4, device, seed=6).to(dtype)
    sinks = base[::2] if strided else base
    leaf = sinks.detach().clone().requires_grad_() if not strided else sinks.detach().requires_grad_()
    o = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=leaf)
    (dsinks,) = torch.autograd.grad(o, [leaf], do)
    assert dsinks.dtype == dtype
    assert compare_attention(o, reference_attention(q, k, v, is_causal=True, sinks=sinks), FP16).passed
    want = reference_attention_grads(q, k, v, do, is_causal=True, sinks=sinks)[3]
    assert compare(dsinks, want, rel_rms=2e-2).passed


def test_a_minus_infinite_sink_is_no_sink(device):
    """A sink of -inf takes no share: rows that see no key keep O = 0 and LSE -inf, and dSinks stays finite."""
    q, k, v = attention_inputs(1, 4, 90, 40, 64, torch.float16, device, hkv=2, seed=25)
    sinks = torch.tensor([float("-inf"), 0.0, 1.0, 2.0], device=device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = xkernels.attention(*leaves[:3], enable_gqa=True, window_size=(3, 2), sinks=leaves[3], return_lse=True)
    assert torch.isinf(lse[0, 0]).any() and torch.isfinite(lse[0, 1:]).all()
    grads = torch.autograd.grad(o, leaves, torch.ones_like(o))
    assert torch.isfinite(grads[3]).all() and grads[3][0] == 0


def test_kvcache_sinks_of_other_dtypes_reuse_the_plan(device):
    """fp32 then bf16 sinks on the same cache call (one plan): both match float64."""
    g = torch.Generator(device=device).manual_seed(17)
    kc, vc = (uniform((2, 48, 2, 64), torch.float16, device, g) for _ in range(2))
    q = uniform((2, 1, 4, 64), torch.float16, device, g)
    lengths = torch.tensor([30, 48], dtype=torch.int32, device=device)
    for dtype in (torch.float32, torch.bfloat16):
        sinks = _sinks(4, device, seed=7).to(dtype)
        out = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, sinks=sinks)
        for i in range(2):
            n = int(lengths[i])
            ref = reference_attention(q[i:i + 1].transpose(1, 2), kc[i:i + 1, :n].transpose(1, 2),
                                      vc[i:i + 1, :n].transpose(1, 2), sinks=sinks)
            assert compare_attention(out[i:i + 1].transpose(1, 2), ref, FP16).passed, (dtype, i)


def test_fused_merge_counts_the_sink_once(device, monkeypatch):
    """The split-KV kernel's opt-in fused merge (the last split merges the partials) with sinks."""
    import dataclasses

    from xkernels import decode, kvcache, plans
    from xkernels.portable import configs as portable_configs

    real = portable_configs.decode_config
    monkeypatch.setattr(portable_configs, "decode_config",
                        lambda *a, **kw: dataclasses.replace(real(*a, **kw), fused_combine=True))
    for cache in (plans._PLANS, decode._PLANS, kvcache._RESOLVED):
        cache.clear()
    g = torch.Generator(device=device).manual_seed(19)
    kc, vc = (uniform((2, 320, 2, 64), torch.float16, device, g) for _ in range(2))  # > 2 key tiles of 128
    q = uniform((2, 1, 4, 64), torch.float16, device, g)
    lengths = torch.tensor([270, 320], dtype=torch.int32, device=device)
    sinks = _sinks(4, device, seed=8)
    out = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, sinks=sinks, num_splits=2)
    assert "-fc" in xkernels.last_backend() and "splits=2" in xkernels.last_backend(), xkernels.last_backend()
    for i in range(2):
        n = int(lengths[i])
        ref = reference_attention(q[i:i + 1].transpose(1, 2), kc[i:i + 1, :n].transpose(1, 2),
                                  vc[i:i + 1, :n].transpose(1, 2), sinks=sinks)
        assert compare_attention(out[i:i + 1].transpose(1, 2), ref, FP16).passed, i
    for cache in (plans._PLANS, decode._PLANS, kvcache._RESOLVED):
        cache.clear()
