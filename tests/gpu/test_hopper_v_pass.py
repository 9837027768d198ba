"""bf16io with V converted to fp16 by one pass before the Hopper kernel (`hopper:v_pass=1`) on an H100/H200: the
dense and persistent kernels, causal and full, GQA, tails, V in (B, S, H, D) strides and V with gaps (which the
producer then converts, as without the pass), against float64 within bf16io's contract from NaN-poisoned outputs,
and the same bits as the producer's in-kernel conversion (both round each V element to fp16 once); the packed
kernels too (the persistent one serves bf16io only with the pass)."""

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, reference_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]
BF16IO = ATTENTION_RECIPES["bf16io"]


def _views(q, k, v, layout):
    if layout == "bshd":  # (B, S, H, D) storage seen as (B, H, S, D): dense, permuted strides
        return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    if layout == "gaps":  # V every other head of a wider tensor: strides with gaps, no dense copy keeps them
        wide = torch.stack([v, v], dim=2).flatten(1, 2)
        return [q, k, wide[:, ::2]]
    return [q, k, v]


@pytest.mark.parametrize("layout", ["contiguous", "bshd", "gaps"])
@pytest.mark.parametrize("sq,skv", [(1024, 1024), (1000, 1500), (2048, 4096)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_v_pass_matches_float64_and_the_in_kernel_conversion(d, causal, sq, skv, layout):
    q, k, v = _views(*attention_inputs(2, 8, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + d), layout)
    v0 = v.clone()
    kw = dict(is_causal=causal, enable_gqa=True, precision="bf16io")
    o = xkernels.attention(q, k, v, out=poisoned_like(q), backend="hopper:v_pass=1", **kw)
    name = xkernels.last_backend()
    assert name.startswith("hopper.attention[bf16io") and ("-vp" in name) == (layout != "gaps"), name
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), BF16IO)
    assert c.passed, c
    assert torch.equal(o, xkernels.attention(q, k, v, out=poisoned_like(q), backend="hopper:v_pass=0", **kw))
    assert "-vp" not in xkernels.last_backend()
    # the plan's second call: its compiled kernel launched with a new fp16 copy (a new address; the persistent
    # kernel re-encodes its V descriptor)
    keep = torch.empty(1 << 20, device="cuda")  # moves the caching allocator's next block
    assert torch.equal(o, xkernels.attention(q, k, v, out=poisoned_like(q), backend="hopper:v_pass=1", **kw))
    del keep
    assert torch.equal(v, v0), "V was modified"


@pytest.mark.parametrize("causal", [False, True])
def test_v_pass_in_the_varlen_kernel(causal):
    lens = [300, 1000, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(total, h, 128, generator=g, device="cuda").bfloat16() for h in (8, 2, 2))
    o = xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=causal, precision="bf16io",
                                  backend="hopper:v_pass=1")
    # GQA batches of short sequences take the persistent packed kernel, which serves bf16io only with the pass
    name = xkernels.last_backend()
    assert "-vp" in name and "persistent" in name, name
    whole = xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=causal, precision="bf16io",
                                      backend="hopper:v_pass=1,persistent=0")
    name = xkernels.last_backend()
    assert "-vp" in name and "persistent" not in name, name
    for i, n in enumerate(lens):
        s = slice(int(cu[i]), int(cu[i]) + n)
        ref = reference_attention(*(t[s].transpose(0, 1)[None] for t in (q, k, v)), is_causal=causal)
        for got in (o, whole):  # the persistent kernel and the per-sequence one
            c = compare_attention(got[s].transpose(0, 1)[None], ref, BF16IO)
            assert c.passed, (i, c)
