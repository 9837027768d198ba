"""The Hopper backward's dQ paths on an H100/H200: the Gluon dQ kernel (`hopper/attention_dq.py`) and dQ fused into
the dK/dV kernel (FUSED_DQ), each against the portable dQ kernel: the same dK and dV (bitwise where the dK/dV kernel
is the same; within the recipe's bounds for the fused variant, whose dK takes its dS from shared memory), and dQ
within the recipe's bounds against float64 autograd, with tails, causal with Sq != Skv, GQA and the LSE's gradient;
the gradient buffers are NaN-poisoned so a row a kernel skips fails."""

import dataclasses

import pytest
import torch

from xkernels import backward, select
from xkernels.common.runtime import hopper_available
from xkernels.hopper.configs import ATTENTION_DQ_CONFIGS, FUSED_BWD_CONFIGS
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]


def _run(q, k, v, do, dlse, *, causal, dq_path):
    import xkernels

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, dlse, enable_gqa=True, precision="auto",
                                                  backend="auto")
    cfg = choice.config
    dkdv = dataclasses.replace(cfg.dkdv, fused_dq={"fused1": 1, "fused2": 2, "fused3": 3}.get(dq_path, 0))
    cfg = select.HopperBackward(dkdv, cfg.portable, ATTENTION_DQ_CONFIGS[q.shape[-1]] if dq_path == "gluon" else None)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o.detach(), lse.detach(), do, *grads, dlse, is_causal=causal,
                     scale=q.shape[-1] ** -0.5, cfg=cfg)
    return grads


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq", [1, 17, 64])
@pytest.mark.parametrize("bshd", [False, True])
def test_one_query_block_takes_the_split_pair(d, sq, bshd):
    """A call of at most 64 query rows takes the split dK/dV + dQ pair even with deterministic=False and "hopper"
    forced (`select.FUSED_DQ_MIN_QUERIES`: the fused D64 kernel read shared memory out of bounds at one row against
    77 keys, full), and its gradients pass against float64, on contiguous tensors and (B, S, H, D) views."""
    import xkernels

    q, k, v = attention_inputs(2, 4, sq, 77, d, torch.bfloat16, "cuda", hkv=2, seed=sq + d)
    if bshd:
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    for backend in ("auto", "hopper"):
        o = xkernels.attention(*leaves, enable_gqa=True, deterministic=False, backend=backend)
        grads = torch.autograd.grad(o, leaves, do)
        name = xkernels.last_backend()
        assert "attention_backward" in name and "fused dQ" not in name, name
        for g, ref in zip(grads, reference_attention_grads(q, k, v, do), strict=True):
            c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
            assert c.passed, (backend, c.reason)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,sq,skv", [(False, 1000, 1000), (True, 1000, 1000), (True, 300, 777),
                                           (False, 130, 65), (True, 1, 200),
                                           (False, 200, 256)])  # whole key blocks: one unmasked walk (EVEN_KEYS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dq_path", ["gluon", "fused1", "fused2", "fused3"])
def test_dq_paths_match_float64(dq_path, d, causal, sq, skv, dtype):
    """D256 (the dK/dV kernel's split_d tiles) takes the Gluon dQ kernel only; fused3 (turns at the whole dQ
    partial) is D64's."""
    if d == 256 and dq_path.startswith("fused"):
        pytest.skip("split_d has no fused dQ")
    if dq_path == "fused3" and d != 64:
        pytest.skip("fused_dq=3 is D64's")
    q, k, v = attention_inputs(2, 8, sq, skv, d, dtype, "cuda", hkv=2, seed=sq + skv)
    g = torch.Generator(device="cuda").manual_seed(7)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    dlse = torch.rand(q.shape[:3], generator=g, device="cuda") - 0.5
    dq, dk, dv = _run(q, k, v, do, dlse, causal=causal, dq_path=dq_path)
    _, dk_portable, dv_portable = _run(q, k, v, do, dlse, causal=causal, dq_path="portable")
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, grad_lse=dlse)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    if dq_path == "gluon":  # the same dK/dV kernel either way; it is checked against float64 here too
        assert torch.equal(dk, dk_portable) and torch.equal(dv, dv_portable)
        for g, ref in ((dk, refs[1]), (dv, refs[2])):
            c = compare_grad(g, ref, recipe)
            assert c.passed, c.reason
    else:
        assert torch.equal(dv, dv_portable)
        c = compare_grad(dk, refs[1], recipe)
        assert c.passed, c.reason
    c = compare_grad(dq, refs[0], recipe)
    assert c.passed, c.reason


@pytest.mark.parametrize("causal,sq,skv", [(False, 1000, 1000), (True, 300, 777), (True, 1, 200), (False, 200, 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fused_dq", [0, 1, 2, 3])
def test_kv_regs_matches_float64(fused_dq, causal, sq, skv, dtype):
    """D64's opt-in `kv_regs` (K and V as the register A operands of S^T and dP^T), split and fused: every gradient
    within the recipe's bounds against float64, from NaN-poisoned buffers, with GQA, tails and causal Sq != Skv."""
    import xkernels

    q, k, v = attention_inputs(2, 8, sq, skv, 64, dtype, "cuda", hkv=2, seed=sq + skv)
    g = torch.Generator(device="cuda").manual_seed(7)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="auto")
    dkdv = dataclasses.replace(choice.config.dkdv, fused_dq=fused_dq, kv_regs=1)
    cfg = select.HopperBackward(dkdv, choice.config.portable, None if fused_dq else ATTENTION_DQ_CONFIGS[64])
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=0.125, cfg=cfg)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    for grad, ref in zip(grads, reference_attention_grads(q, k, v, do, is_causal=causal), strict=True):
        c = compare_grad(grad, ref, recipe)
        assert c.passed, c.reason
    if not fused_dq:  # the same products from registers: the same dK and dV bits as from shared memory
        smem = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        backward._hopper(q, k, v, o, lse, do, *smem, None, is_causal=causal, scale=0.125,
                         cfg=dataclasses.replace(cfg, dkdv=dataclasses.replace(dkdv, kv_regs=0)))
        assert torch.equal(grads[1], smem[1]) and torch.equal(grads[2], smem[2])


@pytest.mark.parametrize("causal", [False, True])
def test_concurrent_dq_equals_the_sequential_backward(causal):
    """The Gluon dQ kernel on a side stream beside dK/dV (`HopperBackward.concurrent_dq`): the same kernels on the
    same inputs, so the same bits, eagerly and replayed from a CUDA graph (the fork and join are captured); dQ is
    complete when the call returns on the caller's stream."""
    q, k, v = attention_inputs(2, 8, 1000, 1000, 128, torch.bfloat16, "cuda", hkv=2, seed=3)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    import xkernels

    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="auto")
    seq = dataclasses.replace(choice.config, dq=ATTENTION_DQ_CONFIGS[128], concurrent_dq=False)
    conc = dataclasses.replace(seq, concurrent_dq=True)

    def run(cfg, grads):
        backward._hopper(q, k, v, o.detach(), lse.detach(), do, *grads, None, is_causal=causal,
                         scale=q.shape[-1] ** -0.5, cfg=cfg)
        return grads

    want = run(seq, [torch.full_like(t, float("nan")) for t in (q, k, v)])
    got = run(conc, [torch.full_like(t, float("nan")) for t in (q, k, v)])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    static = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    run(conc, static)  # compiled outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(conc, static)
    for t in static:
        t.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(static, want, strict=True))



@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_false_runs_the_fused_backward_through_the_api(d, causal):
    """`xkernels.attention(..., deterministic=False, backend="hopper")`'s backward is the fused-dQ kernel
    (`FUSED_BWD_CONFIGS`) and passes the float64 checks with GQA and a tail, on contiguous inputs (the plan's direct
    launches) and on (B, S, H, D) views (the general path's copies); deterministic=True's is the split one, bitwise
    the same on a second call."""
    import xkernels

    q, k, v = attention_inputs(2, 8, 777, 777, d, torch.bfloat16, "cuda", hkv=2, seed=d)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    refs = reference_attention_grads(q, k, v, do, is_causal=causal)

    def grads(det, bshd=False):
        # clone() keeps a view's strides: the (B, S, H, D) storage seen as (B, H, S, D)
        views = [t.transpose(1, 2).contiguous().transpose(1, 2) if bshd else t for t in (q, k, v)]
        leaves = [t.detach().clone().requires_grad_() for t in views]
        # "hopper" forced: the fused kernel at a shape `select.fused_dq_pays` leaves to the split one under "auto"
        o = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, deterministic=det, backend="hopper")
        out = torch.autograd.grad(o, leaves, do)
        return out, xkernels.last_backend()

    for bshd in (False, True):
        fused, name = grads(False, bshd)
        assert f"{FUSED_BWD_CONFIGS[d]} fused dQ" in name, name
        for g, ref in zip(fused, refs, strict=True):
            c = compare_grad(g, ref, ATTENTION_RECIPES["bf16"])
            assert c.passed, (bshd, c.reason)
    (first, name), (second, _) = grads(True), grads(True)
    assert "fused dQ" not in name and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,sq,skv", [(False, 1000, 1000), (True, 1000, 1000), (True, 300, 777),
                                           (True, 777, 300), (False, 130, 65), (True, 1, 200)])
@pytest.mark.parametrize("fused", [False, True])
def test_mask_split_matches_the_masked_walk(fused, d, causal, sq, skv):
    """`mask_split` (the query walk's steps past the keys' diagonal in a loop without the mask): the same dK and dV
    bits as the walk that masks every step (a select that keeps everything changes nothing), and every gradient
    within the recipe's bounds against float64, from NaN-poisoned buffers, with GQA, key tails and Sq != Skv both
    ways."""
    import xkernels

    if fused and d == 256:
        pytest.skip("split_d has no fused dQ")
    q, k, v = attention_inputs(2, 8, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + skv + d)
    g = torch.Generator(device="cuda").manual_seed(11)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="auto")
    shipped = select.hopper_backward(d, choice.config.portable, fused_dq=fused)
    masked, split = (dataclasses.replace(shipped, dkdv=dataclasses.replace(shipped.dkdv, mask_split=ms))
                     for ms in (0, 1))
    runs = []
    for cfg in (masked, split):
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=d ** -0.5, cfg=cfg)
        runs.append(grads)
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][2], runs[1][2])
    if not fused:  # the separate dQ kernel: bitwise repeatable
        assert torch.equal(runs[0][0], runs[1][0])
    for grad, ref in zip(runs[1], reference_attention_grads(q, k, v, do, is_causal=causal), strict=True):
        c = compare_grad(grad, ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, c.reason


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("sq,skv", [(200, 256), (1000, 1024), (300, 1000)])
def test_even_keys_matches_float64_and_the_masked_walk(d, fused, sq, skv):
    """`even_keys` (opt-in): a full mask over whole key blocks walks one unmasked loop. Every gradient within bf16's
    bounds against float64 from NaN-poisoned buffers (GQA, a query tail), and the split pair's gradients bitwise
    those of the masked walk (every pair is kept there, so the mask's select changes no value). 1000 keys end
    inside a block: the config must mask there (a key past the end would take the next head's K and V)."""
    import xkernels

    if d == 256 and fused:
        pytest.skip("split_d has no fused dQ")
    dtype = torch.bfloat16
    q, k, v = attention_inputs(2, 8, sq, skv, d, dtype, "cuda", hkv=2, seed=sq + skv + d)
    g = torch.Generator(device="cuda").manual_seed(11)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    o, lse = xkernels.attention(q, k, v, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="auto")
    base = select.hopper_backward(d, choice.config.portable, fused_dq=fused)
    cfg = dataclasses.replace(base, dkdv=dataclasses.replace(base.dkdv, even_keys=1))
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=False, scale=d ** -0.5, cfg=cfg)
    recipe = ATTENTION_RECIPES["bf16"]
    for grad, ref in zip(grads, reference_attention_grads(q, k, v, do), strict=True):
        c = compare_grad(grad, ref, recipe)
        assert c.passed, c.reason
    if not fused:  # dQ from the Gluon dQ kernel, dK and dV from either walk: the same bits
        masked = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        backward._hopper(q, k, v, o, lse, do, *masked, None, is_causal=False, scale=d ** -0.5, cfg=base)
        assert all(torch.equal(a, b) for a, b in zip(grads, masked, strict=True))


@pytest.mark.parametrize("causal,sq,skv", [(False, 1000, 1000), (False, 300, 1000), (False, 1000, 130),
                                           (False, 64, 256), (True, 1000, 1000)])  # causal: ROTATE is off there
def test_rotate_matches_float64(causal, sq, skv):
    """`rotate` (opt-in): the fused D128 kernel's dense full walk starts each key block's query walk at its own
    block and wraps. Every gradient within bf16's bounds against float64 from NaN-poisoned buffers, with a query
    tail wherever the rotation puts it, more query blocks than key blocks and fewer, GQA and dLSE; a walk that
    skipped or repeated a query block fails dQ (and dK, dV)."""
    import xkernels

    d, dtype = 128, torch.bfloat16
    q, k, v = attention_inputs(2, 8, sq, skv, d, dtype, "cuda", hkv=2, seed=sq + 3 * skv)
    g = torch.Generator(device="cuda").manual_seed(5)
    do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(dtype)
    dlse = (torch.rand(q.shape[:3], generator=g, device="cuda") - 0.5).float()
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, dlse, enable_gqa=True, precision="auto",
                                                  backend="auto")
    base = select.hopper_backward(d, choice.config.portable, fused_dq=True)
    cfg = dataclasses.replace(base, dkdv=dataclasses.replace(base.dkdv, rotate=1))
    assert cfg.dkdv.constexprs(d, causal=causal)["ROTATE"] is (not causal)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    backward._hopper(q, k, v, o, lse, do, *grads, dlse, is_causal=causal, scale=d ** -0.5, cfg=cfg)
    refs = reference_attention_grads(q, k, v, do, is_causal=causal, grad_lse=dlse)
    for grad, ref in zip(grads, refs, strict=True):
        c = compare_grad(grad, ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, c.reason
