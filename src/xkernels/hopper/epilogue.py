"""The persistent forward's epilogue: a warpgroup's O = acc / l and LSE out of one tile, by the config's O path."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from xkernels.hopper import configs, tma
from xkernels.hopper.attention_fwd import _normalize

WG_ROWS = gl.constexpr(configs.WG_ROWS)


@gluon.jit
def store_tile(acc, m_i, l_i, o_desc, o_buf, O, o_rs, LSE, at, bh, row0, HQ, SQ, free, WRITE_LSE: gl.constexpr,
               O_STORE: gl.constexpr):
    """A warpgroup's epilogue: O = acc / l and the LSE; rows past the sequence store nothing (Sq is a multiple of 64
    only, so the last block's last warpgroups may lie past it). O leaves by `O_STORE` (config `o_store`):
      0  through the warpgroup's O buffer `o_buf` and a TMA store left in flight (the buffer's next user waits);
      1  straight from the accumulator's registers, each thread's column pairs as plain global stores;
      2  through the tile's Q slot (`o_buf`: every QK^T reading it has retired) and a TMA store; once the store has
         read the slot, the warpgroup arrives on `free` (q_free) for the producer to load a later tile's Q there;
      3  through V stage WG (`o_buf`: 64-key tiles are a warpgroup's O tile; the caller waited for its last P.V),
         then `free` (o_left[WG]) for the producer's next V load, while the next tile's Q, freed after the last
         QK^T, loads under this epilogue.
    1-3 need no O buffers: at D256 those are what keep 64-key tiles out of the kernel's shared memory."""
    out, lse = _normalize(acc, m_i, l_i, False)
    if row0 < SQ:
        b = bh // HQ
        h = bh % HQ
        if O_STORE == 1:
            layout: gl.constexpr = acc.type.layout
            rows = b * at[6] + h * at[7] + row0 + gl.arange(0, WG_ROWS, gl.SliceLayout(1, layout))
            cols = h * at[8] + gl.arange(0, acc.shape[1], gl.SliceLayout(0, layout))
            ptrs = O + gl.expand_dims(rows.to(gl.int64) * o_rs, 1) + gl.expand_dims(cols, 0)
            gl.store(ptrs, out.to(O.dtype.element_ty))
        else:
            if O_STORE == 0:
                tma.store_wait(0)  # the previous tile's O store has left this buffer
            o_buf.store(out.to(o_buf.dtype))
            fence_async_shared()
            tma.async_store(o_desc, [b * at[6] + h * at[7] + row0, h * at[8]], o_buf)
        if WRITE_LSE:
            offs_m = row0 + gl.arange(0, WG_ROWS, lse.type.layout)
            gl.store(LSE + bh.to(gl.int64) * SQ + offs_m, lse)
    if O_STORE >= 2:
        tma.store_wait(0)  # the store has read the buffer (a warpgroup past the sequence end stored nothing)
        mbarrier.arrive(free)
