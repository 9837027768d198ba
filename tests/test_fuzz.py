"""Hypothesis shape fuzz (bounded example count) for both kernels, against the float64 reference."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xkernels
from tests.helpers import poisoned_like
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    gemm_inputs,
    reference_attention,
    reference_matmul,
)

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(recipe=st.sampled_from(list(ATTENTION_RECIPES)), d=st.sampled_from([64, 128, 256]),
       b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.integers(1, 3), sq=st.integers(1, 90),
       skv=st.integers(1, 90), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_fuzz(device, recipe, d, b, hkv, group, sq, skv, causal, seed):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(b, hkv * group, sq, skv, d, rec.io_dtype, device, hkv=hkv, seed=seed)
    o = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe, out=poisoned_like(q))
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c


@FUZZ
@given(d=st.sampled_from([64, 128]), hkv=st.integers(1, 2), group=st.integers(1, 2), sq=st.integers(1, 90),
       skv=st.integers(1, 90), causal=st.booleans(), left=st.sampled_from([-1, 0, 1, 7, 16, 31, 63]),
       right=st.sampled_from([-1, 0, 1, 5, 16, 40]), seed=st.integers(0, 2**16))
def test_windowed_attention_fuzz(device, d, hkv, group, sq, skv, causal, left, right, seed):
    """Sliding windows (top-left) of every size against the tiles: O (into a NaN-poisoned `out`), the LSE (-inf
    exactly where a row sees no key) and dQ, dK, dV against float64 (the few-row split-KV path included: Sq <= 16)."""
    from tests.helpers import assert_passes
    from xkernels.testing import compare_grad, compare_lse, reference_attention_grads, reference_lse

    window = (left, 0 if causal else right)
    rec = ATTENTION_RECIPES["fp16"]
    q, k, v = attention_inputs(1, hkv * group, sq, skv, d, torch.float16, device, hkv=hkv, seed=seed)
    do = attention_inputs(1, hkv * group, sq, 1, d, torch.float16, device, seed=seed + 1)[0]
    out = poisoned_like(q)
    lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, window_size=window, out=out,
                             return_lse=True)[1]
    ref_lse = reference_lse(q, k, is_causal=causal, window=window)
    seen = ~torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), ~seen)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, window_size=window)
    grads = torch.autograd.grad(o, leaves, do)
    ref_o = reference_attention(q, k, v, is_causal=causal, window=window)
    checks = {"o": compare_attention(o, ref_o, rec), "out": compare_attention(out, ref_o, rec),
              "lse": compare_lse(lse[seen], ref_lse[seen])}
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, window=window)
    checks |= {n: compare_grad(g, r, rec) for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)}
    assert_passes(checks)


@FUZZ
@given(m=st.integers(1, 100), n=st.integers(1, 100), k=st.integers(1, 100), b_layout=st.sampled_from(["kn", "nk"]),
       walk=st.sampled_from(["row", "grouped", "zorder"]), dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_gemm_fuzz(device, m, n, k, b_layout, walk, dtype, seed):
    a, b = gemm_inputs(m, n, k, dtype, device, b_layout, seed=seed)
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=poisoned_like(a, shape=(m, n)))
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r


@FUZZ
@given(m=st.integers(1, 32), n=st.integers(1, 300), k=st.integers(1, 300), b_layout=st.sampled_from(["kn", "nk"]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), fp32_out=st.booleans(), batch=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_few_row_gemm_fuzz(device, m, n, k, b_layout, dtype, fp32_out, batch, seed):
    """The few-row kernel (walk "auto", at most 32 rows once a's batch folds in): any N, K tails and K slicing."""
    rows = max(1, m // batch) * batch
    a, b = gemm_inputs(rows, n, k, dtype, device, b_layout, seed=seed)
    a3 = a.view(batch, rows // batch, k)
    out_dtype = torch.float32 if fp32_out else dtype
    out = poisoned_like(a, shape=(batch, rows // batch, n), dtype=out_dtype)
    c = xkernels.matmul(a3, b, b_layout=b_layout, out_dtype=out_dtype, out=out)
    assert c is out and "skinny" in xkernels.last_backend()
    r = compare_gemm(c.reshape(rows, n), reference_matmul(a, b, b_layout), k)
    assert r.passed, r


@FUZZ
@given(recipe=st.sampled_from(list(ATTENTION_RECIPES)), d=st.sampled_from([64, 128]), b=st.integers(1, 3),
       hkv=st.integers(1, 2), group=st.integers(1, 4), sq=st.integers(1, 6), append=st.booleans(),
       page=st.sampled_from([0, 16, 32, 64]), causal=st.booleans(), splits=st.integers(0, 4), leftpad=st.booleans(),
       data=st.data())
def test_kvcache_fuzz(device, recipe, d, b, hkv, group, sq, append, page, causal, splits, leftpad, data):
    """attention_with_kvcache over random lengths, pages, appends, splits, left pads and sliding windows against
    float64 over each sequence's valid rows (bottom-right causal)."""
    from xkernels.testing import reference_attention_varlen

    rec = ATTENTION_RECIPES[recipe]
    s_max = 64
    new = sq if append else 0
    lengths = [data.draw(st.integers(0, s_max - new)) for _ in range(b)]
    pads = [data.draw(st.integers(0, n)) for n in lengths] if leftpad and not page else None
    window = (data.draw(st.sampled_from([-1, 0, 1, 5, 17, 40])),
              0 if causal else data.draw(st.sampled_from([-1, 0, 3])))
    g = torch.Generator(device=device).manual_seed(sum(lengths) + 7 * sq)

    def rnd(*shape):
        return (torch.rand(shape, generator=g, device=device) - 0.5).to(rec.io_dtype)

    q, k_cache, v_cache = rnd(b, sq, hkv * group, d), rnd(b, s_max, hkv, d), rnd(b, s_max, hkv, d)
    k, v = (rnd(b, new, hkv, d), rnd(b, new, hkv, d)) if new else (None, None)
    kc, vc, table = k_cache, v_cache, None
    if page:
        per_seq = s_max // page
        table = torch.randperm(b * per_seq, generator=torch.Generator().manual_seed(b)).view(b, per_seq)
        table = table.to(torch.int32).to(device)
        kc = torch.empty((b * per_seq, page, hkv, d), dtype=rec.io_dtype, device=device)
        vc = torch.empty_like(kc)
        kc[table.long()] = k_cache.view(b, per_seq, page, hkv, d)
        vc[table.long()] = v_cache.view(b, per_seq, page, hkv, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    pad_t = None if pads is None else torch.tensor(pads, dtype=torch.int32, device=device)
    o = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, k=k, v=v, block_table=table,
                                        cache_leftpad=pad_t, is_causal=causal, precision=recipe, num_splits=splits,
                                        window_size=window)
    if new:  # the reference reads the appended rows from the dense copy
        for i, n in enumerate(lengths):
            k_cache[i, n:n + new], v_cache[i, n:n + new] = k[i], v[i]
    starts = pads or [0] * b
    keys = torch.cat([k_cache[i, s:n + new] for i, (s, n) in enumerate(zip(starts, lengths, strict=True))])
    values = torch.cat([v_cache[i, s:n + new] for i, (s, n) in enumerate(zip(starts, lengths, strict=True))])
    cu_k = torch.tensor([0, *torch.tensor([n + new - s for s, n in zip(starts, lengths, strict=True)]).cumsum(0)
                         .tolist()], dtype=torch.int32)
    cu_q = torch.arange(b + 1, dtype=torch.int32) * sq
    ref, _ = reference_attention_varlen(q.reshape(b * sq, -1, d).cpu(), keys.cpu(), values.cpu(), cu_q, cu_k,
                                        is_causal=causal, window=window)
    c = compare_attention(o, ref.view(b, sq, -1, d).to(o.device), rec)
    assert c.passed, c


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d=st.sampled_from([64, 128]), hkv=st.integers(1, 2), group=st.integers(1, 3), causal=st.booleans(),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), data=st.data())
def test_varlen_backward_fuzz(device, d, hkv, group, causal, dtype, data):
    """The packed backward over random lengths (empty sequences, Sq > Sk and Sq < Sk per sequence) against float64
    autograd per sequence, every gradient buffer NaN-poisoned."""
    from xkernels import backward
    from xkernels.testing import compare_grad, reference_attention_varlen_grads

    n = data.draw(st.integers(1, 4))
    lens_q = [data.draw(st.integers(0, 40)) for _ in range(n)]
    lens_k = [data.draw(st.integers(0, 40)) for _ in range(n)]
    g = torch.Generator(device=device).manual_seed(sum(lens_q) * 41 + sum(lens_k))

    def rnd(*shape):
        return (torch.rand(shape, generator=g, device=device) - 0.5).to(dtype)

    q, do = rnd(sum(lens_q), hkv * group, d), rnd(sum(lens_q), hkv * group, d)
    k, v = rnd(sum(lens_k), hkv, d), rnd(sum(lens_k), hkv, d)
    cq, ck = (torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for x in (lens_q, lens_k))
    real = backward.grad_like
    backward.grad_like = lambda t: real(t).fill_(float("nan"))
    try:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = xkernels.attention_varlen(*leaves, cq, ck, max(lens_q), max(lens_k), is_causal=causal)
        grads = torch.autograd.grad(o, leaves, do)
    finally:
        backward.grad_like = real
    refs = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=causal)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for name, gr, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        c = compare_grad(gr, ref, recipe)
        assert c.passed, (name, c)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(2, 3), sq=st.integers(1, 3), append=st.booleans(), page=st.sampled_from([0, 16]),
       splits=st.integers(0, 3), corruption=st.sampled_from(["negative", "too_long", "int32_max", "page", "pad"]),
       data=st.data())
def test_kvcache_unsynced_corruption_fuzz(device, b, sq, append, page, splits, corruption, data):
    """sync_checks=False with one sequence's value corrupted: every other sequence gets bitwise what the call with
    the value fixed gives it (outputs and appends); the corrupted sequence's outputs are NaN wherever they depend on
    the bad value (all of them for a length or pad) and equal to the fixed call's elsewhere, and nothing is written
    through it."""
    s_max, d, hkv, group = 64, 64, 2, 2
    new = sq if append else 0
    bad = data.draw(st.integers(0, b - 1))
    lengths = [data.draw(st.integers(1, s_max - new)) for _ in range(b)]
    if corruption == "pad" and page:
        corruption = "negative"  # left pads are for dense caches
    if corruption == "page" and not page:
        corruption = "too_long"  # block ids are for paged caches
    g = torch.Generator(device=device).manual_seed(sum(lengths) + 7 * sq + bad)

    def rnd(*shape):
        return (torch.rand(shape, generator=g, device=device) - 0.5).half()

    q, cache, more = rnd(b, sq, hkv * group, d), rnd(b * s_max, hkv, d), rnd(b * s_max, hkv, d)
    k, v = (rnd(b, new, hkv, d), rnd(b, new, hkv, d)) if new else (None, None)
    i32 = dict(dtype=torch.int32, device=device)
    fixed = dict(cache_seqlens=torch.tensor(lengths, **i32), k=k, v=v, num_splits=splits, return_lse=True)
    if page:
        fixed["block_table"] = torch.randperm(b * s_max // page, generator=torch.Generator().manual_seed(b)).view(
            b, -1).to(**i32)
        caches = (cache.view(-1, page, hkv, d), more.view(-1, page, hkv, d))
    else:
        caches = (cache.view(b, s_max, hkv, d), more.view(b, s_max, hkv, d))
    if corruption == "pad":
        fixed["cache_leftpad"] = torch.zeros(b, **i32)
    broken = {name: t.clone() if isinstance(t, torch.Tensor) and name != "k" and name != "v" else t
              for name, t in fixed.items()}
    if corruption == "negative":
        broken["cache_seqlens"][bad] = -data.draw(st.integers(1, 5))
    elif corruption == "too_long":
        broken["cache_seqlens"][bad] = s_max - new + data.draw(st.integers(1, 5))
    elif corruption == "int32_max":
        broken["cache_seqlens"][bad] = 2**31 - 1
    elif corruption == "pad":
        broken["cache_leftpad"][bad] = lengths[bad] + data.draw(st.integers(1, 5))
    else:  # a block id out of range in one of the pages the sequence reads or writes
        used = -(-(lengths[bad] + new) // page)
        broken["block_table"][bad, data.draw(st.integers(0, used - 1))] = data.draw(
            st.sampled_from([-1, b * s_max // page, 2**31 - 1]))
    runs = []
    for kwargs in (broken, fixed):
        kc, vc = (t.clone() for t in caches)
        runs.append((*xkernels.attention_with_kvcache(q, kc, vc, sync_checks=False, **kwargs), kc, vc))
    (o, lse, kc, vc), (o_fix, lse_fix, kc_fix, vc_fix) = runs
    good = [i for i in range(b) if i != bad]
    assert torch.equal(o[good], o_fix[good]) and torch.equal(lse[good], lse_fix[good])
    if corruption != "page":
        assert o[bad].isnan().all() and lse[bad].isnan().all()
    else:  # each row NaN, or what the fixed call gives it
        rows_nan = o[bad].isnan().all(-1)
        assert (rows_nan | (o[bad] == o_fix[bad]).all(-1)).all() and rows_nan.any()
    if page:
        blocks = fixed["block_table"].long()
        for new_cache, fix_cache, old in ((kc, kc_fix, caches[0]), (vc, vc_fix, caches[1])):
            assert torch.equal(new_cache[blocks[good]], fix_cache[blocks[good]])
            if corruption != "page":
                assert torch.equal(new_cache[blocks[bad]], old[blocks[bad]])
    else:
        for new_cache, fix_cache, old in ((kc, kc_fix, caches[0]), (vc, vc_fix, caches[1])):
            assert torch.equal(new_cache[good], fix_cache[good]) and torch.equal(new_cache[bad], old[bad])


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(causal=st.booleans(), left=st.sampled_from([-1, 0, 3, 17, 50]), right=st.sampled_from([-1, 0, 2, 30]),
       cap=st.sampled_from([0.0, 1.5]), sinks=st.booleans(), group=st.integers(1, 2), data=st.data())
def test_varlen_features_fuzz(device, causal, left, right, cap, sinks, group, data):
    """Packed batches with every combination of window, soft cap and sinks: O, LSE and the gradients (the sinks'
    too) against float64 per sequence, bottom-right."""
    from tests.helpers import assert_passes
    from xkernels.testing import compare, compare_grad, compare_lse, reference_attention_varlen
    from xkernels.testing import reference_attention_varlen_grads as ref_grads
    from xkernels.testing.inputs import uniform

    n = data.draw(st.integers(1, 3))
    lens_q = [data.draw(st.integers(0, 70)) for _ in range(n)]
    lens_k = [data.draw(st.integers(0, 70)) for _ in range(n)]
    window = (left, 0 if causal else right)
    g = torch.Generator(device=device).manual_seed(sum(lens_q) * 7 + sum(lens_k))
    q = (uniform((sum(lens_q), 2 * group, 64), torch.float16, device, g).float() * 4).half()
    k, v = (uniform((sum(lens_k), 2, 64), torch.float16, device, g) for _ in range(2))
    do = uniform(q.shape, torch.float16, device, g)
    sink = (torch.rand(2 * group, generator=torch.Generator().manual_seed(3)) * 3).to(device) if sinks else None
    cq, ck = (torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for x in (lens_q, lens_k))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sink.clone().requires_grad_()] if sinks else [])
    o, lse = xkernels.attention_varlen(*leaves[:3], cq, ck, max(lens_q), max(lens_k), is_causal=causal,
                                       window_size=window, softcap=cap, sinks=leaves[3] if sinks else None,
                                       return_lse=True)
    ref = dict(is_causal=causal, window=window, softcap=cap, sinks=sink)
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, **ref)
    seen = ~torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), ~seen)
    rec = ATTENTION_RECIPES["fp16"]
    checks = {"o": compare_attention(o, ref_o, rec), "lse": compare_lse(lse[seen], ref_lse[seen])}
    if q.shape[0] and k.shape[0]:
        grads = torch.autograd.grad(o, leaves, do)
        refs = ref_grads(q, k, v, do, cq, ck, **ref)
        checks |= {name: compare_grad(gr, r, rec)
                   for name, gr, r in zip(("dq", "dk", "dv"), grads[:3], refs[:3], strict=True)}
        if sinks:
            checks["dsinks"] = compare(grads[3], refs[3], rel_rms=1e-2)
    assert_passes(checks)
