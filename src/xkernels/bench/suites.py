"""The benchmark suites: the seeds' tables plus the LLM and Hopper-relevant shapes."""

from __future__ import annotations

import dataclasses

from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing.cases import (
    AttentionCase,
    AttentionGradCase,
    Case,
    DecodeCase,
    GemmCase,
    VarlenCase,
    VarlenGradCase,
)

WALKS = ("row", "grouped", "zorder")
LLM_NK = ((4096, 4096), (14336, 4096), (4096, 14336))


def gemm_suite(quick: bool) -> tuple[list[Case], list[Case]]:
    """(gate, timed): the seeds check M=N=K=256 before any timing."""
    dtypes = ("fp16", "bf16")
    gate: list[Case] = [GemmCase(256, 256, 256, dt, lay) for dt in dtypes for lay in ("kn", "nk")]
    if quick:
        timed: list[Case] = [GemmCase(4096, 4096, 4096, dt, lay, "grouped") for dt in dtypes for lay in ("kn", "nk")]
        timed += [GemmCase(8192, 8192, 8192, "bf16", "kn", "grouped"), GemmCase(8192, 14336, 4096, "bf16"),
                  GemmCase(8192, 8192, 8192, "bf16", "kn", "grouped", "portable")]
        return gate, timed
    timed = [GemmCase(n, n, n, dt, lay, w)
             for dt in dtypes for n in (4096, 8192) for lay in ("kn", "nk") for w in WALKS]
    timed += [GemmCase(8192, n, k, dt) for dt in dtypes for n, k in LLM_NK]
    timed += [GemmCase(8192, 8192, 8192, dt, lay, "grouped", "portable") for dt in dtypes for lay in ("kn", "nk")]
    return gate, timed + (gemm_ablation() if hopper_here() else [])


def gemm_ablation() -> list[Case]:
    """Stage count x k-tile of the Hopper GEMM's ring (the default, BK64 x 3 stages, is the plain 8192^3 row)."""
    return [GemmCase(8192, 8192, 8192, "bf16", "kn", "grouped", f"hopper:block_k={bk},stages={s}")
            for bk, s in ((64, 2), (32, 3), (32, 4), (32, 6))]


def attention_suite(quick: bool) -> list[Case]:
    """Full: default dispatch (the Hopper kernel on an H100/H200) on the issue's rows in every recipe, the portable
    kernel on two of them, and the Hopper kernel's ablation rows. Quick: five rows, default dispatch."""
    recipes = list(ATTENTION_RECIPES)
    if quick:
        cases: list[Case] = [AttentionCase(1, 32, 32, 8192, 8192, 128, False, r) for r in recipes]
        return cases + [AttentionCase(1, 32, 32, 8192, 8192, 128, True, "bf16"),
                        AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16")]
    seeds = [(8192, 8192), (8192, 16384), (16384, 16384)]  # the seeds' table: B1 H32 D128 non-causal
    cases = [AttentionCase(1, 32, 32, sq, skv, 128, False, r) for sq, skv in seeds for r in recipes]
    extra = [AttentionCase(1, 32, 32, 8192, 8192, 128, True, ""), AttentionCase(4, 32, 32, 4096, 4096, 64, False, ""),
             AttentionCase(1, 16, 16, 8192, 8192, 256, False, ""), AttentionCase(1, 16, 16, 8192, 8192, 256, True, ""),
             AttentionCase(1, 32, 8, 8192, 8192, 128, False, "")]
    for e in extra:
        cases += [AttentionCase(e.b, e.hq, e.hkv, e.sq, e.skv, e.d, e.causal, r) for r in recipes]
    cases += [AttentionCase(1, 32, 32, 8192, 8192, 128, False, "bf16", "portable"),
              AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16", "portable")]
    return cases + (attention_ablation() if hopper_here() else [])


def hopper_here() -> bool:
    """Whether this process's current device runs the Hopper kernels (their forced ablation rows need it)."""
    import torch

    from xkernels.common.runtime import hopper_available

    return torch.cuda.is_available() and hopper_available(torch.device("cuda", torch.cuda.current_device()))


def attention_ablation() -> list[Case]:
    """The shipped Hopper attention config with one switch changed (a trick off, a ring resized, an experiment on):
    on B1 H32 8K D128 (bf16, and bf16io with a third stage) and B4 H32 4K D64."""
    rows = [AttentionCase(1, 32, 32, 8192, 8192, 128, False, "bf16", f"hopper:{v}") for v in ("overlap=0", "stages=3")]
    rows.append(AttentionCase(1, 32, 32, 8192, 8192, 128, False, "bf16io", "hopper:stages=3"))
    d64 = ("consumers=2", "overlap=1")  # D64 ships 3 consumers, the window closed
    return rows + [AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16", f"hopper:{v}") for v in d64]


# The backward anchors measured on the H200 (bf16): (B, H, S, D, causal)
BWD_ROWS = ((1, 32, 8192, 128, False), (1, 32, 8192, 128, True), (4, 32, 4096, 64, False), (1, 16, 8192, 256, False),
            (2, 16, 4096, 128, True))


def attention_bwd_suite(quick: bool) -> list[Case]:
    """The backward ("bwd") on the anchor rows, bf16, and a training step ("fwd+bwd") on two of them, with the
    API's default `deterministic` (None: torch's switch, off in the bench: the fused-dQ backward where it pays),
    each also with deterministic=True (the split backward, bitwise repeatable) in the full suite; fp16 and GQA
    rows there too, among them a causal GQA call with too few dK/dV programs for the SMs (B1 H16/4 4K D128, a 0.85B
    Llama's layer: the group split's case, `select.group_parts`), backward and training step."""
    rows = BWD_ROWS[:2] if quick else BWD_ROWS
    modes = (None,) if quick else (None, True)
    cases: list[Case] = [AttentionGradCase(b, h, h, s, s, d, c, "bf16", step="bwd", deterministic=m)
                         for b, h, s, d, c in rows for m in modes if m is None or d != 256]
    cases += [AttentionGradCase(b, h, h, s, s, d, c, "bf16", step="fwd+bwd", deterministic=m)
              for b, h, s, d, c in rows[:2] for m in modes]
    if not quick:
        cases += [AttentionGradCase(1, 32, 32, 8192, 8192, 128, False, "fp16", step="bwd"),
                  AttentionGradCase(1, 32, 8, 8192, 8192, 128, True, "bf16", step="bwd")]
        cases += [AttentionGradCase(1, 16, 4, 4096, 4096, 128, True, "bf16", step=step) for step in ("bwd", "fwd+bwd")]
    return cases


# The decode anchors (bf16, D128, one query row per sequence): (B, Hq, Hkv, cache length)
DECODE_ROWS = ((8, 32, 8, 8192), (64, 32, 8, 4096), (1, 32, 8, 131072), (16, 64, 8, 32768))


def decode_suite(quick: bool) -> list[Case]:
    """Each anchor through the dense API and a dense cache, the cache call also with `sync_checks=False` (its checks
    stay on the device: no host read per call); paged caches (16 and 64 keys a page) in the full suite, speculative
    decoding (4 query rows), and sliding windows of 4K keys over long caches."""
    caches = ("dense-api", "dense") if quick else ("dense-api", "dense", "paged16", "paged64")
    cases: list[Case] = []
    for b, hq, hkv, s in DECODE_ROWS:
        cases += [DecodeCase(b, hq, hkv, s, 128, cache=c) for c in caches]
        cases += [DecodeCase(b, hq, hkv, s, 128, cache=c, sync_checks=False) for c in caches if c != "dense-api"]
    if not quick:
        cases += [DecodeCase(8, 32, 8, 8192, 128, cache="paged64", sq=4), DecodeCase(8, 32, 8, 8192, 64),
                  DecodeCase(8, 32, 8, 8192, 256)]
        # sliding windows: a 4K window over 32K and 128K caches reads what a 4K cache does (SDPA: the window's keys);
        # unsynchronized, as an inference engine calls it (a synchronized call's host read dwarfs a 4K window)
        cases += [DecodeCase(16, 64, 8, 32768, 128, cache=c, window=4096, sync_checks=False)
                  for c in ("dense", "paged64")]
        cases += [DecodeCase(1, 32, 8, 131072, 128, cache="dense", window=4096, sync_checks=False)]
    return cases


def window_suite(quick: bool) -> list[Case]:
    """Causal sliding windows (bf16): Mistral-7B's (H32/8 D128, 4K keys) on 16K tokens, forward, backward and a
    training step, with the same call unwindowed beside it (what the band saves) and, on Hopper, the portable
    kernels' band on the same call (what the Gluon band wins); in the full suite Gemma-2's D256 layer (H16/8, 4K
    window, 8K tokens), a D64 4K window on 16K tokens and a 1K window on 4K tokens; on Hopper also Gemma 2's soft
    cap and gpt-oss's sinks (its 128-key windows, its full layers) on the Gluon forward (the default) and the
    portable kernels, peerless (SDPA has neither). The SDPA peers take the window as a boolean mask (no SDPA
    backend has a window; flash_attn's window_size where it is installed)."""
    mistral = dict(b=1, hq=32, hkv=8, sq=16384, skv=16384, d=128, causal=True, recipe="bf16")
    windowed = [AttentionCase(**mistral, window=(4095, 0))]
    if not quick:
        windowed += [AttentionCase(1, 16, 8, 8192, 8192, 256, True, "bf16", window=(4095, 0)),
                     AttentionCase(1, 32, 8, 16384, 16384, 64, True, "bf16", window=(4095, 0)),
                     AttentionCase(4, 32, 8, 4096, 4096, 128, True, "bf16", window=(1023, 0))]
    cases: list[Case] = []
    for case in windowed:  # on Hopper each windowed forward beside the portable band's on the same call
        cases += [case] + [dataclasses.replace(case, backend="portable")] * hopper_here()
    cases.append(AttentionCase(**mistral))
    if hopper_here():  # the Gluon forward's soft cap (Gemma 2) and sinks (gpt-oss) beside the portable kernels'
        capped = [AttentionCase(1, 16, 8, 8192, 8192, 256, True, "bf16", window=(4095, 0), softcap=50.0),
                  AttentionCase(1, 64, 8, 16384, 16384, 64, True, "bf16", window=(127, 0), sinks=True),
                  AttentionCase(1, 64, 8, 8192, 8192, 64, True, "bf16", sinks=True)]
        cases += [c for case in capped for c in (case, dataclasses.replace(case, backend="portable"))]
    # the backward alone (and on Hopper the portable band's beside it), then the training step, windowed and not
    bwd = AttentionGradCase(**mistral, window=(4095, 0))
    cases += [bwd] + [dataclasses.replace(bwd, backend="portable")] * hopper_here()
    cases.append(AttentionGradCase(**mistral, window=(4095, 0), step="fwd+bwd"))
    if not quick:
        cases += [AttentionGradCase(**mistral, step="fwd+bwd")]
    return cases


def varlen_suite(quick: bool) -> list[Case]:
    """The packed-batch anchor (32 sequences of 256-4096 tokens, H32 D128, bf16), full and causal, each followed by
    the dense kernel on one sequence of the batch's mean length (the TFLOP/s the packed call should keep); GQA and
    D64 in the full suite; then the anchor's training step (causal in the quick suite; the backward alone and the
    full rows too in the full one) against padded SDPA."""
    packed = [VarlenCase(32, 256, 4096, 32, 32, 128, c) for c in (False, True)]
    if not quick:
        packed += [VarlenCase(32, 256, 4096, 32, 8, 128, True), VarlenCase(32, 256, 4096, 32, 32, 64, False)]
    cases: list[Case] = []
    for v in packed:
        mean = sum(v.lengths) // v.n
        cases += [v, AttentionCase(1, v.hq, v.hkv, mean, mean, v.d, v.causal, v.recipe)]
    steps = [("fwd+bwd", True)] if quick else [(s, c) for c in (False, True) for s in ("bwd", "fwd+bwd")]
    cases += [VarlenGradCase(32, 256, 4096, 32, 32, 128, c, step=s) for s, c in steps]
    return cases
