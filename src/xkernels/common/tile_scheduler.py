"""The persistent attention forward's tile walks: which (batch * head, query block) tile a program runs n-th.

A persistent program `pid` of `nprog` runs `tiles_of(...)` tiles, the n-th being `tile_of(..., n, ...)`; the walk's
five integers are (n_tiles, m_blocks, BH, arg, paired) with BH = batch * query heads and m_blocks query blocks per
head.

WALK 0, L2 chunks, longest first (arg: heads per chunk; paired unused): heads in chunks whose K/V fit the L2 budget
together, and inside a chunk the longest query blocks first with heads fastest; program pid takes tiles pid,
pid + nprog, ... of that list. The round-robin deal spreads each causal length evenly over the programs when a chunk
holds several rounds of tiles; a head's K/V is read again by its later query blocks up to a chunk's worth of tiles
later (its Q and O traffic passes through L2 in between).

WALK 1, head-major (arg: the GQA group size; the dense kernel's default on most shapes,
`attention_persistent.preferred_walk`): a head's query blocks are dealt next to each other, in (KV head, block,
query head of the group) order, so the programs running at one time cover a few heads and each head's K/V is
reread by its query blocks within a round: a working set of a few heads instead of an L2 chunk.
  paired = 0: single tiles, longest block first, round-robin (full masks, whose tiles all cost the same, and causal
    calls of one round of tiles).
  paired = 1 (causal): blocks m_blocks - 1 - j and j form a pair, dealt round-robin, a program running both back to
    back, the longer first. Causal block m sees (m + 1) * BLOCK_M keys (top-left, Skv >= Sq), so every pair costs
    the same and a static deal is balanced without longest-first order; with an odd m_blocks the middle blocks, one
    per head, come after all pairs, one per unit.
The grid is at most the units dealt (`walk_units`), so every program has work.
"""

import triton
import triton.language as tl

WALKS = {0: "L2 chunks, longest first", 1: "head-major"}


def pairs_pay(causal: bool, m_blocks: int, bh: int, sms: int) -> bool:
    """Whether WALK 1 pairs blocks: causal masks (a full mask's tiles cost the same) with more tiles than programs.
    Within one round every program runs one tile and the longest sets the time; past it single tiles dealt
    round-robin can stack a head's longest blocks on one program (with SMs a multiple of m_blocks, every program
    gets the same block each round: 4:1 at 4 blocks a head), while pairs cost the same everywhere."""
    return causal and m_blocks >= 2 and bh * m_blocks > sms


def walk_units(n_tiles: int, m_blocks: int, bh: int, walk: int, paired: bool) -> int:
    """Units a walk deals to the programs (tiles, or with pairs: pairs and middle blocks): the grid is at most this."""
    if walk == 1 and paired:
        return bh * (m_blocks // 2) + bh * (m_blocks % 2)
    return n_tiles


@triton.jit
def chunk_tile(tile, walk):
    """WALK 0: (batch * head index, query block) of tile `tile` of the chunked list (module docstring)."""
    m_blocks = walk[1]
    BH = walk[2]
    chunk = walk[3]
    per_chunk = chunk * m_blocks
    c = tile // per_chunk
    r = tile % per_chunk
    heads = tl.minimum(chunk, BH - c * chunk)
    return c * chunk + r % heads, m_blocks - 1 - r // heads


@triton.jit
def tiles_of(pid, nprog, walk, WALK: tl.constexpr):
    """How many tiles program `pid` of `nprog` runs (pid < nprog <= the walk's units)."""
    count = (walk[0] - pid + nprog - 1) // nprog
    if WALK == 1:
        if walk[4] != 0:
            pairs = walk[2] * (walk[1] // 2)
            units = pairs + walk[2] * (walk[1] % 2)
            # units pid, pid + nprog, ... below `units`; those below `pairs` hold two tiles
            count = (units - pid + nprog - 1) // nprog + (pairs - pid + nprog - 1) // nprog
    return count


@triton.jit
def tile_of(pid, nprog, n, walk, WALK: tl.constexpr):
    """(batch * head index, query block) of the n-th tile program `pid` of `nprog` runs."""
    m_blocks = walk[1]
    if WALK == 0:
        bh, m_block = chunk_tile(pid + n * nprog, walk)
    else:
        BH = walk[2]
        group = walk[3]
        if walk[4] != 0:
            half = m_blocks // 2
            pairs = BH * half
            my_pairs = (pairs - pid + nprog - 1) // nprog
            if n < 2 * my_pairs:
                u = pid + (n // 2) * nprog
                per_kv = group * tl.maximum(half, 1)
                j = (u // group) % tl.maximum(half, 1)
                bh = (u // per_kv) * group + u % group
                m_block = tl.where(n % 2 == 0, m_blocks - 1 - j, j)  # the pair's longer block first
            else:  # a middle block (odd m_blocks), one per head, after every pair
                bh = pid + (my_pairs + n - 2 * my_pairs) * nprog - pairs
                m_block = half
        else:
            u = pid + n * nprog
            rest = u // group
            bh = (rest // m_blocks) * group + u % group
            m_block = m_blocks - 1 - rest % m_blocks
    return bh, m_block


# The packed (varlen) persistent kernel's WALK 1 deals units of real tiles, not tile indices: with indices over
# B * m_blocks * Hq (m_blocks from the longest sequence), a short sequence's few real tiles fall on a few programs,
# and the programs drift apart through the list, so the tiles running at one time spread over dozens of (sequence,
# head) pairs whatever the order. Units: a query block of a head, or with pairs (causal calls of more tiles than
# programs, `packed_pairs_pay`) blocks m_blocks - 1 - j and j together and a middle block (bottom-right causal: the
# pairs of a sequence cost the same where Sk >= Sq); a sequence's units are head-major, and `packed_units_kernel`
# counts them per sequence on the device (the kernel then finds a unit's sequence by a binary search of those
# counts).
PACKED_UNITS_BLOCK = 256  # sequences per step of the count (any batch: the loop carries the sum)


def packed_pairs_pay(causal: bool, heads: int, total_q: int, block_m: int, sms: int) -> bool:
    """Whether the packed WALK 1 pairs blocks: `pairs_pay` with the batch's rows as one sequence, whose
    heads * ceil(total_q / block_m) tiles are at most the batch's real ones."""
    return pairs_pay(causal, -(-total_q // block_m), heads, sms)


@triton.jit(do_not_specialize=["B", "HQ"])
def packed_units_kernel(CU_Q, UNITS, B, HQ, BLOCK_M: tl.constexpr, PAIRS: tl.constexpr, BLOCK: tl.constexpr):
    """UNITS (B + 1 int32): the units of the sequences before each one, UNITS[B] all of them (one program)."""
    tl.store(UNITS, 0)
    carry = B * 0
    for start in range(0, B, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i < B
        sq = tl.load(CU_Q + i + 1, mask=inside, other=0) - tl.load(CU_Q + i, mask=inside, other=0)
        blocks = (tl.maximum(sq, 0) + BLOCK_M - 1) // BLOCK_M
        if PAIRS:
            blocks = (blocks + 1) // 2
        units = tl.where(inside, blocks * HQ, 0)
        tl.store(UNITS + 1 + i, tl.cumsum(units, 0) + carry, mask=inside)
        carry += tl.sum(units, 0)


@triton.jit
def packed_tiles_of(pid, nprog, UNITS, B, PAIRS: tl.constexpr):
    """How many tiles program `pid` of `nprog` runs in the packed WALK 1 (with PAIRS two per unit, the second of a
    middle block's unit absent: `packed_tile` says so)."""
    count = (tl.load(UNITS + B) - pid + nprog - 1) // nprog
    if PAIRS:
        count = 2 * count
    return count


@triton.jit
def packed_tile(n, pid, nprog, UNITS, CU_Q, B, BLOCK_M: tl.constexpr, PAIRS: tl.constexpr):
    """(sequence, query head, query block) of the n-th tile program `pid` runs in the packed WALK 1; the block is
    the sequence's block count (past its end: no tile) for the absent second tile of a middle block's unit."""
    if PAIRS:
        unit = pid + (n // 2) * nprog
    else:
        unit = pid + n * nprog
    lo = B * 0  # UNITS[lo] <= unit < UNITS[hi]: the unit's sequence is the last lo with UNITS[lo] <= unit
    hi = B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        below = tl.load(UNITS + mid) <= unit
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    r = unit - tl.load(UNITS + lo)
    blocks = (tl.load(CU_Q + lo + 1) - tl.load(CU_Q + lo) + BLOCK_M - 1) // BLOCK_M
    if PAIRS:
        per_head = (blocks + 1) // 2
        h = r // per_head
        j = r % per_head
        block = tl.where(n % 2 == 0, blocks - 1 - j, tl.where(j == blocks - 1 - j, blocks, j))
    else:
        h = r // blocks
        block = blocks - 1 - r % blocks
    return lo, h, block
