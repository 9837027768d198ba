"""`xkernels.attention_with_kvcache`: decode and chunked prefill against a float64 reference over each sequence's
filled cache rows (causal aligned bottom-right), the in-place append, paged caches equal to dense ones, checks that
leave the cache untouched on bad input, and the op's registration."""

import dataclasses

import pytest
import torch

import xkernels
from xkernels import decode, kvcache, ops, plans, select, varlen
from xkernels.portable import configs as portable_configs
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, reference_attention, reference_attention_varlen
from xkernels.testing.inputs import uniform


@pytest.fixture(autouse=True)
def poisoned_output(monkeypatch):
    real = varlen.output_like
    monkeypatch.setattr(varlen, "output_like", lambda q: real(q).fill_(float("nan")))


@pytest.fixture(params=["combine kernel", "fused merge"])
def merge(request, monkeypatch):
    """How a split call's partials are merged: by the combine kernel (the shipped configs), or by the last split
    to finish each row block (`DecodeConfig.fused_combine`, opt-in), whose arrival counters must be back at zero
    for the next call. The partials' workspace starts as NaN, so a slot the merge reads unwritten shows."""
    if request.param == "fused merge":
        real = portable_configs.decode_config
        monkeypatch.setattr(portable_configs, "decode_config",
                            lambda *a, **k: dataclasses.replace(real(*a, **k), fused_combine=True))
    monkeypatch.setattr(decode, "_partials", lambda words, device: torch.full((words,), float("nan"), device=device))
    caches = (plans._PLANS, decode._PLANS, kvcache._RESOLVED)  # they hold the config
    for c in caches:
        c.clear()
    yield request.param
    for c in caches:
        c.clear()


def setup(device, *, batch=3, sq=2, new=2, s_max=48, hq=4, hkv=2, d=64, lengths=(5, 0, 30), seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = uniform((batch, sq, hq, d), torch.float16, device, g)
    k_cache = uniform((batch, s_max, hkv, d), torch.float16, device, g)
    v_cache = uniform((batch, s_max, hkv, d), torch.float16, device, g)
    k = uniform((batch, new, hkv, d), torch.float16, device, g) if new else None
    v = uniform((batch, new, hkv, d), torch.float16, device, g) if new else None
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, k, v, cache_seqlens


def reference(q, k_cache, v_cache, lengths, *, causal, window=(-1, -1)):
    """float64 O over rows [0, lengths[b]) of each sequence's (already updated) cache."""
    batch, sq, hq, d = q.shape
    keys = torch.cat([k_cache[b, :n] for b, n in enumerate(lengths)])
    values = torch.cat([v_cache[b, :n] for b, n in enumerate(lengths)])
    cu_q = torch.arange(batch + 1, dtype=torch.int32) * sq
    cu_k = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    o, _ = reference_attention_varlen(q.reshape(batch * sq, hq, d).cpu(), keys.cpu(), values.cpu(), cu_q, cu_k,
                                      is_causal=causal, window=window)
    return o.view(batch, sq, hq, d)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,new", [(1, 1), (1, 0), (4, 4), (3, 0)])
def test_dense_cache_matches_float64_and_appends_in_place(device, causal, sq, new):
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=sq, new=new)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v, is_causal=causal)
    filled = [n + new for n in lengths.tolist()]
    for b, n in enumerate(lengths.tolist()):  # new rows written, every other row untouched
        if new:
            assert torch.equal(k_cache[b, n:n + new], k[b]) and torch.equal(v_cache[b, n:n + new], v[b])
        keep = torch.ones(k_cache.shape[1], dtype=torch.bool)
        keep[n:n + new] = False
        assert torch.equal(k_cache[b, keep], before_k[b, keep]) and torch.equal(v_cache[b, keep], before_v[b, keep])
    c = compare_attention(o, reference(q, k_cache, v_cache, filled, causal=causal).to(o.device),
                          ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason


@pytest.mark.parametrize("page", [16, 32])
def test_paged_cache_equals_the_dense_cache(device, page):
    q, k_cache, v_cache, k, v, lengths = setup(device, s_max=64, new=3, sq=3)
    batch, s_max, hkv, d = k_cache.shape
    per_seq = s_max // page
    perm = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(1))
    block_table = perm.view(batch, per_seq).to(torch.int32).to(device)
    paged_k = torch.empty((batch * per_seq, page, hkv, d), dtype=k_cache.dtype, device=device)
    paged_v = torch.empty_like(paged_k)
    paged_k[block_table.long()] = k_cache.view(batch, per_seq, page, hkv, d)
    paged_v[block_table.long()] = v_cache.view(batch, per_seq, page, hkv, d)
    dense = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v)
    paged = xkernels.attention_with_kvcache(q, paged_k, paged_v, cache_seqlens=lengths, k=k, v=v,
                                            block_table=block_table)
    assert torch.equal(paged, dense)
    assert torch.equal(paged_k[block_table.long()].view_as(k_cache), k_cache)  # the same rows appended


def test_lse_shape_and_values(device):
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=2, new=0, lengths=(6, 9, 40))
    o, lse = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, return_lse=True)
    assert lse.shape == (3, 4, 2) and lse.dtype == torch.float32
    s = torch.einsum("qhd,khd->hqk", q[2].double().cpu(), k_cache[2, :40].double().cpu().repeat_interleave(2, 1)) / 8
    i = torch.arange(2)[:, None]
    s = s.masked_fill(torch.arange(40)[None, :] > i + 38, float("-inf"))
    torch.testing.assert_close(lse[2].double().cpu(), torch.logsumexp(s, -1).cpu(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("which", ["q", "k_cache", "v_cache", "k"])
@pytest.mark.parametrize("append", [False, True])
def test_an_input_that_requires_grad_is_refused_on_every_path(device, which, append):
    """An inference op: a q, cache or new token that requires grad raises naming it, whether tokens are appended
    (the op through the dispatcher) or not (a plain eager call may run the kernel directly, past autograd), and
    nothing is written; under no_grad the same call runs."""
    if which == "k" and not append:
        pytest.skip("no tokens to append")
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=1, new=1)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=lengths, k=k if append else None,
                v=v if append else None)
    before = k_cache.clone()
    args[which] = args[which].detach().requires_grad_()
    with pytest.raises(ValueError, match=f"{which}: requires grad"):
        xkernels.attention_with_kvcache(**args)
    assert torch.equal(k_cache, before)
    with torch.no_grad():
        o = xkernels.attention_with_kvcache(**args)
    assert not o.requires_grad and torch.isfinite(o).all()


@pytest.mark.parametrize("case,match", [
    ("too_short", "cache_seqlens: 47 cached \\+ 2 new tokens exceed"),
    ("negative", "cache_seqlens: negative"),
    ("page_table", "block_table: entries outside"),
    ("page_size", "page size 8 is not a power of two from 16 to 256"),
    ("k_only", "k, v: pass both"),
    ("seqlens_dtype", "cache_seqlens: expected int32"),
    ("hopper", "backend: 'hopper' was forced"),
    ("leftpad_past_end", "cache_leftpad: values"),
    ("leftpad_paged", "cache_leftpad: a left-padded cache must be dense"),
    ("no_blocks", "k_cache: a paged cache with no blocks"),
])
def test_bad_input_names_the_argument_and_leaves_the_cache(device, case, match):
    q, k_cache, v_cache, k, v, lengths = setup(device)
    kwargs = dict(cache_seqlens=lengths, k=k, v=v)
    if case == "too_short":
        kwargs["cache_seqlens"] = torch.tensor([5, 47, 3], dtype=torch.int32, device=device)
    elif case == "negative":
        kwargs["cache_seqlens"] = torch.tensor([5, -1, 3], dtype=torch.int32, device=device)
    elif case in ("page_table", "page_size"):
        page = 16 if case == "page_table" else 8
        k_cache = k_cache.reshape(-1, page, *k_cache.shape[2:])
        v_cache = v_cache.reshape(-1, page, *v_cache.shape[2:])
        table = torch.zeros((3, 48 // page), dtype=torch.int32, device=device)
        table[0, 0] = k_cache.shape[0]  # one past the last block
        kwargs["block_table"] = table
    elif case == "k_only":
        kwargs["v"] = None
    elif case == "seqlens_dtype":
        kwargs["cache_seqlens"] = lengths.long()
    elif case == "leftpad_past_end":
        kwargs["cache_leftpad"] = torch.tensor([0, 1, 0], dtype=torch.int32, device=device)  # sequence 1 has 0
    elif case == "leftpad_paged":
        k_cache = k_cache.reshape(-1, 16, *k_cache.shape[2:])
        v_cache = v_cache.reshape(-1, 16, *v_cache.shape[2:])
        kwargs["block_table"] = torch.arange(9, dtype=torch.int32, device=device).view(3, 3)
        kwargs["cache_leftpad"] = torch.zeros(3, dtype=torch.int32, device=device)
    elif case == "no_blocks":
        k_cache = k_cache.reshape(-1, 16, *k_cache.shape[2:])[:0]
        v_cache = v_cache.reshape(-1, 16, *v_cache.shape[2:])[:0]
        kwargs.update(block_table=torch.zeros((3, 3), dtype=torch.int32, device=device), sync_checks=False)
    else:
        kwargs["backend"] = "hopper"
    before = k_cache.clone(), v_cache.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        xkernels.attention_with_kvcache(q, k_cache, v_cache, **kwargs)
    assert torch.equal(before[0], k_cache) and torch.equal(before[1], v_cache)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", ["too_short", "negative", "page_table", "leftpad_past_end", "strided"])
def test_unsynced_checks_isolate_a_bad_sequence(device, case, splits, merge):
    """sync_checks=False (and CUDA-graph capture): no read to the host; the kernels check each sequence's values as
    they read them. The bad sequence gets nothing written (strided caches included) and NaN outputs, whether the
    attention kernel writes them (one split) or the merge of its splits does; the other sequences get exactly what
    a call with the bad value fixed gives them, appends included."""
    q, k_cache, v_cache, k, v, lengths = setup(device)
    kwargs = dict(cache_seqlens=lengths, k=k, v=v, return_lse=True, num_splits=splits)
    fixed = dict(kwargs)
    bad = 1
    i32 = dict(dtype=torch.int32, device=device)
    if case in ("too_short", "strided"):
        kwargs["cache_seqlens"] = torch.tensor([5, 47, 3], **i32)  # 47 + 2 new > 48
        fixed["cache_seqlens"] = torch.tensor([5, 0, 3], **i32)
    elif case == "negative":
        kwargs["cache_seqlens"] = torch.tensor([5, -1, 3], **i32)
        fixed["cache_seqlens"] = torch.tensor([5, 0, 3], **i32)
    elif case == "page_table":
        bad = 0
        k_cache = k_cache.reshape(-1, 16, *k_cache.shape[2:])
        v_cache = v_cache.reshape(-1, 16, *v_cache.shape[2:])
        fixed["block_table"] = torch.arange(9, **i32).view(3, 3)
        kwargs["block_table"] = fixed["block_table"].clone()
        kwargs["block_table"][0, 0] = k_cache.shape[0]  # one past the last block
    else:
        kwargs["cache_leftpad"] = torch.tensor([0, 1, 0], **i32)  # past sequence 1's 0 keys
        fixed["cache_leftpad"] = torch.tensor([0, 0, 0], **i32)
    if case == "strided":  # head-dim rows strided
        k_cache = torch.stack([k_cache, k_cache], -1)[..., 0]
        v_cache = torch.stack([v_cache, v_cache], -1)[..., 0]
    runs = []
    for args in (kwargs, fixed):
        caches = (k_cache.clone(), v_cache.clone())
        runs.append((*xkernels.attention_with_kvcache(q, *caches, sync_checks=False, **args), *caches))
    (o, lse, k_bad, v_bad), (o_fix, lse_fix, k_fix, v_fix) = runs
    good = [b for b in range(3) if b != bad]
    assert o[bad].isnan().all() and lse[bad].isnan().all()
    assert not o[good].isnan().any() and torch.equal(o[good], o_fix[good]) and torch.equal(lse[good], lse_fix[good])
    blocks = fixed["block_table"].long() if case == "page_table" else torch.arange(3, device=device)[:, None]
    for new_cache, fix_cache, old in ((k_bad, k_fix, k_cache), (v_bad, v_fix, v_cache)):
        assert torch.equal(new_cache[blocks[good]], fix_cache[blocks[good]])  # the good sequences' appends
        assert torch.equal(new_cache[blocks[bad]], old[blocks[bad]])  # nothing of the bad one's
    assert not torch.equal(k_bad, k_cache)
    with pytest.raises(ValueError):  # the same call, synchronized, names the argument
        xkernels.attention_with_kvcache(q, k_cache, v_cache, **kwargs)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("paged", [False, True])
def test_unsynced_checks_on_good_values_match_the_synced_call(device, paged, splits, merge):
    q, k_cache, v_cache, k, v, lengths = setup(device)
    kwargs = dict(cache_seqlens=lengths, return_lse=True, num_splits=splits)
    if paged:
        kwargs["block_table"] = torch.arange(9, dtype=torch.int32, device=device).view(3, 3).flip(1)
        k_cache = k_cache.reshape(-1, 16, *k_cache.shape[2:])
        v_cache = v_cache.reshape(-1, 16, *v_cache.shape[2:])
    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    o1, lse1 = xkernels.attention_with_kvcache(q, *caches[0], k=k, v=v, **kwargs)
    o2, lse2 = xkernels.attention_with_kvcache(q, *caches[1], k=k, v=v, sync_checks=False, **kwargs)
    assert not o1.isnan().any()
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    assert not torch.equal(caches[0][0], k_cache)  # the append happened


def test_opcheck_and_compile(device):
    q, k_cache, v_cache, k, v, lengths = setup(device)
    for sync in (True, False):
        torch.library.opcheck(ops.attention_with_kvcache_op,
                              (q, k_cache.clone(), v_cache.clone(), lengths, k, v, None, None, True, None, "auto", True,
                               0, sync, -1, -1, "auto"))

    def step(q, k_cache, v_cache, k, v):
        return xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v)

    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    want = step(q, eager_k, eager_v, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    got = compiled(q, k_cache, v_cache, k, v)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v)  # the append happened under compile too


def paged_copy(cache, page, generator):
    """A paged cache holding `cache` (B, S_max, Hkv, D) in shuffled blocks, two spare NaN blocks, and its block
    table (every entry a valid block: callers set the entries a sequence does not reach to -1 where they test it)."""
    batch, s_max = cache.shape[:2]
    per_seq = s_max // page
    perm = torch.randperm(batch * per_seq + 2, generator=generator)[:batch * per_seq]
    table = perm.view(batch, per_seq).to(torch.int32).to(cache.device)
    paged = torch.full((batch * per_seq + 2, page, *cache.shape[2:]), float("nan"), dtype=cache.dtype,
                       device=cache.device)
    paged[table.long()] = cache.view(batch, per_seq, page, *cache.shape[2:])
    return paged, table


@pytest.mark.parametrize("page", [None, 16, 64, pytest.param(256, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("splits", [1, 4, 0])
@pytest.mark.parametrize("causal,sq", [(True, 1), (True, 5), (False, 3)])
def test_split_kv_paged_and_dense_match_float64(device, page, splits, causal, sq, merge):
    """Key splits merged through their LSEs, pages smaller and larger than a key tile, rows past each sequence's
    length holding NaN (never read), GQA heads packed into one tile (Hq 8 / Hkv 2), an empty sequence."""
    g = torch.Generator().manual_seed(3)
    s_max = 128 if device == "cpu" else 512  # four key tiles of the interpreter's and the H200's configs
    q, k_cache, v_cache, _, _, lengths = setup(device, batch=4, sq=sq, new=0, s_max=s_max, hq=8, hkv=2,
                                               lengths=(0, s_max, s_max * 3 // 5, 3))
    for b, n in enumerate(lengths.tolist()):  # unfilled rows: NaN, so a read of one shows in O
        k_cache[b, n:] = float("nan")
        v_cache[b, n:] = float("nan")
    table = None
    kc, vc = k_cache, v_cache
    if page is not None:
        kc, table = paged_copy(k_cache, page, g)
        vc = paged_copy(v_cache, page, g)[0]
        vc[table.long()] = v_cache.view(4, -1, page, *v_cache.shape[2:])
        for b, n in enumerate(lengths.tolist()):
            table[b, -(-n // page):] = -1  # pages a sequence does not reach point nowhere
    o, lse = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table, is_causal=causal,
                                             num_splits=splits, return_lse=True)
    want = reference(q, k_cache, v_cache, lengths.tolist(), causal=causal).to(o.device)
    assert torch.equal(o[0], torch.zeros_like(o[0])) and torch.isinf(lse[0]).all()  # no key: O = 0, LSE = -inf
    c = compare_attention(o[1:], want[1:], ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason
    assert xkernels.last_backend().startswith("portable.decode")
    assert ("-fc" in xkernels.last_backend()) == (merge == "fused merge")  # the config's name
    if splits:
        assert f"splits={splits}" in xkernels.last_backend()


@pytest.mark.parametrize("page", [None, 16])
def test_many_splits_merge_in_chunks(device, page, merge):
    """37 key splits (past the combine kernel's chunks of 16 splits a load, its last chunk part empty), a sequence
    whose later splits see no key, an empty one, and a row block of 2 packed query heads."""
    g = torch.Generator().manual_seed(5)
    tile = portable_configs.decode_config(64, select._target(torch.device(device))).block_n
    s_max = 37 * tile  # one tile per split
    q, k_cache, v_cache, _, _, lengths = setup(device, batch=3, sq=1, new=0, s_max=s_max, hq=4, hkv=2,
                                               lengths=(s_max, 0, 5 * tile + 3))
    # sequence 0's last split scores ~120 above the others for query heads 0 and 2: merged against a maximum that
    # missed it (one chunk's), its weight would overflow fp32
    k_cache[0, -tile:] = 60 * q[0, 0, ::2].sign()
    table, kc, vc = None, k_cache, v_cache
    if page is not None:
        kc, table = paged_copy(k_cache, page, g)
        vc = paged_copy(v_cache, page, g)[0]
        vc[table.long()] = v_cache.view(3, -1, page, *v_cache.shape[2:])
    o, lse = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths, block_table=table, num_splits=37,
                                             return_lse=True)
    assert "splits=37" in xkernels.last_backend()
    want = reference(q, k_cache, v_cache, lengths.tolist(), causal=True).to(o.device)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.isinf(lse[1]).all()
    for b in (0, 2):
        c = compare_attention(o[b:b + 1], want[b:b + 1], ATTENTION_RECIPES["fp16"])
        assert c.passed, (b, c.reason)
    q64 = q.double().transpose(1, 2)
    for b, n in ((0, s_max), (2, 5 * tile + 3)):  # the LSE too: each row's log-sum-exp over its keys, float64
        scores = q64[b] @ k_cache[b, :n].double().permute(1, 2, 0).repeat_interleave(2, 0) / 8
        torch.testing.assert_close(lse[b].double().cpu(), scores.logsumexp(-1).cpu(), rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("strided", ["none", "new", "cache"])
def test_append_writes_exactly_the_new_rows(device, strided):
    """The append kernel writes exactly the new rows, whatever the strides of the new keys or of the cache (head-dim
    stride 2 here)."""
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=3, new=3)
    if strided == "new":
        k = torch.stack([k, torch.zeros_like(k)], -1)[..., 0]  # last stride 2
        v = torch.stack([v, torch.zeros_like(v)], -1)[..., 0]
        assert k.stride(-1) == 2
    elif strided == "cache":
        k_cache = torch.stack([k_cache, torch.zeros_like(k_cache)], -1)[..., 0]
        v_cache = torch.stack([v_cache, torch.zeros_like(v_cache)], -1)[..., 0]
        assert k_cache.stride(-1) == 2
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths.tolist()):
        want_k[b, n:n + 3], want_v[b, n:n + 3] = k[b], v[b]
    xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("sq,new", [(1, 1), (3, 0)])
@pytest.mark.parametrize("splits", [1, 3])
def test_left_padded_cache_attends_from_each_first_key(device, sq, new, splits):
    """cache_leftpad (flash_attn's): sequence b attends cache rows leftpad[b] .. cache_seqlens[b] + new, causal
    aligned to the end; the rows before its first key hold NaN and are never read."""
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=sq, new=new, s_max=96, lengths=(40, 7, 90 - new))
    pad = torch.tensor([13, 0, 61], dtype=torch.int32, device=device)
    for b, p in enumerate(pad.tolist()):
        k_cache[b, :p] = float("nan")
        v_cache[b, :p] = float("nan")
    o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v, cache_leftpad=pad,
                                        num_splits=splits)
    shifted_k = torch.stack([k_cache[b].roll(-p, 0) for b, p in enumerate(pad.tolist())])
    shifted_v = torch.stack([v_cache[b].roll(-p, 0) for b, p in enumerate(pad.tolist())])
    filled = [n + new - p for n, p in zip(lengths.tolist(), pad.tolist(), strict=True)]
    want = reference(q, shifted_k, shifted_v, filled, causal=True).to(o.device)
    c = compare_attention(o, want, ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_prefill_spans_several_row_blocks(device, causal):
    """24 new tokens x a GQA group of 4 = 96 packed rows: several row blocks per (sequence, kv head), each with its
    own causal limits, and key splits."""
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=24, new=24, s_max=160, hq=8, hkv=2, lengths=(0, 100, 17))
    o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v, is_causal=causal,
                                        num_splits=2)
    filled = [n + 24 for n in lengths.tolist()]
    c = compare_attention(o, reference(q, k_cache, v_cache, filled, causal=causal).to(o.device),
                          ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason
    assert "splits=2" in xkernels.last_backend()


def test_checks_fail_on_a_broken_decode(device):
    """The same float64 comparison rejects the likeliest decode bugs, each made with the real op: a page table read
    as if the blocks were in order, the left pad ignored, and one key split of several kept without the merge."""
    g = torch.Generator().manual_seed(11)
    q, k_cache, v_cache, _, _, lengths = setup(device, batch=2, sq=1, new=0, s_max=128, hq=4, hkv=2,
                                               lengths=(128, 90))
    want = reference(q, k_cache, v_cache, lengths.tolist(), causal=True).to(q.device)
    recipe = ATTENTION_RECIPES["fp16"]
    paged_k, table = paged_copy(k_cache, 16, g)
    paged_v = torch.empty_like(paged_k)
    paged_v[table.long()] = v_cache.view(2, -1, 16, *v_cache.shape[2:])
    ok = xkernels.attention_with_kvcache(q, paged_k, paged_v, cache_seqlens=lengths, block_table=table)
    assert compare_attention(ok, want, recipe).passed
    in_order = torch.arange(table.numel(), dtype=torch.int32, device=device).view_as(table)
    paged_in_order = xkernels.attention_with_kvcache(q, paged_k, paged_v, cache_seqlens=lengths, block_table=in_order)
    assert not compare_attention(paged_in_order, want, recipe).passed
    pad = torch.tensor([0, 40], dtype=torch.int32, device=device)
    shifted = [k_cache[b].roll(-p, 0) for b, p in enumerate(pad.tolist())]
    want_pad = reference(q, torch.stack(shifted), torch.stack([v_cache[b].roll(-p, 0) for b, p in
                                                              enumerate(pad.tolist())]), [128, 50], causal=True)
    no_pad = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert not compare_attention(no_pad, want_pad.to(q.device), recipe).passed
    last_split_only = xkernels.attention_with_kvcache(q, k_cache[:, 96:], v_cache[:, 96:],
                                                      cache_seqlens=(lengths - 96).clamp(min=0))
    assert not compare_attention(last_split_only, want, recipe).passed


@pytest.mark.parametrize("causal,window", [(True, (37, 0)), (True, (0, -1)), (False, (20, 9)), (False, (-1, 5))])
@pytest.mark.parametrize("page,sq", [(0, 1), (16, 1), (0, 5), (16, 5), (64, 1), (64, 5)])
def test_sliding_window_matches_float64_and_reads_only_its_window(device, causal, window, page, sq):
    """window_size=(left, right), flash_attn_with_kvcache's: query at position p sees keys p - left .. p (causal) or
    .. p + right. The cache rows before the first query's window are NaN here: the kernel never reads them (the
    splits cut the window only), so the output stays finite and right."""
    lengths = (300, 41, 7)
    q, k_cache, v_cache, _, _, seqlens = setup(device, sq=sq, new=0, s_max=320, lengths=lengths, seed=3)
    if window[0] >= 0:
        for b, n in enumerate(lengths):
            first = max(n - sq - window[0], 0)  # the first query's first key
            k_cache[b, :first] = float("nan")
            v_cache[b, :first] = float("nan")
    table = None
    kc, vc = k_cache, v_cache
    if page:
        per_seq = 320 // page
        table = torch.randperm(3 * per_seq, generator=torch.Generator().manual_seed(1)).view(3, per_seq)
        table = table.to(torch.int32).to(device)
        kc = torch.empty((3 * per_seq, page, 2, 64), dtype=k_cache.dtype, device=device)
        vc = torch.empty_like(kc)
        kc[table.long()] = k_cache.view(3, per_seq, page, 2, 64)
        vc[table.long()] = v_cache.view(3, per_seq, page, 2, 64)
    o = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, is_causal=causal,
                                        window_size=window)
    assert "window" in xkernels.last_backend()
    ref = reference(q, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), lengths, causal=causal, window=window)
    c = compare_attention(o, ref.to(o.device), ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason


@pytest.mark.parametrize("window,causal", [((3, 2**31 - 1), False), ((2**31 - 1, 0), True), ((-1, 2**31 - 1), False)])
def test_window_sides_longer_than_the_cache_are_unbounded(device, window, causal):
    """A side near 2^31 (int32 in the kernel) is the same as -1: the positions never wrap."""
    q, k_cache, v_cache, _, _, seqlens = setup(device, sq=4, new=0, lengths=(40, 3, 12))
    o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, is_causal=causal,
                                        window_size=window)
    bounded = tuple(-1 if side > 1000 else side for side in window)
    ref = reference(q, k_cache, v_cache, (40, 3, 12), causal=causal, window=bounded)
    c = compare_attention(o, ref.to(o.device), ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason


@pytest.mark.parametrize("window,causal,exc,match", [
    ((4,), True, TypeError, "window_size: expected a"), ((4, 2.0), False, TypeError, "window_size"),
    ((-2, 0), True, ValueError, "below -1"), ((4, 3), True, ValueError, "right = 3 with is_causal")])
def test_bad_window_names_the_argument(device, window, causal, exc, match):
    q, k_cache, v_cache, _, _, seqlens = setup(device, new=0)
    with pytest.raises(exc, match=match):
        xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, is_causal=causal,
                                        window_size=window)


def test_resolved_calls_keep_checking_and_hold_no_tensor(device):
    """The per-metadata cache of the checks (`kvcache._resolve`): a call whose metadata differs is checked again, and
    nothing of a call's tensors outlives it."""
    import gc
    import weakref

    q, k_cache, v_cache, k, v, lengths = setup(device)
    xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v)
    with pytest.raises(ValueError, match="cache_seqlens: expected int32"):
        xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths.long(), k=k, v=v)
    with pytest.raises(ValueError, match="k: expected"):
        xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k[:, :, :1], v=v[:, :, :1])
    refs = [weakref.ref(t) for t in (q, k_cache, v_cache, k, v, lengths)]
    del q, k_cache, v_cache, k, v, lengths
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("sync", [True, False])
def test_a_length_near_int32_max_is_caught(device, sync):
    """cache_seqlens + new wraps in int32 for a length near 2^31: the checks compare against capacity - new, so the
    call raises (synchronized) or writes nothing and returns NaN for that sequence (not a write at row 2^31 - 1)."""
    q, k_cache, v_cache, k, v, _ = setup(device)
    lengths = torch.tensor([5, 2**31 - 1, 3], dtype=torch.int32, device=device)
    before = k_cache.clone()
    if sync:
        with pytest.raises(ValueError, match="cache_seqlens"):
            xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v)
        assert torch.equal(k_cache, before)
        return
    o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k=k, v=v, sync_checks=False)
    assert o[1].isnan().all() and not o[[0, 2]].isnan().any()
    assert torch.equal(k_cache[1], before[1])


def test_a_bad_page_in_another_sequences_place_does_not_touch_it(device):
    """A strided paged cache: sequence 1's bad block id must not be redirected onto sequence 0's block (where its
    write-back of old rows would race sequence 0's append); sequence 0 is served as with a good table."""
    g = torch.Generator(device=device).manual_seed(5)
    q = uniform((2, 1, 2, 64), torch.float16, device, g)
    k, v = (uniform((2, 2, 2, 64), torch.float16, device, g) for _ in range(2))
    base = uniform((4, 16, 2, 64), torch.float16, device, g)
    lengths = torch.tensor([5, 5], dtype=torch.int32, device=device)
    runs = []
    for table in ([[0, 1], [-1, 3]], [[0, 1], [2, 3]]):  # bad, fixed
        caches = [torch.stack([base, base], -1)[..., 0] for _ in range(2)]  # head-dim stride 2
        o = xkernels.attention_with_kvcache(q, *caches, cache_seqlens=lengths, k=k, v=v, sync_checks=False,
                                            block_table=torch.tensor(table, dtype=torch.int32, device=device))
        runs.append((o, caches[0]))
    (o_bad, k_bad), (o_fix, k_fix) = runs
    assert torch.equal(k_bad[0, 5:7], k[0]) and torch.equal(k_bad[0], k_fix[0])
    assert torch.equal(o_bad[0], o_fix[0]) and o_bad[1].isnan().all()
    assert torch.equal(k_bad[2:], base[2:])  # sequence 1's real pages untouched


def test_a_bad_page_outside_the_window_is_never_used(device):
    """The kernels check the values they use: a bad block id in a page the sliding window never reaches is not read,
    so the outputs are the correct ones (those of a good table) and the new tokens land in their good page; the
    synchronized call, which checks every page below the length, raises."""
    g = torch.Generator(device=device).manual_seed(6)
    q, k, v = (uniform((1, 4, 2, 64), torch.float16, device, g) for _ in range(3))
    base = uniform((4, 16, 2, 64), torch.float16, device, g)
    lengths = torch.tensor([20], dtype=torch.int32, device=device)  # positions 20..23 new: page 1
    runs = []
    for table in ([[99, 1]], [[0, 1]]):  # page 0 bad, fixed
        caches = [base.clone(), base.clone()]
        kwargs = dict(cache_seqlens=lengths, k=k, v=v, window_size=(2, 0),
                      block_table=torch.tensor(table, dtype=torch.int32, device=device))
        runs.append((xkernels.attention_with_kvcache(q, *caches, sync_checks=False, **kwargs), caches[0]))
    (o_bad, k_bad), (o_fix, k_fix) = runs
    assert not o_bad.isnan().any() and torch.equal(o_bad, o_fix) and torch.equal(k_bad, k_fix)
    with pytest.raises(ValueError, match="block_table"):
        xkernels.attention_with_kvcache(q, base.clone(), base.clone(), **kwargs | dict(block_table=torch.tensor(
            [[99, 1]], dtype=torch.int32, device=device)))


@pytest.mark.parametrize("page", [16, 64])
def test_page_offsets_past_int32_are_served(device, page):
    """A strided paged cache whose offset inside a page, (page - 1) x row stride, passes 2^31 elements: the plan
    takes the kernel's 64-bit variant (the int32 one would read ~2^32 elements before the cache). A ~4.3 GB view over
    two blocks, of which only the rows read are touched."""
    h, d, blocks = 1, 64, 2
    row_stride = ((2**31) // (page - 1) // 16 + 16) * 16
    storage = torch.empty((blocks - 1) * h * d + (page - 1) * row_stride + h * d, dtype=torch.float16, device=device)
    cache = storage.as_strided((blocks, page, h, d), (h * d, row_stride, d, 1))
    g = torch.Generator().manual_seed(0)
    values = torch.randn(blocks, page, h, d, generator=g).half().to(device)
    cache.copy_(values)
    q = torch.randn(1, 1, h, d, generator=g).half().to(device)
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=device)
    lengths = torch.tensor([page * blocks], dtype=torch.int32, device=device)
    o = xkernels.attention_with_kvcache(q, cache, cache, cache_seqlens=lengths, block_table=table, sync_checks=False)
    keys = values.view(1, blocks * page, h, d).transpose(1, 2)
    want = reference_attention(q.transpose(1, 2), keys, keys).transpose(1, 2)
    c = compare_attention(o, want.to(o.device), ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason


@pytest.mark.parametrize("return_lse", [True, False])
def test_fused_merge_leaves_its_counters_at_zero(device, merge, return_lse):
    """After split calls, windowed or not, with or without the LSE, every kept arrival counter is back at zero (the
    next launch on the stream counts from there), and O matches float64."""
    from xkernels.common import scratch

    q, k_cache, v_cache, k, v, lengths = setup(device, sq=1)
    for window in ((-1, -1), (7, 0)):
        o = xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, num_splits=3,
                                            window_size=window, return_lse=return_lse)
        o = o[0] if return_lse else o
        want = reference(q, k_cache, v_cache, lengths.tolist(), causal=True, window=window).to(o.device)
        c = compare_attention(o[lengths > 0], want[lengths.cpu() > 0], ATTENTION_RECIPES["fp16"])
        assert c.passed, (window, c.reason)
        for kept in scratch._SETS.values():
            assert not kept.counters.any()


@pytest.mark.parametrize("window", [(-1, -1), (9, 0)])
def test_block_ids_read_before_or_inside_the_key_loop_agree(device, monkeypatch, window):
    """A split's block ids read once before its key loop (`DecodeConfig.preload_ids`: the shipped D128 config on
    sm_90, the interpreter's) and each tile's ids read one tile ahead inside it (a split with more pages than that)
    give the same O, bitwise, matching float64; a bad id in either mode makes its sequence's rows NaN and leaves
    the others' as they were."""
    g = torch.Generator().manual_seed(9)
    s_max = 128 if device == "cpu" else 1024
    q, k_cache, v_cache, _, _, lengths = setup(device, batch=4, sq=3, new=0, s_max=s_max, hq=8, hkv=2,
                                               lengths=(s_max, 0, s_max * 3 // 5, 19))
    kc, table = paged_copy(k_cache, 16, g)
    vc = torch.empty_like(kc)
    vc[table.long()] = v_cache.view(4, -1, 16, *v_cache.shape[2:])
    bad = table.clone()
    bad[2, (int(lengths[2]) - 1) // 16] = kc.shape[0] + 5  # sequence 2's last page (in every window): outside
    unread = table.clone()  # bad ids only on pages no key of the call is read from
    unread[3, 2:] = -1  # past sequence 3's 19 keys
    unread[1, :] = kc.shape[0] + 7  # sequence 1 has no key
    if window[0] >= 0:  # sequence 0's rows see keys from s_max - 3 - 9 on; the page before that key's page lies
        # below the window but inside the first key tile the split walks (tiles start at a multiple of BLOCK_N)
        unread[0, (s_max - 12) // 16 - 1] = -5
    real = portable_configs.decode_config
    runs = {}
    for preload in (1 << 12, 0):
        monkeypatch.setattr(portable_configs, "decode_config",
                            lambda *a, n=preload, **k: dataclasses.replace(real(*a, **k), preload_ids=n))
        for c in (plans._PLANS, decode._PLANS, kvcache._RESOLVED):
            c.clear()
        kwargs = dict(cache_seqlens=lengths, is_causal=True, num_splits=2, window_size=window, sync_checks=False)
        good = xkernels.attention_with_kvcache(q, kc, vc, block_table=table, **kwargs)
        assert [p.constexprs["PAGE_IDS"] > 0 for p in decode._PLANS.values()] == [bool(preload)]
        runs[preload] = (good, xkernels.attention_with_kvcache(q, kc, vc, block_table=bad, **kwargs))
        assert torch.equal(xkernels.attention_with_kvcache(q, kc, vc, block_table=unread, **kwargs), good)
    (good, broken), (good_loop, broken_loop) = runs.values()
    assert torch.equal(good, good_loop) and torch.equal(broken.isnan(), broken_loop.isnan())
    want = reference(q, k_cache, v_cache, lengths.tolist(), causal=True, window=window).to(good.device)
    c = compare_attention(good[[0, 2, 3]], want[[0, 2, 3]], ATTENTION_RECIPES["fp16"])
    assert c.passed, c.reason
    for o in (broken, broken_loop):
        assert o[2].isnan().all() and torch.equal(o[[0, 1, 3]], good[[0, 1, 3]])


def test_an_append_refuses_arguments_that_alias_the_caches(device):
    """The append writes k_cache and v_cache in place, so a cache passed as both, an expanded cache (several rows
    in one memory), new k/v or q that live inside a cache are refused by name, and nothing is written; without an
    append the same caches are only read and are accepted."""
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=1, new=2)
    expanded = k_cache[:, :1].expand(k_cache.shape)
    cases = {"v_cache: overlaps k_cache": (q, k_cache, k_cache, k, v),
             "k_cache: several of its elements": (q, expanded, v_cache, k, v),
             "k: overlaps the cache": (q, k_cache, v_cache, k_cache[:, 4:6], v),
             "v: overlaps the cache": (q, k_cache, v_cache, k, v_cache[:, 4:6])}
    # q inside a cache: a view of the cache's rows with q's shape (hq = 2 * hkv here)
    cases["q: overlaps the cache"] = (k_cache.view(k_cache.shape[0], -1, k_cache.shape[-1])[:, None, :q.shape[2]],
                                      k_cache, v_cache, k, v)
    for match, (qq, kc, vc, kk, vv) in cases.items():
        before = (kc.clone(), vc.clone(), kk.clone())
        with pytest.raises(ValueError, match=match):
            xkernels.attention_with_kvcache(qq, kc, vc, cache_seqlens=lengths, k=kk, v=vv)
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1]) and torch.equal(kk, before[2])
    o = xkernels.attention_with_kvcache(q, k_cache, k_cache, cache_seqlens=lengths)  # read only: fine
    want = reference(q, k_cache, k_cache, lengths.tolist(), causal=True).to(o.device)
    good = [b for b, n in enumerate(lengths.tolist()) if n > 0]
    assert compare_attention(o[good], want[good], ATTENTION_RECIPES["fp16"]).passed


@pytest.mark.parametrize("page", [None, 16])
def test_an_append_into_interleaved_caches_of_one_buffer(device, page):
    """K and V as the interleaved halves of one buffer (kv[:, :, 0] and kv[:, :, 1], dense or paged): their address
    ranges meet but no element is in both, so the append runs, and writes and attends as into two separate caches;
    halves of one buffer that do share elements (one row apart) are still refused, with nothing written."""
    q, k_cache, v_cache, k, v, lengths = setup(device, sq=2, new=2, s_max=32)
    kv = torch.stack([k_cache, v_cache], 2)  # (B, S_max, 2, Hkv, D)
    table = None
    if page is not None:
        g = torch.Generator(device=device).manual_seed(5)
        paged, table = paged_copy(kv.flatten(2, 3), page, g)
        kv = paged.unflatten(2, (2, k_cache.shape[2]))
    separate = (kv[:, :, 0].clone(), kv[:, :, 1].clone())
    o = xkernels.attention_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], cache_seqlens=lengths, k=k, v=v,
                                        block_table=table)
    want = xkernels.attention_with_kvcache(q, *separate, cache_seqlens=lengths, k=k, v=v, block_table=table)
    assert torch.equal(o, want)
    for half, cache in zip((0, 1), separate, strict=True):
        assert torch.equal(kv[:, :, half].nan_to_num(7.0), cache.nan_to_num(7.0))
    if page is None:  # the layout-agnostic check, on dense halves one row apart (31 rows each)
        before, short = kv.clone(), torch.tensor([5, 0, 20], dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match="v_cache: overlaps k_cache"):
            xkernels.attention_with_kvcache(q, kv[:, 1:, 0], kv[:, :-1, 0], cache_seqlens=short, k=k, v=v)
        assert torch.equal(kv, before)
