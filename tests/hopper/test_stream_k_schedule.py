"""The stream-K walk's arithmetic (`hopper/gemm.py`: `_stream_span`, `_units`, `_k_range`, `_stream_fixup`), written
out in Python with the kernel's integer formulas, checked over many (tiles, k-steps, CTAs): every k-step of every tile
is run exactly once; each CTA contributes at most one piece and does so first; a tile's owner is the CTA of its last
k-step and counts exactly the CTAs holding its earlier k-steps, all numbered below it (so no wait is circular). The
kernel itself runs only on a GPU (tests/gpu/test_gpu_kernels.py::test_hopper_gemm_stream_k)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


def pieces(pid: int, grid: int, tiles: int, ks: int) -> list[tuple[int, int, int]]:
    """(tile, first k-step, end k-step) of CTA pid's units, in the order the kernel runs them."""
    total = tiles * ks
    first, end = pid * total // grid, (pid + 1) * total // grid
    n = (end - 1) // ks - first // ks + 1
    out = []
    for unit in range(n):
        tile = (end - 1) // ks - unit
        start = tile * ks
        out.append((tile, max(first, start) - start, min(end, start + ks) - start))
    return out


def first_cta(tile: int, grid: int, tiles: int, ks: int) -> int:
    """`_stream_fixup`'s c0: the CTA holding the tile's first k-step."""
    return ((tile * ks + 1) * grid - 1) // (tiles * ks)


@settings(max_examples=300, deadline=None)
@given(tiles=st.integers(1, 400), ks=st.integers(1, 80), sms=st.integers(1, 140))
def test_stream_k_walk_covers_each_step_once_and_waits_only_downward(tiles, ks, sms):
    grid = min(sms, tiles * ks)  # `launch_spec`: every CTA holds at least one k-step
    seen: dict[int, list[tuple[int, int, int]]] = {}
    for pid in range(grid):
        units = pieces(pid, grid, tiles, ks)
        assert units, "an empty span"
        contributions = [i for i, (_, _, hi) in enumerate(units) if hi < ks]
        assert contributions in ([], [0]), "a CTA contributes at most once, first"
        for tile, lo, hi in units:
            assert 0 <= lo < hi <= ks
            seen.setdefault(tile, []).append((lo, hi, pid))
    assert sorted(seen) == list(range(tiles))
    for tile, parts in seen.items():
        parts.sort()
        assert parts[0][0] == 0 and parts[-1][1] == ks
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False)), "k-steps run once, in order"
        owner = parts[-1][2]
        contributors = [pid for _, _, pid in parts[:-1]]
        assert contributors == list(range(first_cta(tile, grid, tiles, ks), owner)), "the owner's count and slots"
        assert first_cta(tile, grid, tiles, ks) == parts[0][2]
