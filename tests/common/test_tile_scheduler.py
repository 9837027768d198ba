"""The persistent attention forward's tile walks (`common/tile_scheduler.py`), run through the Triton interpreter on
the CPU (on a GPU compiled): each program's tile list equal to a plain-Python statement of the walk, every tile
exactly once, and the head-major walk's balance and locality."""

import itertools

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xkernels.common.tile_scheduler import (
    packed_pairs_pay,
    packed_tile,
    packed_tiles_of,
    packed_units_kernel,
    pairs_pay,
    tile_of,
    tiles_of,
    walk_units,
)


@triton.jit
def _enumerate(OUT, COUNT, n_tiles, m_blocks, BH, arg, paired, WALK: tl.constexpr, MAX: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    walk = (n_tiles, m_blocks, BH, arg, paired)
    count = tiles_of(pid, nprog, walk, WALK)
    tl.store(COUNT + pid, count)
    for n in range(0, tl.minimum(count, MAX)):
        bh, m_block = tile_of(pid, nprog, n, walk, WALK)
        tl.store(OUT + (pid * MAX + n) * 2, bh)
        tl.store(OUT + (pid * MAX + n) * 2 + 1, m_block)


def walk_lists(bh: int, m_blocks: int, sms: int, walk: int, arg: int, paired: bool,
               device: str) -> list[list[tuple[int, int]]]:
    """Each program's tiles in order, from the kernel, with the grid a launch would use (at most the walk's units)."""
    n_tiles = bh * m_blocks
    grid = min(walk_units(n_tiles, m_blocks, bh, walk, paired), sms)
    out = torch.full((grid, n_tiles, 2), -1, dtype=torch.int32, device=device)
    count = torch.full((grid,), -1, dtype=torch.int32, device=device)
    _enumerate[(grid,)](out, count, n_tiles, m_blocks, bh, arg, int(paired), WALK=walk, MAX=n_tiles)
    out, count = out.cpu(), count.cpu()
    assert int(count.max()) <= n_tiles and int(count.min()) >= 0
    return [[tuple(int(x) for x in out[p, n]) for n in range(int(count[p]))] for p in range(grid)]


def reference_lists(bh: int, m_blocks: int, sms: int, walk: int, arg: int, paired: bool) -> list[list[tuple]]:
    """The walks as the module docstring states them, in plain Python."""
    if walk == 0:  # chunks of `arg` heads, longest blocks first with heads fastest, dealt round-robin
        order = []
        for c in range(0, bh, arg):
            heads = min(arg, bh - c)
            order += [(c + r % heads, m_blocks - 1 - r // heads) for r in range(heads * m_blocks)]
        units = [[t] for t in order]
    elif not paired:  # (KV head, block longest first, query head of the group), one tile a unit
        units = [[(kv * arg + g, m)] for kv in range(bh // arg) for m in reversed(range(m_blocks))
                 for g in range(arg)]
    else:  # pairs in (KV head, pair, query head) order, then the middle blocks
        half = m_blocks // 2
        units = [[(kv * arg + g, m_blocks - 1 - j), (kv * arg + g, j)] for kv in range(bh // arg)
                 for j in range(half) for g in range(arg)]
        units += [[(h, half)] for h in range(bh)] if m_blocks % 2 else []
    grid = min(len(units), sms)
    return [[t for u in units[p::grid] for t in u] for p in range(grid)]


def _covers_once(lists, bh: int, m_blocks: int) -> None:
    seen = [t for tiles in lists for t in tiles]
    assert sorted(seen) == [(h, m) for h in range(bh) for m in range(m_blocks)], "each tile exactly once"
    assert all(tiles for tiles in lists), "every program of the grid has a tile"


def _check(bh, m_blocks, sms, walk, arg, paired, device):
    lists = walk_lists(bh, m_blocks, sms, walk, arg, paired, device)
    assert lists == reference_lists(bh, m_blocks, sms, walk, arg, paired)
    _covers_once(lists, bh, m_blocks)
    return lists


@pytest.mark.parametrize("bh,m_blocks,sms,group", [(1024, 4, 132, 1), (128, 8, 132, 4), (264, 5, 132, 1),
                                                   (90, 3, 40, 2), (16, 1, 8, 2)])
def test_head_major_pairs_balance_and_stay_local(device, bh, m_blocks, sms, group):
    lists = _check(bh, m_blocks, sms, 1, group, True, device)
    half = m_blocks // 2
    # causal cost (block m sees m + 1 blocks of keys): programs differ by at most one unit
    costs = [sum(m + 1 for _, m in tiles) for tiles in lists]
    assert max(costs) - min(costs) <= m_blocks + 1, costs
    # locality: the units programs run as their r-th (one round) cover a narrow range of KV heads
    if half:
        pair_rounds = min(sum(m > half - (m_blocks % 2 == 0) for _, m in t) for t in lists)  # longer blocks
        for r in range(pair_rounds):
            kv_heads = {tiles[2 * r][0] // group for tiles in lists}
            assert max(kv_heads) - min(kv_heads) <= len(lists) // (group * half) + 1, (r, sorted(kv_heads))


@pytest.mark.parametrize("bh,m_blocks,sms,group", [(32, 4, 132, 1), (64, 8, 132, 4), (7, 3, 5, 1)])
def test_head_major_single_tiles(device, bh, m_blocks, sms, group):
    """Unpaired (full masks, few pairs): every program of min(tiles, SMs) busy, a head's blocks side by side."""
    lists = _check(bh, m_blocks, sms, 1, group, False, device)
    assert len(lists) == min(bh * m_blocks, sms)


@pytest.mark.parametrize("bh,m_blocks,sms,chunk", [(128, 4, 132, 128), (64, 8, 132, 16), (9, 3, 4, 4)])
def test_l2_chunk_walk(device, bh, m_blocks, sms, chunk):
    _check(bh, m_blocks, sms, 0, chunk, False, device)


def test_pairs_only_where_they_pay():
    assert pairs_pay(True, 4, 1024, 132) and not pairs_pay(False, 4, 1024, 132)  # a full mask: no pairs
    assert not pairs_pay(True, 4, 32, 132)  # 128 tiles: one round, a tile a program
    assert pairs_pay(True, 4, 64, 132)  # 256 tiles: two rounds of single tiles could stack two long blocks
    assert not pairs_pay(True, 1, 1024, 132)  # one block a head: nothing to pair


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kv=st.integers(1, 12), group=st.sampled_from([1, 2, 4]), m_blocks=st.integers(1, 9), sms=st.integers(1, 40),
       paired=st.booleans())
def test_head_major_any_shape(device, kv, group, m_blocks, sms, paired):
    bh = kv * group
    lists = _check(bh, m_blocks, sms, 1, group, paired, device)
    if paired:
        costs = [sum(m + 1 for _, m in tiles) for tiles in lists]
        assert max(costs) - min(costs) <= m_blocks + 1


def test_a_broken_walk_is_caught(device):
    """The checks fail on a program that drops its last tile, and on pairs dealt shorter block first."""
    lists = walk_lists(32, 4, 20, 1, 1, True, device)
    with pytest.raises(AssertionError):
        _covers_once([t[:-1] if p == 3 else t for p, t in enumerate(lists)], 32, 4)
    swapped = [[t for a, b in zip(tiles[0::2], tiles[1::2], strict=True) for t in (b, a)] for tiles in lists]
    assert swapped != reference_lists(32, 4, 20, 1, 1, True)


@triton.jit
def _enumerate_packed(CU_Q, UNITS, OUT, COUNT, B, HQ, BLOCK_M: tl.constexpr, PAIRS: tl.constexpr, MAX: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    count = packed_tiles_of(pid, nprog, UNITS, B, PAIRS)
    tl.store(COUNT + pid, count)
    for n in range(0, tl.minimum(count, MAX)):
        seq, h, block = packed_tile(n, pid, nprog, UNITS, CU_Q, B, BLOCK_M, PAIRS)
        tl.store(OUT + (pid * MAX + n) * 3, seq)
        tl.store(OUT + (pid * MAX + n) * 3 + 1, h)
        tl.store(OUT + (pid * MAX + n) * 3 + 2, block)


def packed_lists(lengths, hq, sms, pairs, device, block_m=128):
    """Each program's (sequence, head, block) tiles from the kernels, absent second tiles dropped."""
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=device)
    b = len(lengths)
    units = torch.full((b + 1,), -1, dtype=torch.int32, device=device)
    packed_units_kernel[(1,)](cu, units, b, hq, BLOCK_M=block_m, PAIRS=pairs, BLOCK=8)
    blocks = [-(-n // block_m) for n in lengths]
    per_seq = [hq * ((m + 1) // 2 if pairs else m) for m in blocks]
    assert units.cpu().tolist() == [0] + list(itertools.accumulate(per_seq)), "unit counts per sequence"
    most = 2 * sum(blocks) * hq + 1  # a program's tiles: at most every tile, each with an absent partner
    out = torch.full((sms, most, 3), -1, dtype=torch.int32, device=device)
    count = torch.full((sms,), -1, dtype=torch.int32, device=device)
    _enumerate_packed[(sms,)](cu, units, out, count, b, hq, BLOCK_M=block_m, PAIRS=pairs, MAX=most)
    out, count = out.cpu(), count.cpu()
    assert 0 <= int(count.min()) and int(count.max()) <= most
    return [[tuple(int(x) for x in out[p, n]) for n in range(int(count[p]))] for p in range(sms)]


def packed_reference(lengths, hq, sms, pairs, block_m=128):
    """Each program's tiles as the module states the deal; the absent second tile of a middle block's unit as
    (sequence, head, block count), which the kernels skip (its rows start past the sequence)."""
    units = []
    for s, n in enumerate(lengths):
        m = -(-n // block_m)
        for h in range(hq):
            if pairs:
                units += [[(s, h, m - 1 - j), (s, h, j if j != m - 1 - j else m)] for j in range((m + 1) // 2)]
            else:
                units += [[(s, h, blk)] for blk in reversed(range(m))]
    return [[t for u in units[p::sms] for t in u] for p in range(sms)]


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("lengths,hq,sms", [([300, 0, 129, 1, 640, 0], 4, 7), ([128] * 5, 2, 3), ([0, 0], 2, 4),
                                            ([1000, 64, 255, 512, 3], 3, 16)])
def test_packed_walk_deals_real_tiles(device, lengths, hq, sms, pairs):
    """The packed kernel's WALK 1: unit counts per sequence (empty sequences hold none), each program's tiles as the
    reference deals them, every (sequence, head, block) tile once; programs past the units run none."""
    lists = packed_lists(lengths, hq, sms, pairs, device)
    assert lists == packed_reference(lengths, hq, sms, pairs)
    want = sorted((s, h, blk) for s, n in enumerate(lengths) for h in range(hq) for blk in range(-(-n // 128)))
    assert sorted(t for tiles in lists for t in tiles if t[2] < -(-lengths[t[0]] // 128)) == want


def test_packed_unit_counts_over_many_steps(device):
    """More sequences than a step of the count holds (the test's BLOCK is 8): the sum carries across steps."""
    lengths = [(37 * i) % 300 for i in range(45)]
    assert packed_lists(lengths, 3, 11, True, device) == packed_reference(lengths, 3, 11, True)


def test_packed_pairs_only_past_one_round():
    assert packed_pairs_pay(True, 32, 4096, 128, 132)  # 1024 tiles at least
    assert not packed_pairs_pay(True, 8, 1024, 128, 132)  # 64 tiles: one round, pairs would idle half the SMs
    assert not packed_pairs_pay(False, 32, 1 << 20, 128, 132)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 700), min_size=1, max_size=10), hq=st.integers(1, 4),
       sms=st.integers(1, 20), pairs=st.booleans())
def test_packed_walk_any_batch(device, lengths, hq, sms, pairs):
    lists = packed_lists(lengths, hq, sms, pairs, device)
    assert lists == packed_reference(lengths, hq, sms, pairs)
