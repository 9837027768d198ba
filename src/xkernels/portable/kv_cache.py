"""The KV-cache kernels besides attention (`attention_with_kvcache`): the check of the values the other kernels trust
(one launch, its flags read back once, for a synchronized call that raises), and the in-place append of new keys and
values (k=, v=), which can check its own sequence's values and then writes nothing for a bad one."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["NEW", "HKV", "CAPACITY", "NUM_BLOCKS"])
def cache_append_kernel(K_NEW, V_NEW, K_CACHE, V_CACHE, SEQLENS, BLOCK_TABLE, LEFT_PAD,
                        kn_sb, kn_ss, kn_sh, kn_sd, vn_sb, vn_ss, vn_sh, vn_sd, kc_sp, kc_ss, kc_sh, kc_sd, vc_sp,
                        vc_ss, vc_sh, vc_sd, bt_sb, NEW, HKV, CAPACITY, NUM_BLOCKS, HEAD_DIM: tl.constexpr,
                        HEADS: tl.constexpr, PAGE: tl.constexpr, LEFTPAD: tl.constexpr, CHUNK: tl.constexpr):
    """One program per new token (b, t), any strides (a head-dim stride of 1 specializes to vector accesses).
    HEADS: Hkv rounded up to a power of two. PAGE: 0 for a dense cache.
    The program checks its sequence's length (0 <= SEQLENS[b], SEQLENS[b] + NEW <= CAPACITY), left pad
    (LEFTPAD: 0 <= LEFT_PAD[b] <= SEQLENS[b]) and (paged) every block id the sequence's NEW tokens land on
    ([0, NUM_BLOCKS)), CHUNK ids a load; if one is bad, no program of that sequence writes (no address derived from
    the bad values is touched), and the others write as usual."""
    pid = tl.program_id(0)
    b = (pid // NEW).to(tl.int64)
    t = pid % NEW
    cached = tl.load(SEQLENS + b)
    ok = (cached >= 0) & (cached <= CAPACITY - NEW)  # not cached + NEW: it wraps for a length near 2^31
    if LEFTPAD:
        pad = tl.load(LEFT_PAD + b)
        ok = ok & (pad >= 0) & (pad <= cached)
    if PAGE > 0:  # the pages of positions cached .. cached + NEW - 1
        first = tl.maximum(cached, 0) // PAGE
        pages = tl.where(ok, (cached + NEW - 1) // PAGE - first + 1, 0)
        wrong = 0
        for p0 in range(0, pages, CHUNK):
            idx = p0 + tl.arange(0, CHUNK)
            entry = tl.load(BLOCK_TABLE + b * bt_sb + first + idx, mask=idx < pages, other=0)
            wrong = tl.maximum(wrong, tl.max(((entry < 0) | (entry >= NUM_BLOCKS)).to(tl.int32), 0))
        ok = ok & (wrong == 0)
    pos = tl.where(ok, cached + t, 0)
    if PAGE == 0:
        block = b
        row = pos.to(tl.int64)
    else:
        block = tl.load(BLOCK_TABLE + b * bt_sb + pos // PAGE, mask=ok, other=0).to(tl.int64)
        row = (pos % PAGE).to(tl.int64)
    heads = tl.arange(0, HEADS).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    keep = (heads < HKV)[:, None] & ok
    k = tl.load(K_NEW + b * kn_sb + t * kn_ss + heads[:, None] * kn_sh + cols[None, :] * kn_sd, mask=keep)
    v = tl.load(V_NEW + b * vn_sb + t * vn_ss + heads[:, None] * vn_sh + cols[None, :] * vn_sd, mask=keep)
    tl.store(K_CACHE + block * kc_sp + row * kc_ss + heads[:, None] * kc_sh + cols[None, :] * kc_sd, k, mask=keep)
    tl.store(V_CACHE + block * vc_sp + row * vc_ss + heads[:, None] * vc_sh + cols[None, :] * vc_sd, v, mask=keep)


@triton.jit(do_not_specialize=["NEW", "CAPACITY", "NUM_BLOCKS", "MAX_PAGES"])
def cache_check_kernel(SEQLENS, BLOCK_TABLE, LEFT_PAD, FLAGS, bt_sb, NEW, CAPACITY, NUM_BLOCKS, MAX_PAGES,
                       PAGE: tl.constexpr, LEFTPAD: tl.constexpr, CHUNK: tl.constexpr):
    """One program per sequence b, raising FLAGS (4 int32, zeroed by the caller) where a value would send a kernel
    out of bounds: [0] cache_seqlens[b] < 0, [1] cache_seqlens[b] + NEW > CAPACITY, [2] (paged) an entry of the
    pages sequence b reads outside [0, NUM_BLOCKS), [3] (LEFTPAD) cache_leftpad[b] outside [0, cache_seqlens[b]]."""
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(SEQLENS + b)
    tl.atomic_max(FLAGS + 0, (n < 0).to(tl.int32))
    tl.atomic_max(FLAGS + 1, (n > CAPACITY - NEW).to(tl.int32))  # not n + NEW: it wraps for a length near 2^31
    if LEFTPAD:
        pad = tl.load(LEFT_PAD + b)
        tl.atomic_max(FLAGS + 3, ((pad < 0) | (pad > n)).to(tl.int32))
    if PAGE > 0:
        pages = tl.minimum(tl.cdiv(tl.minimum(tl.maximum(n, 0), CAPACITY) + NEW, PAGE), MAX_PAGES)
        bad = tl.zeros([CHUNK], tl.int32)
        for p0 in range(0, pages, CHUNK):
            idx = p0 + tl.arange(0, CHUNK)
            entry = tl.load(BLOCK_TABLE + b * bt_sb + idx, mask=idx < pages, other=0)
            bad = tl.maximum(bad, ((entry < 0) | (entry >= NUM_BLOCKS)).to(tl.int32))
        tl.atomic_max(FLAGS + 2, tl.max(bad, 0))
