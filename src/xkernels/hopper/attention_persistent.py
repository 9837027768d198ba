"""Persistent Hopper attention forward: one CTA per SM walks (batch, head, query block) tiles.

The dense kernel (`attention_fwd.py`) launches a CTA per 128-192 query rows; at short sequences each pays its
prologue (barrier setup, four in-kernel tensor maps, the first Q and K latencies) for a few key tiles of work, and
causal blocks of unequal length leave SMs idle in the last wave. Here the grid is the SM count and every partition
walks the same static tile sequence (`common/tile_scheduler.py`); the rings and their counters run on across tiles,
so the producer loads tile i+1's Q, K and V while the consumers finish tile i, and no barrier is re-initialised.

Tile order (config `walk`; the default, 2, picks per shape: `preferred_walk`): 1, head-major: a head's query blocks
dealt side by side (causal ones paired longest with shortest, equal cost per pair), GQA heads of a group next to
each other, so a head's K/V is reread within one round; 0, heads in chunks whose K/V fit in L2 together (heads per
chunk from the host), and inside a chunk the longest query blocks first with heads fastest (the heavy tiles first,
each length spread evenly over the CTAs), which rereads a head's K/V a chunk of tiles later: 1.46x cuDNN's DRAM
reads at B32 H32 512 causal D128, 2.1x at 1K causal D256 (walk 1: 1.04x and 1.00x;
benchmarks/results/h100/2026-12-06/01-walk).

Descriptors are made once on the host over 2-D views of Q, K, V and O (`descriptor_view`): a tile of head (b, h)
starts at row b * rows_b + h * rows_h, column h * cols_h. Those views do not stop at one head's sequence end, so the
kernel is used only when Sq is a multiple of a warpgroup's 64 rows (a warpgroup past the end computes on rows of the
next head or TMA's zero fill, row-wise independent, and stores nothing) and Skv of the key tile (a key past the end
would multiply its P = 0 by another head's V); the plan checks, other shapes take the dense kernel.

Chained tiles (config `chained`, the shipped default): a tile boundary would drain the tensor cores (the last P.V
alone, the epilogue, then the next tile's first QK^T alone); instead a consumer issues the next tile's first QK^T
together with this tile's last P.V, masks and exponentiates the next tile's first scores while that P.V runs, then
stores this tile's O (`_consumer_chained`). The next tile's Q must be resident by then, so Q has two slots.

Barriers beyond the dense kernel's (`hopper/barriers.py`), one pair per Q slot (tile n of a program uses slot
n % slots):
  q_ready  producer's TMA -> each consumer: the tile's Q rows have landed in the slot.
  q_free   each consumer, once the last QK^T of its tile retired -> producer, before loading a later tile's Q into
           the slot: nobody reads it any more. The window it opens: that Q lands under the rest of this tile (one slot)
           or under the whole next tile (two slots). With O stored through the slot (o_store 2), once that store has
           read it: with one slot the next Q's latency is then exposed, and the producer issues the tile's first K
           and V before it waits.
  o_left   (o_store 3, per consumer) once its O store has read its V stage -> producer, before the tile's first V
           load: the window is the next tile's Q load, already under way.
O leaves through a buffer per consumer; its TMA store is waited on only before the next tile's epilogue reuses it.
Config `o_store` 1-3: it leaves from the accumulator's registers, through the tile's Q slot, or through the V ring
instead, and the kernel has no O buffers (`epilogue.store_tile`; D256 needs that to fit 64-key tiles).
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xkernels.common.seqlen import kv_bounds
from xkernels.common.tile_scheduler import pairs_pay, tile_of, tiles_of, walk_units
from xkernels.hopper import configs, tma
from xkernels.hopper.attention_fwd import (
    _attend,
    _key_steps,
    _load_q,
    _load_tiles,
    _scores,
    consumer_registers,
    first_key_tile,
    producer_registers,
)
from xkernels.hopper.attention_persistent_flat import consumer_flat
from xkernels.hopper.barriers import kv_rings, o_store_barriers, q_slot_barriers
from xkernels.hopper.configs import HopperAttentionConfig
from xkernels.hopper.epilogue import store_tile
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.named_barrier import pass_turn, wait_turn
from xkernels.hopper.softmax import softmax_step
from xkernels.hopper.views import descriptor_view
from xkernels.recipes import AttentionRecipe

WG_ROWS = gl.constexpr(configs.WG_ROWS)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_bufs, q_ready, q_free, o_left, k, v, v_landed, at, walk, HQ,
              GROUP, SKV, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr,
              NUM_WG: gl.constexpr, CONVERT_STEPS: gl.constexpr, O_STORE: gl.constexpr, WALK: gl.constexpr):
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    Q_SLOTS: gl.constexpr = q_bufs.shape[0] // NUM_WG
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    for done in range(0, tiles_of(pid, nprog, walk, WALK)):  # `done`: this program's tiles before this one
        bh, m_block = tile_of(pid, nprog, done, walk, WALK)
        b = bh // HQ
        h = bh % HQ
        hk = h // GROUP
        start_m = m_block * BLOCK_M
        _, hi = kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        slot = done % Q_SLOTS
        kv_at = (b * at[3] + hk * at[4], hk * at[5])  # K and V share one view geometry (the plan checks)
        lo = 0
        if O_STORE == 2 and Q_SLOTS == 1 and not CONVERT_V:
            # O leaves through the one Q slot, which frees only once the previous tile's O store has read it: issue
            # this tile's first K and V tiles before waiting, so that only Q's latency stays exposed (bf16io: its
            # conversion follows the K loads in `_load_tiles`, which then issues them all)
            it = gl.to_tensor(it)
            k.load(k_desc, [kv_at[0], kv_at[1]], it)
            v.load(v_desc, [kv_at[0], kv_at[1]], it)
            it += 1
            lo = BLOCK_N
        mbarrier.wait(q_free.index(slot), ((done // Q_SLOTS) & 1) ^ 1)  # each slot's first tile passes at once
        q_at = (b * at[0] + h * at[1] + start_m, h * at[2])
        if O_STORE == 3:
            it = _load_tiles_o_in_v(q_desc, k_desc, v_desc, q_bufs, slot * NUM_WG, q_ready.index(slot), k, v,
                                    o_left, done, q_at, kv_at, hi, it, BLOCK_N, NUM_WG)
        else:
            it = _load_tiles(q_desc, k_desc, v_desc, q_bufs, slot * NUM_WG, q_ready.index(slot), k, v, v_landed,
                             q_at, kv_at, hi, it, BLOCK_N, CONVERT_V, NUM_WG, CONVERT_STEPS, lo)


@gluon.jit
def _load_tiles_o_in_v(q_desc, k_desc, v_desc, q_bufs, q_first, q_ready, k, v, o_left, done, q_at, kv_at, hi, it,
                       BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr):
    """`_load_tiles` for O_STORE 3, where the previous tile's O left through the V stages: the tile's first V load
    waits until every warpgroup's O store has read its stage (`o_left`, one completion per tile). No V conversion
    (the config check refuses bf16io here)."""
    _load_q(q_desc, q_bufs, q_first, q_ready, q_at, NUM_WG)
    it = gl.to_tensor(it)
    for start_n in range(0, hi, BLOCK_N):
        k.load(k_desc, [kv_at[0] + start_n, kv_at[1]], it)
        if start_n == 0 and done > 0:
            for w in gl.static_range(NUM_WG):
                mbarrier.wait(o_left.index(w), (done - 1) & 1)
        v.load(v_desc, [kv_at[0] + start_n, kv_at[1]], it)
        it += 1
    return it


@gluon.jit
def _consumer(WG: gl.constexpr, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk, HQ,
              SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr, WRITE_LSE: gl.constexpr,
              NUM_WG: gl.constexpr, O_STORE: gl.constexpr, WALK: gl.constexpr):
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    FREE_Q: gl.constexpr = O_STORE != 2  # else the slot frees once O, stored through it, has left
    gl.static_assert(O_STORE != 3 or (BLOCK_N == WG_ROWS and v.bufs.shape[0] >= NUM_WG),
                     "O through the V ring: a warpgroup's O tile per V stage")
    gl.static_assert(O_STORE != 3 or v.bufs.dtype == o_desc.dtype, "O through the V ring: no V conversion")
    q = q_bufs.index(WG)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    it = 0
    for done in range(0, tiles_of(pid, nprog, walk, WALK)):  # `done`: this program's tiles before this one
        bh, m_block = tile_of(pid, nprog, done, walk, WALK)
        start_m = m_block * BLOCK_M
        full_hi, hi = kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        row0 = start_m + WG * WG_ROWS
        acc, m_i, l_i, it = _attend(q, q_ready.index(0), done & 1, q_free.index(0), k, v, it, row0, full_hi, hi,
                                    SKV, 0, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                                    False, FREE_Q)
        if O_STORE == 3:
            # O goes to V stage WG: wait until both warpgroups' P.V on it (its last use, `last`) retired
            STAGES: gl.constexpr = v.bufs.shape[0]
            if it - 1 - WG >= 0:
                last = it - 1 - (it - 1 - WG) % STAGES
                mbarrier.wait(v.empty.index(WG), (last // STAGES) & 1)
            store_tile(acc, m_i, l_i, o_desc, v.bufs.index(WG), O, o_rs, LSE, at, bh, row0, HQ, SQ,
                       o_left.index(WG), WRITE_LSE, O_STORE)
        else:
            store_tile(acc, m_i, l_i, o_desc, q if O_STORE == 2 else o_bufs.index(WG), O, o_rs, LSE, at, bh, row0,
                       HQ, SQ, q_free.index(0), WRITE_LSE, O_STORE)
    tma.store_wait(0)


@gluon.jit
def _consumer_chained(WG: gl.constexpr, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, k, v, LSE, at, walk,
                      HQ, SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                      POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr,
                      WRITE_LSE: gl.constexpr, NUM_WG: gl.constexpr, O_STORE: gl.constexpr, WALK: gl.constexpr,
                      PINGPONG: gl.constexpr):
    """`_consumer` with the tiles chained: at a tile boundary the next tile's first QK^T is issued together with this
    tile's last P.V, and the next tile's first softmax runs while that P.V is in flight (the window the pipelined
    loop opens between key tiles, opened between work tiles too); the epilogue follows. Needs the next tile's Q
    before this tile's last P.V, so Q has two slots (q_ready / q_free per slot; tile n of this program uses slot
    n % 2). PINGPONG (two warpgroups): every pair of products after the program's first QK^T, the boundary pair
    included, is issued in turns (`named_barrier.py`); both warpgroups walk the same key tiles, so the turns match."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    gl.static_assert(O_STORE != 3, "chained tiles keep the next tile's V stages busy through the epilogue")
    gl.static_assert(not PINGPONG or NUM_WG == 2, "turns between two consumer warpgroups")
    s_layout: gl.constexpr = wgmma_acc(BLOCK_N)
    o_layout: gl.constexpr = wgmma_acc(HEAD_DIM)
    p_layout: gl.constexpr = wgmma_operand(HEAD_DIM)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    pv_dtype: gl.constexpr = v.bufs.dtype
    acc_dtype: gl.constexpr = gl.float16 if ACC16 else gl.float32
    step_scale = qk_scale if POSITIVE_SCALE else 1.0
    zero_s = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    m_0 = gl.full([WG_ROWS], float("-inf"), gl.float32, rows_s)
    l_0 = gl.zeros([WG_ROWS], gl.float32, rows_s)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    n_tiles = tiles_of(pid, nprog, walk, WALK)  # this program's (at least one: the grid is at most the units)

    # the first tile's key tile 0: scores and softmax only (its P.V goes out with key tile 1's QK^T)
    bh, m_block = tile_of(pid, nprog, 0, walk, WALK)
    full_hi = kv_bounds(m_block * BLOCK_M, SKV, BLOCK_M, BLOCK_N, CAUSAL)[0]
    offs_m = m_block * BLOCK_M + WG * WG_ROWS + gl.arange(0, WG_ROWS, rows_s)
    m_i, l_i, p_op, it = first_key_tile(q_bufs.index(WG), q_ready.index(0), k, full_hi, offs_m, SKV, qk_scale, zero_s,
                                        m_0, l_0, CAUSAL, POSITIVE_SCALE, p_layout, pv_dtype, PINGPONG, WG)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
    for n in range(0, n_tiles):  # `n`: this program's tiles before this one
        slot = n % 2
        bh, m_block = tile_of(pid, nprog, n, walk, WALK)
        start_m = m_block * BLOCK_M
        full_hi, hi = kv_bounds(start_m, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        row0 = start_m + WG * WG_ROWS
        offs_m = row0 + gl.arange(0, WG_ROWS, rows_s)
        acc, m_i, l_i, p_op, it = _key_steps(q_bufs.index(slot * NUM_WG + WG), k, v, acc, m_i, l_i, p_op, it, BLOCK_N,
                                             full_hi, hi, offs_m, SKV, qk_scale, zero_s, BLOCK_N, CAUSAL,
                                             POSITIVE_SCALE, OVERLAP, False, PINGPONG=PINGPONG, WG=WG)
        if O_STORE != 2:
            mbarrier.arrive(q_free.index(slot))  # every QK^T reading this tile's Q has retired
        if n + 1 < n_tiles:
            n_bh, n_block = tile_of(pid, nprog, n + 1, walk, WALK)
            n_full_hi, _ = kv_bounds(n_block * BLOCK_M, SKV, BLOCK_M, BLOCK_N, CAUSAL)
            n_offs = n_block * BLOCK_M + WG * WG_ROWS + gl.arange(0, WG_ROWS, rows_s)
            mbarrier.wait(q_ready.index(1 - slot), ((n + 1) // 2) & 1)
            s = k.wait(it)
            if PINGPONG:  # both stages landed before the turn (`_key_steps`)
                v_s = v.wait(it - 1)
                wait_turn(WG)
            qk_tok = warpgroup_mma(q_bufs.index((1 - slot) * NUM_WG + WG), k.bufs.index(s).permute((1, 0)), zero_s,
                                   use_acc=False, is_async=True)
            if not PINGPONG:
                v_s = v.wait(it - 1)
            acc_tok = warpgroup_mma(p_op, v.bufs.index(v_s), acc, is_async=True)
            if PINGPONG:
                pass_turn(WG)
            # arrive -> independent work -> wait: this tile's last P.V runs while the next tile's first scores
            # are masked and exponentiated (OVERLAP off: both retire first, as between key tiles)
            qk = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[qk_tok])
            k.release(it)
            qk = _scores(qk, 0, n_full_hi, n_offs, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
            p, m_next, l_next, _ = softmax_step(qk, m_0, l_0, step_scale, False)
            acc, p_op = warpgroup_mma_wait(0, deps=[acc_tok, p_op])
            v.release(it - 1)
            p_next = gl.convert_layout(p.to(pv_dtype), p_layout)
        else:  # the program's last tile: its last P.V alone
            acc = warpgroup_mma(p_op, v.bufs.index(v.wait(it - 1)), acc)
            v.release(it - 1)
            p_next = p_op
            m_next = m_i
            l_next = l_i
        store_tile(acc, m_i, l_i, o_desc, q_bufs.index(slot * NUM_WG + WG) if O_STORE == 2 else o_bufs.index(WG),
                   O, o_rs, LSE, at, bh, row0, HQ, SQ, q_free.index(slot), WRITE_LSE, O_STORE)
        acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
        p_op = p_next
        m_i = m_next
        l_i = l_next
        it += 1
    tma.store_wait(0)


@gluon.jit
def _consumer_entry(WG: gl.constexpr, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk, HQ,
                    SQ, SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                    POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr,
                    WRITE_LSE: gl.constexpr, NUM_WG: gl.constexpr, CHAINED: gl.constexpr, O_STORE: gl.constexpr,
                    WALK: gl.constexpr, PINGPONG: gl.constexpr, FLAT: gl.constexpr):
    if CHAINED and FLAT:
        consumer_flat(WG, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, k, v, LSE, at, walk, HQ, SQ, SKV, qk_scale,
                      HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE, NUM_WG, O_STORE, WALK,
                      PINGPONG)
    elif CHAINED:
        _consumer_chained(WG, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, k, v, LSE, at, walk, HQ, SQ, SKV,
                          qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE, NUM_WG,
                          O_STORE, WALK, PINGPONG)
    else:
        _consumer(WG, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk, HQ, SQ, SKV,
                  qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16, WRITE_LSE, NUM_WG, O_STORE,
                  WALK)


@gluon.jit
def attention_persistent_kernel(q_desc, k_desc, v_desc, o_desc, LSE, O, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, o_rb,
                                o_rh, o_ch, o_rs, HQ, GROUP, SQ, SKV, n_tiles, m_blocks, BH, walk_arg, walk_pairs,
                                qk_scale,
                                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr, CONVERT_V: gl.constexpr, POSITIVE_SCALE: gl.constexpr,
                                OVERLAP: gl.constexpr, NUM_WG: gl.constexpr, ACC16: gl.constexpr,
                                CONVERT_STEPS: gl.constexpr, WRITE_LSE: gl.constexpr, CHAINED: gl.constexpr,
                                O_STORE: gl.constexpr, WALK: gl.constexpr, PINGPONG: gl.constexpr,
                                FLAT: gl.constexpr):
    """O: the output's base (O_STORE 1's stores; o_desc covers the same view), o_rs its view's row stride; the walk
    (`common/tile_scheduler.py`): WALK 0 with walk_arg heads per L2 chunk, WALK 1 with walk_arg the GQA group and
    walk_pairs 1 where causal blocks are paired."""
    at = (q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, o_rb, o_rh, o_ch)
    walk = (n_tiles, m_blocks, BH, walk_arg, walk_pairs)
    Q_SLOTS: gl.constexpr = 2 if CHAINED else 1
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [Q_SLOTS * NUM_WG, WG_ROWS, HEAD_DIM], q_desc.layout)
    if O_STORE != 0:
        o_bufs = q_bufs  # unused: O leaves from registers or through the Q slots
    else:
        o_bufs = gl.allocate_shared_memory(o_desc.dtype, [NUM_WG, WG_ROWS, HEAD_DIM], o_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    k, v, v_landed = kv_rings(k_bufs, v_bufs, CONVERT_V, NUM_WG)
    q_ready, q_free = q_slot_barriers(Q_SLOTS, NUM_WG)
    if O_STORE == 3:
        o_left = o_store_barriers(NUM_WG)
    else:
        o_left = q_free  # unused
    regs: gl.constexpr = consumer_registers(NUM_WG, CONVERT_V)  # as the dense kernel's partitions
    producer_warps: gl.constexpr = 4 if CONVERT_V else 1
    producer_regs: gl.constexpr = producer_registers(NUM_WG, CONVERT_V, CONVERT_STEPS)
    if NUM_WG == 2:
        gl.warp_specialize([
            (_consumer_entry, (0, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk,
                               HQ, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                               WRITE_LSE, NUM_WG, CHAINED, O_STORE, WALK, PINGPONG, FLAT)),
            (_consumer_entry, (1, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk,
                               HQ, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                               WRITE_LSE, NUM_WG, CHAINED, O_STORE, WALK, PINGPONG, FLAT)),
            (_producer, (q_desc, k_desc, v_desc, q_bufs, q_ready, q_free, o_left, k, v, v_landed, at, walk, HQ,
                         GROUP, SKV, BLOCK_N, CAUSAL, CONVERT_V, NUM_WG, CONVERT_STEPS, O_STORE, WALK))],
            [4, producer_warps], [regs, producer_regs])
    else:
        gl.static_assert(NUM_WG == 3, "2 or 3 consumer warpgroups")
        gl.warp_specialize([
            (_consumer_entry, (0, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk,
                               HQ, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                               WRITE_LSE, NUM_WG, CHAINED, O_STORE, WALK, PINGPONG, FLAT)),
            (_consumer_entry, (1, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk,
                               HQ, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                               WRITE_LSE, NUM_WG, CHAINED, O_STORE, WALK, PINGPONG, FLAT)),
            (_consumer_entry, (2, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, o_left, k, v, LSE, at, walk,
                               HQ, SQ, SKV, qk_scale, HEAD_DIM, BLOCK_N, CAUSAL, POSITIVE_SCALE, OVERLAP, ACC16,
                               WRITE_LSE, NUM_WG, CHAINED, O_STORE, WALK, PINGPONG, FLAT)),
            (_producer, (q_desc, k_desc, v_desc, q_bufs, q_ready, q_free, o_left, k, v, v_landed, at, walk, HQ,
                         GROUP, SKV, BLOCK_N, CAUSAL, CONVERT_V, NUM_WG, CONVERT_STEPS, O_STORE, WALK))],
            [4, 4, producer_warps], [regs, regs, producer_regs])


def heads_per_chunk(skv: int, head_dim: int, group: int, elem: int, budget: int) -> int:
    """Query heads whose K/V (shared by `group` of them) fit `budget` bytes together (the config's l2_budget_kib,
    by default `configs.l2_budget_kib`'s); at least one group."""
    kv_bytes = 2 * skv * head_dim * elem
    return max(1, budget // kv_bytes) * group


def launch_spec(batch: int, heads: int, sq: int, skv: int, head_dim: int, group: int, elem: int, sms: int, *,
                is_causal: bool, recipe: AttentionRecipe, positive_scale: bool, write_lse: bool,
                cfg: HopperAttentionConfig) -> tuple[int, tuple[int, ...], dict[str, object], dict[str, int]]:
    """(grid, the walk's ints (n_tiles, m_blocks, BH, walk_arg, walk_pairs), constexprs, options); walk_arg is the
    heads per L2 chunk (resolved walk 0, `resolved`) or the GQA group (walk 1), walk_pairs whether walk 1 pairs
    causal blocks (`tile_scheduler.pairs_pay`); the caller checked the shape (`eligible`)."""
    cfg.check(head_dim, recipe, "persistent")
    cfg = resolved(cfg, recipe, skv, is_causal, group, head_dim)
    m_blocks = -(-sq // cfg.block_m)
    bh = batch * heads
    n_tiles = m_blocks * bh
    paired = cfg.walk == 1 and pairs_pay(is_causal, m_blocks, bh, sms)
    if cfg.walk == 0:
        budget = cfg.l2_budget_kib or configs.l2_budget_kib(head_dim, causal=is_causal, group=group)
        walk_arg = min(bh, heads_per_chunk(skv, head_dim, group, elem, budget << 10))
    else:
        walk_arg = group
    constexprs = cfg.constexprs(head_dim, recipe, causal=is_causal, positive_scale=positive_scale,
                                write_lse=write_lse, persistent=True)
    grid = min(walk_units(n_tiles, m_blocks, bh, cfg.walk, paired), sms)
    return grid, (n_tiles, m_blocks, bh, walk_arg, int(paired)), constexprs, dict(num_warps=4)


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: HopperAttentionConfig, recipe: AttentionRecipe,
             *, causal: bool) -> bool:
    """Whether the persistent kernel serves this call: the shape divides as the module docstring says, Q, K and V
    (K and V alike) have descriptor views (the caller checks O's), and the config asks for it: persistent=2 always,
    persistent=1 where it measured faster than the dense kernel on the H200 (`prefer_persistent`)."""
    sq, skv = q.shape[2], k.shape[2]
    if q.numel() == 0 or k.numel() == 0:  # empty calls never launch
        return False
    if not cfg.persistent or sq % configs.WG_ROWS or skv % cfg.block_n:
        return False
    group, d = q.shape[1] // k.shape[1], q.shape[-1]
    if cfg.persistent == 1 and not prefer_persistent(skv, causal, group, d, cfg.converts_in_kernel(recipe),
                                                     resolved(cfg, recipe, skv, causal, group, d).walk):
        return False
    kv = descriptor_view(k)
    return (descriptor_view(q) is not None and kv is not None and descriptor_view(v) is not None
            and descriptor_view(v)[1:] == kv[1:])


def prefer_persistent(skv: int, causal: bool, group: int, head_dim: int, converts_v: bool = False,
                      walk: int = 1) -> bool:
    """The measured rule (benchmarks/results/h200/2026-11-30/29-persistent-attention): up to 4K keys the persistent
    walk wins (1.05-1.9x the dense kernel at 512-2K); beyond, the dense grid is level or ahead (0.91-1.02x), except
    causal GQA, whose group's heads share K/V in L2 (1.02-1.07x at 8K-16K). D256 (O through the Q slot, whose
    reload each tile waits for): up to 4K keys on the head-major walk, 1.01-1.33x the dense kernel at 512-2K
    (2026-12-03/73-persistent-d256-o-store, 74-*), at 4K 1.01x full and 1.11x causal (h100/2026-12-06/01-walk;
    0.87-0.98x on the L2-chunk walk, runs 73-74, which keeps 2K); bf16io at D256 (the conversion keeps the first K
    and V loads behind that reload) up to 1K keys: 1.15-1.21x at 512, 0.99-1.08x at 1K, 0.94-0.97x at 2K
    (2026-12-03/76-persistent-bf16io). bf16io at D64/D128 follows bf16's rule (1.06-2.0x the dense kernel at
    512-2K, run 76)."""
    if head_dim > 128:
        return skv <= (1024 if converts_v else 4096 if walk == 1 else 2048)
    return skv <= 4096 or (causal and group > 1)


def resolved(cfg: HopperAttentionConfig, recipe: AttentionRecipe, skv: int, causal: bool, group: int,
             head_dim: int) -> HopperAttentionConfig:
    """`cfg` with the walk and consumer loop it runs: an explicit 0 or 1 as given; 2 (the default) by
    `preferred_walk` (or 0 where the config names an L2 chunk budget, `l2_budget_kib`, which only that walk reads)
    and `preferred_flat`."""
    if cfg.flat == 2:
        cfg = dataclasses.replace(cfg, flat=preferred_flat(skv, causal, bool(cfg.chained), cfg.consumers,
                                                           cfg.converts_in_kernel(recipe)))
    if cfg.walk != 2:
        return cfg
    walk = 0 if cfg.l2_budget_kib else preferred_walk(skv, causal, group, head_dim, cfg.converts_in_kernel(recipe))
    return dataclasses.replace(cfg, walk=walk)


def preferred_flat(skv: int, causal: bool, chained: bool, consumers: int = 2, converts_v: bool = False) -> int:
    """The consumer loop of config flat=2 (the default): one loop over a program's tiles (1,
    `attention_persistent_flat.py`) for chained causal rows of up to 512 keys (two warpgroups, as measured), where a
    tile has 2.5 key tiles on average and the chained consumer's second copy of the key step runs once a tile; else
    the chained consumer (0). CUDA-graph replay x cuDNN, H100 (benchmarks/results/h100/2026-12-06/
    07-flat-varlen-default): 512 causal D128 0.79 -> 0.93, D64 0.80 -> 0.84, GQA 32/8 D128 0.96 -> 0.98; at 1K
    level (D128) or behind (D64 0.96 -> 0.88), on full rows and from 2K behind by 3-20 % (its boundary branch and
    selects in every step; at D128 full rows it also reloads 56 bytes from the stack). Not where the producer
    converts V (bf16io without the pass): there it reloads 48 bytes per step at D128 (triton 3.7.1), unmeasured.
    With the lighter epilogue and no acc copies (11-epilogue-mask-flat-acc): 512 causal D64 / D128 / GQA 0.89 /
    0.98 / 1.08 against the chained consumer's 0.83 / 0.95 / 1.03; 1K causal mixed (0.98-1.18 against 1.02-1.16),
    full rows still behind (1.00-1.11 against 1.06-1.12): the rule stands."""
    return int(chained and consumers == 2 and causal and skv <= 512 and not converts_v)


def preferred_walk(skv: int, causal: bool, group: int, head_dim: int, converts_v: bool = False) -> int:
    """The tile walk of config walk=2 (the default): head-major (1) but where the L2-chunk walk (0) measured ahead in
    CUDA-graph replay, twice on the H100 (benchmarks/results/h100/2026-12-06/01-walk, 02-*): GQA at D64/D128 from 2K
    keys (B8 H32/8 2K D128: 1.17 / 1.10x cuDNN causal / full on walk 0, 1.06 / 1.03x on walk 1; level at 4K; walk 0
    measured at 8K-16K), and D64 causal up to 512 keys (0.80 against 0.76x). ncu times the GQA 2K and D64 512 rows
    alike on both walks (cold L2 per launch), so back-to-back launches make the difference; not yet explained.
    bf16io at D256 with the producer converting V keeps walk 0, measured (run 76), where walk 1 reloads 8 bytes from
    the stack on triton 3.6."""
    if head_dim > 128 and converts_v:
        return 0
    if head_dim <= 128 and group > 1 and skv >= 2048:
        return 0
    if head_dim == 64 and causal and skv <= 512:
        return 0
    return 1


def descriptors(tensors, views, *, block_n: int) -> list:
    """Host TMA descriptors of Q, K, V, O over their 2-D `views` (`descriptor_view`), to compile against (launches
    re-encode only the addresses)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from xkernels.common.dtypes import smem_layout

    d = tensors[0].shape[-1]
    descs = []
    for t, (shape, strides, _), rows in zip(tensors, views, (configs.WG_ROWS, block_n, block_n, configs.WG_ROWS),
                                            strict=True):
        block = [rows, d]
        layout = smem_layout(tuple(block), t.dtype)
        descs.append(TensorDescriptor(t, list(shape), list(strides), block, layout))
    return descs
