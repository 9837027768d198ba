"""The Hopper (Gluon) kernels' shipped configs for sm_90, with the opt-in variants the overrides reach."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from itertools import product

import torch

from xkernels.inspection.report import KernelConfig
from xkernels.inspection.variants import SIDE_WINDOWS, SOFTCAP, WINDOW, attention_types
from xkernels.portable.softmax import softcap_name


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
                               attn.attention_fwd_kernel, attention_types(torch.bfloat16, torch.float16),
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
                    attention_types(recipe.io_dtype, torch.float16 if recipe.converts_v else None),
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
                           attention_types(torch.bfloat16, torch.float16) | {"CU_Q": "*i32", "CU_K": "*i32"},
                           constexprs, 4, gluon=True, divisible=divisible)
    for d, ac in sorted(ATTENTION_CONFIGS.items()):
        for recipe in ATTENTION_RECIPES.values():
            # bf16 also with a causal sliding window (the dense kernel's band, bottom-right)
            for causal, band, sinks in ((False, None, False), (True, None, False)) + (
                    ((True, WINDOW, False), (True, WINDOW, True)) if recipe.name == "bf16" else ()) + (
                    ((SIDE_WINDOWS[0].causal, SIDE_WINDOWS[0], False),) if recipe.name == "bf16" and d == 128
                    else ()):
                types = attention_types(recipe.io_dtype, torch.float16 if recipe.converts_v else None) | {
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
                             "scale": "fp32", "dq_desc": descs["q_desc"], "CU_Q": "*i32", "CU_K": "*i32",
                             "WS": "*fp32", "CNT": "*i32"}
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
                fused_box = fused_types([bc.block_m, d if fused_default.fused_dq == 3 else d // 2])
                variants += [(fused_default, fused_box)]
                if d == 128 and dt == "bf16":  # opt-in `rotate` (its dense full walk only: compiled there)
                    variants += [(dataclasses.replace(fused_default, rotate=1), fused_box)]
            if not bc.split_d:  # a causal call's group in parts (`select.group_parts`; dense causal calls only)
                variants += [(dataclasses.replace(bc, group_parts=2), types)]
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
                    if fused.rotate and (causal or even):  # (ROTATE is off there: the fused default's program)
                        continue
                    if fused.group_parts > 1 and (varlen or not causal or band is not None):
                        continue
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


