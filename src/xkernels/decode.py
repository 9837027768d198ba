"""Host path of the split-KV kernel (`portable/attention_decode.py`), shared by `attention_with_kvcache` and by the
dense `attention` when it has few query rows: how many key splits, the partial-result workspace, and the launches.

A plan is resolved once per (shapes, strides, dtypes, device, flags) key, as in `plans`: the grid, the split count
and every integer argument follow from the key, so a repeated call allocates its outputs (and, when split, the fp32
partials) and calls the compiled launchers directly. A plan holds numbers and compiled kernels, never a tensor.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from xkernels.common import launch, scratch
from xkernels.common.runtime import INTERPRET, pdl_available, sm_count
from xkernels.portable import attention_decode as kernel
from xkernels.portable.configs import DecodeConfig
from xkernels.portable.softmax import softcap_name
from xkernels.recipes import AttentionRecipe

LOG2E = math.log2(math.e)
MAX_SPLITS = 128
COMBINE_CHUNK = 16
INTERPRETED_SMS = 4  # a small "GPU" under the interpreter, so CPU tests split the keys too


def _cdiv(a: int, b: int) -> int:
    """Ceiling division (`triton.cdiv` is a JIT function: ~3 us of host time per call)."""
    return -(-a // b)


def num_splits(programs: int, keys: int, block_n: int, slots: int) -> int:
    """Key splits per (sequence, kv head, row block): as many as fill one wave of the GPU's `slots` (SMs times the
    config's programs per SM: one ~140 KB program at D128, two ~70 KB ones at D64), never more than the key tiles.
    Measured on the H200 (benchmarks/results/h200/2026-11-30/15): 2 splits for 64 programs, 16 for 8, 1 for 128 and
    512 at D128, each within 1 % of the best of 1-64 splits, where four programs per SM lost 5-12 %; at D64 two per
    SM won 0-9 % (2026-12-01/25)."""
    tiles = _cdiv(max(keys, 1), block_n)
    return max(1, min(slots // max(programs, 1), tiles, MAX_SPLITS))


def _partials(words: int, device: torch.device) -> torch.Tensor:
    """A split launch's fp32 workspace (uninitialized: every slot the combine reads is written first; tests poison
    it through this hook)."""
    return torch.empty(words, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class Geometry:
    """A call's shapes as the kernel sees them. q, O: (B, SQ, HQ, D) by (batch, token, head) strides; K, V: key n
    of sequence b at block b (dense, page = 0) or at block table[b, n // page], row n % page, by (block, row, head)
    strides; `capacity`: the most keys a sequence can have (the split count follows it, never the lengths on the
    device, so nothing is read back); `num_blocks`: the cache's blocks (pages, or sequences when dense)."""

    batch: int
    sq: int
    hq: int
    hkv: int
    head_dim: int
    capacity: int
    page: int
    q_strides: tuple[int, int, int]
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    o_strides: tuple[int, int, int]
    table_stride: int
    num_blocks: int


NO_WINDOW = 1 << 30  # a window side the kernel never reaches (keys are int32)


@dataclass
class _Variant:
    """The kernels of one compile-time variant of a plan (split or not; every integer argument 32-bit or not)."""

    constexprs: dict
    tail: tuple
    kernel: launch.Kernel | None = None
    combine: launch.Kernel | None = None


@dataclass(frozen=True)
class Launch:
    """What follows from a plan and its cache's capacity (and K/V strides): the split count, grid, integer
    arguments and the variant whose kernels run them."""

    splits: int
    grid: int
    ints: tuple
    combine_ints: tuple
    variant: _Variant
    name: str
    tail: tuple  # the block count and the window's sides (NO_WINDOW where unbounded)


class DecodePlan:
    def __init__(self, g: Geometry, *, seq_lengths: bool, is_causal: bool, bottom_right: bool,
                 recipe: AttentionRecipe, cfg: DecodeConfig, write_lse: bool, device: torch.device,
                 splits: int = 0, key_starts: bool = False, window: tuple[int, int] = (-1, -1),
                 softcap: float = 0.0, sinks: bool = False):
        """`window` (left, right): FlashAttention's window_size, -1 for an unbounded side; `softcap` the scores'
        soft cap (0: none); `sinks`: every call passes (Hq,) sink logits. With `seq_lengths` the
        kernel checks each sequence's length, left pad and block ids as it reads them (`attention_decode_kernel`).
        The launch for `g`'s capacity is `self.launch`; `resize` gives the launch for another capacity of a dense
        cache (the dense API's K/V grown by a token: the same plan, new integer arguments)."""
        self.window = window
        if cfg.pdl and not pdl_available(device):  # griddepcontrol: CUDA sm_90 and newer only
            cfg = dataclasses.replace(cfg, pdl=False)
        self.g, self.device, self.write_lse, self.cfg, self.recipe = g, device, write_lse, cfg, recipe
        self.is_causal, self.forced_splits = is_causal, splits
        self.group = g.hq // g.hkv
        rows = g.sq * self.group
        self.block_m = cfg.block_m(rows)
        self.programs = g.batch * g.hkv * _cdiv(rows, self.block_m)
        sms = INTERPRETED_SMS if INTERPRET or device.type != "cuda" else sm_count(device.index or 0)
        self.slots = sms * cfg.programs_per_sm
        self.rows = g.batch * g.sq * g.hq
        # a row's offset inside its page, up to (page - 1) * row stride, is int32 in the kernel unless that could wrap
        wide = g.page > 0 and (g.page - 1) * max(g.k_strides[1], g.v_strides[1]) >= 2**31
        self._flags = dict(rows=rows, page=g.page, seq_lengths=seq_lengths, causal=is_causal,
                           bottom_right=bottom_right, write_lse=write_lse, key_starts=key_starts, wide_rows=wide,
                           softcap=softcap, sinks=sinks)
        self.softcap = softcap
        self._variants: dict[tuple, _Variant] = {}
        self.options = cfg.options()
        self.direct = launch.direct_launch_available(device)
        # (both CUDA launchers, the direct path's and Triton's, set the programmatic-dependent launch attribute)
        self.combine_constexprs = dict(HEAD_DIM=g.head_dim, CHUNK=COMBINE_CHUNK, WRITE_LSE=write_lse,
                                       WAIT_PRIMARY=cfg.pdl)
        self.combine_options = dict(num_warps=1, num_stages=1) | (dict(launch_pdl=True) if cfg.pdl else {})
        self.combine_tail = launch.constexpr_tail(kernel.combine_kernel, self.combine_constexprs)
        self._qk_scale = LOG2E / math.sqrt(g.head_dim)  # the default scale's, folded with log2(e) for exp2
        self.launch = self.resize(g.capacity, g.k_strides, g.v_strides)

    @property
    def splits(self) -> int:
        return self.launch.splits

    @property
    def ints(self) -> tuple:
        return self.launch.ints

    @property
    def constexprs(self) -> dict:
        return self.launch.variant.constexprs

    @property
    def name(self) -> str:
        return self.launch.name

    def resize(self, capacity: int, k_strides: tuple[int, int, int], v_strides: tuple[int, int, int]) -> Launch:
        """The launch for a cache of `capacity` keys per sequence with these K/V (block, row, head) strides."""
        g, cfg = self.g, self.cfg
        # a side that reaches past every key from every row (|diagonal shift| < capacity + sq, either alignment) cuts
        # nothing: unbounded, so such a window runs the unwindowed variant and int32 positions never wrap
        window = tuple(-1 if side < 0 or side >= capacity + g.sq else side for side in self.window)
        windowed = window[0] >= 0 or (window[1] >= 0 and not self.is_causal)
        # the keys a row block can see: the cache, or with a left window at most the window and the block's rows
        # (and the right window, not causal); the splits cut that span
        span = capacity
        if window[0] >= 0:  # the kernel starts the span at the key tile of the window's first key
            right = 0 if self.is_causal else (window[1] if window[1] >= 0 else capacity)
            span = min(capacity, window[0] + g.sq + right + cfg.block_n - 1)
        splits = self.forced_splits
        if splits <= 0:
            splits = num_splits(self.programs, span, cfg.block_n, self.slots)
        tiles = _cdiv(max(span, 1), cfg.block_n)
        split_keys = _cdiv(tiles, min(splits, tiles)) * cfg.block_n
        splits = _cdiv(max(span, 1), split_keys)
        ints = (*g.q_strides, *k_strides, *v_strides, *g.o_strides, g.table_stride, g.sq, g.hkv, self.group,
                capacity, split_keys, self.rows, splits)
        # Triton types each int argument i64 from 2^31 up and specializes strides on being 1 or a multiple of 16:
        # variants of their own (a dense cache's strides keep theirs as it grows: D is a multiple of 16)
        page_ids = cfg.page_ids(g.page, split_keys)
        key = (splits > 1, tuple(x >= 2**31 for x in ints),
               tuple((s == 1, s % 16 == 0) for s in (*k_strides, *v_strides)), windowed, page_ids)
        variant = self._variants.get(key)
        if variant is None:
            constexprs = cfg.constexprs(g.head_dim, self.recipe, split=key[0], windowed=windowed, page_ids=page_ids,
                                        **self._flags)
            variant = self._variants[key] = _Variant(constexprs,
                                                     launch.constexpr_tail(kernel.attention_decode_kernel, constexprs))
        name = (f"portable.decode[{self.recipe.name} {cfg} BM{self.block_m} splits={splits}"
                + (f" window={window[0]},{window[1]}" if windowed else "") + softcap_name(self.softcap)
                + " sinks" * self._flags["sinks"] + "]")
        tail = (g.num_blocks, *(NO_WINDOW if side < 0 else side for side in window))
        return Launch(splits, self.programs * splits, ints, (*g.o_strides, self.rows, g.sq, g.hq, splits), variant,
                      name, tail)

    def run(self, q, k, v, out, lse, seqlens, block_table, scale: float | None, key_start=None,
            new: int = 0, at: Launch | None = None, sinks=None) -> None:
        """Write O into `out` and, when the plan writes it, the LSE (B, HQ, SQ) fp32 into `lse`. `seqlens` (B,)
        int32: each sequence's cached keys, to which `new` keys were appended (they count too); `key_start` (B,)
        int32: each sequence's first key row, for a plan made with `key_starts`; `at`: a launch from `resize`
        (default: the plan's own capacity). A split launch's fp32 partials (O (splits, rows, D), then LSE
        (splits, rows)) are allocated per call, or with the fused merge taken with its arrival counters from the
        current stream's kept scratch (`common.scratch`; per call under capture). `sinks`: (Hq,) contiguous sink
        logits, for a plan made with them."""
        g, at = self.g, at or self.launch
        qk_scale = self._qk_scale if scale is None else scale * LOG2E
        o_ptr = out.data_ptr()  # stands in for the optional tensors not given (never read)
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o_ptr, o_ptr if lse is None else lse.data_ptr(),
                o_ptr if seqlens is None else seqlens.data_ptr(),
                o_ptr if block_table is None else block_table.data_ptr(),
                o_ptr if key_start is None else key_start.data_ptr(), o_ptr if sinks is None else sinks.data_ptr())
        variant = at.variant
        fused = variant.constexprs["FUSED_COMBINE"]
        part = arrivals = None
        if at.splits > 1:
            o_words = at.splits * self.rows * g.head_dim  # a multiple of 4: the LSE partials stay 16-byte aligned
            # the fused merge is one launch, so the stream's kept buffer serves it (launches on a stream run in
            # order); a kernel + combine pair could interleave with another host thread's pair on the same stream,
            # so it takes buffers of its own, as it does under capture (from the graph's pool, counters zeroed)
            kept = scratch.split_k(self.device, self.programs, o_words + at.splits * self.rows) if fused else None
            if kept is not None:
                arrivals, part = kept
            else:
                part = _partials(o_words + at.splits * self.rows, self.device)
                if fused:
                    arrivals = torch.zeros(self.programs, dtype=torch.int32, device=self.device)
        ints = (*at.ints, new, *at.tail, qk_scale)
        combined = part is not None and not fused  # the merge is a kernel of its own
        if self.direct and not ((ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6] | ptrs[7]
                                 | ptrs[8]) & 15):  # every base 16-byte aligned, as the variant was specialized
            if variant.kernel is None or (combined and variant.combine is None):  # this variant's first launch
                tensors = self._tensors(q, k, v, out, lse, seqlens, block_table, key_start, sinks)
                args, combine = self._arguments(at, tensors, part, arrivals, ints)
                variant.kernel = launch.compile_kernel(kernel.attention_decode_kernel, at.grid, args,
                                                       variant.constexprs, self.options, self.device)
                if combined:
                    variant.combine = launch.compile_kernel(kernel.combine_kernel, self.rows, combine,
                                                            self.combine_constexprs, self.combine_options,
                                                            self.device)
            o_part = lse_part = counter_ptr = ptrs[3]  # never touched unless split (and fused)
            if part is not None:
                o_part = part.data_ptr()
                lse_part = o_part + 4 * o_words
                counter_ptr = arrivals.data_ptr() if fused else ptrs[3]
            variant.kernel.launch(at.grid, (*ptrs[:5], o_part, lse_part, *ptrs[5:8], counter_ptr, *ints, ptrs[8],
                                            *variant.tail))
            if combined:
                variant.combine.launch(self.rows, (o_part, lse_part, ptrs[3], ptrs[4], *at.combine_ints,
                                                   *self.combine_tail))
            return
        tensors = self._tensors(q, k, v, out, lse, seqlens, block_table, key_start, sinks)
        args, combine = self._arguments(at, tensors, part, arrivals, ints)
        launch.generic_launch(kernel.attention_decode_kernel, at.grid, args, variant.constexprs, self.options)
        if combined:
            launch.generic_launch(kernel.combine_kernel, self.rows, combine, self.combine_constexprs,
                                  self.combine_options)

    @staticmethod
    def _tensors(q, k, v, out, lse, seqlens, block_table, key_start, sinks) -> tuple:
        """The kernel's tensor arguments in order, `out` standing in for those not given."""
        return (q, k, v, out, out if lse is None else lse, out if seqlens is None else seqlens,
                out if block_table is None else block_table, out if key_start is None else key_start,
                out if sinks is None else sinks)

    def _arguments(self, at: Launch, tensors, part, arrivals, ints) -> tuple[tuple, tuple]:
        """The decode and combine kernels' argument lists as tensors (Triton's launcher and the first compile of a
        variant take them so): the partials viewed out of `part`, `out` where an argument is never touched."""
        out, lse_arg = tensors[3], tensors[4]
        o_part = lse_part = out
        if part is not None:
            o_words = at.splits * self.rows * self.g.head_dim
            o_part = part[:o_words].view(at.splits, self.rows, self.g.head_dim)
            lse_part = part[o_words:o_words + at.splits * self.rows].view(at.splits, self.rows)
        args = (*tensors[:5], o_part, lse_part, *tensors[5:8], out if arrivals is None else arrivals, *ints,
                tensors[8])
        return args, (o_part, lse_part, out, lse_arg, *at.combine_ints)


_PLANS: dict = {}
_PLANS_MAX = 1024


def _plan(key: tuple, make) -> DecodePlan:
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        plan = _PLANS[key] = make()
    return plan


def kvcache_plan(q, k_cache, v_cache, out, block_table, *, is_causal: bool, recipe: AttentionRecipe,
                 cfg: DecodeConfig, write_lse: bool, splits: int, key_starts: bool = False,
                 window: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: bool = False) -> DecodePlan:
    """The plan of an `attention_with_kvcache` call: q, O (B, Sq, Hq, D); a dense (B, S_max, Hkv, D) or paged
    (num_blocks, page_size, Hkv, D) cache; bottom-right causal; per-sequence lengths (and, for a left-padded dense
    cache, first keys) read on the device."""
    paged = block_table is not None
    key = ("kvcache", q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(), out.stride(),
           None if not paged else (block_table.shape, block_table.stride()), q.dtype, q.device, is_causal,
           recipe.name, cfg, write_lse, splits, key_starts, window, softcap, sinks)

    def make() -> DecodePlan:
        batch, sq, hq, d = q.shape
        page = k_cache.shape[1] if paged else 0
        g = Geometry(batch, sq, hq, k_cache.shape[2], d, page * block_table.shape[1] if paged else k_cache.shape[1],
                     page, q.stride()[:3], k_cache.stride()[:3], v_cache.stride()[:3], out.stride()[:3],
                     block_table.stride(0) if paged else 0, k_cache.shape[0])
        return DecodePlan(g, seq_lengths=True, is_causal=is_causal, bottom_right=True, recipe=recipe, cfg=cfg,
                          write_lse=write_lse, device=q.device, splits=splits, key_starts=key_starts, window=window,
                          softcap=softcap, sinks=sinks)

    return _plan(key, make)


def dense_plan(q, k, v, out, *, is_causal: bool, recipe: AttentionRecipe, cfg: DecodeConfig,
               write_lse: bool, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
               sinks: bool = False) -> DecodePlan:
    """The plan of a dense `attention` call with few query rows: q, O (B, Hq, Sq, D), K, V (B, Hkv, Skv, D) read
    as a one-page-per-sequence cache of Skv keys each; top-left causal and window, as the dense API. Not cached here:
    the caller's plan (`plans.DecodeAttentionPlan`) keeps it under its own key."""
    batch, hq, sq, d = q.shape

    def bsh(t):  # (batch, token, head) strides of a (B, H, S, D) tensor
        return t.stride(0), t.stride(2), t.stride(1)

    g = Geometry(batch, sq, hq, k.shape[1], d, k.shape[2], 0, bsh(q), bsh(k), bsh(v), bsh(out), 0, batch)
    return DecodePlan(g, seq_lengths=False, is_causal=is_causal, bottom_right=False, recipe=recipe, cfg=cfg,
                      write_lse=write_lse, device=q.device, window=window, softcap=softcap, sinks=sinks)
