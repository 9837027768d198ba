"""`xkernels.integrations.flash_attn`: flash_attn's functions, layouts and alignment on xkernels' kernels. The dense
functions against float64 references with flash_attn's bottom-right causal and window (Sq != Skv both ways), GQA,
soft cap, the LSE and gradients; outputs NaN-poisoned first and contiguous; the packed variants equal to their
unpacked calls (gradients too); the varlen and KV-cache functions equal to xkernels' own calls with flash_attn's
defaults (the KV cache's causal=False); what the kernels lack refused by name."""

import pytest
import torch

import xkernels
from xkernels import plans, varlen
from xkernels.integrations import flash_attn as fa
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, compare_grad, compare_lse, reference_attention_varlen
from xkernels.testing.inputs import uniform
from xkernels.testing.reference import reference_attention_varlen_grads


@pytest.fixture(autouse=True)
def poisoned_output(monkeypatch):
    real = varlen.output_like
    monkeypatch.setattr(varlen, "output_like", lambda q: real(q).fill_(float("nan")))
    dense = plans.new_output
    monkeypatch.setattr(plans, "new_output", lambda *args: dense(*args).fill_(float("nan")))


def _bshd(b, s, h, d, device, seed, dtype=torch.float16):
    return uniform((b, s, h, d), dtype, device, torch.Generator(device=device).manual_seed(seed))


def _uniform_cu(b, s, device):
    return torch.arange(b + 1, dtype=torch.int32, device=device) * s


@pytest.mark.parametrize(("sq", "skv", "causal", "window", "softcap", "kernel"),
                         [(13, 29, True, (-1, -1), 0.0, "varlen"), (29, 13, True, (-1, -1), 0.0, "varlen"),
                          (21, 21, False, (-1, -1), 0.0, "attention["), (17, 40, True, (5, 0), 0.0, "varlen"),
                          (24, 24, False, (3, 2), 20.0, "attention["), (19, 30, False, (-1, -1), 0.0, "attention["),
                          (24, 24, True, (-1, -1), 0.0, "attention[")])
def test_flash_attn_func_matches_float64(device, sq, skv, causal, window, softcap, kernel):
    """Bottom-right causal and window (flash_attn's): with Sq > Skv the first rows see no key and are 0. Where the
    alignment cannot matter the dense kernels serve the call (on views of the same memory), else the packed ones."""
    b, hq, hkv, d = 2, 4, 2, 64
    q, k, v = _bshd(b, sq, hq, d, device, 1), _bshd(b, skv, hkv, d, device, 2), _bshd(b, skv, hkv, d, device, 3)
    out, lse, probs = fa.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                         softmax_scale=0.2, return_attn_probs=True)
    assert kernel in xkernels.last_backend() and "copied" not in xkernels.last_backend(), xkernels.last_backend()
    assert probs is None and out.shape == q.shape and out.is_contiguous() and lse.shape == (b, hq, sq)
    assert out.view(b, sq, -1).shape == (b, sq, hq * d)
    ref_o, ref_lse = reference_attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                                _uniform_cu(b, sq, device), _uniform_cu(b, skv, device),
                                                is_causal=causal, scale=0.2, window=window, softcap=softcap)
    c = compare_attention(out.flatten(0, 1), ref_o, ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason
    ref_lse = ref_lse.unflatten(1, (b, sq)).transpose(0, 1)
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty)
    assert empty.any() == (sq > skv and causal)
    c = compare_lse(lse[~empty], ref_lse[~empty])
    assert c.passed, c.reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attn_func_gradients_match_float64(device, dtype):
    b, sq, skv, hq, hkv, d = 2, 11, 19, 4, 1, 64
    leaves = [_bshd(b, s, h, d, device, i, dtype).requires_grad_()
              for i, (s, h) in enumerate(((sq, hq), (skv, hkv), (skv, hkv)))]
    grad_out = _bshd(b, sq, hq, d, device, 7, dtype)
    out = fa.flash_attn_func(*leaves, causal=True)
    grads = torch.autograd.grad(out, leaves, grad_out)
    refs = reference_attention_varlen_grads(*(t.detach().flatten(0, 1) for t in leaves), grad_out.flatten(0, 1),
                                            _uniform_cu(b, sq, device), _uniform_cu(b, skv, device), is_causal=True)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for name, g, ref in zip("qkv", grads, refs, strict=True):
        assert g.shape == leaves["qkv".index(name)].shape
        c = compare_grad(g.flatten(0, 1), ref, recipe)
        assert c.passed, f"d{name}: {c.reason}"


def test_causal_window_right_side_is_zero_as_in_flash_attn(device):
    """flash_attn sets a causal call's right window side to 0 (transformers passes (w - 1, w - 1) with causal)."""
    q, k = _bshd(1, 12, 2, 64, device, 1), _bshd(1, 20, 2, 64, device, 2)
    want = fa.flash_attn_func(q, k, k, causal=True, window_size=(3, 0))
    assert torch.equal(fa.flash_attn_func(q, k, k, causal=True, window_size=(3, 3)), want)
    assert not torch.equal(fa.flash_attn_func(q, k, k, causal=True, window_size=(4, 0)), want)


def test_packed_functions_equal_unpacked_calls(device):
    """qkv (B, S, 3, H, D) and kv (B, S, 2, H, D) read in place; the packed gradient is the unpacked ones stacked."""
    b, s, h, d = 2, 9, 2, 64
    qkv = _bshd(b, s, 3 * h, d, device, 4).unflatten(2, (3, h)).requires_grad_()
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    leaves = [t.detach().clone().requires_grad_() for t in qkv.unbind(2)]
    want = fa.flash_attn_func(*leaves, causal=True)
    assert torch.equal(out, want)
    grad_out = _bshd(b, s, h, d, device, 5)
    (got,) = torch.autograd.grad(out, qkv, grad_out)
    assert torch.equal(got, torch.stack(torch.autograd.grad(want, leaves, grad_out), 2))
    q, kv = qkv.detach()[:, :, 0], qkv.detach()[:, :, 1:]
    assert torch.equal(fa.flash_attn_kvpacked_func(q, kv, causal=True), want)
    cu = _uniform_cu(b, s, device)
    flat = qkv.detach().flatten(0, 1)
    want = fa.flash_attn_varlen_func(*flat.unbind(1), cu, cu, s, s, causal=True)
    assert torch.equal(fa.flash_attn_varlen_qkvpacked_func(flat, cu, s, causal=True), want)
    assert torch.equal(fa.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, s, s, causal=True), want)


def test_varlen_function_is_attention_varlen(device):
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 9, 20], dtype=torch.int32, device=device)
    q, k, v = (uniform((n, h, 64), torch.float16, device, torch.Generator(device=device).manual_seed(n))
               for n, h in ((12, 4), (20, 2), (20, 2)))
    out, lse, probs = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 11, causal=True, window_size=[4, 0],
                                                return_attn_probs=True)
    want = xkernels.attention_varlen(q, k, v, cu_q, cu_k, 7, 11, is_causal=True, window_size=(4, 0),
                                     return_lse=True)
    assert probs is None and torch.equal(out, want[0]) and torch.equal(lse, want[1])


def test_kvcache_function_keeps_flash_attn_defaults(device):
    """causal=False by default (flash_attn's), cache_seqlens an int or None; the append writes the caches."""
    b, s_max, hq, hkv, d = 2, 32, 4, 2, 64
    k_cache, v_cache = _bshd(b, s_max, hkv, d, device, 1), _bshd(b, s_max, hkv, d, device, 2)
    q, k_new = _bshd(b, 3, hq, d, device, 3), _bshd(b, 3, hkv, d, device, 4)
    seqlens = torch.full((b,), 20, dtype=torch.int32, device=device)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = fa.flash_attn_with_kvcache(q, kc, vc, k_new, k_new, cache_seqlens=20, return_softmax_lse=True)
    kc2, vc2 = k_cache.clone(), v_cache.clone()
    want = xkernels.attention_with_kvcache(q, kc2, vc2, cache_seqlens=seqlens, k=k_new, v=k_new, is_causal=False,
                                           return_lse=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2) and torch.equal(kc[:, 20:23], k_new)
    causal = xkernels.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), cache_seqlens=seqlens, k=k_new,
                                             v=k_new)
    assert not torch.equal(got[0], causal), "the default is flash_attn's causal=False"
    rows = torch.cat([kc, k_cache]), torch.cat([vc, v_cache])  # more cache rows than sequences: rows 0 .. B - 1
    assert torch.equal(fa.flash_attn_with_kvcache(q, *rows, cache_seqlens=23), got[0])
    whole = fa.flash_attn_with_kvcache(q, k_cache, v_cache)
    full = torch.full((b,), s_max, dtype=torch.int32, device=device)
    assert torch.equal(whole, xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=full,
                                                              is_causal=False))


def test_kvcache_cache_batch_idx_reads_and_writes_its_rows(device):
    """Sequence b attends to (and appends to) cache row cache_batch_idx[b], as flash_attn's; the other rows are not
    touched."""
    rows, s_max, hq, hkv, d = 4, 48, 4, 2, 64  # 48: pages of 16
    k_cache, v_cache = _bshd(rows, s_max, hkv, d, device, 1), _bshd(rows, s_max, hkv, d, device, 2)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    q, k_new, v_new = _bshd(2, 2, hq, d, device, 3), _bshd(2, 2, hkv, d, device, 4), _bshd(2, 2, hkv, d, device, 5)
    seqlens = torch.tensor([30, 7], dtype=torch.int32, device=device)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, cache_batch_idx=idx,
                                     causal=True, return_softmax_lse=True)
    picked_k, picked_v = k_cache[idx.long()].clone(), v_cache[idx.long()].clone()
    want = xkernels.attention_with_kvcache(q, picked_k, picked_v, cache_seqlens=seqlens, k=k_new, v=v_new,
                                           return_lse=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert torch.equal(kc[idx.long()], picked_k) and torch.equal(vc[idx.long()], picked_v)
    untouched = torch.tensor([1, 3], device=device)
    assert torch.equal(kc[untouched], k_cache[untouched]) and torch.equal(vc[untouched], v_cache[untouched])


def _rope64(x, cos, sin, pos, interleaved):
    """Rotary embedding in float64 as complex products: pairs (2i, 2i + 1) or (i, i + r / 2) times e^(i theta)."""
    r = 2 * cos.shape[1]
    part = x[..., :r].double()
    pairs = part.unflatten(-1, (-1, 2)) if interleaved else torch.stack(part.chunk(2, -1), -1)
    z = torch.view_as_complex(pairs.contiguous())
    rot = torch.view_as_real(z * torch.polar(torch.ones_like(cos.double()[pos]), torch.atan2(
        sin.double()[pos], cos.double()[pos]))[:, :, None])
    rot = rot.flatten(-2) if interleaved else torch.cat(rot.unbind(-1), -1)
    return torch.cat((rot.to(x.dtype), x[..., r:]), -1)


@pytest.mark.parametrize(("interleaved", "causal"), [(True, True), (False, True), (False, False)])
def test_kvcache_rotary_rotates_q_and_new_k(device, interleaved, causal):
    """k at positions cache_seqlens + i (and so written into the cache), q there too when causal, else all of q at
    cache_seqlens; the first rotary_dim dims only (32 of 64)."""
    b, s_max, hq, hkv, d, new = 2, 32, 4, 2, 64, 3
    k_cache, v_cache = _bshd(b, s_max, hkv, d, device, 1), _bshd(b, s_max, hkv, d, device, 2)
    q = _bshd(b, new, hq, d, device, 3)
    k_new, v_new = _bshd(b, new, hkv, d, device, 4), _bshd(b, new, hkv, d, device, 5)
    theta = torch.arange(s_max, device=device)[:, None] * 0.3 ** torch.arange(16, device=device)[None, :]
    cos, sin = theta.cos().half(), theta.sin().half()
    seqlens = torch.tensor([9, 20], dtype=torch.int32, device=device)
    kc, vc = k_cache.clone(), v_cache.clone()
    got = fa.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cos, sin, seqlens, causal=causal,
                                     rotary_interleaved=interleaved)
    steps = seqlens.long()[:, None] + torch.arange(new, device=device)[None, :]
    k_rot = _rope64(k_new, cos, sin, steps, interleaved)
    q_rot = _rope64(q, cos, sin, steps if causal else seqlens.long()[:, None].expand(-1, new), interleaved)
    for i, n in enumerate(seqlens.tolist()):
        torch.testing.assert_close(kc[i, n:n + new], k_rot[i], rtol=0, atol=2e-3)
        assert torch.equal(kc[i, :n], k_cache[i, :n]) and torch.equal(vc[i, n:n + new], v_new[i])
    assert not torch.equal(k_rot[..., :32], k_new[..., :32]) and torch.equal(kc[0, 9:12, :, 32:], k_new[0, :, :, 32:])
    want = xkernels.attention_with_kvcache(q_rot, k_cache.clone(), v_cache.clone(), cache_seqlens=seqlens, k=k_rot,
                                           v=v_new, is_causal=causal)
    torch.testing.assert_close(got, want, rtol=0, atol=4e-3)


def test_what_the_kernels_lack_is_refused_by_name(device):
    q = _bshd(1, 8, 2, 64, device, 0)
    cu = _uniform_cu(1, 8, device)
    flat = q.flatten(0, 1)
    slopes = torch.ones(2, device=device)
    cache16 = _bshd(1, 16, 2, 64, device, 1)
    for call, exc, msg in [
            (lambda: fa.flash_attn_func(q, q, q, dropout_p=0.1), ValueError, "dropout_p: attention dropout"),
            (lambda: fa.flash_attn_func(q, q, q, 0.0, None, False, (-1, -1), 0.0, slopes), ValueError,
             "alibi_slopes: ALiBi"),
            (lambda: fa.flash_attn_func(q[0], q, q), ValueError, "q: expected 4 dims"),
            (lambda: fa.flash_attn_func(q, q[:, :4], q), ValueError, "v: 8 keys, k has 4"),
            (lambda: fa.flash_attn_qkvpacked_func(q), ValueError, "qkv: expected"),
            (lambda: fa.flash_attn_varlen_func(flat, flat, flat, cu, cu, 8, 8, block_table=cu[None]), ValueError,
             "block_table: packed sequences over a paged cache"),
            (lambda: fa.flash_attn_with_kvcache(q, q, q, rotary_cos=slopes, rotary_sin=slopes), ValueError,
             "rotary_cos: rotary embedding applies to new k"),
            (lambda: fa.flash_attn_with_kvcache(q, q, q, q, q, slopes[None], slopes, cache_seqlens=0), ValueError,
             "rotary_sin: rotary_cos and rotary_sin must both be"),
            (lambda: fa.flash_attn_with_kvcache(q, q, q, q, q, slopes[None], slopes[None], cache_seqlens=0),
             ValueError, "rotary_cos: 1 positions, fewer than the cache's 8"),
            (lambda: fa.flash_attn_with_kvcache(q, q, q, cache_batch_idx=cu.long()), TypeError,
             "cache_batch_idx: expected a 1-D int32"),
            (lambda: fa.flash_attn_with_kvcache(q, cache16, cache16, cache_batch_idx=cu), ValueError,
             "cache_batch_idx: 2 indices for a batch of 1"),
            (lambda: fa.flash_attn_with_kvcache(q, q[:, :4], q[:, :4], cache_batch_idx=cu[:1]), ValueError,
             "cache_batch_idx: needs a dense cache"),
            (lambda: fa.flash_attn_with_kvcache(q, cache16, cache16, cache_batch_idx=cu[1:], cache_seqlens=4),
             ValueError,
             "cache_batch_idx: every index must be a row of the cache, 0 to 0"),
            (lambda: fa.flash_attn_with_kvcache(q[:, :1], q, q, q[:, :1], q[:, :1]), ValueError,
             "cache_seqlens: None with new k"),
            (lambda: fa.flash_attn_func(q, q, q, window_size="left"), TypeError, "window_size")]:
        with pytest.raises(exc, match=msg):
            call()
