"""The backward's direct path (`backward.BackwardPlan`: launches prepared once per key, descriptors encoded once per
address) against its general path (`backward._general`, launched through `launch.run`) on an H100/H200: bitwise equal
gradients, each also within the recipe's bounds against float64 autograd, over head dims, causal with Sq != Skv and
tails, GQA, a gradient through the LSE, a second call on other tensors and a misaligned call (the general path
serves it); every gradient buffer NaN-poisoned."""

import pytest
import torch

from tests.helpers import NEEDS_HOPPER, poison_gradient_buffers
from xkernels import backward, plans
from xkernels.common.seqlen import Band
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

pytestmark = NEEDS_HOPPER


GENERAL = backward._general


@pytest.fixture(autouse=True)
def poisoned_gradients(monkeypatch):
    poison_gradient_buffers(monkeypatch)


@pytest.fixture(autouse=True)
def direct_only(monkeypatch):
    """A plan call that falls back to the general path fails the test (both record the same kernel name); a test
    that expects the fallback says so by restoring it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the plan took the general path")

    monkeypatch.setattr(backward, "_general", refuse)


def _forward(q, k, v, causal):
    import xkernels

    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    return o, lse


def _inputs(d, causal, sq, skv, dtype, seed, dlse: bool):
    q, k, v = attention_inputs(2, 8, sq, skv, d, dtype, "cuda", hkv=2, seed=seed)
    o, lse = _forward(q, k, v, causal)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    grad_lse = torch.rand(q.shape[:3], generator=g, device="cuda") - 0.5 if dlse else None
    return q, k, v, o, lse, do, grad_lse


def _plan_grads(q, k, v, o, lse, do, grad_lse, causal):
    grads = backward.attention_backward(do, q, k, v, o, lse, grad_lse, is_causal=causal, scale=None,
                                        enable_gqa=True, precision="auto", backend="auto")
    return grads, plans.last_backend()


def _general_grads(q, k, v, o, lse, do, grad_lse, causal):
    _, choice = backward.select.resolve_attention_backward(do, q, k, v, o, lse, grad_lse, enable_gqa=True,
                                                           precision="auto", backend="auto", is_causal=causal)
    grads = tuple(backward.grad_like(t) for t in (q, k, v))
    GENERAL(do, q, k, v, o, lse, grad_lse, *grads, is_causal=causal, scale=q.shape[-1] ** -0.5, choice=choice,
            band=Band(causal))
    return grads


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,sq,skv,dlse", [(False, 1000, 1000, False), (True, 300, 777, True),
                                                (True, 130, 65, False), (False, 1, 200, True),
                                                (False, 200, 256, True)])  # whole key blocks (EVEN_KEYS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_direct_path_matches_general_path_and_float64(d, causal, sq, skv, dlse, dtype):
    q, k, v, o, lse, do, grad_lse = _inputs(d, causal, sq, skv, dtype, seed=sq + skv + d, dlse=dlse)
    direct, name = _plan_grads(q, k, v, o, lse, do, grad_lse, causal)
    assert name.startswith("hopper.attention_backward"), name
    general = _general_grads(q, k, v, o, lse, do, grad_lse, causal)
    for a, b in zip(direct, general, strict=True):
        assert torch.equal(a, b)
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, grad_lse=grad_lse)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for g, ref in zip(direct, refs, strict=True):
        c = compare_grad(g, ref, recipe)
        assert c.passed, c.reason


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal,sq,skv,dlse", [(False, 1000, 1000, False), (True, 300, 777, True),
                                                (True, 130, 65, False), (False, 200, 256, False)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_direct_path_matches_float64(d, causal, sq, skv, dlse, dtype):
    """The fused-dQ variant's direct launches (the preprocess zeroing the fp32 dQ buffer, dK/dV reducing into it,
    the scaling pass), forced with backend="hopper": within the recipe's bounds against float64, dLSE and causal
    Sq != Skv included (its partials land in any order, so no bitwise comparison with the general path)."""
    q, k, v, o, lse, do, grad_lse = _inputs(d, causal, sq, skv, dtype, seed=sq + skv + d + 1, dlse=dlse)
    grads = backward.attention_backward(do, q, k, v, o, lse, grad_lse, is_causal=causal, scale=None,
                                        enable_gqa=True, precision="auto", backend="hopper", deterministic=False)
    assert "fused dQ" in plans.last_backend(), plans.last_backend()
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, grad_lse=grad_lse)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for g, ref in zip(grads, refs, strict=True):
        c = compare_grad(g, ref, recipe)
        assert c.passed, c.reason


def test_a_second_call_on_other_tensors_and_a_misaligned_call(monkeypatch):
    """The plan's descriptors are encoded per address: a second call with the same key on other tensors gives that
    call's gradients; a call whose q starts 2 bytes into its storage (not 16-byte aligned) takes the general path
    and is right too."""
    first = _inputs(128, True, 512, 512, torch.bfloat16, seed=1, dlse=False)
    second = _inputs(128, True, 512, 512, torch.bfloat16, seed=2, dlse=False)
    g1, _ = _plan_grads(*first, True)
    g2, _ = _plan_grads(*second, True)
    assert not torch.equal(g1[0], g2[0])
    for args, grads in ((first, g1), (second, g2)):
        general = _general_grads(*args, True)
        assert all(torch.equal(a, b) for a, b in zip(grads, general, strict=True))
    q, k, v, o, lse, do, _ = second
    storage = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    q_off = storage[1:].view(q.shape).copy_(q)
    assert q_off.data_ptr() % 16 and q_off.is_contiguous()
    fallbacks = []
    monkeypatch.setattr(backward, "_general", lambda *a, **kw: fallbacks.append(1) or GENERAL(*a, **kw))
    g3, _ = _plan_grads(q_off, k, v, o, lse, do, None, True)
    assert fallbacks == [1]
    assert all(torch.equal(a, b) for a, b in zip(g2, g3, strict=True))


def test_captured_backward_replays_the_direct_path():
    """The plan's fork and join of the dQ stream are captured as graph edges: replays give the eager gradients."""
    q, k, v, o, lse, do, _ = _inputs(128, True, 1024, 1024, torch.bfloat16, seed=3, dlse=False)
    eager, _ = _plan_grads(q, k, v, o, lse, do, None, True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _plan_grads(q, k, v, o, lse, do, None, True)  # warm up on the capturing stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = _plan_grads(q, k, v, o, lse, do, None, True)
    for t in captured:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager, captured, strict=True))


def _sequence_outer_inputs(d, causal, sq, skv, dtype, seed, layout: str):
    """q, k, v as (B, S, H, D) storage seen as (B, H, S, D) ("bshd"), sliced from one (B, S, Hq + 2 Hkv, D) projection
    ("qkv", sq == skv), or q contiguous beside (B, S, H, D) k and v ("mixed": the two pairs' geometries differ);
    their forward, and a dO in q's layout."""
    b, hq, hkv = 2, 8, 2
    q, k, v = attention_inputs(b, hq, sq, skv, d, dtype, "cuda", hkv=hkv, seed=seed)
    if layout == "qkv":
        assert sq == skv
        proj = torch.cat([t.transpose(1, 2) for t in (q, k, v)], dim=2)  # (B, S, Hq + 2 Hkv, D)
        q, k, v = (proj[:, :, lo:hi].transpose(1, 2) for lo, hi in ((0, hq), (hq, hq + hkv), (hq + hkv, hq + 2 * hkv)))
    else:
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
        if layout == "bshd":
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
    o, lse = _forward(q, k, v, causal)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    do = (torch.rand((b, sq, hq, d), generator=g, device="cuda") - 0.5).to(dtype).transpose(1, 2)
    if layout == "mixed":
        do = do.contiguous()
    return q, k, v, o, lse, do


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,sq,skv,layout", [(True, 300, 300, "bshd"), (False, 1000, 777, "bshd"),
                                                  (True, 130, 65, "bshd"), (True, 384, 384, "qkv"),
                                                  (False, 200, 200, "qkv"), (True, 300, 777, "mixed"),
                                                  (False, 1, 200, "mixed"), (True, 1, 1, "bshd")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sequence_outer_layouts_are_read_in_place(d, causal, sq, skv, layout, dtype):
    """(B, S, H, D) views of q, k, v and dO, as transformers and flash_attn callers hold them, slices of a fused QKV
    projection, or contiguous q and dO beside (B, S, H, D) k and v (each pair its own geometry), one query row
    included: the plan's direct path reads them in place (the fixture refuses the general path), its gradients
    bitwise equal to the general path's on contiguous copies (masked rows past a sequence's end meet other rows
    than on the contiguous layout: exact zeros either way) and within the recipe's bounds against float64."""
    q, k, v, o, lse, do = _sequence_outer_inputs(d, causal, sq, skv, dtype, seed=sq + d, layout=layout)
    assert not k.is_contiguous() or skv == 1
    direct, name = _plan_grads(q, k, v, o, lse, do, None, causal)
    assert name.startswith("hopper.attention_backward"), name
    for g, t in zip(direct, (q, k, v), strict=True):
        assert g.shape == t.shape
    contiguous = [t.contiguous() for t in (q, k, v, o, lse, do)]
    general = _general_grads(*contiguous[:5], contiguous[5], None, causal)
    for a, b in zip(direct, general, strict=True):
        assert torch.equal(a, b)
    refs = reference_attention_grads(q, k, v, do, is_causal=causal)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for g, ref in zip(direct, refs, strict=True):
        c = compare_grad(g, ref, recipe)
        assert c.passed, c.reason


def test_a_contiguous_grad_out_beside_sequence_outer_inputs(monkeypatch):
    """dO contiguous beside (B, S, H, D) views of q, k, v (the plan's pairs differ in layout): the general path
    serves it, copying dO into q's layout, with the direct path's gradients; the fused variant alike against
    float64."""
    q, k, v, o, lse, do = _sequence_outer_inputs(128, True, 512, 512, torch.bfloat16, seed=5, layout="bshd")
    in_place, _ = _plan_grads(q, k, v, o, lse, do, None, True)
    fallbacks = []
    monkeypatch.setattr(backward, "_general", lambda *a, **kw: fallbacks.append(1) or GENERAL(*a, **kw))
    copied, _ = _plan_grads(q, k, v, o, lse, do.contiguous(), None, True)
    assert fallbacks == [1]
    assert all(torch.equal(a, b) for a, b in zip(in_place, copied, strict=True))
    fused = backward.attention_backward(do.contiguous(), q, k, v, o, lse, None, is_causal=True, scale=None,
                                        enable_gqa=True, precision="auto", backend="hopper", deterministic=False)
    refs = reference_attention_grads(q, k, v, do, is_causal=True)
    for g, ref in zip(fused, refs, strict=True):
        c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, c.reason
