"""A model of the persistent forward's DRAM traffic under each tile walk (`common/tile_scheduler.py`), on the CPU: the
programs run their tiles in simulated time (one unit per key tile), every Q, K, V and O tile access goes through an
LRU cache of the L2's size, and a miss (or an evicted O tile) is DRAM traffic. It ignores the L2's partitions,
hashing and prefetch, so it ranks walks rather than predicting bytes; `attn_profile.sh walk` measures them. Dense
rows of 16K tokens, then the packed batch of `varlen_ab.py` on the packed kernel's two walks.

    python scripts/walk_l2_model.py [--l2-mib 50] [--sms 132]
"""

from __future__ import annotations

import argparse
import heapq
from collections import OrderedDict

from xkernels.common.tile_scheduler import pairs_pay, walk_units
from xkernels.hopper import attention_persistent as hp
from xkernels.hopper import configs
from xkernels.testing.cases import VarlenCase

ROWS = [  # (batch, q heads, kv heads, S, D, causal): the sweep's short rows (16K tokens)
    (32, 32, 32, 512, 128, True), (32, 32, 32, 512, 128, False), (16, 32, 32, 1024, 128, True),
    (16, 32, 32, 1024, 128, False), (8, 32, 32, 2048, 128, True), (32, 32, 32, 512, 64, True),
    (16, 32, 32, 1024, 256, False), (32, 32, 8, 512, 128, True)]


def programs_tiles(b, hq, hkv, s, d, causal, sms, walk):
    """Each program's (bh, m_block) list, as `tile_scheduler` deals them (a plain-Python statement of the walks)."""
    group, m_blocks, bh = hq // hkv, s // 128, b * hq
    n_tiles = bh * m_blocks
    if walk == 0:
        budget = configs.l2_budget_kib(d, causal=causal, group=group) << 10
        chunk = min(bh, hp.heads_per_chunk(s, d, group, 2, budget))
        order = []
        for c in range(0, bh, chunk):
            heads = min(chunk, bh - c)
            order += [[(c + r % heads, m_blocks - 1 - r // heads)] for r in range(heads * m_blocks)]
    elif pairs_pay(causal, m_blocks, bh, sms):
        half = m_blocks // 2
        order = [[(kv * group + g, m_blocks - 1 - j), (kv * group + g, j)] for kv in range(bh // group)
                 for j in range(half) for g in range(group)]
        order += [[(h, half)] for h in range(bh)] if m_blocks % 2 else []
    else:
        order = [[(kv * group + g, m)] for kv in range(bh // group) for m in reversed(range(m_blocks))
                 for g in range(group)]
    grid = min(walk_units(n_tiles, m_blocks, bh, walk, pairs_pay(causal, m_blocks, bh, sms)), sms)
    return [[t for u in order[p::grid] for t in u] for p in range(grid)], group, m_blocks


def replay(progs, group: int, keys_of, tile: int, l2_bytes: int) -> tuple[float, float]:
    """(DRAM bytes read, written): each program's (sequence, head, block) tiles in simulated time (a unit per key
    tile; `keys_of(sequence, block)` key tiles each), every tile's Q, K, V and O through an LRU of `l2_bytes`."""
    cache: OrderedDict = OrderedDict()  # key -> dirty
    read = written = 0

    def touch(key, write=False):
        nonlocal read, written
        if key in cache:
            cache.move_to_end(key)
            cache[key] = cache[key] or write
        else:
            read += 0 if write else tile
            cache[key] = write
        while len(cache) * tile > l2_bytes:
            _, dirty = cache.popitem(last=False)
            written += tile if dirty else 0

    # events: (time, program, tile index, key tile index or -1 for the tile's start)
    heap = [(0.0, p, 0, -1) for p in range(len(progs)) if progs[p]]
    while heap:
        t, p, i, j = heapq.heappop(heap)
        seq, h, m = progs[p][i]
        if j == -1:
            touch(("q", seq, h, m))
            heapq.heappush(heap, (t, p, i, 0))
        elif j < keys_of(seq, m):
            touch(("k", seq, h // group, j))
            touch(("v", seq, h // group, j))
            heapq.heappush(heap, (t + 1.0, p, i, j + 1))
        else:
            touch(("o", seq, h, m), write=True)
            if i + 1 < len(progs[p]):
                heapq.heappush(heap, (t, p, i + 1, -1))
    written += sum(tile for dirty in cache.values() if dirty)
    return read, written


def dram_bytes(b, hq, hkv, s, d, causal, *, sms, l2_bytes, walk) -> tuple[float, float]:
    """(DRAM bytes read, written) of one call in the model (a Q/O tile of 128 rows, a K/V tile of 128 keys)."""
    progs, group, m_blocks = programs_tiles(b, hq, hkv, s, d, causal, sms, walk)
    return replay([[(0, bh, m) for bh, m in tiles] for tiles in progs], group,
                  lambda seq, m: m + 1 if causal else m_blocks, 128 * d * 2, l2_bytes)


def varlen_programs(lengths, hq, sms, walk, causal):
    """The packed persistent kernel's deal (`attention_varlen_persistent._work`), (sequence, head, m_block) lists.
    Walk 0: every program walks tile indices pid, pid + sms, ... of B * m_blocks * Hq, skipping those past their
    sequence's end; walk 1: units of real tiles (a block, or causal pairs of blocks, of a head) dealt round-robin."""
    if walk == 0:
        m_blocks = -(-max(lengths) // 128)
        per_seq = m_blocks * hq
        progs = [[] for _ in range(sms)]
        for tile in range(len(lengths) * per_seq):
            seq, r = divmod(tile, per_seq)
            h, m = r % hq, m_blocks - 1 - r // hq
            if m * 128 < lengths[seq]:
                progs[tile % sms].append((seq, h, m))
        return progs
    units = []
    for seq, n in enumerate(lengths):
        m = -(-n // 128)
        for h in range(hq):
            if causal:
                units += [[(seq, h, m - 1 - j)] + ([(seq, h, j)] if j != m - 1 - j else [])
                          for j in range((m + 1) // 2)]
            else:
                units += [[(seq, h, blk)] for blk in reversed(range(m))]
    return [[t for u in units[p::sms] for t in u] for p in range(sms)]


def varlen_dram_bytes(lengths, hq, hkv, d, causal, *, sms, l2_bytes, walk) -> tuple[float, float]:
    """(DRAM bytes read, written) of a packed call in the model."""
    progs = varlen_programs(lengths, hq, sms, walk, causal)
    return replay(progs, hq // hkv, lambda seq, m: m + 1 if causal else -(-lengths[seq] // 128), 128 * d * 2,
                  l2_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--l2-mib", type=float, default=50.0)
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args()
    print(f"L2 {args.l2_mib} MiB, {args.sms} programs; DRAM MB read + written (floor: Q, K, V read once, O written)")
    print(f"{'row':<34} {'floor':>7} {'walk 0':>15} {'walk 1':>15}")
    for row in ROWS:
        b, hq, hkv, s, d, causal = row
        floor = (2 * b * hq * s * d + 2 * b * hkv * s * d) * 2 / 1e6
        cells = []
        for walk in (0, 1):
            r, w = dram_bytes(*row, sms=args.sms, l2_bytes=int(args.l2_mib * 2**20), walk=walk)
            cells.append(f"{r / 1e6:.0f} + {w / 1e6:.0f}")
        name = f"B{b} H{hq}/{hkv} {s} D{d}{' causal' if causal else ''}"
        print(f"{name:<34} {floor:>7.0f} {cells[0]:>15} {cells[1]:>15}", flush=True)
    # the packed batch of `xkernels bench --suite varlen` / varlen_ab.py: 32 sequences of 256-4096 tokens
    lengths = VarlenCase(32, 256, 4096, 32, 32, 128, False).lengths
    for hq, hkv, causal in ((32, 32, False), (32, 32, True), (32, 8, False)):
        floor = (2 * hq + 2 * hkv) * sum(-(-n // 128) * 128 for n in lengths) * 128 * 2 / 1e6
        cells = []
        for walk in (0, 1):
            r, w = varlen_dram_bytes(lengths, hq, hkv, 128, causal, sms=args.sms,
                                     l2_bytes=int(args.l2_mib * 2**20), walk=walk)
            cells.append(f"{r / 1e6:.0f} + {w / 1e6:.0f}")
        name = f"packed 32 x 256-4096 H{hq}/{hkv} D128{' causal' if causal else ''}"
        print(f"{name:<34} {floor:>7.0f} {cells[0]:>15} {cells[1]:>15}", flush=True)


if __name__ == "__main__":
    main()
