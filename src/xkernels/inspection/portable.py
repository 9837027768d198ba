"""The portable (plain `tl`) kernels' shipped configs per target, as the target's config tables pick them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from itertools import product

import torch

from xkernels.common.dtypes import POINTER_TYPE, SHORT_NAME
from xkernels.common.targets import Target
from xkernels.inspection.report import KernelConfig
from xkernels.inspection.variants import (
    ATTENTION_DIVISIBLE,
    GEMM_DIVISIBLE,
    SOFTCAP,
    WINDOW,
    attention_types,
)
from xkernels.portable.softmax import softcap_name


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
                    attn.attention_fwd_kernel, attention_types(recipe.io_dtype),
                    cfg.constexprs(d, recipe, causal=causal, write_lse=True, interpret=False, band=band, softcap=cap,
                                   sinks=band is not None),
                    cfg.num_warps, cfg.num_stages, divisible=ATTENTION_DIVISIBLE,
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
                    g.constexprs(lay, walk, interpret=False), g.num_warps, g.num_stages, divisible=GEMM_DIVISIBLE,
                    spill_free=table_for(target).spill_free("gemm", out.itemsize))
    yield from _gemm_skinny_configs(target)


def _gemm_skinny_configs(target: Target) -> Iterator[KernelConfig]:
    """The few-row GEMM, bf16, at 1 and 32 rows (16- and 32-row tiles), one K slice and several (the arrival
    counter and the ordered sum), both B layouts; and the target's configs for more rows (`skinny_rows`,
    `skinny_wide_rows`) at 9 and 32.
    On sm_90 a 16-row tile takes mma.sync (wgmma needs 64 rows); with `swap` (opt-in, compiled for sm_90's
    configs of 64 columns or more) the weight's columns are the product's rows, and a wgmma takes it."""
    from xkernels.portable import configs, gemm_skinny
    from xkernels.portable.configs import skinny_gemm_config, table_for

    p = POINTER_TYPE[torch.bfloat16]
    types = {"A": p, "B": p, "C": p, "PARTIALS": "*fp32", "ARRIVALS": "*i32"}
    divisible = ("A", "B", "C", "PARTIALS", "ARRIVALS", "N", "K", "a_sm", "b_s0", "c_sm", "k_slice")
    # the target's own configs against a K-split weight (`skinny_wide_rows` serves 1-8 rows too: BLOCK_M 16, the
    # program compiled here for 9 rows)
    table = table_for(target)
    more = [c for c in (table.skinny_rows, table.skinny_wide_rows) if c is not None]
    variants = [(skinny_gemm_config(target, interpret=False), m) for m in (1, configs.SKINNY_MAX_M)] + [
        (rows, m) for rows in more for m in (configs.SKINNY_FEW_ROWS + 1, configs.SKINNY_MAX_M)]
    if target.name == "sm_90":
        variants += [(dataclasses.replace(cfg, swap=True), m) for cfg, m in variants if cfg.block_n >= 64]
    for cfg, m in variants:
        bm = gemm_skinny.block_m(m)
        matrix = "HMMA" if target.name == "sm_90" and bm < 64 and not cfg.swap else "target"
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
    types = attention_types(recipe.io_dtype) | {"CU_Q": "*i32", "CU_K": "*i32"}
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


