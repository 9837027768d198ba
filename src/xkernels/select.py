"""Kernel choice: a pure function of the op, the device, the problem and an explicit override, with no global state.

`backend` is the override every public function takes (and the custom ops carry as a string, so a compiled graph
sees it): "auto" lets the problem choose; "portable" or "hopper" forces a layer (a forced layer that cannot run
raises); "hopper:stages=3,overlap=0" also overrides fields of the Hopper tile config, for ablations. The
XKERNELS_LAYER environment variable, read once at import, is the default of `backend`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import torch

from xkernels.common.runtime import INTERPRET, check_device, device_index, hopper_available, sm_count
from xkernels.common.seqlen import Band
from xkernels.common.targets import TARGETS, Target, device_target
from xkernels.hopper.configs import (
    ATTENTION_BWD_CONFIGS,
    ATTENTION_CONFIGS,
    ATTENTION_DQ_CONFIGS,
    FUSED_BWD_CONFIGS,
    PERSISTENT_ATTENTION_CONFIGS,
    HopperAttentionBwdConfig,
    HopperAttentionConfig,
    HopperAttentionDqConfig,
    HopperGemmConfig,
    gemm_config,
)
from xkernels.portable import configs as portable_configs
from xkernels.recipes import AttentionRecipe
from xkernels.validation import (
    NO_WINDOW,
    check_attention,
    check_attention_backward,
    check_attention_kvcache,
    check_attention_varlen,
    check_attention_varlen_backward,
    check_matmul,
    check_sinks,
)

LAYERS = ("portable", "hopper")
DEFAULT_BACKEND: str = os.environ.get("XKERNELS_LAYER") or "auto"


@dataclass(frozen=True)
class Override:
    layer: str | None  # None: the problem chooses
    config: tuple[tuple[str, int], ...] = ()  # Hopper config fields to override


@functools.lru_cache(maxsize=256)
def parse_backend(backend: str) -> Override:
    """'auto' | 'portable' | 'hopper' | 'hopper:field=int,...' -> Override; ValueError naming `backend` otherwise."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    layer, _, fields = backend.partition(":")
    if layer == "auto" and not fields:
        return Override(None)
    if layer not in LAYERS:
        raise ValueError(f"backend: {backend!r} is not 'auto', one of {LAYERS}, or 'hopper:field=value,...'")
    config = []
    for item in filter(None, fields.split(",")):
        name, eq, value = item.partition("=")
        if not eq or not value.lstrip("-").isdigit():
            raise ValueError(f"backend: {item!r} in {backend!r} is not field=integer")
        config.append((name.strip(), int(value)))
    if config and layer != "hopper":
        raise ValueError(f"backend: config overrides {backend!r} need the 'hopper' layer")
    known = _fields(HopperAttentionConfig) | _fields(HopperGemmConfig)
    unknown = sorted({n for n, _ in config} - known)
    if unknown:
        raise ValueError(f"backend: {unknown} are not Hopper config fields {sorted(known)}")
    return Override(layer, tuple(config))


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _configured(default, config: tuple[tuple[str, int], ...]):
    """The kernel's default config with the override's fields; a field this kernel lacks is an error."""
    if not config:
        return default
    unknown = {n for n, _ in config} - _fields(type(default))
    if unknown:
        raise ValueError(f"backend: {sorted(unknown)} are not fields of {type(default).__name__}")
    return dataclasses.replace(default, **dict(config))


def _target(device: torch.device) -> Target | None:
    """The compile target of a CUDA, ROCm or Intel device (the portable configs follow it); None elsewhere. Every
    Intel GPU gets the Xe2 tables (sized for its 128 KB of shared local memory, compiled in CI)."""
    if INTERPRET:
        return None
    if device.type == "xpu":
        return TARGETS["xe2"]
    if device.type != "cuda":
        return None
    return device_target(device_index(device))


@dataclass(frozen=True)
class Choice:
    layer: str  # "portable" or "hopper"
    config: object  # the kernel's tile config
    kernel: str = ""  # which of the op's kernels, where it has several ("decode": the split-KV kernel)


# Dense attention calls with at most this many query rows per (batch, head) run the split-KV kernel (`decode.py`),
# which packs a GQA group's rows into one tile and splits the keys over the SMs; the forward kernels put 64-192 rows
# in a tile and one program per row block.
DECODE_MAX_SQ = 16


@dataclass(frozen=True)
class HopperBackward:
    """The Hopper backward's configs: its Gluon dK/dV kernel, the portable preprocess kernel, and dQ: the Gluon dQ
    kernel's config, or None for the portable dQ kernel (`portable`'s tiles)."""

    dkdv: HopperAttentionBwdConfig
    portable: portable_configs.AttentionBwdConfig
    dq: HopperAttentionDqConfig | None = None
    # the Gluon dQ kernel on a side stream beside dK/dV, so its CTAs fill the SMs dK/dV's last wave leaves idle
    # (benchmarks/results/h200/2026-12-01/03-*/dq_ab.json: 1-7% off the backward on every anchor row)
    concurrent_dq: bool = True

    def __str__(self) -> str:
        if self.dkdv.fused_dq:  # no dQ kernel: the dK/dV kernel reduces dQ, the preprocess's tiles scale it
            return f"dKdV {self.dkdv} fused dQ"
        return f"dKdV {self.dkdv} dQ {self.dq if self.dq else self.portable}" + " concurrent" * self.concurrent_dq


@dataclass(frozen=True)
class HopperForward:
    """The Hopper forward's configs: the dense kernel's, and the persistent kernel's (D64, D128, D256),
    which serves the shapes `attention_persistent.eligible` accepts. A config override applies to both."""

    dense: HopperAttentionConfig
    persistent: HopperAttentionConfig | None = None

    def __str__(self) -> str:
        return str(self.dense)

    def with_v_pass(self, v_pass: int, head_dim: int, recipe: AttentionRecipe) -> HopperForward:
        """Both kernels' configs with V converted by a pass (`v_pass` 1) or by the producer (0); a config that
        cannot take the pass (its check) keeps the producer's conversion (the same bits)."""
        def set_(c: HopperAttentionConfig | None, *kind: str) -> HopperAttentionConfig | None:
            if c is None or c.v_pass == v_pass:
                return c
            changed = dataclasses.replace(c, v_pass=v_pass)
            try:
                if v_pass:
                    changed.check(head_dim, recipe, *kind)
            except ValueError:
                return c
            return changed

        return HopperForward(set_(self.dense), set_(self.persistent, "persistent"))


# fields of HopperAttentionConfig that only the persistent kernel reads (the dense kernel ignores them)
PERSISTENT_FIELDS = frozenset({"persistent", "chained", "l2_budget_kib", "o_store", "walk", "pingpong", "flat"})


def _hopper_forward(head_dim: int, recipe: AttentionRecipe, override: Override) -> HopperForward:
    """The Hopper forward's configs with the override's fields, checked; the persistent one is dropped where the head
    dim has none, the override turns it off, or the override's fields do not fit the persistent kernel while the
    override names none of the persistent kernel's own fields ("hopper:stages=3" at D128: three stages fit beside
    one Q slot, not beside the persistent kernel's two and its O buffers; the dense kernel then serves every shape).
    An override of a field only the persistent kernel reads (`PERSISTENT_FIELDS`) gets its error instead."""
    cfg = _configured(ATTENTION_CONFIGS[head_dim], override.config)
    cfg.check(head_dim, recipe)
    persistent = None
    if head_dim in PERSISTENT_ATTENTION_CONFIGS:
        persistent = _configured(PERSISTENT_ATTENTION_CONFIGS[head_dim], override.config)
        if persistent.persistent:  # a config that stays off is not checked: the override targets the dense one
            try:
                persistent.check(head_dim, recipe, "persistent")
            except ValueError:
                if PERSISTENT_FIELDS & set(dict(override.config)):
                    raise
                persistent = None
    return HopperForward(cfg, persistent if persistent and persistent.persistent else None)


def select_attention(device: torch.device, head_dim: int, recipe: AttentionRecipe, override: Override) -> Choice:
    """Hopper kernel on sm_90 with a tested triton (every recipe, head dim, mask, window, GQA, length, soft cap and
    sinks); else portable. The Gluon forward's band, soft cap and sinks against the portable kernels' on the H200:
    1.27-1.33x on 4K windows, 1.23x on Gemma 2's capped layer, 1.41x on gpt-oss's sink layer (TFLOP/s, device time,
    bf16; benchmarks/results/h200/2026-12-02/42-sinkscap; every recipe's caps and sinks against float64 on the GPU:
    48-gputests-recipes)."""
    on_hopper = hopper_available(device)
    if override.layer == "hopper" and not on_hopper:
        raise ValueError("backend: 'hopper' was forced, but attention there needs sm_90 and a tested triton")
    if override.layer != "portable" and on_hopper:
        return Choice("hopper", _hopper_forward(head_dim, recipe, override))
    return Choice("portable", portable_configs.attention_config(head_dim, recipe, _target(device)))


def resolve_attention(q, k, v, out, *, enable_gqa: bool, precision: str, backend: str, is_causal: bool = False,
                      window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0, sinks=None):
    """Every metadata check of an attention call and its kernel choice: run by the plans and by the fake kernels
    alike, so a traced call raises what the eager call raises. Calls with few query rows take the split-KV kernel
    unless "hopper" is forced; soft caps, sinks (checked here) and sliding windows the Hopper kernel on sm_90 and the
    portable kernels elsewhere. Returns (recipe, Choice)."""
    recipe = check_attention(q, k, v, out, enable_gqa=enable_gqa, precision=precision)
    check_sinks(sinks, q.shape[1], q.device)
    check_device(q.device, "q")
    override = parse_backend(backend)
    if q.device.type == "meta":  # shapes only: no kernel is chosen for a device that runs none
        return recipe, Choice("meta", None)
    # int(): the head dim picks a config (a dict key), so a traced call specializes on it, as every kernel does
    d = int(q.shape[-1])
    if override.layer != "hopper" and q.shape[2] <= DECODE_MAX_SQ:  # a guard on the relation, not on Sq
        return recipe, Choice("portable", _decode_config(q, d, q.shape[0] * k.shape[1]), "decode")
    choice = select_attention(q.device, d, recipe, override)
    # bf16io's V converted by one pass where that pays, on the calls it was measured on (no window, sinks or soft
    # cap); an override of `v_pass` or of the producer's conversion (`convert_steps`) decides alone. Concrete sizes
    # only: a traced call's symbolic ones would turn the threshold into a shape guard (the real call decides)
    sizes = (q.shape[1], k.shape[1], q.shape[2])
    if (choice.layer == "hopper" and not {"v_pass", "convert_steps"} & set(dict(override.config))
            and all(type(n) is int for n in sizes) and not (Band.of(is_causal, window).windowed or sinks is not None
                                                           or softcap) and v_pass_pays(recipe, d, *sizes, is_causal)):
        choice = Choice("hopper", choice.config.with_v_pass(1, d, recipe))
    return recipe, choice


# bf16io on Hopper: V converted to fp16 by one elementwise pass before the kernel (`HopperAttentionConfig.v_pass`),
# which then runs the fp16 recipe's kernel, against the producer warpgroup converting each V tile in shared memory.
# The pass costs a read and a write of V (per KV head, Skv x D); the kernel's work per V element grows with the query
# rows of the KV head's group, halved by a causal mask. Measured on the H100 (device time, x bf16's time, in-kernel
# -> pass; benchmarks/results/h100/2026-12-05/02-* and 03-*): D128 and D256 win from 2048 such rows (B8 2K D128
# 1.22 -> 1.19, causal B4 4K 1.19 -> 1.11, B1 8K 1.14 -> 1.04, B4 4K 1.20 -> 1.08, D256 8K 1.27 -> 1.07) and lose
# at 1024 (B16 1K 1.34 -> 1.48, D256 1.33 -> 1.37, causal B8 2K 1.27 -> 1.35). D64's conversion costs little
# in the kernel (1.03x at 8K: a key's V row is half as wide): the pass wins 2 % at 8192 rows, loses 2 % causal.
V_PASS_MIN_ROWS = {64: 8192, 128: 2048, 256: 2048}


def v_pass_pays(recipe: AttentionRecipe, head_dim: int, q_heads: int, kv_heads: int, sq: int, causal: bool) -> bool:
    """Whether bf16io's V is converted by one pass before the kernel rather than by its producer (`V_PASS_MIN_ROWS`
    query rows per KV head, twice that with a causal mask). bf16io-acc16 keeps the producer's conversion (its
    kernel with the pass was never timed)."""
    rows = sq * (q_heads // max(kv_heads, 1))
    need = V_PASS_MIN_ROWS.get(head_dim)
    return (recipe.converts_v and recipe.pv_acc_dtype == torch.float32 and need is not None
            and rows >= need * (2 if causal else 1))


def resolve_attention_backward(grad_out, q, k, v, out, lse, grad_lse, *, enable_gqa: bool, precision: str,
                               backend: str, is_causal: bool = False, window: tuple[int, int] = NO_WINDOW,
                               softcap: float = 0.0, deterministic: bool = True):
    """The backward's checks and kernel choice, for the real and the fake kernel alike: on sm_90 with a tested triton
    the Hopper dK/dV and dQ kernels (every head dim: D256 splits dK's and dV's columns across the warpgroups), else
    the portable kernels. `backend` "portable" forces those; "hopper" where the Hopper backward has no kernel (other
    GPUs, an untested triton) runs the portable one (`last_backend()` names it), and config overrides
    ("hopper:stages=3") apply to the forward only; a soft cap runs the portable kernels (also where "hopper" is
    forced), a sliding window the Hopper kernels' band. `deterministic` False: the Hopper dK/dV kernel with dQ
    fused in where it has that variant and is the faster one there (`fused_dq_pays`; at any shape where "hopper" is
    forced), on calls of more than one query block (`FUSED_DQ_MIN_QUERIES`). Causal calls whose dK/dV grid is too
    small for the SMs split each key block's GQA group over programs (`group_parts`; bitwise repeatable still).
    Returns (recipe, Choice)."""
    recipe = check_attention_backward(grad_out, q, k, v, out, lse, grad_lse, enable_gqa=enable_gqa,
                                      precision=precision)
    if type(deterministic) is not bool:
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    # a causal call may reach here as window (-1, 0) (`check_window` makes a causal right side 0): the band, not
    # the pair, says whether a window cuts keys. A forced "hopper" layer (`backend` or XKERNELS_LAYER) fuses at any
    # shape; otherwise `fused_dq_pays` decides, on concrete sizes only: a traced call's symbolic sizes would turn
    # its thresholds into shape guards (a recompile, or an error for a dimension marked dynamic), so the fake
    # kernel leaves them alone (its outputs are alike either way) and the real call decides.
    band = Band.of(is_causal, window)
    sizes = (q.shape[0], q.shape[1], k.shape[1], k.shape[2])
    concrete = all(type(n) is int for n in (*sizes, q.shape[2]))
    fused = (not deterministic and not band.windowed and type(q.shape[2]) is int
             and q.shape[2] >= FUSED_DQ_MIN_QUERIES
             and (parse_backend(backend).layer == "hopper"
                  or (concrete and fused_dq_pays(int(q.shape[-1]), band.causal, *sizes))))
    parts = 1
    if not fused and band.causal and not band.windowed and concrete and q.device.type == "cuda":
        parts = group_parts(int(q.shape[-1]), *sizes[:3], int(q.shape[2]), sizes[3],
                            sm_count(device_index(q.device)))
    return recipe, _backward_choice(q, backend, hopper_by_default=True, softcap=softcap, fused_dq=fused,
                                    group_parts=parts)


# Head dims whose Hopper dK/dV kernel has the fused-dQ variant (D256 splits its head dim across the warpgroups)
FUSED_DQ_HEAD_DIMS = tuple(FUSED_BWD_CONFIGS)
# Where the fused-dQ backward (`FUSED_BWD_CONFIGS`) measured faster than the split one (device time, whole backward,
# scripts/fused_dq_sweep.py, MHA and GQA 32/8): (head dim, causal) -> (keys, units of work) it needs (query heads x
# key blocks: a dK/dV program walks its GQA group's query heads), and a shape with a rule also a grid of
# FUSED_DQ_MIN_GRID CTAs (8 waves on 132 SMs); no rule: at every shape.
# - D128 (H200, benchmarks/results/h200/2026-12-04/91-fused-dq-sweep and 92-*): full 0-8 % faster at every length;
#   causal only from 8K keys and 4096 units since the split path's dK/dV kernel runs its unmasked query steps
#   without the mask (`mask_split`; H100, benchmarks/results/h100/2026-12-06/18-fused-dq-sweep-mask-split: fused
#   over split 0.89-0.97 at 1K-2K and B1 H32 8K, 0.99-1.00 at 4K, 1.02 at 8K-16K with 4096 units).
# - D64 with the warpgroups taking turns at dQ and K, V in registers (H100, benchmarks/results/h100/2026-12-05/
#   03-d64-fused-sweep-v-pass-mid): 1.01-1.24x the split path on every row from 1K to 16K keys, full and causal, MHA
#   and GQA, but for GQA causal B1 H32/8 8K (512 CTAs: 0.92).
FUSED_DQ_RULES = {(128, True): (8192, 4096), (64, True): (0, 0)}
# Calls of at most one query block take the split pair, forced "hopper" layer included: the D64 fused kernel read
# shared memory out of bounds on one (Sq = 1 against 77 keys, full, GQA 4/2; compute-sanitizer, H100,
# benchmarks/results/h100/2026-12-07/38-views-bwd-cases-memcheck-probe), which is not yet explained; the split pair
# passes its float64 tests at one query row (the GPU tests of runs 33 and 37).
FUSED_DQ_MIN_QUERIES = 65
FUSED_DQ_MIN_GRID = 1024
# A causal dK/dV program's walk is as long as its key block is early (block 0 sees every query of its group's heads),
# so with too few programs for the SMs the first blocks' walks outlast everything else, dQ's concurrent kernel
# included. Splitting each key block's GQA group over parts shortens the longest walk by the part count, for one fp32
# store and load of dK and dV per part. Measured (H100, split pair x cuDNN, causal, benchmarks/results/h100/
# 2026-12-07/41-group-parts): B1 H8/2 4K D128 0.67 -> 1.21 with 2 parts (4: 1.13), B1 H16/4 4K D128 1.07 -> 1.10,
# B1 H32/4 4K D64 1.01 -> 1.08 (4 parts: 1.05); lost where the parts' walks get short (B1 H32/8 2K: 64 steps a
# part, D128 1.19 -> 1.14, D64 1.22 -> 1.14) or the grid passes two waves (4 parts above; 256 programs level).
# So: two parts where the group is even, the grid stays within GROUP_PARTS_MAX_WAVES waves and each part's longest
# walk is GROUP_PARTS_MIN_STEPS query blocks or more.
GROUP_PARTS_MAX_WAVES = 2
GROUP_PARTS_MIN_STEPS = 128
# The last arriver's sum is unrolled over the parts: at 4, D128's consumer keeps 376 bytes on the stack (2: 40, none:
# 48), and 4 parts were never the faster in run 41
GROUP_PARTS_MAX = 2


def fused_dq_pays(head_dim: int, causal: bool, batch: int, q_heads: int, kv_heads: int, skv: int) -> bool:
    """Whether the fused-dQ backward is the faster one at this shape (`FUSED_DQ_RULES`); the dK/dV grid is one
    CTA per BLOCK_N keys per batch and KV head."""
    if head_dim not in FUSED_DQ_HEAD_DIMS:
        return False
    rule = FUSED_DQ_RULES.get((head_dim, causal))
    if rule is None:
        return True
    min_keys, min_units = rule
    blocks = batch * -(-skv // FUSED_BWD_CONFIGS[head_dim].block_n)
    return skv >= min_keys and blocks * q_heads >= min_units and blocks * kv_heads >= FUSED_DQ_MIN_GRID


def group_parts(head_dim: int, batch: int, q_heads: int, kv_heads: int, sq: int, skv: int, sms: int) -> int:
    """How many programs share each key block's GQA group in a causal backward: the most, a power of two dividing the
    group and at most `GROUP_PARTS_MAX`, within `GROUP_PARTS_MAX_WAVES` waves of the dK/dV grid and with each part's
    longest walk (block 0's: its heads' every query block) `GROUP_PARTS_MIN_STEPS` steps or more. Symbolic sizes
    never reach it (`resolve_attention_backward`)."""
    cfg = ATTENTION_BWD_CONFIGS.get(head_dim)
    if cfg is None or cfg.split_d or kv_heads == 0:  # (split_d, D256: both warpgroups on one set of keys)
        return 1
    group = q_heads // kv_heads
    programs = batch * kv_heads * -(-skv // cfg.block_n)
    steps = -(-sq // cfg.block_m)
    parts = 1
    while (2 * parts <= GROUP_PARTS_MAX and group % (2 * parts) == 0
           and programs * 2 * parts <= GROUP_PARTS_MAX_WAVES * sms
           and group // (2 * parts) * steps >= GROUP_PARTS_MIN_STEPS):
        parts *= 2
    return parts


def hopper_backward(head_dim: int, portable: portable_configs.AttentionBwdConfig, *,
                    fused_dq: bool = False, group_parts: int = 1) -> HopperBackward:
    """The Hopper backward's configs at `head_dim`: the dK/dV kernel and the Gluon dQ kernel beside it (bitwise
    repeatable), or with `fused_dq` where the head dim has it, dQ reduce-added by the dK/dV kernel (not bitwise
    repeatable: the partials of different key blocks land in any order; `fused_dq_pays` says where it is faster)."""
    if fused_dq and head_dim in FUSED_DQ_HEAD_DIMS:
        return HopperBackward(FUSED_BWD_CONFIGS[head_dim], portable, None)
    dkdv = ATTENTION_BWD_CONFIGS[head_dim]
    if group_parts > 1:
        dkdv = dataclasses.replace(dkdv, group_parts=group_parts)
    return HopperBackward(dkdv, portable, ATTENTION_DQ_CONFIGS.get(head_dim))


def _backward_choice(q, backend: str, *, hopper_by_default: bool, softcap: float = 0.0,
                     fused_dq: bool = False, group_parts: int = 1) -> Choice:
    """The backward kernels: the Hopper dK/dV and dQ kernels (windows included: their band) on sm_90 with a tested
    triton where "hopper" is forced, or with `hopper_by_default` where no layer is, but for soft caps; else the
    portable ones."""
    check_device(q.device, "q")
    override = parse_backend(backend)
    # soft caps: the portable kernels even where "hopper" is forced (a forced layer without a kernel falls back
    # here, as documented). Sinks need nothing of the kernels (the LSE holds them; dSinks is the op's own pass).
    portable_only = bool(softcap)
    if q.device.type == "meta":
        return Choice("meta", None)
    d = int(q.shape[-1])
    portable = portable_configs.attention_bwd_config(d, _target(q.device))
    wanted = not portable_only and (override.layer == "hopper" or (hopper_by_default and override.layer is None))
    if wanted and d in ATTENTION_BWD_CONFIGS and hopper_available(q.device):
        return Choice("hopper", hopper_backward(d, portable, fused_dq=fused_dq, group_parts=group_parts))
    return Choice("portable", portable)


# Head dims the Hopper varlen kernel serves (the dense forward's configs).
HOPPER_VARLEN_HEAD_DIMS = (64, 128, 256)


def _varlen_choice(q, recipe: AttentionRecipe, backend: str) -> Choice:
    """The varlen kernel's choice: the Hopper kernel (the dense forward's program per sequence, its config and
    overrides, its band for a sliding window, its soft cap and sinks) on sm_90 with a tested triton at the head dims
    it ran at; else the portable one; a forced layer that cannot run raises."""
    check_device(q.device, "q")
    override = parse_backend(backend)
    if q.device.type == "meta":
        return Choice("meta", None)
    d = int(q.shape[-1])
    hopper = hopper_available(q.device) and d in HOPPER_VARLEN_HEAD_DIMS
    if override.layer == "hopper" and not hopper:
        raise ValueError(f"backend: 'hopper' was forced, but attention_varlen there needs sm_90, a tested triton and "
                         f"a head dim in {HOPPER_VARLEN_HEAD_DIMS}")
    if override.layer != "portable" and hopper:
        return Choice("hopper", _hopper_forward(d, recipe, override))
    return Choice("portable", portable_configs.attention_config(d, recipe, _target(q.device)))


def resolve_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, precision: str,
                             backend: str, is_causal: bool = False, window: tuple[int, int] = NO_WINDOW,
                             softcap: float = 0.0, sinks=None):
    """The varlen forward's metadata checks and kernel choice. Returns (recipe, Choice)."""
    recipe = check_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    precision=precision)
    check_sinks(sinks, q.shape[1], q.device)
    return recipe, _varlen_choice(q, recipe, backend)


def resolve_attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q, max_seqlen_k, *, precision: str, backend: str,
                                     is_causal: bool = False, window: tuple[int, int] = NO_WINDOW,
                                     softcap: float = 0.0):
    """The varlen backward's checks and kernel: on sm_90 with a tested triton the Hopper dK/dV and dQ kernels' packed
    variants (`VARLEN`; 1.4-1.7x padded SDPA-cuDNN's backward and 1.3x the portable kernels on the bench's packed
    batches), else the portable kernels, as the dense backward (`backend="portable"` forces them; config fields
    apply to the forward only; `last_backend()` names the kernels). Returns (recipe, Choice)."""
    recipe = check_attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k,
                                             max_seqlen_q, max_seqlen_k, precision=precision)
    return recipe, _backward_choice(q, backend, hopper_by_default=True, softcap=softcap)


def resolve_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, *, precision: str,
                              backend: str):
    """KV-cache calls run the portable split-KV kernel on every device (`decode.py`); forcing "hopper" raises.
    Returns (recipe, Choice)."""
    recipe = check_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad,
                                     precision=precision)
    check_device(q.device, "q")
    if parse_backend(backend).layer == "hopper":
        raise ValueError("backend: 'hopper' was forced, but attention_with_kvcache has only the portable split-KV "
                         "kernel so far")
    if q.device.type == "meta":
        return recipe, Choice("meta", None)
    return recipe, Choice("portable", _decode_config(q, int(q.shape[-1]), q.shape[0] * k_cache.shape[2]))


def _decode_config(q, head_dim: int, pairs) -> portable_configs.DecodeConfig:
    """The split-KV config for `pairs` (sequence, kv head) pairs on q's device (`portable_configs.decode_config`).
    A symbolic count (a traced call with a dynamic batch) takes the head dim's one config: the fake kernel needs no
    config, and comparing the count would add a guard (torch.export of a batch range across the rule fails on it);
    the real kernel resolves again with the concrete count."""
    if type(pairs) is not int or q.device.type != "cuda" or not torch.cuda.is_available():
        return portable_configs.decode_config(head_dim, _target(q.device))
    return portable_configs.decode_config(head_dim, _target(q.device), pairs=pairs,
                                          sms=sm_count(device_index(q.device)))


def resolve_matmul(a, b, out, *, b_layout: str, out_dtype, backend: str, walk: str = "auto"):
    """As `resolve_attention` for matmul. Returns ((batch, M, N, K, out dtype), Choice)."""
    shape = check_matmul(a, b, out, b_layout=b_layout, out_dtype=out_dtype)
    check_device(a.device, "a")
    override = parse_backend(backend)
    batch, m, n, k, dtype = shape
    folds = b.dim() == 2 and a.dim() > 2  # a's batch folds into M against a 2-D b
    problems = math.prod(batch) if b.dim() > 2 else 1
    rows = m * math.prod(batch) if folds else m
    if a.device.type == "meta" or m * n * math.prod(batch) == 0 or k == 0:
        return shape, Choice("none", None)
    return shape, select_matmul(a.device, problems, rows, a.dtype, dtype, override, walk, cols=n, depth=k)


def select_matmul(device: torch.device, problems: int, rows: int, dtype: torch.dtype, out_dtype: torch.dtype,
                  override: Override, walk: str = "auto", *, cols: int, depth: int) -> Choice:
    """One 2-D problem of at most SKINNY_MAX_M rows: the few-row kernel (`gemm_skinny`, any device) unless "hopper"
    is forced or a walk order asked for (it has no output tiles to walk). Else the Hopper kernel for one 2-D problem
    with a 16-bit output on sm_90, its tile and K split from the `rows` x `cols` x `depth` problem and the SM count
    (`hopper.configs.gemm_config`; an override's fields apply on top); batched and fp32-output calls portable."""
    if override.layer != "hopper" and problems == 1 and rows <= portable_configs.SKINNY_MAX_M and walk == "auto":
        sms = sm_count(device_index(device)) if device.type == "cuda" else 0
        return Choice("portable", portable_configs.skinny_gemm_config(_target(device), rows=rows, n=cols, k=depth,
                                                                      sms=sms), "skinny")
    fits_hopper = hopper_available(device) and problems == 1 and out_dtype != torch.float32
    if override.layer == "hopper" and not fits_hopper:
        raise ValueError("backend: 'hopper' was forced, but this call needs sm_90, a tested triton, one 2-D problem "
                         "and a 16-bit output")
    if override.layer != "portable" and fits_hopper:
        cfg = _configured(gemm_config(rows, cols, depth, sm_count(device_index(device))), override.config)
        if cfg.acc_fp16 and "split_k" not in dict(override.config):  # fp16 accumulation: no fp32 partials to sum
            cfg = dataclasses.replace(cfg, split_k=1)
        cfg.check(dtype)
        return Choice("hopper", cfg)
    return Choice("portable", portable_configs.gemm_config(out_dtype, _target(device)))


if DEFAULT_BACKEND != "auto":  # a bad XKERNELS_LAYER fails at import, naming the variable
    try:
        parse_backend(DEFAULT_BACKEND)
    except ValueError as e:
        raise ValueError(f"XKERNELS_LAYER: {e}") from None
