"""The split-KV decode with its combine as a programmatic dependent launch (`DecodeConfig.pdl`) on a CUDA device:
the same bits as the plain launch pair (the same kernels; only the combine's start moves), eagerly and replayed from
a CUDA graph, on a paged and a dense cache, from NaN-poisoned outputs, and within bf16's contract against float64."""

import dataclasses

import pytest
import torch

from xkernels import decode, select
from xkernels.portable.configs import decode_config
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, reference_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("page", [16, 0])
@pytest.mark.parametrize("d", [64, 128])
def test_pdl_combine_gives_the_plain_launch_bits(d, page):
    b, hq, hkv, s = 4, 16, 4, 3000
    g = torch.Generator(device="cuda").manual_seed(d + page)
    q = torch.randn(b, 1, hq, d, generator=g, device="cuda").bfloat16()
    k = torch.randn(b, s, hkv, d, generator=g, device="cuda").bfloat16()
    v = torch.randn(b, s, hkv, d, generator=g, device="cuda").bfloat16()
    lengths = torch.tensor([3000, 1, 1777, 2048], dtype=torch.int32, device="cuda")
    table = None
    kc, vc = k, v
    if page:  # the same keys on shuffled pages
        pages = s // page + 1
        perm = torch.randperm(b * pages, generator=torch.Generator().manual_seed(1)).cuda()
        kc = torch.zeros(b * pages, page, hkv, d, device="cuda", dtype=k.dtype)
        vc = torch.zeros_like(kc)
        padded = [torch.cat([t, t.new_zeros(b, pages * page - s, hkv, d)], 1).view(b * pages, page, hkv, d)
                  for t in (k, v)]
        kc[perm], vc[perm] = padded
        table = perm.view(b, pages).to(torch.int32)
    shipped = decode_config(d, select._target(q.device))
    outs = []
    for cfg in (dataclasses.replace(shipped, pdl=False), dataclasses.replace(shipped, pdl=True)):
        decode._PLANS.clear()
        out = torch.full_like(q, float("nan"))
        plan = decode.kvcache_plan(q, kc, vc, out, table, is_causal=True, recipe=ATTENTION_RECIPES["bf16"], cfg=cfg,
                                   write_lse=False, splits=0)
        assert plan.splits > 1, "the test needs the split launch and its combine"
        plan.run(q, kc, vc, out, None, lengths, table, None)
        graph_out = torch.full_like(q, float("nan"))
        plan.run(q, kc, vc, graph_out, None, lengths, table, None)  # warm outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan.run(q, kc, vc, graph_out, None, lengths, table, None)
        graph_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, graph_out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    for i in range(b):
        n = int(lengths[i])
        ref = reference_attention(q[i:i + 1].transpose(1, 2), k[i:i + 1, :n].transpose(1, 2),
                                  v[i:i + 1, :n].transpose(1, 2))
        c = compare_attention(outs[1][i:i + 1].transpose(1, 2), ref, ATTENTION_RECIPES["bf16"])
        assert c.passed, (i, c)
