"""The persistent attention forward's tile walks (`common/tile_scheduler.py`), run through the Triton interpreter on
the CPU (on a GPU compiled): every tile exactly once, and WALK 1's balance and locality."""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xkernels.common.tile_scheduler import tile_of, tiles_of, walk_units

MAX_TILES = 64  # per program, in these tests


@triton.jit
def _enumerate(OUT, COUNT, n_tiles, m_blocks, BH, arg, WALK: tl.constexpr, MAX: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    walk = (n_tiles, m_blocks, BH, arg)
    count = tiles_of(pid, nprog, walk, WALK)
    tl.store(COUNT + pid, count)
    for n in range(0, tl.minimum(count, MAX)):
        bh, m_block = tile_of(pid, nprog, n, walk, WALK)
        tl.store(OUT + (pid * MAX + n) * 2, bh)
        tl.store(OUT + (pid * MAX + n) * 2 + 1, m_block)


def walk_lists(bh: int, m_blocks: int, sms: int, walk: int, arg: int, device: str) -> list[list[tuple[int, int]]]:
    """Each program's tiles in order, with the grid a launch would use (at most the walk's units)."""
    n_tiles = bh * m_blocks
    grid = min(walk_units(n_tiles, m_blocks, bh, walk), sms)
    out = torch.full((grid, MAX_TILES, 2), -1, dtype=torch.int32, device=device)
    count = torch.full((grid,), -1, dtype=torch.int32, device=device)
    _enumerate[(grid,)](out, count, n_tiles, m_blocks, bh, arg, WALK=walk, MAX=MAX_TILES)
    out, count = out.cpu(), count.cpu()
    assert int(count.max()) <= MAX_TILES, "test too large for its buffer"
    return [[tuple(int(x) for x in out[p, n]) for n in range(int(count[p]))] for p in range(grid)]


def _covers_once(lists, bh: int, m_blocks: int) -> None:
    seen = [t for tiles in lists for t in tiles]
    want = [(h, m) for h in range(bh) for m in range(m_blocks)]
    assert sorted(seen) == want, "each (head, query block) tile exactly once"
    assert all(tiles for tiles in lists), "every program of the grid has a tile"


@pytest.mark.parametrize("bh,m_blocks,sms,group", [(128, 4, 132, 1), (64, 8, 132, 4), (32, 5, 132, 1),
                                                   (7, 3, 132, 1), (1024, 4, 132, 1), (16, 1, 8, 2)])
def test_head_major_pairs_cover_balance_and_stay_local(device, bh, m_blocks, sms, group):
    lists = walk_lists(bh, m_blocks, sms, 1, group, device)
    _covers_once(lists, bh, m_blocks)
    half = m_blocks // 2
    for tiles in lists:
        pairs = [t for t in tiles if t[1] != half or m_blocks % 2 == 0]
        # the pairs come first, each as (longer block, its partner) of one head back to back
        for a, b in zip(pairs[0::2], pairs[1::2], strict=True):
            assert a[0] == b[0] and a[1] + b[1] == m_blocks - 1 and a[1] > b[1], (a, b)
    # causal cost (key tiles of block m: m + 1): programs differ by at most one unit
    costs = [sum(m + 1 for _, m in tiles) for tiles in lists]
    assert max(costs) - min(costs) <= m_blocks + 1, costs
    # locality: the units programs run as their r-th (one round) cover a narrow range of KV heads
    if half:
        for r in range(min(len(t) for t in lists) // 2):
            kv_heads = {tiles[2 * r][0] // group for tiles in lists if len(tiles) > 2 * r + 1}
            assert max(kv_heads) - min(kv_heads) <= len(lists) // (group * half) + 1, (r, sorted(kv_heads))


@pytest.mark.parametrize("bh,m_blocks,sms,chunk", [(128, 4, 132, 128), (64, 8, 132, 16), (9, 3, 4, 4)])
def test_l2_chunk_walk_covers_every_tile_once(device, bh, m_blocks, sms, chunk):
    lists = walk_lists(bh, m_blocks, sms, 0, chunk, device)
    _covers_once(lists, bh, m_blocks)
    for p, tiles in enumerate(lists):  # the longest block of the first chunk first, round-robin
        assert tiles[0] == (p % min(chunk, bh), m_blocks - 1 - p // min(chunk, bh)) or p >= chunk * m_blocks


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kv=st.integers(1, 12), group=st.sampled_from([1, 2, 4]), m_blocks=st.integers(1, 9), sms=st.integers(1, 40))
def test_head_major_pairs_any_shape(device, kv, group, m_blocks, sms):
    bh = kv * group
    lists = walk_lists(bh, m_blocks, sms, 1, group, device)
    _covers_once(lists, bh, m_blocks)
    costs = [sum(m + 1 for _, m in tiles) for tiles in lists]
    assert max(costs) - min(costs) <= m_blocks + 1


def test_broken_walk_is_caught(device):
    """The coverage check fails on a walk that drops a program's last tile (tiles_of one short)."""
    lists = walk_lists(32, 4, 20, 1, 1, device)
    lists[3] = lists[3][:-1]
    with pytest.raises(AssertionError):
        _covers_once(lists, 32, 4)
