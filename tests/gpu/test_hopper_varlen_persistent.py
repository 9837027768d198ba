"""The persistent Hopper varlen forward (`hopper/attention_varlen_persistent.py`) on an H100/H200: against float64
per sequence and bitwise against the per-sequence Hopper varlen kernel (the same per-row arithmetic), over many tiles
per program (both Q slots turn over), empty sequences, sequences without keys, causal Sq > Sk, GQA and MQA, D64 and
D128; and a neighbour's inf in V never reaching a sequence (the tail tile's rows past the end are zeroed)."""

import pytest
import torch

import xkernels
from tests.test_varlen import packed
from xkernels.common.runtime import hopper_available
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, compare_lse, reference_attention_varlen

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]


def _run(q, k, v, cq, ck, causal, backend="auto"):
    lq, lk = (cq[1:] - cq[:-1]).max().item(), (ck[1:] - ck[:-1]).max().item()
    o, lse = xkernels.attention_varlen(q, k, v, cq, ck, lq, lk, is_causal=causal, return_lse=True, backend=backend)
    return o, lse, xkernels.last_backend()


def _lengths(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


CASES = [  # (lens_q, lens_k, hq, hkv)
    (_lengths(24, 1, 700, 1), None, 8, 2),  # many tiles per program, ragged tails
    ([0, 7, 300, 3, 129], [5, 0, 120, 3, 129], 4, 4),  # empty sequences, no keys, causal Sq > Sk
    ([64, 128, 65], [512, 130, 1], 4, 1),  # MQA, Sk > Sq, a one-key sequence
]


@pytest.mark.parametrize("walk", [0, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_persistent_varlen_matches_float64_and_per_sequence_kernel(dtype, causal, case, d, walk):
    """Both walks by override: the L2-chunk one (heads fastest in a sequence) and the head-major unit deal."""
    lens_q, lens_k, hq, hkv = CASES[case]
    lens_k = lens_k or lens_q
    q, k, v, cq, ck = packed(lens_q, lens_k, hq, hkv, d, dtype, "cuda", seed=case + d)
    o, lse, name = _run(q, k, v, cq, ck, causal, backend=f"hopper:walk={walk}")
    assert "persistent" in name and f"walk={walk}]" in name, name
    ref_o, ref_lse = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal)
    c = compare_attention(o, ref_o, ATTENTION_RECIPES["bf16" if dtype == torch.bfloat16 else "fp16"])
    assert c.passed, c
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty) and (o.transpose(0, 1)[empty] == 0).all()
    assert compare_lse(lse[~empty], ref_lse[~empty]).passed
    o_seq, lse_seq, seq_name = _run(q, k, v, cq, ck, causal, backend="hopper:persistent=0")
    assert "persistent" not in seq_name, seq_name
    assert torch.equal(o, o_seq) and torch.equal(lse, lse_seq), "persistent and per-sequence tiles differ"


@pytest.mark.parametrize("causal", [False, True])
def test_a_neighbours_inf_does_not_reach_a_sequence(causal):
    """Sequence 0 ends mid key tile; sequence 1's V holds inf. Sequence 0's tail tile reads those rows through the
    packed descriptor: they must be zeroed before P.V, or 0 * inf = NaN lands in sequence 0."""
    q, k, v, cq, ck = packed([100, 50], [100, 50], 4, 4, 128, torch.bfloat16, "cuda", seed=5)
    v[100:] = float("inf")
    o, _, name = _run(q, k, v, cq, ck, causal)
    assert "persistent" in name, name
    ref_o, _ = reference_attention_varlen(q[:100], k[:100], v[:100], cq[:2], ck[:2], is_causal=causal)
    assert compare_attention(o[:100], ref_o, ATTENTION_RECIPES["bf16"]).passed


@pytest.mark.parametrize("zero_tail", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_tail_zeroing_variants_keep_a_neighbours_inf_out(causal, zero_tail):
    """The kernel's V-tail switch run directly (`varlen._run_persistent`): the shipped 2 and the candidate 3 (only
    the 32-row chunks past the end rewritten). Each sequence in turn keeps its V and every other row of V is inf or
    NaN; its tail ends inside a chunk (100, 37, 70 keys), on a chunk edge (96, 64) or at a tile edge (128)."""
    import math

    from xkernels import select, varlen

    lens = [100, 37, 96, 128, 70, 64]
    q, k, v, cq, ck = packed(lens, lens, 4, 2, 128, torch.bfloat16, "cuda", seed=21)
    ref_o, _ = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal)
    _, choice = select.resolve_attention_varlen(q, k, v, cq, ck, max(lens), max(lens), precision="bf16",
                                                backend="hopper:persistent=2")
    starts = cq.tolist()
    for t in range(len(lens)):
        own = slice(starts[t], starts[t + 1])
        poisoned = torch.full_like(v, float("inf") if t % 2 else float("nan"))
        poisoned[own] = v[own]
        o = torch.full_like(q, float("nan"))
        varlen._run_persistent(q, k, poisoned, o, None, cq, ck, max(lens), 128 ** -0.5 * math.log2(math.e),
                               is_causal=causal, positive_scale=True, recipe=ATTENTION_RECIPES["bf16"],
                               cfg=choice.config.persistent, knobs=dict(ZERO_TAIL=zero_tail))
        assert not torch.isnan(o[own]).any(), (t, lens[t])
        assert compare_attention(o[own], ref_o[own], ATTENTION_RECIPES["bf16"]).passed, (t, lens[t])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("walk", [0, 1])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_tma_store_of_inside_rows(causal, case, walk, d, dtype):
    """The O_TMA switch (the default; here set through `varlen._run_persistent`): 64-row blocks inside a sequence
    leave by TMA store, its last rows by masked stores. The packed tensors carry 200 rows past the batch's last
    sequence (a sequence dropped from cu_seqlens), which must stay NaN: a block stored past a sequence's end would
    land there for the last sequence (inside the batch a neighbour's own tile may overwrite it later). Bitwise
    against the per-sequence kernel."""
    import math

    from xkernels import select, varlen

    lens_q, lens_k, hq, hkv = CASES[case]
    lens_k = lens_k or lens_q
    q, k, v, cq, ck = packed(lens_q + [200], lens_k + [200], hq, hkv, d, dtype, "cuda", seed=case + 40)
    cq, ck = cq[:-1], ck[:-1]  # the last 200 rows belong to no sequence
    tq, tk = cq[-1].item(), ck[-1].item()
    lq = max(lens_q)
    recipe = ATTENTION_RECIPES["bf16" if dtype == torch.bfloat16 else "fp16"]
    _, choice = select.resolve_attention_varlen(q[:tq], k[:tk], v[:tk], cq, ck, lq, max(lens_k),
                                                precision=recipe.name, backend=f"hopper:persistent=2,walk={walk}")
    o = torch.full_like(q, float("nan"))
    lse = torch.full((hq, q.shape[0]), float("nan"), device="cuda")
    ran = varlen._run_persistent(q, k, v, o, lse, cq, ck, lq, d ** -0.5 * math.log2(math.e), is_causal=causal,
                                 positive_scale=True, recipe=recipe, cfg=choice.config.persistent,
                                 knobs=dict(O_TMA=True))
    assert ran == walk
    assert torch.isnan(o[tq:]).all(), "a store past the batch's last sequence"
    o_seq, lse_seq, seq_name = _run(q[:tq], k[:tk], v[:tk], cq, ck, causal, backend="hopper:persistent=0")
    assert "persistent" not in seq_name, seq_name
    assert not torch.isnan(o[:tq]).any()
    assert torch.equal(o[:tq], o_seq) and torch.equal(lse[:, :tq], lse_seq)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [[1000], [1 + i % 3 for i in range(1100)], [700] * 3 + [5] * 300])
def test_head_major_walk_batches(causal, lens):
    """The unit deal (`walk=1`) on one sequence (32 units: most programs have none), on more sequences than a step
    of the unit count (1100 of 1-3 tokens: its sum carried over steps), and on long and short sequences whose causal
    calls pair blocks: float64 and bitwise against the per-sequence kernel."""
    q, k, v, cq, ck = packed(lens, lens, 4, 2, 128, torch.bfloat16, "cuda", seed=len(lens))
    o, lse, name = _run(q, k, v, cq, ck, causal, backend="hopper:walk=1")
    assert "persistent" in name and "walk=1]" in name, name
    ref_o, _ = reference_attention_varlen(q, k, v, cq, ck, is_causal=causal)
    assert compare_attention(o, ref_o, ATTENTION_RECIPES["bf16"]).passed
    o_seq, lse_seq, _ = _run(q, k, v, cq, ck, causal, backend="hopper:persistent=0")
    assert torch.equal(o, o_seq) and torch.equal(lse, lse_seq)


def test_head_major_walk_bad_call_is_nan():
    """cu_seqlens that break a check, with sync_checks=False: every output NaN on the unit deal too (its counts
    come from the zeroed copy: no tile runs)."""
    q, k, v, cq, ck = packed([200, 100], [200, 100], 4, 4, 128, torch.bfloat16, "cuda", seed=9)
    bad = cq.clone()
    bad[1] = 350  # past cu_seqlens[2] (300) and past the 300 rows: decreasing
    o = xkernels.attention_varlen(q, k, v, bad, ck, 300, 300, is_causal=True, sync_checks=False,
                                  backend="hopper:walk=1")
    assert torch.isnan(o).all()
