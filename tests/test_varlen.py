"""`xkernels.attention_varlen`: packed variable-length sequences against float64 references per sequence (causal
aligned bottom-right), GQA, empty sequences, rows that see no key, LSE, NaN-poisoned outputs, bad inputs, and the
op's registration (opcheck, torch.compile)."""

import math

import pytest
import torch

import xkernels
from xkernels import ops, varlen
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, compare_lse, reference_attention_varlen
from xkernels.testing.inputs import uniform


@pytest.fixture(autouse=True)
def poisoned_output(monkeypatch):
    real = varlen.output_like
    monkeypatch.setattr(varlen, "output_like", lambda q: real(q).fill_(float("nan")))


def packed(lens_q, lens_k, hq, hkv, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = uniform((sum(lens_q), hq, d), dtype, device, g)
    k = uniform((sum(lens_k), hkv, d), dtype, device, g)
    v = uniform((sum(lens_k), hkv, d), dtype, device, g)

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    return q, k, v, cu(lens_q), cu(lens_k)


def _check(device, lens_q, lens_k, *, causal, dtype=torch.float16, hq=4, hkv=2, d=64, scale=None,
           precision="auto"):
    q, k, v, cq, ck = packed(lens_q, lens_k, hq, hkv, d, dtype, device, seed=len(lens_q))
    o, lse = xkernels.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), is_causal=causal, scale=scale,
                                       return_lse=True, precision=precision)
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal, scale=scale)
    auto = "fp16" if dtype == torch.float16 else "bf16"
    recipe = ATTENTION_RECIPES[auto if precision == "auto" else precision]
    c = compare_attention(o, ref_o, recipe)
    assert c.passed, c.reason
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty), "rows that see no key have LSE -inf, and only they"
    assert (o.transpose(0, 1)[empty] == 0).all(), "rows that see no key are 0"
    c_lse = compare_lse(lse[~empty], ref_lse[~empty])
    assert c_lse.passed, c_lse.reason


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_float64_per_sequence(device, causal, dtype):
    _check(device, [5, 17, 33, 40], [9, 17, 20, 64], causal=causal, dtype=dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequences_and_rows_without_keys(device, causal):
    """A sequence with no queries, one with no keys (its rows: 0), and causal Sq > Sk (its first rows: 0)."""
    _check(device, [0, 7, 40, 3], [5, 0, 12, 3], causal=causal)


@pytest.mark.parametrize("d", [128, 256])
def test_larger_head_dims_mqa_and_scale(device, d):
    _check(device, [19, 33], [33, 19], causal=True, hq=4, hkv=1, d=d, scale=0.2)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16io_recipe_and_long_sequences(device, causal):
    """bf16io (V converted to fp16 in-kernel) on sequences that span several row blocks and key tiles of every
    config, the empty ones included."""
    _check(device, [300, 0, 129, 200], [300, 50, 129, 450], causal=causal, dtype=torch.bfloat16, d=128,
           precision="bf16io")


def test_one_sequence_equals_the_dense_kernel(device):
    """With Sq = Sk the bottom-right and top-left diagonals coincide: varlen and dense agree (same tiles, same
    arithmetic)."""
    q, k, v, cq, ck = packed([48], [48], 4, 4, 64, torch.float16, device, seed=3)
    o = xkernels.attention_varlen(q, k, v, cq, ck, 48, 48, is_causal=True)
    dense = xkernels.attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                               is_causal=True)
    torch.testing.assert_close(o, dense[0].transpose(0, 1), rtol=0, atol=1e-3)


def test_checks_fail_on_a_broken_varlen_kernel(device):
    """The same checks fail when the causal diagonal is top-left instead of bottom-right (the likeliest bug)."""
    lens_q, lens_k = [7, 20], [20, 20]
    q, k, v, cq, ck = packed(lens_q, lens_k, 2, 2, 64, torch.float16, device, seed=9)
    o = xkernels.attention_varlen(q, k, v, cq, ck, 20, 20, is_causal=True)
    top_left = torch.cat([xkernels.attention(q[a:b].transpose(0, 1)[None], k[c:e].transpose(0, 1)[None],
                                             v[c:e].transpose(0, 1)[None], is_causal=True)[0].transpose(0, 1)
                          for a, b, c, e in ((0, 7, 0, 20), (7, 27, 20, 40))])
    ref = reference_attention_varlen(q, k, v, cq, ck, is_causal=True)[0]
    assert compare_attention(o, ref, ATTENTION_RECIPES["fp16"]).passed
    assert not compare_attention(top_left, ref, ATTENTION_RECIPES["fp16"]).passed


@pytest.mark.parametrize("change,exc,match", [
    (dict(cu_seqlens_q="float"), TypeError, "cu_seqlens_q: dtype"),
    (dict(cu_seqlens_k="short"), ValueError, "cu_seqlens_k: shape"),
    (dict(cu_seqlens_q="offset"), ValueError, "cu_seqlens_q: must start at 0"),
    (dict(cu_seqlens_k="decreasing"), ValueError, "cu_seqlens_k: must be non-decreasing"),
    (dict(cu_seqlens_q="total"), ValueError, "cu_seqlens_q: ends at"),
    (dict(max_seqlen_k=3), ValueError, "max_seqlen_k: 3 is less than"),
    (dict(max_seqlen_q=-1), ValueError, "max_seqlen_q: -1 is outside"),
    (dict(max_seqlen_q=2**31), ValueError, "max_seqlen_q: 2147483648 is outside"),
    (dict(max_seqlen_k=7.0), TypeError, "max_seqlen_k: expected an int, got float"),
    (dict(max_seqlen_k=True), TypeError, "max_seqlen_k: expected an int, got bool"),
    (dict(cu_seqlens_q=[0, 4, 10]), TypeError, "cu_seqlens_q: expected a torch.Tensor"),
    (dict(q="4d"), ValueError, "q: expected 3 dims"),
    (dict(q="heads"), ValueError, "kv heads do not divide"),
    (dict(backend="hopper"), ValueError, "backend: 'hopper' was forced"),
])
def test_bad_input_names_the_argument(device, change, exc, match):
    if change.get("backend") == "hopper" and device == "cuda" and hopper_available(torch.device("cuda")):
        pytest.skip("the Hopper varlen kernel runs here")
    q, k, v, cq, ck = packed([4, 6], [5, 7], 4, 2, 64, torch.float16, device)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=6, max_seqlen_k=7, backend=None)
    before = [t.clone() for t in (q, k, v, cq, ck)]
    edits = {"float": lambda t: t.float(), "short": lambda t: t[:2], "offset": lambda t: t + 1,
             "decreasing": lambda t: torch.tensor([0, 13, 12], dtype=torch.int32, device=device),
             "total": lambda t: torch.tensor([0, 4, 9], dtype=torch.int32, device=device),
             "4d": lambda t: t[None], "heads": lambda t: t[:, :3]}
    for name, value in change.items():
        args[name] = edits[value](args[name]) if isinstance(value, str) and value in edits else value
    with pytest.raises(exc, match=match):
        xkernels.attention_varlen(**args)
    for b, t in zip(before, (q, k, v, cq, ck), strict=True):
        assert torch.equal(b, t)


def test_unsynced_checks(device, monkeypatch):
    """sync_checks=False: good values give the synced call's result bitwise; each bad value (the cases the synced
    checks raise on) gives NaN in every output and LSE element instead of an error, with nothing read to the host and
    the inputs untouched. The output is not poisoned here, so the NaN must come from the check."""
    monkeypatch.setattr(varlen, "output_like", lambda q: torch.zeros_like(q, memory_format=torch.contiguous_format))
    q, k, v, cq, ck = packed([4, 6], [5, 7], 4, 2, 64, torch.float16, device)
    want = xkernels.attention_varlen(q, k, v, cq, ck, 6, 7, is_causal=True, return_lse=True)

    def read_to_host(*args, **kwargs):
        raise AssertionError("a cu_seqlens value was read to the host")

    with monkeypatch.context() as m:
        m.setattr(varlen, "check_cu_seqlens", read_to_host)
        got = xkernels.attention_varlen(q, k, v, cq, ck, 6, 7, is_causal=True, return_lse=True, sync_checks=False)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    bad = {"offset": (cq + 1, ck, 6, 7), "decreasing": (cq, torch.tensor([0, 13, 12], dtype=torch.int32,
                                                                          device=device), 6, 7),
           "total": (torch.tensor([0, 4, 9], dtype=torch.int32, device=device), ck, 6, 7),
           "too long": (cq, ck, 6, 3),
           "no work launched": (cq, ck, 0, 7),  # max_seqlen_q = 0: the call returns before any launch
           "no sequences": (cq[:1], ck[:1], 6, 7)}  # batch 0 over 10 packed tokens
    for name, (cq_bad, ck_bad, mq, mk) in bad.items():
        before = [t.clone() for t in (q, k, v, cq_bad, ck_bad)]
        o, lse = xkernels.attention_varlen(q, k, v, cq_bad, ck_bad, mq, mk, is_causal=True, return_lse=True,
                                           sync_checks=False)
        assert o.isnan().all() and lse.isnan().all(), name
        assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v, cq_bad, ck_bad), strict=True)), name
    with pytest.raises(TypeError, match="sync_checks"):
        xkernels.attention_varlen(q, k, v, cq, ck, 6, 7, sync_checks=1)


def test_unaligned_contiguous_inputs_are_copied(device):
    """A contiguous q whose base is not 16-byte aligned (a slice of a larger buffer) is copied for the kernel's
    descriptors, and the result is right."""
    q, k, v, cq, ck = packed([5, 17], [9, 17], 2, 2, 64, torch.float16, device)
    unaligned = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)[1:].view(q.shape)
    unaligned.copy_(q)
    assert unaligned.is_contiguous() and unaligned.data_ptr() % 16
    want = xkernels.attention_varlen(q, k, v, cq, ck, 17, 17, is_causal=True)
    assert torch.equal(xkernels.attention_varlen(unaligned, k, v, cq, ck, 17, 17, is_causal=True), want)


def test_strided_cu_seqlens_are_read_as_their_values(device):
    """A cu_seqlens view with a stride (every other element) means the values it shows, as in the checks."""
    q, k, v, cq, ck = packed([5, 17], [9, 17], 2, 2, 64, torch.float16, device)
    spread = lambda cu: torch.stack([cu, torch.full_like(cu, 999)], 1).flatten()[::2]  # noqa: E731
    want = xkernels.attention_varlen(q, k, v, cq, ck, 17, 17, is_causal=True)
    got = xkernels.attention_varlen(q, k, v, spread(cq), spread(ck), 17, 17, is_causal=True)
    assert spread(cq).stride(0) == 2 and torch.equal(got, want)


def test_opcheck_and_compile(device):
    q, k, v, cq, ck = packed([5, 17], [9, 17], 4, 2, 64, torch.float16, device)
    for return_lse in (False, True):
        for sync_checks in (True, False):
            torch.library.opcheck(ops.attention_varlen_op, (q, k, v, cq, ck, 17, 17, True, None, "auto", return_lse,
                                                             sync_checks, "auto"))
    fn = lambda q, k, v: xkernels.attention_varlen(q, k, v, cq, ck, 17, 17, is_causal=True)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=0, atol=0)


def test_scale_default_is_one_over_sqrt_d(device):
    q, k, v, cq, ck = packed([9], [9], 2, 2, 64, torch.float16, device)
    a = xkernels.attention_varlen(q, k, v, cq, ck, 9, 9)
    b = xkernels.attention_varlen(q, k, v, cq, ck, 9, 9, scale=1 / math.sqrt(64))
    assert torch.equal(a, b)


def test_persistent_varlen_rule():
    """The persistent Hopper varlen kernel serves causal, GQA and short (<= 2K keys) batches, and full MHA at D128 on
    its head-major walk; full MHA at D64 over longer sequences (or at D128 on the L2-chunk walk) stays on the
    per-sequence kernel; persistent=2 forces it, and the V-converting recipe never gets it."""
    import dataclasses

    from xkernels import varlen
    from xkernels.hopper.configs import PERSISTENT_ATTENTION_CONFIGS
    from xkernels.recipes import ATTENTION_RECIPES

    cfg, bf16 = PERSISTENT_ATTENTION_CONFIGS[128], ATTENTION_RECIPES["bf16"]
    q, kv, kv_gqa = (torch.empty(100, h, 128, dtype=torch.bfloat16, device="meta") for h in (32, 32, 8))
    assert varlen._persistent(q, kv, kv, 4096, False, bf16, cfg)
    assert not varlen._persistent(q, kv, kv, 4096, False, bf16, dataclasses.replace(cfg, walk=0))
    q64 = torch.empty(100, 32, 64, dtype=torch.bfloat16, device="meta")
    assert not varlen._persistent(q64, q64, q64, 4096, False, bf16, PERSISTENT_ATTENTION_CONFIGS[64])
    assert varlen._persistent(q, kv, kv, 4096, True, bf16, cfg)
    assert varlen._persistent(q, kv_gqa, kv_gqa, 4096, False, bf16, cfg)
    assert varlen._persistent(q, kv, kv, 2048, False, bf16, cfg)
    assert varlen._persistent(q, kv, kv, 4096, False, bf16, dataclasses.replace(cfg, persistent=2))
    assert not varlen._persistent(q, kv, kv, 2048, True, bf16, dataclasses.replace(cfg, persistent=0))
    assert not varlen._persistent(q, kv, kv, 2048, True, ATTENTION_RECIPES["bf16io"], cfg)


def test_a_max_seqlen_past_the_total_is_an_upper_bound_like_any_other(device):
    """flash_attn's max_seqlen is an upper bound; one near 2^31 (past the packed total) gives the exact bound's O,
    LSE and gradients and launches no more work than the total holds (the grid follows the smaller)."""
    q, k, v, cq, ck = packed([5, 12], [9, 3], 4, 2, 64, torch.float16, device)
    for t in (q, k, v):
        t.requires_grad_(True)
    runs = []
    for mq, mk in ((12, 9), (2**31 - 1, 2**31 - 1)):
        o, lse = xkernels.attention_varlen(q, k, v, cq, ck, mq, mk, is_causal=True, return_lse=True)
        runs.append((o, lse, *torch.autograd.grad((o.float() * o.float()).sum() + lse.sum(), (q, k, v))))
    for exact, huge in zip(*runs, strict=True):
        assert torch.equal(exact, huge)


@pytest.mark.parametrize("sync_checks", [True, False])
def test_a_batch_without_keys(device, sync_checks):
    """No key in the whole batch (total_k = 0): every row is 0 with LSE -inf, or its sink with sinks; the gradients
    are 0; a bad cu_seqlens_q checked on the device still gives NaN."""
    q, k, v, cq, ck = packed([5, 12], [0, 0], 4, 2, 64, torch.float16, device)
    for t in (q, k, v):
        t.requires_grad_(True)
    o, lse = xkernels.attention_varlen(q, k, v, cq, ck, 12, 0, return_lse=True, sync_checks=sync_checks)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    dq, dk, dv = torch.autograd.grad(o.float().sum(), (q, k, v))
    assert torch.equal(dq, torch.zeros_like(dq)) and dk.numel() == dv.numel() == 0
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=device)
    o, lse = xkernels.attention_varlen(q.detach(), k.detach(), v.detach(), cq, ck, 12, 0, return_lse=True,
                                       sinks=sinks, sync_checks=sync_checks)
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(lse, sinks[:, None].expand(4, 17))
    if not sync_checks:
        bad = torch.tensor([0, 9, 5], dtype=torch.int32, device=device)  # decreasing
        o, lse = xkernels.attention_varlen(q.detach(), k.detach(), v.detach(), bad, ck, 12, 0, return_lse=True,
                                           sync_checks=False)
        assert o.isnan().all() and lse.isnan().all()
