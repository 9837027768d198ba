"""Named hardware barriers (`bar.sync` / `bar.arrive` with an id and a thread count) between consumer warpgroups.

Gluon's `mbarrier.arrive` synchronizes the arriving warpgroup (a `bar.sync` of its 128 threads) before one thread
arrives; a named barrier costs one instruction per thread and needs no shared memory. Ids 0-2 are Triton's (the
whole CTA, and each warp-specialized partition's own barrier); the ids here sit above them.

The ping-pong schedule (FlashAttention-3's "warp scheduler barrier", here `HopperAttentionConfig.pingpong`): two
consumer warpgroups take turns issuing their per-step matrix products. Warpgroup w waits on its own id before it
issues, and arrives on the other's id right after, so while one warpgroup's wgmmas run on the tensor cores the
other runs its softmax: the tensor cores see the two warpgroups' products back to back instead of both warpgroups'
softmax at the same time. A barrier completes when 256 threads (both warpgroups) reached it: 128 waiting, 128
arriving. Warpgroup 1 arrives once before its first turn, so warpgroup 0 goes first; the last of those arrivals is
left pending when the program ends (the hardware resets named barriers for every CTA).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# the ids of warpgroup 0's and warpgroup 1's turns (Triton's warp specialization uses 0-2 on sm_90)
PINGPONG_IDS = (8, 9)


@gluon.jit
def _bar(asm: gl.constexpr):
    """Run `asm` (a barrier instruction) once per thread, kept in program order (not pure)."""
    gl.inline_asm_elementwise(asm + " mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_turn(WG: gl.constexpr):
    """Warpgroup WG (0 or 1) waits for its turn: the other warpgroup has issued its products (or, for warpgroup
    0's first turn, warpgroup 1 has started)."""
    if WG == 0:
        _bar("bar.sync 8, 256;")
    else:
        _bar("bar.sync 9, 256;")


@gluon.jit
def pass_turn(WG: gl.constexpr):
    """Warpgroup WG has issued its products: the other warpgroup's turn (an arrive: WG does not wait)."""
    if WG == 0:
        _bar("bar.arrive 9, 256;")
    else:
        _bar("bar.arrive 8, 256;")
