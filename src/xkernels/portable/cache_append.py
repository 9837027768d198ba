"""Writing new keys and values into a KV cache in place (`attention_with_kvcache`'s k=, v=): one program per new
token copies its (Hkv, D) rows of k and v to position cache_seqlens[b] + t of sequence b, in a dense cache (block b,
row = position) or a paged one (block table[b, position // PAGE], row = position % PAGE)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["NEW", "HKV"])
def cache_append_kernel(K_NEW, V_NEW, K_CACHE, V_CACHE, SEQLENS, BLOCK_TABLE,
                        kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh, kc_sp, kc_ss, kc_sh, vc_sp, vc_ss, vc_sh, bt_sb,
                        NEW, HKV, HEAD_DIM: tl.constexpr, HEADS: tl.constexpr, PAGE: tl.constexpr):
    """HEADS: Hkv rounded up to a power of two. PAGE: 0 for a dense cache."""
    pid = tl.program_id(0)
    b = (pid // NEW).to(tl.int64)
    t = pid % NEW
    pos = tl.load(SEQLENS + b) + t
    if PAGE == 0:
        block = b
        row = pos.to(tl.int64)
    else:
        block = tl.load(BLOCK_TABLE + b * bt_sb + pos // PAGE).to(tl.int64)
        row = (pos % PAGE).to(tl.int64)
    heads = tl.arange(0, HEADS).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    keep = (heads < HKV)[:, None]
    k = tl.load(K_NEW + b * kn_sb + t * kn_ss + heads[:, None] * kn_sh + cols[None, :], mask=keep)
    v = tl.load(V_NEW + b * vn_sb + t * vn_ss + heads[:, None] * vn_sh + cols[None, :], mask=keep)
    tl.store(K_CACHE + block * kc_sp + row * kc_ss + heads[:, None] * kc_sh + cols[None, :], k, mask=keep)
    tl.store(V_CACHE + block * vc_sp + row * vc_ss + heads[:, None] * vc_sh + cols[None, :], v, mask=keep)
