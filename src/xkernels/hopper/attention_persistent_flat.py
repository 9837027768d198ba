"""The persistent forward's consumer with a program's tiles in one loop (config `flat=1`, opt-in).

The chained consumer (`attention_persistent._consumer_chained`) runs a tile's key steps in `_key_steps` and the step
that crosses into the next tile (the next tile's first QK^T issued with this tile's last P.V) as a second copy of
the same code after it, so every consumer warpgroup's hot code holds two copies of the step (the products, masking,
softmax), each several hundred instructions. On short causal rows (2.5 key tiles a tile at 512 keys) both copies
run for every tile, and ncu counts 2.0 cycles per issued instruction of warps waiting for an instruction fetch
("no instruction") against cuDNN's 0.06 (benchmarks/results/h100/2026-12-06/05-ncu-stalls).

Here every step after the program's first key tile is one iteration of a single loop: the step issues QK^T of the
next key tile (the current tile's next one, or at a boundary the next tile's first) and P.V of the key tile
before; at a boundary the softmax starts from a fresh row state and the finished tile's epilogue runs after the
P.V has landed. The products, waits and releases per warpgroup are the chained consumer's, in its order but one:
a step waits for its V stage before issuing QK^T (the chained consumer issues QK^T first; the producer loads V(j-1)
before K(j), so the V wait seldom blocks, and this is the order measured). The same barriers and rings serve it,
and the outputs are bitwise the chained consumer's.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from xkernels.common.seqlen import kv_bounds
from xkernels.common.tile_scheduler import tile_of, tiles_of
from xkernels.hopper import configs, tma
from xkernels.hopper.attention_fwd import _scores, first_key_tile
from xkernels.hopper.epilogue import store_tile
from xkernels.hopper.layouts import wgmma_acc, wgmma_operand
from xkernels.hopper.named_barrier import pass_turn, wait_turn
from xkernels.hopper.softmax import softmax_step

WG_ROWS = gl.constexpr(configs.WG_ROWS)


@gluon.jit
def consumer_flat(WG: gl.constexpr, o_desc, q_bufs, o_bufs, O, o_rs, q_ready, q_free, k, v, LSE, at, walk, HQ, SQ,
                  SKV, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  POSITIVE_SCALE: gl.constexpr, OVERLAP: gl.constexpr, ACC16: gl.constexpr, WRITE_LSE: gl.constexpr,
                  NUM_WG: gl.constexpr, O_STORE: gl.constexpr, WALK: gl.constexpr, PINGPONG: gl.constexpr):
    """The chained consumer's schedule in one loop (module docstring): Q in two slots (tile n in slot n % 2), O by
    `O_STORE` 0-2 (`epilogue.store_tile`), PINGPONG the warpgroups' turns around each step's products."""
    BLOCK_M: gl.constexpr = NUM_WG * WG_ROWS
    gl.static_assert(O_STORE != 3, "chained tiles keep the next tile's V stages busy through the epilogue")
    gl.static_assert(not PINGPONG or NUM_WG == 2, "turns between two consumer warpgroups")
    s_layout: gl.constexpr = wgmma_acc(BLOCK_N)
    o_layout: gl.constexpr = wgmma_acc(HEAD_DIM)
    p_layout: gl.constexpr = wgmma_operand(HEAD_DIM)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
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

    # tile 0, key tile 0: scores and softmax only (its P.V goes out with the next step's QK^T)
    bh, m_block = tile_of(pid, nprog, 0, walk, WALK)
    full_hi, hi = kv_bounds(m_block * BLOCK_M, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    row0 = m_block * BLOCK_M + WG * WG_ROWS
    offs_m = row0 + gl.arange(0, WG_ROWS, rows_s)
    m_i, l_i, p_op, it = first_key_tile(q_bufs.index(WG), q_ready.index(0), k, full_hi, offs_m, SKV, qk_scale, zero_s,
                                        m_0, l_0, CAUSAL, POSITIVE_SCALE, p_layout, pv_dtype, PINGPONG, WG)
    acc = gl.zeros([WG_ROWS, HEAD_DIM], acc_dtype, o_layout)
    fresh = gl.to_tensor(True)  # the next P.V is a tile's first: it overwrites acc (wgmma's scale-d predicate off)
    n = gl.to_tensor(0)  # the tile whose rows acc holds
    start_n = gl.to_tensor(BLOCK_N)  # the key tile this step multiplies (of tile n, or past its hi: a boundary)
    while (start_n < hi) | (n + 1 < n_tiles):
        boundary = start_n >= hi
        end_bh = bh  # the tile a boundary step finishes
        end_row0 = row0
        end_slot = n % 2
        if boundary:  # the next tile: its first key tile, its Q slot
            if O_STORE != 2:
                mbarrier.arrive(q_free.index(end_slot))  # every QK^T reading the finished tile's Q has retired
            n += 1
            bh, m_block = tile_of(pid, nprog, n, walk, WALK)
            full_hi, hi = kv_bounds(m_block * BLOCK_M, SKV, BLOCK_M, BLOCK_N, CAUSAL)
            row0 = m_block * BLOCK_M + WG * WG_ROWS
            offs_m = row0 + gl.arange(0, WG_ROWS, rows_s)
            start_n = start_n * 0
            mbarrier.wait(q_ready.index(n % 2), (n // 2) & 1)
        slot = n % 2
        s = k.wait(it)
        v_s = v.wait(it - 1)
        if PINGPONG:
            wait_turn(WG)
        qk_tok = warpgroup_mma(q_bufs.index(slot * NUM_WG + WG), k.bufs.index(s).permute((1, 0)), zero_s,
                               use_acc=False, is_async=True)
        acc_tok = warpgroup_mma(p_op, v.bufs.index(v_s), acc, use_acc=not fresh, is_async=True)
        if PINGPONG:
            pass_turn(WG)
        # arrive -> independent work -> wait: P.V of the key tile before (at a boundary, the finished tile's last)
        # runs while this key tile's scores are masked and exponentiated
        qk = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[qk_tok])
        k.release(it)
        qk = _scores(qk, start_n, full_hi, offs_m, SKV, qk_scale, CAUSAL, POSITIVE_SCALE, cols_s)
        p, m_new, l_new, alpha = softmax_step(qk, gl.where(boundary, m_0, m_i), gl.where(boundary, l_0, l_i),
                                              step_scale, False)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc_tok, p_op])
        v.release(it - 1)
        if boundary:
            store_tile(acc, m_i, l_i, o_desc, q_bufs.index(end_slot * NUM_WG + WG) if O_STORE == 2
                       else o_bufs.index(WG), O, o_rs, LSE, at, end_bh, end_row0, HQ, SQ, q_free.index(end_slot),
                       WRITE_LSE, O_STORE)
        # deferred rescale: the P.V before has landed. Unconditional, so acc keeps the wgmma's registers (a
        # zeroed or rescaled acc chosen by branch costs a register copy of it every step); after a boundary the
        # next P.V overwrites it (`fresh`), so what this makes of the finished tile's acc is never read
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1).to(acc.dtype)
        fresh = boundary
        p_op = gl.convert_layout(p.to(pv_dtype), p_layout)
        m_i = m_new
        l_i = l_new
        it += 1
        start_n += BLOCK_N
    # the program's last tile: its last P.V alone
    if O_STORE != 2:
        mbarrier.arrive(q_free.index(n % 2))
    acc = warpgroup_mma(p_op, v.bufs.index(v.wait(it - 1)), acc, use_acc=not fresh)
    v.release(it - 1)
    store_tile(acc, m_i, l_i, o_desc, q_bufs.index((n % 2) * NUM_WG + WG) if O_STORE == 2 else o_bufs.index(WG), O,
               o_rs, LSE, at, bh, row0, HQ, SQ, q_free.index(n % 2), WRITE_LSE, O_STORE)
    tma.store_wait(0)
