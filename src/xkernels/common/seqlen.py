"""Which keys a block of query rows visits, and which of them need a mask, and where a packed sequence starts: written
once for every attention kernel.

Dense causal masks are top-left aligned, as in F.scaled_dot_product_attention(is_causal=True): query i sees keys
j <= i, whatever Sq and Skv are. Variable-length (and KV-cache) calls align them bottom-right, as FlashAttention
does: query i sees keys j <= i + Skv - Sq; that is the same rule with the diagonal shifted by `offset`.

Sliding windows (FlashAttention's window_size=(left, right)) make the visible keys a band around that diagonal:
query i sees keys i + offset - left <= j <= i + offset + right, a side of -1 unbounded, causal being right = 0. The
kernels take the band as three compile-time values (`Band.constexprs`): CAUSAL (the upper side is present), SHIFT
(how far past the alignment's diagonal it lies: 0 when causal, `right` for a non-causal window) and BAND (-1: no
lower side; else the lower side's distance below the shifted diagonal, left + SHIFT). A kernel adds SHIFT to its
`offset` and masks keys j < i + offset - BAND.
"""

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class Band:
    """The keys each query row sees, as the attention kernels take it (module docstring): the portable ones, the
    Gluon dense and varlen forwards and the Gluon dK/dV and dQ kernels."""

    causal: bool
    shift: int = 0
    band: int = -1

    @classmethod
    def of(cls, is_causal: bool, window: tuple[int, int] = (-1, -1)) -> "Band":
        """From the API's `is_causal` and a checked window (`validation.check_window`: a causal right side is 0)."""
        left, right = window
        shift = 0 if is_causal or right < 0 else right
        return cls(is_causal or right >= 0, shift, -1 if left < 0 else left + shift)

    @property
    def windowed(self) -> bool:
        """Whether a window cuts keys that the plain causal or full mask keeps (a non-causal window of right side 0
        and no left side is the causal mask)."""
        return self.shift > 0 or self.band >= 0

    def constexprs(self) -> dict[str, object]:
        return dict(CAUSAL=self.causal, SHIFT=self.shift, BAND=self.band)

    def __str__(self) -> str:
        """' window=left,right' (as window_size) when windowed, else ''."""
        if not self.windowed:
            return ""
        return f" window={self.band - self.shift if self.band >= 0 else -1},{self.shift if self.causal else -1}"


def band_constexprs(band: Band | None, causal: bool) -> dict[str, object]:
    """A kernel's CAUSAL, SHIFT and BAND: `band`'s where it cuts keys, else the plain causal or full mask's."""
    return (band if band is not None and band.windowed else Band(causal)).constexprs()


@triton.jit
def kv_bounds(start_m, SKV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full_hi, hi): key tiles in [0, full_hi) need no mask; [full_hi, hi) holds the tail tile and, when causal, the
    diagonal tiles; keys >= hi are never visited. A causal tile is mask-free only if it ends at or before the block's
    first query; BLOCK_M need not be a multiple of BLOCK_N (192-row blocks start mid-tile), so full_hi rounds start_m
    down to a tile boundary."""
    full_hi = (SKV // BLOCK_N) * BLOCK_N
    hi = SKV
    if CAUSAL:
        full_hi = min(full_hi, (start_m // BLOCK_N) * BLOCK_N)
        hi = min(SKV, start_m + BLOCK_M)
    return full_hi, hi


@triton.jit
def kv_bounds_shifted(start_m, offset, SKV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """`kv_bounds` for a causal diagonal shifted by `offset` (query i sees keys j <= i + offset; offset may be
    negative, and then the first rows see no key)."""
    full_hi = (SKV // BLOCK_N) * BLOCK_N
    hi = SKV
    if CAUSAL:
        first = max(start_m + offset, 0)  # clamped before rounding: integer division truncates negatives
        full_hi = min(full_hi, (first // BLOCK_N) * BLOCK_N)
        hi = max(min(SKV, start_m + BLOCK_M + offset), 0)
    return full_hi, hi


@triton.jit
def kv_band_start(start_m, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BAND: tl.constexpr):
    """(lo, full_lo) for the rows [start_m, start_m + BLOCK_M) with the diagonal at `offset` (SHIFT included) and a
    lower side BAND below it (BAND >= 0): the first key tile a row of the block sees (earlier tiles are never
    visited) and the first tile no row of the block masks on that side (tiles between them need the lower mask)."""
    lo = (max(start_m + offset - BAND, 0) // BLOCK_N) * BLOCK_N
    full_lo = ((max(start_m + BLOCK_M - 1 + offset - BAND, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    return lo, full_lo


@triton.jit
def sequence_bounds(CU_Q, CU_K, b):
    """(q0, SQ, k0, SKV) of sequence b of a packed batch: its first query row (int64) and query count, its first key
    row (int64) and key count."""
    q0 = tl.load(CU_Q + b).to(tl.int64)
    sq = tl.load(CU_Q + b + 1) - q0.to(tl.int32)
    k0 = tl.load(CU_K + b).to(tl.int64)
    return q0, sq, k0, tl.load(CU_K + b + 1) - k0.to(tl.int32)


@triton.jit
def sequence(CU_Q, CU_K, b, SQ, SKV, VARLEN: tl.constexpr):
    """(q0, sq, k0, skv, offset) of batch entry b: its first query row and key row, its query and key counts, and the
    causal diagonal's shift (query i sees keys j <= i + offset). Dense: rows from 0, the call's lengths, top-left
    (offset 0); VARLEN: sequence b of a packed batch, bottom-right (offset skv - sq)."""
    if VARLEN:
        q0, sq, k0, skv = sequence_bounds(CU_Q, CU_K, b)
        offset = skv - sq
    else:
        q0, sq, k0, skv, offset = 0, SQ, 0, SKV, 0
    return q0, sq, k0, skv, offset


@triton.jit
def q_bounds(start_n, offset, sq, skv, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
             BLOCK_N: tl.constexpr = 0, BAND: tl.constexpr = -1):
    """(lo, hi): the query blocks a block of keys from `start_n` meets (a backward's dK/dV walk): from the block of
    the first query that sees key start_n (causal: query start_n - offset) to sq, or with a lower band side (BAND >= 0,
    the block holding BLOCK_N keys) to the last query that sees key start_n + BLOCK_N - 1 (query
    start_n + BLOCK_N - 1 - offset + BAND); none where start_n is past the sequence's keys (VARLEN: the grid covers
    the longest sequence)."""
    lo = 0
    if CAUSAL:
        lo = (max(start_n - offset, 0) // BLOCK_M) * BLOCK_M
    hi = sq
    if BAND >= 0:
        hi = max(min(sq, start_n + BLOCK_N - offset + BAND), 0)
    if VARLEN:
        hi = tl.where(start_n < skv, hi, 0)
    return lo, hi
