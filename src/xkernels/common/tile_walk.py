"""Output-tile walk orders (the seeds' tile walk): which (tile_m, tile_n) program `pid` computes.

Row-major is the plain order; grouped walks GROUP_M tile rows column by column so neighbouring programs share B
tiles in L2; Z-order (Morton) interleaves the bits of the two indices, so any aligned square of consecutive programs
covers a square of output tiles. Z-order runs over power-of-two squares stacked along the longer side; programs
that land outside the tile grid get coordinates past the end and do nothing.
"""

import triton
import triton.language as tl

WALKS = ("row", "grouped", "zorder")


def zorder_grid(tiles_m: int, tiles_n: int) -> tuple[int, int, int]:
    """(programs, log2 of the square's side, 1 if the squares stack along M) for a Z-order launch."""
    pm, pn = triton.next_power_of_2(tiles_m), triton.next_power_of_2(tiles_n)
    side = min(pm, pn)
    return pm * pn, side.bit_length() - 1, int(pm > pn)


@triton.jit
def _compact_even_bits(x):
    x = x & 0x55555555
    x = (x | (x >> 1)) & 0x33333333
    x = (x | (x >> 2)) & 0x0F0F0F0F
    x = (x | (x >> 4)) & 0x00FF00FF
    x = (x | (x >> 8)) & 0x0000FFFF
    return x


@triton.jit
def tile_coords(pid, tiles_m, tiles_n, z_bits, z_tall, WALK: tl.constexpr, GROUP_M: tl.constexpr):
    if WALK == "row":
        tile_m = pid // tiles_n
        tile_n = pid % tiles_n
    elif WALK == "grouped":
        width = GROUP_M * tiles_n
        first_m = (pid // width) * GROUP_M
        rows = min(tiles_m - first_m, GROUP_M)
        tile_m = first_m + (pid % width) % rows
        tile_n = (pid % width) // rows
    else:
        square = pid & ((1 << (2 * z_bits)) - 1)
        stack = (pid >> (2 * z_bits)) << z_bits
        tile_m = _compact_even_bits(square)
        tile_n = _compact_even_bits(square >> 1)
        if z_tall:
            tile_m += stack
        else:
            tile_n += stack
    return tile_m, tile_n
