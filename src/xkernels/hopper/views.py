"""The 2-D views that host TMA descriptors tile, over dense (B, H, S, D) tensors of either common layout.

A kernel addresses head (b, h) of such a view at row b * rows_b + h * rows_h (plus its sequence position) and
column h * cols_h, so one kernel reads heads-outer tensors ((B, H, S, D) contiguous: rows_h = S, cols_h = 0) and
sequence-outer ones ((B, S, H, D) transposed, as projections and flash_attn callers hold them: rows_h = 0,
cols_h = the head stride) in place. The forward's persistent kernel and the backward's kernels share this.
"""

from __future__ import annotations

import torch

Geometry = tuple[int, int, int]  # (rows_b, rows_h, cols_h)


def descriptor_view(t: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int], Geometry] | None:
    """A 2-D view of a (B, H, S, D) tensor that TMA can tile, or None: ((rows, cols), (row stride, 1), (rows_b,
    rows_h, cols_h)) such that element (b, h, s, d) is at row b * rows_b + h * rows_h + s, column h * cols_h + d.
    Covers heads-outer layouts ((B, H, S, D) contiguous and its views) and sequence-outer ones ((B, S, H, D)
    transposed, as projections produce them). The base address's alignment is the caller's to check."""
    b, h, s, d = t.shape
    sb, sh = (st if n > 1 else 0 for st, n in zip(t.stride()[:2], t.shape[:2], strict=True))  # any for size 1
    ss = t.stride(2)
    if s == 1:  # a stride of nothing: take the next dim out's, so layouts one in memory get one view ((B, 1, H, D)
        ss = sb or sh or d  # transposed and (B, H, 1, D) contiguous: a row per batch entry, heads side by side)
    if t.stride(3) != 1 or ss <= 0 or (ss * t.element_size()) % 16 or sb % ss:
        return None
    if sh % ss == 0:  # heads outer: whole rows per head
        rows_b, rows_h, cols_h = sb // ss, sh // ss, 0
        rows, cols = (b - 1) * rows_b + (h - 1) * rows_h + s, d
    elif (h - 1) * sh + d <= ss and (sh * t.element_size()) % 16 == 0:  # heads side by side within a row
        rows_b, rows_h, cols_h = sb // ss, 0, sh
        rows, cols = (b - 1) * rows_b + s, (h - 1) * sh + d
    else:
        return None
    if rows >= 2**31:  # TMA coordinates are int32 (an overlapping view can get here; the dense kernel serves it)
        return None
    return (rows, cols), (ss, 1), (rows_b, rows_h, cols_h)


def tight(t: torch.Tensor, geometry: Geometry) -> bool:
    """Whether the rows a tile reads past one head's sequence end are the tensor's own elements (the next head's or
    batch entry's rows of the same columns) or past the view's last row (TMA's zero fill), never memory between
    them: a kernel that masks such rows multiplies their zeros by what they hold, which is then finite wherever
    the caller's tensor is."""
    b, h, s, _ = t.shape
    rows_b, rows_h, cols_h = geometry
    heads_ok = h == 1 or rows_h == s or (rows_h == 0 and cols_h > 0)
    return heads_ok and (b == 1 or rows_b == s * (h if rows_h else 1))
