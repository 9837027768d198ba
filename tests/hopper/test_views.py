"""The 2-D views the Hopper kernels' descriptors tile (`hopper/views.py`): element (b, h, s, d) at row
b * rows_b + h * rows_h + s, column h * cols_h + d, for heads-outer and sequence-outer layouts; which views are tight
(a tile past a head's end reads the tensor's own rows). Runs without a GPU."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xkernels.hopper.views import descriptor_view, tight

BF16 = torch.bfloat16


def _storage_offset(b, h, s, d, view):
    (_, _), (row_stride, _), (rb, rh, ch) = view
    return (b * rb + h * rh + s) * row_stride + h * ch + d


def _layouts():
    """(name, tensor, geometry, tight): contiguous, (B, S, H, D) transposed, sliced from a fused QKV projection, and
    sliced along S from a longer buffer (a cache: not tight), on the meta device."""
    bhsd = torch.empty(2, 3, 256, 64, device="meta", dtype=BF16)
    bshd = torch.empty(2, 256, 3, 64, device="meta", dtype=BF16).transpose(1, 2)
    qkv = torch.empty(2, 256, 3 + 2 * 1, 64, device="meta", dtype=BF16)[:, :, :3].transpose(1, 2)
    cache_bhsd = torch.empty(2, 3, 512, 64, device="meta", dtype=BF16)[:, :, :256]
    cache_bshd = torch.empty(2, 512, 3, 64, device="meta", dtype=BF16).transpose(1, 2)[:, :, :256]
    return [("bhsd", bhsd, (3 * 256, 256, 0), True), ("bshd", bshd, (256, 0, 64), True),
            ("qkv", qkv, (256, 0, 64), True), ("cache_bhsd", cache_bhsd, (3 * 512, 512, 0), False),
            ("cache_bshd", cache_bshd, (512, 0, 64), False)]


@pytest.mark.parametrize("name,t,geometry,is_tight", _layouts(), ids=[c[0] for c in _layouts()])
def test_views_address_every_element_and_end_at_the_last(name, t, geometry, is_tight):
    view = descriptor_view(t)
    assert view is not None and view[2] == geometry
    for idx in ((0, 0, 0, 0), (1, 2, 255, 63), (1, 1, 7, 5), (0, 2, 100, 1)):
        assert _storage_offset(*idx, view) == sum(i * st for i, st in zip(idx, t.stride(), strict=True))
    (rows, cols), _, _ = view
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    assert (rows - 1) * view[1][0] + cols - 1 == last  # the view ends at the tensor's last element
    assert tight(t, view[2]) is is_tight


def test_views_that_tma_cannot_tile():
    assert descriptor_view(torch.empty(2, 3, 64, 256, device="meta").transpose(2, 3)) is None  # D not unit-stride
    unaligned = torch.empty(2, 3, 256, 68, device="meta", dtype=BF16)[..., :60]
    assert descriptor_view(unaligned) is None  # rows not 16-byte multiples


def test_size_one_dims_and_single_heads_are_tight():
    for shape in ((1, 1, 8, 64), (2, 1, 8, 64), (1, 4, 8, 64)):
        t = torch.empty(*shape, device="meta", dtype=BF16)
        view = descriptor_view(t)
        assert view is not None and tight(t, view[2])
    one_head_bshd = torch.empty(2, 8, 1, 64, device="meta", dtype=BF16).transpose(1, 2)
    assert tight(one_head_bshd, descriptor_view(one_head_bshd)[2])


def test_one_row_views_agree_whatever_the_size_one_stride():
    """S = 1: the sequence stride is meaningless (torch's `is_contiguous` ignores it), so (B, H, 1, D) contiguous,
    (B, 1, H, D) transposed and any stride of that dim give one view: a row per batch entry, heads side by side."""
    q = torch.empty(2, 4, 1, 64, device="meta", dtype=BF16)
    for t in (q, torch.empty(2, 1, 4, 64, device="meta", dtype=BF16).transpose(1, 2),
              torch.empty_strided((2, 4, 1, 64), (256, 64, 7, 1), device="meta", dtype=BF16)):
        view = descriptor_view(t)
        assert view == (((2, 256), (256, 1), (1, 0, 64))) and tight(t, view[2])
    one = torch.empty(1, 1, 1, 64, device="meta", dtype=BF16)
    assert descriptor_view(torch.empty_strided(one.shape, (64, 64, 3, 1), device="meta", dtype=BF16))[1] == (64, 1)


@st.composite
def _laid_out(draw):
    """A (B, H, S, D) bf16 tensor on the meta device over storage of another order, possibly with more heads (a fused
    projection) or more positions (a cache) than it takes, or one head or row: what callers hand the kernels."""
    b, h, s = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    d = 8  # 16 bytes: TMA's smallest row
    extra_h, extra_s = draw(st.sampled_from([0, 0, 2])), draw(st.sampled_from([0, 0, 3]))
    order = draw(st.permutations(["b", "h", "s"]))
    sizes = {"b": b, "h": h + extra_h, "s": s + extra_s}
    base = torch.empty([sizes[n] for n in order] + [d], device="meta", dtype=BF16)
    t = base.permute(*[order.index(n) for n in "bhs"], 3)
    return t[:, :h, :s]


def _offsets(t):
    """Every element's storage offset."""
    b, h, s, d = t.shape
    return {sum(i * st for i, st in zip(idx, t.stride(), strict=True))
            for idx in ((i, j, k, m) for i in range(b) for j in range(h) for k in range(s) for m in range(d))}


@settings(max_examples=300, deadline=None)
@given(_laid_out())
def test_views_map_every_element_and_tight_tiles_stay_inside_the_tensor(t):
    """For any layout `descriptor_view` accepts, each element sits where the view says; where the view is tight,
    every row a tile reads past a head's sequence end (up to 16 rows here) is either past the view's last row (TMA's
    zero fill) or made of the tensor's own elements, never memory outside it."""
    view = descriptor_view(t)
    if view is None:
        return
    (rows, cols), (row_stride, _), geometry = view
    b, h, s, d = t.shape
    for idx in ((0, 0, 0, 0), (b - 1, h - 1, s - 1, d - 1), (b // 2, h // 2, s // 2, 1)):
        assert _storage_offset(*idx, view) == sum(i * st for i, st in zip(idx, t.stride(), strict=True))
    assert (h - 1) * geometry[2] + d <= cols
    if not tight(t, geometry):
        return
    own = _offsets(t)
    for bi in range(b):
        for hi in range(h):
            for r in range(s + 16):
                row = bi * geometry[0] + hi * geometry[1] + r
                if row >= rows:
                    break
                start = row * row_stride + hi * geometry[2]
                assert all(start + m in own for m in range(d)), (bi, hi, r)
