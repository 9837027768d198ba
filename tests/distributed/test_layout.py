"""The ring's block plan (`layout.ring_blocks`): over the W steps each rank attends exactly the (query, key) pairs
the mask allows, each once, for both layouts, with and without a causal mask."""

import pytest

from xkernels.distributed.layout import ring_blocks


def _positions(rank: int, world: int, n: int, layout: str) -> list[int]:
    if layout == "contiguous":
        return list(range(rank * n, (rank + 1) * n))
    c = n // 2
    return list(range(rank * c, (rank + 1) * c)) + list(range((2 * world - 1 - rank) * c, (2 * world - rank) * c))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_blocks_cover_the_mask_exactly_once(world, layout, causal):
    n = 6
    for rank in range(world):
        qpos = _positions(rank, world, n, layout)
        seen: list[tuple[int, int]] = []
        for source in range(world):
            kpos = _positions(source, world, n, layout)
            for b in ring_blocks(rank, source, n, causal=causal, layout=layout):
                for i in range(b.q0, b.q1):
                    for j in range(b.k0, b.k1):
                        if not b.causal or (j - b.k0) <= (i - b.q0):
                            seen.append((qpos[i], kpos[j]))
        want = [(i, j) for i in qpos for j in range(world * n) if not causal or j <= i]
        assert sorted(seen) == sorted(want)
