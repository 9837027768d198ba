"""Split-KV attention over a KV cache ("flash-decoding"): decode, speculative decoding and chunked prefill against a
dense or paged cache, and the dense API's calls with few query rows.

A decode step has one query row per (sequence, head) and thousands of keys: one program per row block would leave
most SMs idle and put one row in a 64-128-row tile. So a program owns one (sequence, kv head, row block, key split):
  * rows: the query heads of a GQA group share their K/V, so they are packed into one tile, token-major (row
    r = token * GROUP + head in group); each K/V byte is read once per group, not once per query head;
  * key split: the program reads keys [split * SPLIT_KEYS, (split + 1) * SPLIT_KEYS) of its sequence and writes an
    fp32 partial O and its LSE; `combine_kernel` merges the splits through their LSEs, or (FUSED_COMBINE) the
    program that finishes a row block's splits last does (`_merge_splits`: an arrival counter per row block, as the
    few-row GEMM's). With one split the program writes O and the LSE directly.
Keys are addressed through a page table: key n of sequence b sits in row n % PAGE of cache block
BLOCK_TABLE[b, n // PAGE]. A dense cache is the same with one page per sequence (block b, PAGE = 0 here), so the
dense API's (B, H, S, D) and the cache's (B, S, H, D) differ only in strides. K/V are read with masked pointer loads
(a page may be smaller than a key tile, so rows of one tile may come from several blocks); rows past a sequence's
length are never read, so uninitialized cache rows (NaN bit patterns included) cannot leak into P.V.
Causal is aligned bottom-right (query t sees keys j <= t + L - Sq, the KV-cache convention) or top-left (the dense
API's); rows that see no key return O = 0 and LSE = -inf. A sliding window (WINDOWED, FlashAttention's
window_size=(left, right)) keeps keys limit - left .. limit (causal) or .. limit + right (not causal), with limit =
t + L - Sq; the split's keys before the block's first window are skipped, so a decode step reads only its window.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xkernels.portable import pdl
from xkernels.portable.dot import mma
from xkernels.portable.softmax import LN2, finish, online_step, scores, start_rows


@triton.jit
def _blocks(start_n, b, floor, hi, num_blocks, BLOCK_TABLE, bt_sb, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
            FLOORED: tl.constexpr):
    """Cache blocks of the key tile at start_n (a multiple of BLOCK_N) of sequence b: dense caches, block b; pages of
    at most BLOCK_N keys, one id per key ([BLOCK_N], the tile's ids repeated PAGE times each); larger pages, the
    one id of the tile (a scalar). Ids of keys at or past `hi` (and, FLOORED, below `floor`) read 0 (table entries
    outside a sequence's pages or window may be anything); ids outside [0, num_blocks) read block 0, so a bad table
    sends no load outside the cache (`_bad_pages` reports them after the loop)."""
    if PAGE == 0:
        ids = b
    elif PAGE <= BLOCK_N:
        keys = start_n + tl.arange(0, BLOCK_N)
        inside = keys < hi
        if FLOORED:
            inside = inside & (keys >= floor)
        ids = tl.load(BLOCK_TABLE + b * bt_sb + start_n // PAGE + tl.arange(0, BLOCK_N) // PAGE, mask=inside,
                      other=0)
        ids = tl.where((ids < 0) | (ids >= num_blocks), 0, ids)
    else:  # the tile lies in one page, which holds `floor` too when the tile starts below it
        ids = tl.load(BLOCK_TABLE + b * bt_sb + start_n // PAGE, mask=start_n < hi, other=0)
        ids = tl.where((ids < 0) | (ids >= num_blocks), 0, ids)
    return ids


@triton.jit
def _split_ids(BLOCK_TABLE, bt_sb, b, lo, floor, hi, num_blocks, PAGE: tl.constexpr, PAGE_IDS: tl.constexpr):
    """The block ids of a split's pages, PAGE_IDS of them from page lo // PAGE (the split's first), read once before
    its key loop: those holding no key of [floor, hi) read 0, ids outside [0, num_blocks) read block 0. Returns
    (ids, whether one of the read ids was outside)."""
    pages = lo // PAGE + tl.arange(0, PAGE_IDS)
    want = (pages * PAGE < hi) & ((pages + 1) * PAGE > floor)
    ids = tl.load(BLOCK_TABLE + b * bt_sb + pages, mask=want, other=0)
    outside = (ids < 0) | (ids >= num_blocks)
    return tl.where(outside, 0, ids), tl.max((outside & want).to(tl.int32), 0)


@triton.jit
def _tile_ids(split_ids, start_n, split_lo, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PAGE_IDS: tl.constexpr):
    """The key tile at start_n's block ids ([BLOCK_N], each page's id PAGE times) from its split's `_split_ids`
    (split_lo: the split's first key): a gather from registers, so no K/V address waits on a global load."""
    at = (start_n - split_lo) // PAGE + tl.arange(0, BLOCK_N) // PAGE
    return tl.gather(split_ids, tl.minimum(at, PAGE_IDS - 1), 0)


@triton.jit
def _rows(blocks, start_n, page_st, row_st, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, WIDE: tl.constexpr):
    """Element offsets of the key tile at start_n (held in `blocks`, `_blocks`) in a cache, kv head aside. With the
    tile aligned to BLOCK_N, a key's row in its page is loop-invariant (pages of at most BLOCK_N keys) or the tile's
    start plus the row (larger pages), so an offset costs one wide multiply-add of the block id. The offset inside a
    page, at most (PAGE - 1) * row_st, is computed in int32 unless WIDE (the host sets it when that could wrap)."""
    r = tl.arange(0, BLOCK_N)
    if PAGE == 0:
        rows = tl.cast(blocks, tl.int64) * page_st + (start_n + r).to(tl.int64) * row_st
    elif PAGE <= BLOCK_N:
        if WIDE:
            rows = tl.cast(blocks, tl.int64) * page_st + (r % PAGE).to(tl.int64) * row_st
        else:
            rows = tl.cast(blocks, tl.int64) * page_st + (r % PAGE) * row_st
    else:
        if WIDE:
            rows = (tl.cast(blocks, tl.int64) * page_st + tl.cast(start_n % PAGE, tl.int64) * row_st
                    + r.to(tl.int64) * row_st)
        else:
            rows = tl.cast(blocks, tl.int64) * page_st + ((start_n % PAGE) * row_st + r * row_st)
    return rows


@triton.jit
def _bad_pages(BLOCK_TABLE, bt_sb, b, lo, hi, num_blocks, PAGE: tl.constexpr, SCAN: tl.constexpr):
    """Whether a block id of keys [lo, hi) of sequence b lies outside [0, num_blocks): the table slice the key loop
    read, scanned once after it (a check per tile, on the loop's critical path, cost 10-20 % of a paged decode)."""
    first = lo // PAGE
    last = tl.where(hi > lo, tl.cdiv(hi, PAGE), first)  # no key, no page
    wrong = tl.zeros([SCAN], tl.int32)
    for p0 in range(first, last, SCAN):
        pages = p0 + tl.arange(0, SCAN)
        ids = tl.load(BLOCK_TABLE + b * bt_sb + pages, mask=pages < last, other=0)
        wrong = tl.maximum(wrong, ((ids < 0) | (ids >= num_blocks)).to(tl.int32))
    return tl.max(wrong, 0)


@triton.jit
def _bad_sequence(SEQLENS, KEY_START, b, NEW, SKV, KEY_STARTS: tl.constexpr):
    """Whether sequence b's length (0 <= SEQLENS[b], SEQLENS[b] + NEW <= SKV, compared so that nothing wraps in
    int32) or left pad (0 <= KEY_START[b] <= SEQLENS[b]) would send a load outside the cache."""
    cached = tl.load(SEQLENS + b)
    wrong = (cached < 0) | (cached > SKV - NEW)
    if KEY_STARTS:
        first = tl.load(KEY_START + b)
        wrong = wrong | (first < 0) | (first > cached)
    return wrong


@triton.jit
def _attend(acc, l_i, m_i, q, K, V, b, floor, lo, hi, limit, win_left, win_right, BLOCK_TABLE, bt_sb, num_blocks,
            k_sp, k_ss, v_sp, v_ss, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
            CAUSAL: tl.constexpr, MASKED: tl.constexpr, WINDOWED: tl.constexpr, PV_DTYPE: tl.constexpr,
            WIDE_ROWS: tl.constexpr, INTERPRET: tl.constexpr, SOFTCAP: tl.constexpr, split_ids, split_lo,
            PAGE_IDS: tl.constexpr):
    """Fold key tiles [lo, hi) (lo a multiple of BLOCK_N) into (acc, l_i, m_i). MASKED: keys >= hi and (causal)
    keys past each row's `limit` are dropped, and their K/V rows are not read; WINDOWED (with MASKED) also keys
    below limit - win_left and (not causal) above limit + win_right, and reads no K/V row or block id below `floor`
    (the block's first row's first key: rows before a window may hold anything). A paged cache's block ids are read
    one tile ahead (a loop-carried value), so the K/V loads depend on no load of their own iteration and the
    pipeliner can issue them early (read in their own iteration, the pipeliner single-buffered K/V). PAGE_IDS > 0:
    they come from the split's ids read before the loop (`split_ids`, `_tile_ids`) instead."""
    cols = tl.arange(0, HEAD_DIM)
    if PAGE_IDS == 0:
        blocks = _blocks(lo, b, floor, hi, num_blocks, BLOCK_TABLE, bt_sb, BLOCK_N, PAGE, WINDOWED)
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        if PAGE_IDS > 0:
            blocks = _tile_ids(split_ids, start_n, split_lo, BLOCK_N, PAGE, PAGE_IDS)
        k_rows = _rows(blocks, start_n, k_sp, k_ss, BLOCK_N, PAGE, WIDE_ROWS)
        v_rows = _rows(blocks, start_n, v_sp, v_ss, BLOCK_N, PAGE, WIDE_ROWS)
        if PAGE_IDS == 0:
            blocks = _blocks(start_n + BLOCK_N, b, floor, hi, num_blocks, BLOCK_TABLE, bt_sb, BLOCK_N, PAGE,
                             WINDOWED)
        read = keys < hi
        if WINDOWED:
            read = read & (keys >= floor)
        if MASKED:
            k = tl.load(K + k_rows[:, None] + cols[None, :], mask=read[:, None], other=0.0)
        else:
            k = tl.load(K + k_rows[:, None] + cols[None, :])
        s = scores(mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], tl.float32), INTERPRET), qk_scale, SOFTCAP)
        if MASKED:
            keep = keys[None, :] < hi
            if CAUSAL:
                keep = keep & (keys[None, :] <= limit[:, None])
            if WINDOWED:
                keep = keep & (keys[None, :] >= (limit - win_left)[:, None])
                if not CAUSAL:
                    keep = keep & (keys[None, :] <= (limit + win_right)[:, None])
            s = tl.where(keep, s, float("-inf"))
        p, m_i, l_i, acc = online_step(s, m_i, l_i, acc, True)
        if MASKED:
            v = tl.load(V + v_rows[:, None] + cols[None, :], mask=read[:, None], other=0.0)
        else:
            v = tl.load(V + v_rows[:, None] + cols[None, :])
        acc = mma(p.to(PV_DTYPE), v.to(PV_DTYPE), acc, INTERPRET)
    return acc, l_i, m_i


@triton.jit
def _merge_splits(O_PART, LSE_PART, O, LSE, part_rows, b, t, h, cols, in_q, o_sb, o_ss, o_sh, ROWS, SQ, hq, SPLITS,
                  BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, WRITE_LSE: tl.constexpr):
    """O and LSE of a row block from its SPLITS partials (rows `part_rows` of each split's (ROWS, D) slice), as
    `combine_kernel` merges them: splits that saw no key weigh 0, a row no split saw gets O = 0 and LSE = -inf, a
    NaN partial LSE makes the row's O and LSE NaN. Partials are read through L2 (`.cg`): other programs wrote them."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    poisoned = tl.zeros([BLOCK_M], tl.int32)
    for s in range(0, SPLITS):
        lse_s = tl.load(LSE_PART + s * ROWS + part_rows, mask=in_q, other=float("-inf"), cache_modifier=".cg")
        m = tl.maximum(m, lse_s)
        poisoned = tl.maximum(poisoned, (lse_s != lse_s).to(tl.int32))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for s in range(0, SPLITS):
        at = s * ROWS + part_rows
        w = tl.math.exp2((tl.load(LSE_PART + at, mask=in_q, other=float("-inf"), cache_modifier=".cg") - m_safe)
                         * (1.0 / LN2))
        o_s = tl.load(O_PART + at[:, None] * HEAD_DIM + cols[None, :], mask=in_q[:, None], other=0.0,
                      cache_modifier=".cg")
        acc += w[:, None] * o_s
        total += w
    seen = total != 0  # NaN (an infinite partial LSE) stays NaN
    o = tl.where(seen[:, None], acc / tl.where(seen, total, 1.0)[:, None], 0.0)
    lse = tl.where(seen, m_safe + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    o = tl.where(poisoned[:, None] > 0, float("nan"), o)
    lse = tl.where(poisoned > 0, float("nan"), lse)
    tl.store(O + b.to(tl.int64) * o_sb + t.to(tl.int64)[:, None] * o_ss + h[:, None] * o_sh + cols[None, :],
             o.to(O.dtype.element_ty), mask=in_q[:, None])
    if WRITE_LSE:
        tl.store(LSE + (b.to(tl.int64) * hq + h) * SQ + t, lse, mask=in_q)


@triton.jit(do_not_specialize=["SQ", "HKV", "GROUP", "SKV", "SPLIT_KEYS", "ROWS", "SPLITS", "NEW", "NUM_BLOCKS"])
def attention_decode_kernel(Q, K, V, O, LSE, O_PART, LSE_PART, SEQLENS, BLOCK_TABLE, KEY_START, ARRIVALS,
                            q_sb, q_ss, q_sh, k_sp, k_ss, k_sh, v_sp, v_ss, v_sh, o_sb, o_ss, o_sh, bt_sb,
                            SQ, HKV, GROUP, SKV, SPLIT_KEYS, ROWS, SPLITS, NEW, NUM_BLOCKS, win_left, win_right,
                            qk_scale, SINKS,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            PAGE: tl.constexpr, SEQ_LENGTHS: tl.constexpr, KEY_STARTS: tl.constexpr,
                            CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, WINDOWED: tl.constexpr,
                            PV_DTYPE: tl.constexpr, WRITE_LSE: tl.constexpr, SPLIT: tl.constexpr,
                            FUSED_COMBINE: tl.constexpr, WIDE_ROWS: tl.constexpr, INTERPRET: tl.constexpr,
                            SOFTCAP: tl.constexpr = 0.0, HAS_SINKS: tl.constexpr = False, PAGE_IDS: tl.constexpr = 0,
                            LAUNCH_DEPENDENTS: tl.constexpr = False):
    """One program per (split, sequence b, kv head, row block), row blocks innermost (they share their K/V in L2);
    SPLITS programs' worth of key splits per (b, kv head). q is (B, SQ, HKV * GROUP, D) by its strides; sequence b has
    SEQLENS[b] + NEW keys (SEQ_LENGTHS: the cached ones and the NEW just appended) or SKV, of which KEY_STARTS skips
    the first KEY_START[b] (a left-padded dense cache: its keys are rows KEY_START[b] .. SEQLENS[b] + NEW);
    ROWS = B * SQ * HQ. SPLIT: write the partial O (fp32) and LSE of the split to O_PART (splits, B, SQ, HQ, D) and
    LSE_PART (splits, B, SQ, HQ), contiguous (and with FUSED_COMBINE, the last of a row block's splits to arrive,
    counted in ARRIVALS[(b, kv head, row block)] (int32, zero between launches: the last arriver resets it), merges
    them into O and LSE); else O (strides o_*) and LSE (B, HQ, SQ) contiguous. With
    SEQ_LENGTHS (a cache call) the program checks the values it trusts, its sequence's length (0 <= SEQLENS[b],
    SEQLENS[b] + NEW <= SKV), left pad (0 <= KEY_START[b] <= SEQLENS[b]) and each block id it reads
    ([0, NUM_BLOCKS)); a bad one reads no key (or block 0 for a bad id) and writes NaN to its O and LSE (partial
    ones when split: the merge then gives NaN), so every output that depends on a bad value is NaN (a bad block id:
    the rows of the programs that would read its page) and the others are untouched."""
    if LAUNCH_DEPENDENTS:  # the combine kernel (a programmatic dependent) may be scheduled: it waits for our writes
        pdl.launch_dependents()
    m_blocks = tl.cdiv(SQ * GROUP, BLOCK_M)
    pid = tl.program_id(0)
    per_split = tl.num_programs(0) // SPLITS
    split = pid // per_split
    start_r = (pid % m_blocks) * BLOCK_M
    bh = (pid % per_split) // m_blocks
    b = bh // HKV
    hk = bh % HKV
    if SEQ_LENGTHS:  # a bad sequence reads no key
        wrong = _bad_sequence(SEQLENS, KEY_START, b, NEW, SKV, KEY_STARTS)
        L = tl.where(wrong, 0, tl.load(SEQLENS + b) + NEW)
    else:
        L = SKV
    if KEY_STARTS:  # dense caches only: the sequence's keys begin `first` rows in
        first = tl.where(wrong, 0, tl.load(KEY_START + b))
        L = L - first
    rows = start_r + tl.arange(0, BLOCK_M)
    t = rows // GROUP  # token of each packed row
    h = (hk * GROUP + rows % GROUP).to(tl.int64)  # its query head
    cols = tl.arange(0, HEAD_DIM)
    in_q = t < SQ
    q = tl.load(Q + b.to(tl.int64) * q_sb + t.to(tl.int64)[:, None] * q_ss + h[:, None] * q_sh + cols[None, :],
                mask=in_q[:, None], other=0.0)

    # keys this program visits: its split, cut at the sequence end and (causal) at the block's last row's limit
    offset = L - SQ if BOTTOM_RIGHT else 0
    limit = t + offset  # row t sees keys j <= limit[t]
    t_last = min(start_r + BLOCK_M - 1, SQ * GROUP - 1) // GROUP
    floor = 0
    base = 0
    if WINDOWED:  # the splits cut the block's window, from the key tile of the first row's first key `floor` (keys
        # before are skipped, and not read; tiles stay aligned to BLOCK_N, so a paged tile's rows sit at fixed places
        # in their pages)
        floor = max(start_r // GROUP + offset - win_left, 0)
        base = (floor // BLOCK_N) * BLOCK_N
    lo = base + split * SPLIT_KEYS
    hi = max(min(lo + SPLIT_KEYS, L), lo)
    full_hi = hi
    if CAUSAL:
        hi = max(min(hi, t_last + offset + 1), lo)
        full_hi = max(min(hi, start_r // GROUP + offset + 1), lo)  # every row of the block sees keys below this
    full_hi = lo + ((full_hi - lo) // BLOCK_N) * BLOCK_N  # whole mask-free tiles; the rest is masked
    if WINDOWED:  # every tile masked: each row's window starts elsewhere
        if not CAUSAL:
            hi = max(min(hi, t_last + offset + win_right + 1), lo)
        full_hi = lo

    sink = 0.0
    if HAS_SINKS:  # each row's head's sink logit (gpt-oss), in split 0 only: the merge counts a split's sink once
        sink = tl.where(split == 0, tl.load(SINKS + h, mask=in_q, other=0.0).to(tl.float32), float("-inf"))
    m_i, l_i = start_rows(sink, BLOCK_M, HAS_SINKS)
    if HAS_SINKS:
        l_i = tl.where(split == 0, l_i, 0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    split_ids = 0
    bad_ids = 0
    if PAGE_IDS > 0:  # the split's block ids, once (pages of at most BLOCK_N keys, PAGE_IDS >= SPLIT_KEYS / PAGE)
        split_ids, bad_ids = _split_ids(BLOCK_TABLE, bt_sb, b, lo, floor, hi, NUM_BLOCKS, PAGE, PAGE_IDS)
    k_base = K + hk.to(tl.int64) * k_sh
    v_base = V + hk.to(tl.int64) * v_sh
    if KEY_STARTS:
        k_base += first.to(tl.int64) * k_ss
        v_base += first.to(tl.int64) * v_ss
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, b, floor, lo, full_hi, limit, win_left, win_right,
                            BLOCK_TABLE, bt_sb, NUM_BLOCKS, k_sp, k_ss, v_sp, v_ss, qk_scale,
                            HEAD_DIM, BLOCK_N, PAGE, CAUSAL, False, WINDOWED, PV_DTYPE, WIDE_ROWS, INTERPRET, SOFTCAP,
                            split_ids, lo, PAGE_IDS)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, b, floor, full_hi, hi, limit, win_left, win_right,
                            BLOCK_TABLE, bt_sb, NUM_BLOCKS, k_sp, k_ss, v_sp, v_ss, qk_scale,
                            HEAD_DIM, BLOCK_N, PAGE, CAUSAL, True, WINDOWED, PV_DTYPE, WIDE_ROWS, INTERPRET, SOFTCAP,
                            split_ids, lo, PAGE_IDS)
    o, lse = finish(acc, l_i, m_i, True)
    if SEQ_LENGTHS:  # re-read after the loop rather than kept live through it (registers)
        bad = _bad_sequence(SEQLENS, KEY_START, b, NEW, SKV, KEY_STARTS).to(tl.int32)
        if PAGE_IDS > 0:
            bad = tl.maximum(bad, bad_ids)
        elif PAGE > 0:
            bad = tl.maximum(bad, _bad_pages(BLOCK_TABLE, bt_sb, b, max(lo, floor), hi, NUM_BLOCKS, PAGE, 256))
        o = tl.where(bad > 0, float("nan"), o)
        lse = tl.where(bad > 0, float("nan"), lse)

    hq = HKV * GROUP
    if SPLIT:
        row = split.to(tl.int64) * ROWS + (b.to(tl.int64) * SQ + t) * hq + h  # (splits, B, SQ, HQ)
        tl.store(O_PART + row[:, None] * HEAD_DIM + cols[None, :], o, mask=in_q[:, None])
        tl.store(LSE_PART + row, lse, mask=in_q)
        if FUSED_COMBINE:  # memory order as the few-row GEMM's (gemm_skinny.py): stores, barrier, acq_rel arrival
            tl.debug_barrier()
            arrived = tl.atomic_add(ARRIVALS + pid % per_split, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:  # the row block's last split: merge them all
                tl.debug_barrier()
                _merge_splits(O_PART, LSE_PART, O, LSE, row - split.to(tl.int64) * ROWS, b, t, h, cols, in_q, o_sb,
                              o_ss, o_sh, ROWS, SQ, hq, SPLITS, BLOCK_M, HEAD_DIM, WRITE_LSE)
                tl.atomic_xchg(ARRIVALS + pid % per_split, 0, sem="relaxed", scope="gpu")  # reusable counters
    else:
        tl.store(O + b.to(tl.int64) * o_sb + t.to(tl.int64)[:, None] * o_ss + h[:, None] * o_sh + cols[None, :],
                 o.to(O.dtype.element_ty), mask=in_q[:, None])
        if WRITE_LSE:
            tl.store(LSE + (b.to(tl.int64) * hq + h) * SQ + t, lse, mask=in_q)


@triton.jit(do_not_specialize=["ROWS", "SQ", "HQ", "SPLITS"])
def combine_kernel(O_PART, LSE_PART, O, LSE, o_sb, o_ss, o_sh, ROWS, SQ, HQ, SPLITS,
                   HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, WRITE_LSE: tl.constexpr,
                   WAIT_PRIMARY: tl.constexpr = False):
    """One program per row r = (b, t, h) of O_PART (SPLITS, ROWS = B * SQ * HQ, D): merge its splits through their
    LSEs, O = sum_s exp(lse_s - lse) O_s with lse = log sum_s exp(lse_s), CHUNK splits per load. Splits that saw no
    key (lse_s = -inf) weigh 0; a row no split saw gets O = 0 and LSE = -inf; a NaN partial LSE (a split that found
    a bad cache value) makes O and the LSE NaN (max() would skip it). WAIT_PRIMARY: launched as a programmatic
    dependent of the split kernel (`DecodeConfig.pdl`), it first waits for that kernel's completion and writes."""
    if WAIT_PRIMARY:
        pdl.wait_primary()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    chunk = tl.arange(0, CHUNK)
    m = float("-inf")
    poisoned = 0
    for s0 in range(0, SPLITS, CHUNK):
        lse_s = tl.load(LSE_PART + (s0 + chunk) * ROWS + row, mask=s0 + chunk < SPLITS, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse_s, 0))
        poisoned = tl.maximum(poisoned, tl.max((lse_s != lse_s).to(tl.int32), 0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = 0.0
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s0 in range(0, SPLITS, CHUNK):
        inside = s0 + chunk < SPLITS
        w = tl.math.exp2((tl.load(LSE_PART + (s0 + chunk) * ROWS + row, mask=inside, other=float("-inf")) - m_safe)
                         * (1.0 / LN2))
        o_s = tl.load(O_PART + ((s0 + chunk) * ROWS + row)[:, None] * HEAD_DIM + cols[None, :], mask=inside[:, None],
                      other=0.0)
        acc += tl.sum(w[:, None] * o_s, 0)
        total += tl.sum(w, 0)
    seen = total != 0  # NaN (an infinite partial LSE) stays NaN
    o = tl.where(seen, acc / tl.where(seen, total, 1.0), 0.0)
    lse = tl.where(seen, m_safe + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    o = tl.where(poisoned > 0, float("nan"), o)
    lse = tl.where(poisoned > 0, float("nan"), lse)
    h = row % HQ
    t = (row // HQ) % SQ
    b = row // (HQ * SQ)
    tl.store(O + b * o_sb + t * o_ss + h * o_sh + cols, o.to(O.dtype.element_ty))
    if WRITE_LSE:  # (B, HQ, SQ)
        tl.store(LSE + (b * HQ + h) * SQ + t, lse)
