"""Compile every shipped kernel config for a target without a GPU and read what the compiler made of it.

The seeds' "check for spills before benchmarking" step, per target (`common/targets.py`): registers (VGPRs on AMD),
stack/local memory or scratch (spills), shared memory against the target's limit, and counts of the instructions
that matter: the matrix instruction (HGMMA on sm_90, HMMA = mma.sync elsewhere on NVIDIA, v_mfma on AMD), TMA or
async copies, 16-byte and 2-byte global loads, barriers and local-memory traffic. NVIDIA cubins are read with the
cuobjdump and nvdisasm in triton's wheel, AMD code from the AMDGCN assembly and its metadata.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import torch
import triton

from xkernels.common.dtypes import POINTER_TYPE, SHORT_NAME
from xkernels.common.seqlen import Band
from xkernels.common.targets import TARGETS, Target
from xkernels.portable.softmax import softcap_name

# instruction counts per backend, label -> regex: the matrix op first, then copies and loads (16-byte vs 2-byte),
# barriers, and local-memory (spill) traffic
_MATRIX = {"HGMMA": r"\bHGMMA\.", "HMMA": r"\bHMMA\.", "v_mfma": r"\bv_mfma"}
_SASS_COMMON = {"LDG.128": r"\bLDG\.[\w.]*128\b", "LDG.U16": r"\bLDG\.[\w.]*U16\b", "BAR": r"\bBAR\.",
                "LDL": r"\bLDL\b", "STL": r"\bSTL\b"}
SASS_OPS = {"sm_90": {"HGMMA": _MATRIX["HGMMA"], "HMMA": _MATRIX["HMMA"], "UTMALDG": r"\bUTMALDG\b",
                      "UTMASTG": r"\bUTMASTG\b", **_SASS_COMMON},
            "cuda": {"HMMA": _MATRIX["HMMA"], "UTMALDG": r"\bUTMALDG\b", "LDGSTS": r"\bLDGSTS\b",
                     "LDGSTS.128": r"\bLDGSTS\.[\w.]*128\b", **_SASS_COMMON}}
AMDGCN_OPS = {"v_mfma": _MATRIX["v_mfma"], "load_dwordx4": r"_load_dwordx4\b", "load_ushort": r"_load_ushort\b",
              "ds_read": r"\bds_read", "s_barrier": r"\bs_barrier\b"}
# Intel: counted in the LLVM IR the SPIR-V is made from (IGC allocates registers when the driver loads it): calls of
# the DPAS builtin, 2D block loads, and work-group barriers
XPU_OPS = {"matrix_mad": r"call[^\n]*matrix_mad_k16", "block_load_2d": r"call[^\n]*2d_block_read",
           "barrier": r"call[^\n]*(?:barrier|__spirv_ControlBarrier)"}


# the sliding window and soft cap the compile gate builds the portable kernels' windowed variants with (Gemma 2's:
# the superset of Mistral's window alone); the forward kernels' also read attention sinks (gpt-oss)
WINDOW = Band.of(True, (4095, 0))
SOFTCAP = 50.0
# non-causal windows the Gluon kernels also compile with at D128 bf16: both sides (the diagonal shifted: SHIFT > 0)
# and a lower side alone (CAUSAL off, BAND on)
SIDE_WINDOWS = (Band.of(False, (100, 60)), Band.of(False, (77, -1)))


def ops_for(target: Target) -> dict[str, str]:
    if target.backend == "xpu":
        return XPU_OPS
    return AMDGCN_OPS if target.backend == "hip" else SASS_OPS.get(target.name, SASS_OPS["cuda"])


_ATTENTION_DIVISIBLE = ("Q", "K", "V", "O", "LSE", "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss", "v_sb", "v_sh",
                        "v_ss", "o_sb", "o_sh", "o_ss", "SQ", "SKV")
_GEMM_DIVISIBLE = ("A", "B", "C", "M", "N", "K", "a_sb", "a_sm", "b_sb", "b_s0", "c_sb", "c_sm")


def _attention_types(io: torch.dtype, v: torch.dtype | None = None) -> dict[str, str]:
    """Argument types of the attention kernels' shared runtime arguments (`plans.attention_args`)."""
    p = POINTER_TYPE[io]
    return {"Q": p, "K": p, "V": POINTER_TYPE[v or io], "O": p, "LSE": "*fp32", "qk_scale": "fp32", "SINKS": "*fp32"}


@dataclass(frozen=True)
class KernelConfig:
    name: str
    fn: object  # a @triton.jit or @gluon.jit function
    arg_types: dict[str, str]  # argument -> triton type string; every other runtime argument is i32
    constexprs: dict[str, object]
    num_warps: int
    num_stages: int = 1
    gluon: bool = False
    spill_free: bool = True  # CI fails when a config marked spill-free spills
    max_stack: int | None = None  # where spills are tolerated, the most stack bytes CI lets through (None: any)
    # runtime arguments compiled as multiples of 16 (the common launch: aligned pointers, sizes and strides), as
    # Triton's launcher specializes them; the report is of that variant
    divisible: tuple[str, ...] = ()
    # the matrix instruction the compiled code must contain: "target" (the target's own), another name from
    # `ops_for(target)`, or None where the kernel has none (a merge step)
    matrix_op: str | None = "target"


@dataclass(frozen=True)
class Report:
    name: str
    target: str
    registers: int  # per thread (VGPRs on AMD)
    stack: int  # NVIDIA stack bytes; AMD private segment (scratch) bytes
    local: int  # NVIDIA local bytes; AMD VGPRs spilled to scratch (SGPR spills go to VGPR lanes, not memory)
    shared: int
    smem_limit: int
    sass: dict[str, int]  # instruction counts (`ops_for(target)`); named for the SASS it was first read from
    matrix_op: str | None
    spill_free_required: bool
    allocated: bool = True  # registers allocated at compile time (False for Intel: IGC does it at load time)
    stack_cap: int | None = None  # `KernelConfig.max_stack`

    @property
    def spills(self) -> bool:
        """Registers spilled and reloaded: local memory, or any local load. (A stack frame written but never read
        back is not a spill: on sm_120 in-kernel descriptors are staged through 8 bytes of stack with STL only.)
        Unknown, and reported as none, where registers are allocated at load time."""
        if not self.allocated:
            return False
        if self.sass.get("LDL") is None:  # AMD: scratch or VGPRs spilled to it
            return bool(self.stack or self.local)
        return bool(self.local or self.sass["LDL"])

    @property
    def fits(self) -> bool:
        return self.shared <= self.smem_limit

    @property
    def within_stack_cap(self) -> bool:
        return self.stack_cap is None or self.stack <= self.stack_cap

    @property
    def ok(self) -> bool:
        return (not (self.spill_free_required and self.spills) and self.within_stack_cap and self.fits
                and (self.matrix_op is None or self.sass.get(self.matrix_op, 0) > 0))

    def verdict(self) -> str:
        if self.ok:
            if not self.allocated:
                return "ok (registers at load)"
            return "ok (spills tolerated)" if self.spills else "ok"
        if not self.fits:
            return "SHARED MEMORY"
        if not self.within_stack_cap:
            return f"STACK > {self.stack_cap}"
        return "SPILLS" if self.spills else f"no {self.matrix_op}"


def portable_configs(target: Target) -> Iterator[KernelConfig]:
    from xkernels.portable import attention_fwd as attn
    from xkernels.portable import gemm
    from xkernels.portable.configs import attention_config, gemm_config, table_for
    from xkernels.recipes import ATTENTION_RECIPES
    from xkernels.validation import HEAD_DIMS

    for d in HEAD_DIMS:
        for recipe in ATTENTION_RECIPES.values():
            cfg = attention_config(d, recipe, target, interpret=False)
            # bf16 also with a causal sliding window and a soft cap (Gemma 2's): the band's masked loop, the tanh
            for causal, band in ((False, None), (True, None)) + ((True, WINDOW),) * (recipe.name == "bf16"):
                cap = SOFTCAP if band else 0.0
                yield KernelConfig(
                    f"portable.attention {recipe.name} D{d}{' causal' if causal else ''}{band or ''}"
                    f"{softcap_name(cap)}{' sinks' if band else ''} {cfg}",
                    attn.attention_fwd_kernel, _attention_types(recipe.io_dtype),
                    cfg.constexprs(d, recipe, causal=causal, write_lse=True, interpret=False, band=band, softcap=cap,
                                   sinks=band is not None),
                    cfg.num_warps, cfg.num_stages, divisible=_ATTENTION_DIVISIBLE,
                    spill_free=table_for(target).spill_free(
                        "attention_acc16" if recipe.pv_acc_dtype == torch.float16 else "attention", d))
    yield from _attention_varlen_configs(target)
    yield _cu_seqlens_check_config()
    yield from _attention_decode_configs(target)
    yield from _attention_bwd_configs(target)
    for dtype, out in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                       (torch.float16, torch.float32), (torch.bfloat16, torch.float32)):
        g = gemm_config(out, target, interpret=False)
        dt = SHORT_NAME[dtype]
        for lay in ("kn", "nk"):
            for walk in ("row", "grouped", "zorder"):
                yield KernelConfig(
                    f"portable.gemm {dt}->{SHORT_NAME[out]} {lay} {walk} {g}", gemm.gemm_kernel,
                    {"A": POINTER_TYPE[dtype], "B": POINTER_TYPE[dtype], "C": POINTER_TYPE[out]},
                    g.constexprs(lay, walk, interpret=False), g.num_warps, g.num_stages, divisible=_GEMM_DIVISIBLE,
                    spill_free=table_for(target).spill_free("gemm", out.itemsize))
    yield from _gemm_skinny_configs(target)


def _gemm_skinny_configs(target: Target) -> Iterator[KernelConfig]:
    """The few-row GEMM, bf16, at 1 and 32 rows (16- and 32-row tiles), one K slice and several (the arrival
    counter and the ordered sum), both B layouts; and the target's configs for more rows (`skinny_rows`,
    `skinny_wide_rows`) at 9 and 32.
    On sm_90 a 16-row tile takes mma.sync (wgmma needs 64 rows)."""
    from xkernels.portable import configs, gemm_skinny
    from xkernels.portable.configs import skinny_gemm_config, table_for

    p = POINTER_TYPE[torch.bfloat16]
    types = {"A": p, "B": p, "C": p, "PARTIALS": "*fp32", "ARRIVALS": "*i32"}
    divisible = ("A", "B", "C", "PARTIALS", "ARRIVALS", "N", "K", "a_sm", "b_s0", "c_sm", "k_slice")
    # the target's own configs against a K-split weight (`skinny_wide_rows` serves 1-8 rows too: BLOCK_M 16, the
    # program compiled here for 9 rows)
    table = table_for(target)
    more = [c for c in (table.skinny_rows, table.skinny_wide_rows) if c is not None]
    for cfg, m in [(skinny_gemm_config(target, interpret=False), m) for m in (1, configs.SKINNY_MAX_M)] + [
            (rows, m) for rows in more for m in (configs.SKINNY_FEW_ROWS + 1, configs.SKINNY_MAX_M)]:
        bm = gemm_skinny.block_m(m)
        matrix = "HMMA" if target.name == "sm_90" and bm < 64 else "target"
        for slices in (1, 4):
            for lay in ("kn", "nk"):
                yield KernelConfig(f"portable.gemm bf16 {lay} M{m} slices{slices} {cfg}",
                                   gemm_skinny.skinny_gemm_kernel, types,
                                   cfg.constexprs(bm, slices, lay, interpret=False), cfg.num_warps,
                                   cfg.num_stages, divisible=divisible, matrix_op=matrix,
                                   spill_free=table_for(target).spill_free("gemm_skinny", 2))


def _attention_varlen_configs(target: Target) -> Iterator[KernelConfig]:
    """The varlen forward per head dim and mask, bf16 (its tile loop is the dense kernel's, compiled for every
    recipe above)."""
    from xkernels.portable import attention_varlen as varlen
    from xkernels.portable.configs import attention_config, table_for
    from xkernels.recipes import ATTENTION_RECIPES
    from xkernels.validation import HEAD_DIMS

    recipe = ATTENTION_RECIPES["bf16"]
    types = _attention_types(recipe.io_dtype) | {"CU_Q": "*i32", "CU_K": "*i32"}
    divisible = ("Q", "K", "V", "O", "LSE", "CU_Q", "CU_K", "q_st", "q_sh", "k_st", "k_sh", "v_st", "v_sh", "o_st",
                 "o_sh")
    for d in HEAD_DIMS:
        cfg = attention_config(d, recipe, target, interpret=False)
        for causal, band in ((False, None), (True, None), (True, WINDOW)):
            cap = SOFTCAP if band else 0.0
            yield KernelConfig(f"portable.attention_varlen bf16 D{d}{' causal' if causal else ''}{band or ''}"
                               f"{softcap_name(cap)}{' sinks' if band else ''} {cfg}",
                               varlen.attention_varlen_kernel, types,
                               cfg.constexprs(d, recipe, causal=causal, write_lse=True, interpret=False, band=band,
                                              softcap=cap, sinks=band is not None),
                               cfg.num_warps, cfg.num_stages, divisible=divisible,
                               spill_free=table_for(target).spill_free("attention_varlen", d))


def _cu_seqlens_check_config() -> KernelConfig:
    """The packed batches' device check of cu_seqlens (the varlen forward's and backward's), with bf16 and fp32
    outputs to fill: no matrix instruction."""
    from xkernels.portable import cu_seqlens

    _, constexprs, options = cu_seqlens.launch_spec(2, ())
    p = POINTER_TYPE[torch.bfloat16]
    return KernelConfig("portable.cu_seqlens_check", cu_seqlens.cu_seqlens_check_kernel,
                        {"CU_Q": "*i32", "CU_K": "*i32", "CHECKED": "*i32", "F0": p, "F1": "*fp32", "F2": p},
                        constexprs, options["num_warps"], matrix_op=None)


def _attention_decode_configs(target: Target) -> Iterator[KernelConfig]:
    """The split-KV kernel per head dim, bf16, one decode row per query head of a GQA group of 4 (16-row tiles): the
    dense API's variant (one page per sequence, no split), the cache's (per-sequence lengths, causal, split) on
    pages of 16 and 64 keys, on a left-padded dense cache and with a sliding window; the merge of the splits and the
    cache append (each with its checks of the cache values). On sm_90 a 16-row tile takes mma.sync (wgmma needs 64)."""
    from xkernels.portable import attention_decode as dec
    from xkernels.portable import kv_cache as kv
    from xkernels.portable.configs import decode_config, table_for
    from xkernels.recipes import ATTENTION_RECIPES
    from xkernels.validation import HEAD_DIMS

    recipe = ATTENTION_RECIPES["bf16"]
    p = POINTER_TYPE[recipe.io_dtype]
    types = {"Q": p, "K": p, "V": p, "O": p, "LSE": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32",
             "SEQLENS": "*i32", "BLOCK_TABLE": "*i32", "KEY_START": "*i32", "ARRIVALS": "*i32", "qk_scale": "fp32",
             "SINKS": "*fp32"}
    divisible = ("Q", "K", "V", "O", "LSE", "O_PART", "LSE_PART", "SEQLENS", "BLOCK_TABLE", "KEY_START", "ARRIVALS",
                 "q_sb", "q_ss", "q_sh", "k_sp", "k_ss", "k_sh", "v_sp", "v_ss", "v_sh", "o_sb", "o_ss", "o_sh",
                 "bt_sb")
    matrix = "HMMA" if target.name == "sm_90" else "target"
    variants = ((0, False, False, False, False, False), (16, True, True, False, False, False),
                (64, False, True, False, False, False), (0, True, True, True, False, False),
                (16, True, True, False, True, False), (64, True, True, False, False, True))
    for d in HEAD_DIMS:
        shipped = decode_config(d, target, interpret=False)
        many = table_for(target).decode_many.get(d)  # calls over many (sequence, kv head) pairs: one split each
        for base, (page, causal, split, left, window, fused) in [(shipped, v) for v in variants] + [
                (many, (page, causal, False, left, window, False)) for page, causal, _, left, window, fused in variants
                if many is not None and not fused]:
            # `fused`: the opt-in variant whose last split merges the splits (DecodeConfig.fused_combine), a Hopper
            # candidate (on sm_89 / sm_120's 4-warp tiles its merge spills 8 bytes)
            if fused and target.name != "sm_90":
                continue
            cfg = dataclasses.replace(base, fused_combine=True) if fused else base
            # where the config reads a split's (or an unsplit call's) block ids before its key loop: the most ids
            # it reads so (the largest PAGE_IDS variant; smaller ones hold fewer ids)
            page_ids = cfg.page_ids(page, cfg.preload_ids * page)
            cx = cfg.constexprs(d, recipe, rows=4, page=page, seq_lengths=page > 0 or left, causal=causal,
                                bottom_right=True, write_lse=True, split=split, key_starts=left, windowed=window,
                                softcap=SOFTCAP if window else 0.0, sinks=window, page_ids=page_ids,
                                interpret=False)
            yield KernelConfig(f"portable.decode bf16 D{d} page{page}{' causal' if causal else ''}"
                               f"{' split' if split else ''}{' leftpad' if left else ''}"
                               f"{' window' + softcap_name(SOFTCAP) + ' sinks' if window else ''} {cfg}",
                               dec.attention_decode_kernel, types, cx,
                               cfg.num_warps, cfg.num_stages, divisible=divisible, matrix_op=matrix,
                               spill_free=table_for(target).spill_free("decode", d))
        # True: the combine as the split kernel's programmatic dependent (`DecodeConfig.pdl`, sm_90's default, whose
        # split rows above carry LAUNCH_DEPENDENTS)
        for wait in (False, True) if target.name == "sm_90" else (False,):
            yield KernelConfig(f"portable.decode.combine bf16 D{d}{' pdl' * wait}", dec.combine_kernel,
                               {"O_PART": "*fp32", "LSE_PART": "*fp32", "O": p, "LSE": "*fp32"},
                               dict(HEAD_DIM=d, CHUNK=16, WRITE_LSE=True, WAIT_PRIMARY=wait), 1, 1,
                               divisible=("O_PART", "LSE_PART", "O", "LSE"), matrix_op=None)
        # the cache append with its per-sequence checks, 8 kv heads on pages of 16
        tensors = ("K_NEW", "V_NEW", "K_CACHE", "V_CACHE", "SEQLENS", "BLOCK_TABLE", "LEFT_PAD")
        yield KernelConfig(f"portable.decode.append bf16 D{d} page16", kv.cache_append_kernel,
                           dict(zip(tensors, (p, p, p, p, "*i32", "*i32", "*i32"), strict=True)),
                           # head-dim strides of 1, as Triton specializes the usual contiguous rows
                           dict(kn_sd=1, vn_sd=1, kc_sd=1, vc_sd=1, HEAD_DIM=d, HEADS=8, PAGE=16,
                                LEFTPAD=False, CHUNK=16), 4, 1,
                           divisible=tensors + ("kn_sb", "kn_ss", "kn_sh", "vn_sb", "vn_ss", "vn_sh", "kc_sp",
                                                "kc_ss", "kc_sh", "vc_sp", "vc_ss", "vc_sh"), matrix_op=None)


_BWD_DIVISIBLE = ("Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "DQ", "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss",
                  "v_sb", "v_sh", "v_ss", "do_sb", "do_sh", "do_ss", "dk_sb", "dk_sh", "dk_ss", "dv_sb", "dv_sh",
                  "dv_ss", "dq_sb", "dq_sh", "dq_ss", "SQ", "SKV")


def _attention_bwd_configs(target: Target) -> Iterator[KernelConfig]:
    """The two backward kernels per head dim, mask and layout (dense, packed varlen), bf16 (fp16 differs only in the
    operand type)."""
    from xkernels.portable import attention_bwd as bwd
    from xkernels.portable.configs import attention_bwd_config, table_for
    from xkernels.validation import HEAD_DIMS

    p = POINTER_TYPE[torch.bfloat16]
    types = {"Q": p, "K": p, "V": p, "DO": p, "DK": p, "DV": p, "DQ": p, "LSE": "*fp32", "DELTA": "*fp32",
             "CU_Q": "*i32", "CU_K": "*i32", "scale": "fp32"}
    for d in HEAD_DIMS:
        cfg = attention_bwd_config(d, target, interpret=False)
        # and both layouts with a causal sliding window and a soft cap (the band's bounds and mask, the tanh)
        for causal, varlen, band in (*product((False, True), (False, True), (None,)), (True, False, WINDOW),
                                     (True, True, WINDOW)):
            cap = SOFTCAP if band else 0.0
            for name, fn, constexprs in (
                    ("dkdv", bwd.dkdv_kernel, cfg.dkdv_constexprs(d, causal=causal, varlen=varlen, interpret=False,
                                                                  band=band, softcap=cap)),
                    ("dq", bwd.dq_kernel, cfg.dq_constexprs(d, causal=causal, varlen=varlen, interpret=False,
                                                            band=band, softcap=cap))):
                mode = " causal" * causal + " varlen" * varlen + str(band or "") + softcap_name(cap)
                yield KernelConfig(f"portable.attention_bwd.{name} bf16 D{d}{mode} {cfg}", fn,
                                   types, constexprs, cfg.num_warps, cfg.num_stages,
                                   divisible=tuple(a for a in _BWD_DIVISIBLE if a in fn.arg_names),
                                   spill_free=table_for(target).spill_free(
                                       "attention_bwd_softcap" if cap else
                                       "attention_bwd_varlen" if varlen else "attention_bwd", d))


def hopper_configs() -> Iterator[KernelConfig]:
    from triton.experimental.gluon import language as gl

    from xkernels.common.runtime import TRITON_TESTED
    from xkernels.hopper import attention_fwd as attn
    from xkernels.hopper import gemm
    from xkernels.hopper.configs import (
        ATTENTION_CONFIGS,
        GEMM_CONFIG,
        MID_GEMM_CONFIG,
        NARROW_GEMM_CONFIG,
        PERSISTENT_ATTENTION_CONFIGS,
        ROWS3_GEMM_CONFIG,
        SMALL_GEMM_CONFIG,
        TINY_GEMM_CONFIG,
    )
    from xkernels.recipes import ATTENTION_RECIPES

    bf16io = ATTENTION_RECIPES["bf16io"]
    for d, ac in sorted(ATTENTION_CONFIGS.items()):
        # bf16io reading V converted to fp16 by a pass (its default from enough query rows per KV head:
        # `select.v_pass_pays`)
        for causal in (False, True):
            vp = dataclasses.replace(ac, v_pass=1)
            yield KernelConfig(f"hopper.attention bf16io D{d}{' causal' if causal else ''} {vp}",
                               attn.attention_fwd_kernel, _attention_types(torch.bfloat16, torch.float16),
                               attn.constexprs(vp, d, bf16io, causal=causal, positive_scale=True, write_lse=True), 4,
                               gluon=True)
        for recipe in ATTENTION_RECIPES.values():
            # bf16 also with a causal sliding window (at D64 its three consumer warpgroups of 128 registers keep the
            # band's bounds on 56 bytes of stack, outside the key loop) and with the window, attention sinks and a
            # soft cap
            # (causal, band, sinks, soft cap, positive scale)
            variants = [(False, None, False, 0.0, True), (True, None, False, 0.0, True)]
            if recipe.name != "bf16" and d == 128:  # the other producers and accumulators with all three
                variants.append((True, WINDOW, True, SOFTCAP, True))
            if recipe.name == "bf16":
                variants += [(True, WINDOW, False, 0.0, True), (True, WINDOW, True, SOFTCAP, True)]
                if d == 128:  # sinks alone, a cap on scores scaled first (a negative scale), non-causal windows
                    variants += [(True, None, True, 0.0, True), (True, None, False, SOFTCAP, False)]
                    variants += [(w.causal, w, False, 0.0, True) for w in SIDE_WINDOWS]
            for causal, band, sinks, cap, positive in variants:
                # spill-free on the releases it runs on; triton 3.9 (compiled, never run) reloads 16 bytes in
                # bf16io-acc16's causal D256 variant, and 16 (24 in the varlen kernel) in D256's window with sinks
                # and a cap
                untested_spill = d == 256 and ((recipe.converts_v and recipe.pv_acc_dtype == torch.float16 and causal)
                                               or bool(cap))
                yield KernelConfig(
                    f"hopper.attention {recipe.name} D{d}{' causal' if causal else ''}{band or ''}"
                    f"{' sinks' * sinks}{softcap_name(cap)}{'' if positive else ' any-scale'} {ac}",
                    attn.attention_fwd_kernel,
                    _attention_types(recipe.io_dtype, torch.float16 if recipe.converts_v else None),
                    attn.constexprs(ac, d, recipe, causal=causal, positive_scale=positive, write_lse=True, band=band,
                                    sinks=sinks, softcap=cap), 4,
                    gluon=True, spill_free=(TRITON_TESTED or not untested_spill) and not (band and d == 64))

    from xkernels.hopper import attention_persistent as persistent

    for d, ac in sorted(PERSISTENT_ATTENTION_CONFIGS.items()):
        # every recipe, and bf16io with V converted by a pass (`select.v_pass_pays`), on each walk the default
        # (config walk=2, `preferred_walk`) can pick for it: both at D64/D128; at D256 the L2-chunk walk where the
        # producer converts V, else the head-major one, and bf16 on the L2-chunk walk too (by override). The
        # one-loop consumer (config flat=2, `preferred_flat`: causal rows of up to 512 keys) for every recipe the rule
        # gives it (not where the producer converts V) on the walk the rule gives those rows (D128 head-major, D64
        # L2-chunk)
        both = (False, True)
        variants = []
        for recipe, c in [(r, ac) for r in ATTENTION_RECIPES.values()] + [(bf16io, dataclasses.replace(ac, v_pass=1))]:
            walks = (0, 1) if d <= 128 else (0 if c.converts_in_kernel(recipe) else 1,)
            variants += [(recipe, dataclasses.replace(c, walk=w, flat=0), both) for w in walks]
            if d <= 128 and not c.converts_in_kernel(recipe):
                variants.append((recipe, dataclasses.replace(c, walk=int(d == 128), flat=1), (True,)))
        if d > 128:
            variants.append((ATTENTION_RECIPES["bf16"], dataclasses.replace(ac, walk=0, flat=0), both))
        else:  # opt-in: the warpgroups' turns (`pingpong=1`), and the one-loop consumer on its other rows, bf16;
            # the one-loop consumer reloads 56 bytes at D128 on full rows (triton 3.7.1), none at D64
            variants += [(ATTENTION_RECIPES["bf16"], dataclasses.replace(ac, walk=w, flat=0, pingpong=1), both)
                         for w in (0, 1)]
            variants.append((ATTENTION_RECIPES["bf16"], dataclasses.replace(ac, walk=1 - int(d == 128), flat=1),
                             (True,)))
            variants += [(ATTENTION_RECIPES["bf16"], dataclasses.replace(ac, walk=w, flat=1), (False,)) for w in (0, 1)]
        for recipe, cfg, causals in variants:
            dt = "fp16" if recipe.io_dtype == torch.float16 else "bf16"
            gdt = gl.float16 if recipe.io_dtype == torch.float16 else gl.bfloat16
            for causal in causals:
                descs = {name: f"tensordesc<{dt}[{rows}, {d}],{gl.NVMMASharedLayout.get_default_for([rows, d], gdt)}>"
                         for name, rows in (("q_desc", 64), ("k_desc", ac.block_n), ("v_desc", ac.block_n),
                                            ("o_desc", 64))}
                if recipe.converts_v:  # bf16io: the V ring is typed fp16 (the producer converts the bf16 bits)
                    descs["v_desc"] = (f"tensordesc<fp16[{ac.block_n}, {d}],"
                                       f"{gl.NVMMASharedLayout.get_default_for([ac.block_n, d], gl.float16)}>")
                # causal variants other than D64 bf16/fp16 reload a few bytes from the stack: D128 tile-walk
                # scalars per tile (runs 29, 34: measured as they are), D256 once per tile in the epilogue; bf16io
                # D128 causal also one reload and store per key tile in the consumers' loop (measured with it:
                # 0.77-0.98x cuDNN at 512-2K against the dense kernel's 0.47-0.78, 2026-12-03/76); on untested
                # tritons (3.9) bf16io spills on full rows too
                yield KernelConfig(
                    f"hopper.attention persistent {recipe.name} D{d}{' causal' if causal else ''} {cfg}",
                    persistent.attention_persistent_kernel, descs | {"LSE": "*fp32", "O": f"*{dt}", "qk_scale": "fp32"},
                    cfg.constexprs(d, recipe, causal=causal, positive_scale=True, write_lse=True, persistent=True), 4,
                    gluon=True, spill_free=(not causal or (d == 64 and not cfg.converts_in_kernel(recipe)))
                    and (TRITON_TESTED or not cfg.converts_in_kernel(recipe)) and not (cfg.flat and d == 128))

    from xkernels.hopper import attention_varlen as hvarlen

    divisible = ("Q", "K", "V", "O", "LSE", "CU_Q", "CU_K", "q_st", "q_sh", "k_st", "k_sh", "v_st", "v_sh",
                 "o_st", "o_sh")
    vp = dataclasses.replace(ATTENTION_CONFIGS[128], v_pass=1)  # opt-in: bf16io reading V converted by a pass
    for causal in (False, True):
        _, constexprs, _ = hvarlen.launch_spec(1, 1, 1, 128, is_causal=causal, recipe=bf16io, positive_scale=True,
                                               write_lse=True, cfg=vp)
        yield KernelConfig(f"hopper.attention_varlen bf16io D128{' causal' if causal else ''} {vp}",
                           hvarlen.attention_varlen_kernel,
                           _attention_types(torch.bfloat16, torch.float16) | {"CU_Q": "*i32", "CU_K": "*i32"},
                           constexprs, 4, gluon=True, divisible=divisible)
    for d, ac in sorted(ATTENTION_CONFIGS.items()):
        for recipe in ATTENTION_RECIPES.values():
            # bf16 also with a causal sliding window (the dense kernel's band, bottom-right)
            for causal, band, sinks in ((False, None, False), (True, None, False)) + (
                    ((True, WINDOW, False), (True, WINDOW, True)) if recipe.name == "bf16" else ()) + (
                    ((SIDE_WINDOWS[0].causal, SIDE_WINDOWS[0], False),) if recipe.name == "bf16" and d == 128
                    else ()):
                types = _attention_types(recipe.io_dtype, torch.float16 if recipe.converts_v else None) | {
                    "CU_Q": "*i32", "CU_K": "*i32"}
                # spill-free on the releases it runs on; triton 3.9 (compiled, never run) reloads 8 bytes in the
                # bf16io D128 variants and 24 in D256's window with sinks and a cap
                cap = SOFTCAP if sinks else 0.0
                _, constexprs, _ = hvarlen.launch_spec(1, 1, 1, d, is_causal=causal, recipe=recipe,
                                                       positive_scale=True, write_lse=True, cfg=ac, band=band,
                                                       sinks=sinks, softcap=cap)
                yield KernelConfig(
                    f"hopper.attention_varlen {recipe.name} D{d}{' causal' if causal else ''}{band or ''}"
                    f"{' sinks' * sinks}{softcap_name(cap)} {ac}",
                    hvarlen.attention_varlen_kernel, types, constexprs, 4, gluon=True, divisible=divisible,
                    spill_free=(TRITON_TESTED or not ((recipe.converts_v and d == 128) or (d == 256 and cap)))
                    and not (band and d == 64))

    from xkernels.hopper import attention_varlen_persistent as hvp

    for d, pc in sorted(PERSISTENT_ATTENTION_CONFIGS.items()):
        # bf16io only with V converted by a pass (`hopper:v_pass=1`); D256 has no chained tiles. Every recipe on
        # the walks its default takes (`packed_walk`: full rows on both, by the group; causal on the L2-chunk
        # walk), and bf16 causal on the head-major walk too (by override, `walk=1`)
        variants = []
        for recipe, ac in ([(r, pc) for r in ATTENTION_RECIPES.values()]
                           + [(bf16io, dataclasses.replace(pc, v_pass=1))]):
            if not (ac.converts_in_kernel(recipe) or d > 128):
                variants += [(recipe, dataclasses.replace(ac, walk=w), c)
                             for w, c in ((0, False), (0, True), (1, False))]
        if d <= 128:
            variants.append((ATTENTION_RECIPES["bf16"], dataclasses.replace(pc, walk=1), True))
        for recipe, ac, causal in variants:
            dt = "fp16" if recipe.io_dtype == torch.float16 else "bf16"
            gdt = gl.float16 if recipe.io_dtype == torch.float16 else gl.bfloat16
            descs = {name: f"tensordesc<{dt}[{rows}, {d}],{gl.NVMMASharedLayout.get_default_for([rows, d], gdt)}>"
                     for name, rows in (("q_desc", 64), ("k_desc", ac.block_n), ("v_desc", ac.block_n),
                                        ("o_desc", 64))}
            if recipe.converts_v:  # V converted to fp16 by the pass
                descs["v_desc"] = (f"tensordesc<fp16[{ac.block_n}, {d}],"
                                   f"{gl.NVMMASharedLayout.get_default_for([ac.block_n, d], gl.float16)}>")
            _, _, constexprs, _ = hvp.launch_spec(1, 1, 1, d, 1, is_causal=causal, recipe=recipe,
                                                  positive_scale=True, write_lse=True, cfg=ac, group=1)
            if constexprs["WALK"]:  # causal: the pairs the walk deals past one round (`packed_pairs_pay`)
                constexprs = constexprs | {"PAIRS": causal}
            # D128 reloads 8-40 bytes of per-tile scalars (sequence bounds) at tile boundaries, none inside the
            # key loop (triton 3.9, compiled, never run: 136-344 bytes); on 3.9 every D64 variant reloads 8-16
            # (the L2-chunk walk's full rows since O leaves by TMA store for the blocks inside a sequence); D64
            # causal on the L2-chunk walk keeps one lane index (8 bytes) on the stack, reloaded once a tile, since
            # masks take one bound a row (benchmarks/results/h100/2026-12-06/12-varlen-default: 1.63x padded
            # cuDNN, where it measured 1.59-1.62 before)
            yield KernelConfig(
                f"hopper.attention_varlen persistent {recipe.name} D{d}{' causal' if causal else ''} {ac}",
                hvp.attention_varlen_persistent_kernel,
                descs | {"O": f"*{dt}", "LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32", "UNITS": "*i32",
                         "qk_scale": "fp32"},
                constexprs, 4, gluon=True,
                spill_free=d != 128 and TRITON_TESTED and not (causal and constexprs["WALK"] == 0),
                divisible=("O", "LSE", "CU_Q", "CU_K", "UNITS", "o_st", "o_sh", "lse_sh", "q_rh", "q_ch", "kv_rh",
                           "kv_ch", "o_rh", "o_ch"))
    from xkernels.common import tile_scheduler

    for pairs in (False, True):  # the head-major walk's unit counts per sequence: no matrix instruction
        yield KernelConfig(f"hopper.attention_varlen persistent unit counts{' (causal pairs)' * pairs}",
                           tile_scheduler.packed_units_kernel, {"CU_Q": "*i32", "UNITS": "*i32"},
                           dict(BLOCK_M=128, PAIRS=pairs, BLOCK=tile_scheduler.PACKED_UNITS_BLOCK), 4, matrix_op=None)

    from xkernels.hopper import attention_bwd as bwd
    from xkernels.hopper.configs import ATTENTION_BWD_CONFIGS, FUSED_BWD_CONFIGS

    for d, bc in sorted(ATTENTION_BWD_CONFIGS.items()):
        for dt, gdt in (("fp16", gl.float16), ("bf16", gl.bfloat16)):
            descs = {name: f"tensordesc<{dt}[{rows}, {d}],{gl.NVMMASharedLayout.get_default_for([rows, d], gdt)}>"
                     for name, rows in (("q_desc", bc.block_m), ("k_desc", bc.block_n), ("v_desc", bc.block_n),
                                        ("do_desc", bc.block_m))}
            types = descs | {"LSE": "*fp32", "DELTA": "*fp32", "DK": f"*{dt}", "DV": f"*{dt}", "qk_scale": "fp32",
                             "scale": "fp32", "dq_desc": descs["q_desc"], "CU_Q": "*i32", "CU_K": "*i32"}
            def fused_types(box, types=types):  # the fp32 dQ buffer's: [BLOCK_M, D / 2] boxes, or [BLOCK_M, D]
                return types | {"dq_desc": f"tensordesc<fp32[{box[0]}, {box[1]}],"
                                           f"{gl.NVMMASharedLayout.get_default_for(box, gl.float32)}>"}
            half = fused_types([bc.block_m, d // 2])
            # the fused-dQ variants walk their queries as the head dim's fused default does (D64 with mask_split)
            fused_ms = FUSED_BWD_CONFIGS[d].mask_split if d in FUSED_BWD_CONFIGS else 0
            variants = [(bc, types)] + ([] if bc.split_d else [
                (dataclasses.replace(bc, fused_dq=n, mask_split=fused_ms), half) for n in (1, 2)])
            if d == 64:  # K and V as the register operands of S^T and dP^T (opt-in on the split path and with
                # dQ's halves: `scripts/bwd_ab.py`), and with the warpgroups taking turns at the whole dQ partial
                # (`FUSED_BWD_CONFIGS[64]`, D64's fused default)
                variants += [(dataclasses.replace(bc, kv_regs=1), types),
                             (dataclasses.replace(bc, fused_dq=1, kv_regs=1), half),
                             (dataclasses.replace(bc, fused_dq=3, kv_regs=1), fused_types([bc.block_m, d]))]
            if d in FUSED_BWD_CONFIGS:  # the shipped fused-dQ config, whatever the lines above derived
                fused_default = FUSED_BWD_CONFIGS[d]
                variants += [(fused_default, fused_types([bc.block_m, d if fused_default.fused_dq == 3 else d // 2]))]
            if dt == "bf16":  # the other query walk (`mask_split` flipped: every step masked at D64 and D128,
                # the unmasked steps in a loop of their own at D256; reported, not gated)
                variants += [(dataclasses.replace(bc, mask_split=1 - bc.mask_split), types)]
            unique = {}
            for variant in variants:
                unique.setdefault(variant[0], variant)
            variants = list(unique.values())
            variants.append((bc, types, True))  # the packed batches' variant
            for fused, cfg_types, *packed in variants:
                varlen = bool(packed)
                # the unfused variants also with a causal sliding window (the band's query bounds and lower mask)
                # (a window masks every step: the flipped walk compiles to the same program there)
                same_walk = fused.mask_split == bc.mask_split
                bands = ((True, WINDOW),) * (not fused.fused_dq and same_walk) + (
                    tuple((w.causal, w) for w in SIDE_WINDOWS) if d == 128 and dt == "bf16" and not fused.fused_dq
                    and not varlen and same_walk else ())
                # full rows twice on the dense layout: a key tail (masked steps) and whole key blocks (the one
                # unmasked loop of `even_keys`, opt-in: compiled for every config, gated with it)
                evens = ((False, None, True),) * (not varlen)
                for causal, band, *even in ((False, None), *evens, (True, None)) + bands:
                    fused_ek = dataclasses.replace(fused, even_keys=1) if even else fused
                    # spill-free on the releases it runs on; triton 3.9 (compiled, never run) reloads 56 bytes at
                    # D128 causal and 13-40 in D64's kv_regs variants (causal, and fused_dq=3). Spills: the fused-dQ
                    # variants but D64's default (D128's: 16-32 bytes kept across its query loop; at most one value
                    # reloaded per step), D128's two-loop walk (mask_split: 32-48 bytes of loop scalars, two
                    # reloads a step from L1; packed 40-96; measured 2-4 % faster on causal rows all the same), and
                    # the D128 band (24-32 bytes: the causal window's four values stored before the query loop,
                    # reloaded after it)
                    mode = " causal" * causal + " varlen" * varlen + str(band or "")
                    yield KernelConfig(f"hopper.attention_bwd.dkdv {dt} D{d}{mode} {fused_ek}",
                                       bwd.attention_dkdv_kernel, cfg_types,
                                       fused_ek.constexprs(d, causal=causal, varlen=varlen, band=band,
                                                           whole_key_blocks=bool(even)), 4,
                                       gluon=True, spill_free=(not fused.fused_dq or (
                                           d == 64 and fused == FUSED_BWD_CONFIGS[64] and TRITON_TESTED))
                                       and fused.mask_split == ATTENTION_BWD_CONFIGS[d].mask_split
                                       and not (d == 128 and (fused.mask_split or band))
                                       and not (d == 128 and causal and varlen)
                                       and (TRITON_TESTED or not ((d == 128 or fused.kv_regs) and causal)),
                                       # where D128 spills on a tested release: at most this much stack (measured
                                       # 8-64 bytes dense, 40-96 packed)
                                       max_stack=(128 if varlen else 64) if d == 128 and TRITON_TESTED else None)

    from xkernels.hopper import attention_dq as dq
    from xkernels.hopper.configs import ATTENTION_DQ_CONFIGS

    for d, qc in sorted(ATTENTION_DQ_CONFIGS.items()):
        for dt, gdt in (("fp16", gl.float16), ("bf16", gl.bfloat16)):
            descs = {name: f"tensordesc<{dt}[{rows}, {d}],{gl.NVMMASharedLayout.get_default_for([rows, d], gdt)}>"
                     for name, rows in (("q_desc", 64), ("k_desc", qc.block_n), ("v_desc", qc.block_n),
                                        ("do_desc", 64))}
            types = descs | {"LSE": "*fp32", "DELTA": "*fp32", "DQ": f"*{dt}", "qk_scale": "fp32", "scale": "fp32",
                             "CU_Q": "*i32", "CU_K": "*i32"}
            sides = tuple((w.causal, False, w) for w in SIDE_WINDOWS) if d == 128 and dt == "bf16" else ()
            for causal, varlen, band in (*product((False, True), (False, True), (None,)), (True, False, WINDOW),
                                         (True, True, WINDOW), *sides):
                mode = f"{' causal' * causal}{' varlen' * varlen}{band or ''}"
                yield KernelConfig(f"hopper.attention_bwd.dq {dt} D{d}{mode} {qc}", dq.attention_dq_kernel, types,
                                   qc.constexprs(d, causal=causal, varlen=varlen, band=band), 4, gluon=True)

    split = dataclasses.replace(SMALL_GEMM_CONFIG, split_k=2)  # the split-K epilogue (any split count compiles alike)
    pingpong = dataclasses.replace(SMALL_GEMM_CONFIG, consumers=2)  # opt-in (`hopper:consumers=2`)
    every_walk = ("row", "grouped", "zorder")
    for c, walks in ((GEMM_CONFIG, every_walk), (MID_GEMM_CONFIG, every_walk), (SMALL_GEMM_CONFIG, every_walk),
                     (TINY_GEMM_CONFIG, every_walk), (NARROW_GEMM_CONFIG, every_walk), (split, ("grouped",)),
                     (pingpong, ("grouped",)), (dataclasses.replace(split, consumers=2), ("grouped",)),
                     (ROWS3_GEMM_CONFIG, every_walk)):
        for (dt, gdt), lay, walk in product((("fp16", gl.float16), ("bf16", gl.bfloat16)), ("kn", "nk"), walks):
            descs = {name: f"tensordesc<{dt}[{shape[0]}, {shape[1]}],"
                           f"{gl.NVMMASharedLayout.get_default_for(shape, gdt)}>"
                     for name, shape in zip(("a_desc", "b_desc", "c_desc"), c.blocks(lay), strict=True)}
            yield KernelConfig(f"hopper.gemm {dt} {lay} {walk} {c}", gemm.persistent_gemm_kernel,
                               descs | {"WS": "*fp32", "CNT": "*i32"}, c.constexprs(lay, walk), c.num_warps,
                               gluon=True)


def all_configs(target: Target = TARGETS["sm_90"]) -> Iterator[KernelConfig]:
    """Every config shipped for `target`: the portable ones the target's config tables pick, and on sm_90 the Gluon
    ones (on the triton releases in `runtime.GLUON_COMPILES`)."""
    from xkernels.common.runtime import GLUON_COMPILED

    yield from portable_configs(target)
    if GLUON_COMPILED and target.name == "sm_90":
        yield from hopper_configs()


def compile_config(cfg: KernelConfig, target: Target = TARGETS["sm_90"]):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if cfg.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    sig = {name: "constexpr" if name in cfg.constexprs else cfg.arg_types.get(name, "i32")
           for name in cfg.fn.arg_names}
    attrs = {(cfg.fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in cfg.divisible}
    src = ASTSource(cfg.fn, sig, constexprs=cfg.constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget(*target.gpu_target),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _matrix_op(cfg: KernelConfig, target: Target) -> str | None:
    return target.matrix_op if cfg.matrix_op == "target" else cfg.matrix_op


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def analyse(cfg: KernelConfig, target: Target = TARGETS["sm_90"]) -> Report:
    if target.backend == "xpu":
        os.environ.setdefault("CC", "g++")  # the Intel backend compiles a SYCL (C++) helper with $CC on first use
    compiled = compile_config(cfg, target)
    if target.backend == "xpu":
        llir = compiled.asm["llir"]
        counts = {op: len(re.findall(rx, llir)) for op, rx in XPU_OPS.items()}
        return Report(cfg.name, target.name, 0, 0, 0, int(compiled.metadata.shared), target.smem, counts,
                      _matrix_op(cfg, target), cfg.spill_free, allocated=False, stack_cap=cfg.max_stack)
    if target.backend == "hip":
        asm = compiled.asm["amdgcn"]
        meta = dict(re.findall(r"^\s*\.(vgpr_count|vgpr_spill_count|private_segment_fixed_size):"
                               r"\s*(\d+)", asm, re.M))
        counts = {op: len(re.findall(rx, asm)) for op, rx in AMDGCN_OPS.items()}
        spills = int(meta.get("vgpr_spill_count", 0))
        return Report(cfg.name, target.name, int(meta.get("vgpr_count", 0)),
                      int(meta.get("private_segment_fixed_size", 0)), spills, int(compiled.metadata.shared),
                      target.smem, counts, _matrix_op(cfg, target), cfg.spill_free, stack_cap=cfg.max_stack)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
    counts = {op: len(re.findall(rx, sass)) for op, rx in ops_for(target).items()}
    return Report(cfg.name, target.name, int(usage.get("REG", 0)), int(usage.get("STACK", 0)),
                  int(usage.get("LOCAL", 0)), int(compiled.metadata.shared), target.smem, counts,
                  _matrix_op(cfg, target), cfg.spill_free, stack_cap=cfg.max_stack)
