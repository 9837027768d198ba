"""Problem cases shared by `xkernels check` and `xkernels bench`: shape, FLOPs, inputs and the correctness check."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

import xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing.inputs import attention_inputs, gemm_inputs
from xkernels.testing.metrics import Comparison, compare_attention, compare_gemm, compare_grad, compare_lse
from xkernels.testing.reference import (
    reference_attention,
    reference_attention_grads,
    reference_attention_varlen,
    reference_attention_varlen_grads,
    reference_lse,
    reference_matmul,
    visible,
)
from xkernels.validation import NO_WINDOW

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _forced(backend: str | None) -> str:
    return f" [{backend}]" if backend else ""


# a case's name for `deterministic`: the default (None) unnamed
_DETERMINISM = {None: "", True: " deterministic", False: " nondeterministic"}


def _k(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


@dataclass(frozen=True)
class AttentionCase:
    b: int
    hq: int
    hkv: int
    sq: int
    skv: int
    d: int
    causal: bool
    recipe: str
    backend: str | None = None  # e.g. "portable", "hopper:stages=3" (xkernels.select); None: the default choice
    window: tuple[int, int] = NO_WINDOW  # window_size (left, right), top-left as the causal mask
    softcap: float = 0.0  # the scores' soft cap (Gemma 2's); 0: none
    sinks: bool = False  # attention sinks (gpt-oss's): a logit per query head, the inputs' last tensor
    # `xkernels.attention`'s deterministic: None its default (torch's switch), False lets the backward fuse dQ
    deterministic: bool | None = None

    @property
    def shape(self) -> str:
        heads = f"H{self.hq}" if self.hq == self.hkv else f"H{self.hq}/{self.hkv}"
        window = f" window {self.window[0]},{self.window[1]}" if self.window != NO_WINDOW else ""
        extra = (f"{f' softcap {self.softcap:g}' if self.softcap else ''}{' sinks' if self.sinks else ''}"
                 f"{_DETERMINISM[self.deterministic]}")
        return (f"B{self.b} {heads} {_k(self.sq)}x{_k(self.skv)} D{self.d}{' causal' if self.causal else ''}"
                f"{window}{extra}{_forced(self.backend)}")

    @property
    def _extra(self) -> dict:
        """The reference's soft cap and window arguments."""
        return dict(is_causal=self.causal, window=self.window, softcap=self.softcap)

    @property
    def flops(self) -> int:
        """4 * D per attended (query, key) pair; causal and a window count only the pairs their top-left masks
        keep."""
        if self.window != NO_WINDOW:
            left, right = self.window
            right = 0 if self.causal else right
            pairs = sum(max(min(self.skv - 1, i + right if right >= 0 else self.skv) - max(0, i - left if left >= 0
                                                                                            else 0) + 1, 0)
                        for i in range(self.sq))
        elif self.causal:
            n = min(self.sq, self.skv)
            pairs = n * (n + 1) // 2 + max(self.sq - self.skv, 0) * self.skv
        else:
            pairs = self.sq * self.skv
        return 4 * self.d * pairs * self.b * self.hq

    def mask(self, device) -> torch.Tensor:
        """The (Sq, Skv) boolean mask of the call's causal mask and window (what an SDPA peer is given)."""
        return visible(self.sq, self.skv, is_causal=self.causal, window=self.window, device=device)

    @property
    def nbytes(self) -> int:
        return 2 * self.d * self.b * (2 * self.hq * self.sq + 2 * self.hkv * self.skv)

    def inputs(self, device: str, seed: int = 0):
        """(q, k, v), and with sinks their (Hq,) fp32 logits. The uniform inputs' scaled scores have a standard
        deviation of ~1/12 at any head dim: with a soft cap q is scaled to make it a quarter of the cap (the tails
        reach the cap, so the cap bends them and the check sees a wrong one). Sinks are drawn around the rows' own
        LSEs (the log of the keys a row sees, its window's at most)."""
        dtype = ATTENTION_RECIPES[self.recipe].io_dtype
        q, k, v = attention_inputs(self.b, self.hq, self.sq, self.skv, self.d, dtype, device, hkv=self.hkv, seed=seed)
        if self.softcap:
            q = (q.float() * (3 * self.softcap)).to(dtype)
        if not self.sinks:
            return q, k, v
        keys = self.skv if self.window[0] < 0 else min(self.skv, self.window[0] + 1)
        g = torch.Generator().manual_seed(seed + 7)
        return q, k, v, (torch.rand(self.hq, generator=g) * 4 + math.log(keys) - 2).to(device)

    def _sinks(self, inputs):
        return inputs[3] if self.sinks else None

    def run(self, inputs, out: torch.Tensor | None = None, return_lse: bool = False):
        q, k, v = inputs[:3]
        return xkernels.attention(q, k, v, is_causal=self.causal, enable_gqa=self.hq != self.hkv,
                                  precision=self.recipe, out=out, return_lse=return_lse, backend=self.backend,
                                  window_size=self.window, softcap=self.softcap, sinks=self._sinks(inputs),
                                  deterministic=self.deterministic)

    def check(self, inputs) -> Comparison:
        """Run on a NaN-poisoned output and compare O and the LSE with their float64 references."""
        q, k, v = inputs[:3]
        out, lse = self.run(inputs, out=torch.full_like(q, float("nan")), return_lse=True)
        ref = self._extra | dict(sinks=self._sinks(inputs))
        c = compare_attention(out, reference_attention(q, k, v, **ref), ATTENTION_RECIPES[self.recipe])
        ref_lse = reference_lse(q, k, **ref)
        seen = ~torch.isinf(ref_lse)
        c_lse = compare_lse(lse[seen], ref_lse[seen])
        if not torch.equal(torch.isinf(lse), ~seen):
            c_lse = dataclasses.replace(c_lse, passed=False, reason="-inf where a row sees a key, or not where none")
        return c if c_lse.passed else dataclasses.replace(c, passed=False, reason=f"lse: {c_lse.reason}")


def _grad_out(like: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator(device=like.device).manual_seed(seed + 1000)
    return (torch.rand(like.shape, generator=g, device=like.device) - 0.5).to(like.dtype)


def _worst(grads, refs, recipe_name: str) -> Comparison:
    """Every gradient against its float64 reference; the worst of the three is reported, with every failure."""
    recipe = ATTENTION_RECIPES[recipe_name]
    results = [(n, compare_grad(g, r, recipe)) for n, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True)]
    failed = [f"{n}: {c.reason}" for n, c in results if not c.passed]
    worst = max((c for _, c in results), key=lambda c: c.rel_rms)
    return dataclasses.replace(worst, passed=not failed, reason="; ".join(failed) or "ok")


class _GradStep:
    """What a gradient case adds to its forward case: the backward ("bwd": dQ, dK, dV from a saved forward, as
    `torch.autograd.grad(O, (q, k, v), dO)`) or a training step ("fwd+bwd"). FLOPs: the backward's five matmuls are
    2.5x the forward's two (masked work left out alike). Subclasses give `forward(inputs) -> (O, fresh leaves)` and
    `references(inputs)`; inputs end with dO."""

    step: str

    @property
    def shape(self) -> str:
        return f"{super().shape} {self.step}"

    @property
    def flops(self) -> int:
        return int(super().flops * (2.5 if self.step == "bwd" else 3.5))

    @property
    def nbytes(self) -> int:
        return 2 * super().nbytes  # q, k, v, O (the forward's) and dO, dQ, dK, dV

    def forward_case(self):
        """The forward case this gradient case extends (its fields without `step`)."""
        base = next(c for c in type(self).__mro__[1:] if c is not _GradStep and dataclasses.is_dataclass(c))
        return base(**{f.name: getattr(self, f.name) for f in dataclasses.fields(base)})

    def prepare(self, inputs):
        """What a timed call starts from: for "bwd" the forward already run (its graph kept for every call)."""
        if self.step != "bwd":
            return inputs
        o, leaves = self.forward(inputs)
        return o, leaves, inputs[-1]

    def run(self, inputs, out: torch.Tensor | None = None, return_lse: bool = False):
        """inputs: the case's inputs, or for "bwd" the prepared (O, leaves, dO) of `prepare`."""
        if self.step == "bwd":
            o, leaves, do = inputs
            return torch.autograd.grad(o, leaves, do, retain_graph=True)
        o, leaves = self.forward(inputs)
        return torch.autograd.grad(o, leaves, inputs[-1])

    def check(self, inputs) -> Comparison:
        """A training step's dQ, dK, dV (a sinks' gradient aside) against float64: the exact gradient of the
        backward given the forward's O as it read it (`reference_attention_grads`' `out`), so rows whose exact dQ
        cancels are not measured on O's bf16 rounding, which does not shrink with the sequence length as the floor
        of the row bound does (benchmarks/results/h200/2026-12-02/46-varlen-dq-worst-rows)."""
        forward = self.forward_case().check(inputs[:-1])  # the O that the references take, against float64 first
        o, leaves = self.forward(inputs)
        grads = torch.autograd.grad(o, leaves, inputs[-1])
        c = _worst(grads[:3], self.references(inputs, out=o.detach()), self.recipe)
        if forward.passed:
            return c
        return dataclasses.replace(c, passed=False, reason=f"forward: {forward.reason}; {c.reason}")


@dataclass(frozen=True)
class AttentionGradCase(_GradStep, AttentionCase):
    """`AttentionCase`'s backward or training step; inputs (q, k, v, dO)."""

    step: str = "bwd"

    def inputs(self, device: str, seed: int = 0):
        """(q, k, v, [sinks,] dO)."""
        forward = super().inputs(device, seed)
        return (*forward, _grad_out(forward[0], seed))

    def forward(self, inputs):
        """(O, leaves) with fresh leaves (q, k, v, and the sinks where the case has them), so each call's graph is
        its own."""
        leaves = tuple(t.detach().requires_grad_() for t in inputs[:-1])
        return AttentionCase.run(self, leaves), leaves

    def references(self, inputs, out=None):
        """dQ, dK, dV (the sinks' gradient is the op's own pass, not the kernels'); `out`: the forward's O."""
        q, k, v = inputs[:3]
        return reference_attention_grads(q, k, v, inputs[-1], **self._extra, sinks=self._sinks(inputs),
                                         out=out)[:3]


@dataclass(frozen=True)
class DecodeCase:
    """Decode against a KV cache of `s` keys per sequence: `sq` query rows (1: one decode step) per (sequence, head),
    every key visible. `cache`: "dense-api" (`xkernels.attention` on (B, H, S, D) tensors), "dense"
    (`attention_with_kvcache` on a (B, S, Hkv, D) cache) or "paged<N>" (pages of N keys in shuffled blocks). The
    figure of merit is bandwidth: K and V bytes read once per call."""

    b: int
    hq: int
    hkv: int
    s: int
    d: int
    recipe: str = "bf16"
    cache: str = "dense-api"
    sq: int = 1
    backend: str | None = None
    sync_checks: bool = True  # cache calls: read the cache checks' flag on the host (False: checks stay on device)
    window: int = -1  # cache calls with one query row: a sliding window of this many keys before it (-1: none)

    def __post_init__(self):
        if self.window >= 0 and (self.cache == "dense-api" or self.sq != 1):
            raise ValueError("window: cache calls with one query row only (the peer reads the window's keys)")

    @property
    def keys(self) -> int:
        """Keys a call reads: the cache, or the window and the query's own key."""
        return self.s if self.window < 0 else min(self.s, self.window + 1)

    @property
    def shape(self) -> str:
        nosync = "" if self.sync_checks or self.cache == "dense-api" else " nosync"
        window = f" window {_k(self.window)}" if self.window >= 0 else ""
        return (f"B{self.b} H{self.hq}/{self.hkv} {self.sq}x{_k(self.s)} D{self.d} {self.cache}{nosync}{window}"
                f"{_forced(self.backend)}")

    @property
    def flops(self) -> int:
        return 4 * self.d * self.sq * self.keys * self.b * self.hq

    @property
    def bytes_read(self) -> int:
        """K and V of the keys read, each byte once: the decode floor."""
        return 2 * 2 * self.b * self.hkv * self.keys * self.d

    @property
    def nbytes(self) -> int:
        return self.bytes_read + 2 * 2 * self.b * self.hq * self.sq * self.d

    @property
    def page(self) -> int:
        return int(self.cache[5:]) if self.cache.startswith("paged") else 0

    def inputs(self, device: str, seed: int = 0):
        """(q, k, v, block_table or None): q, k, v as `run` passes them."""
        dtype = ATTENTION_RECIPES[self.recipe].io_dtype
        q, k, v = attention_inputs(self.b, self.hq, self.sq, self.s, self.d, dtype, device, hkv=self.hkv, seed=seed)
        if self.cache == "dense-api":
            return q, k, v, None
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # (B, S, H, D)
        if not self.page:
            return q, k, v, None
        per_seq = -(-self.s // self.page)
        pad = per_seq * self.page - self.s
        g = torch.Generator().manual_seed(seed)
        table = torch.randperm(self.b * per_seq, generator=g).view(self.b, per_seq).to(torch.int32).to(device)
        paged = []
        for t in (k, v):
            t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)).view(self.b, per_seq, self.page, self.hkv, self.d)
            blocks = torch.empty((self.b * per_seq, self.page, self.hkv, self.d), dtype=t.dtype, device=device)
            blocks[table.long()] = t
            paged.append(blocks)
        return q, paged[0], paged[1], table

    def dense(self, inputs):
        """The same problem as (B, H, S, D) q, k, v for SDPA and the reference (a window's keys only)."""
        q, k, v, table = inputs
        if self.cache == "dense-api":
            return q, k, v
        if table is not None:
            k, v = (t[table.long()].flatten(1, 2)[:, :self.s] for t in (k, v))
        k, v = k[:, self.s - self.keys:self.s], v[:, self.s - self.keys:self.s]
        return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))

    def run(self, inputs, out: torch.Tensor | None = None, return_lse: bool = False):
        q, k, v, table = inputs
        if self.cache == "dense-api":
            return xkernels.attention(q, k, v, enable_gqa=self.hq != self.hkv, precision=self.recipe,
                                      return_lse=return_lse, backend=self.backend)
        lengths = torch.full((self.b,), self.s, dtype=torch.int32, device=q.device)
        return xkernels.attention_with_kvcache(q, k, v, cache_seqlens=lengths, block_table=table, is_causal=False,
                                               precision=self.recipe, return_lse=return_lse,
                                               sync_checks=self.sync_checks,
                                               window_size=(self.window, 0) if self.window >= 0 else (-1, -1),
                                               backend=self.backend)

    def check(self, inputs) -> Comparison:
        q, k, v = self.dense(inputs)
        out, lse = self.run(inputs, return_lse=True)
        if self.cache != "dense-api":
            out = out.transpose(1, 2)
        c = compare_attention(out, reference_attention(q, k, v), ATTENTION_RECIPES[self.recipe])
        c_lse = compare_lse(lse, reference_lse(q, k))
        return c if c_lse.passed else dataclasses.replace(c, passed=False, reason=f"lse: {c_lse.reason}")


def _pad(t: torch.Tensor, cu: torch.Tensor, longest: int) -> torch.Tensor:
    """Packed (total, H, D) rows as (n, H, longest, D), zero past each sequence's end."""
    x = torch.zeros((cu.shape[0] - 1, longest, *t.shape[1:]), dtype=t.dtype, device=t.device)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        x[i, :b - a] = t[a:b]
    return x.transpose(1, 2).contiguous()


@dataclass(frozen=True)
class VarlenCase:
    """A packed batch (`xkernels.attention_varlen`): `n` sequences of lengths drawn uniformly from [lo, hi] (seeded,
    so every run packs the same batch), Hq / Hkv heads, self-attention. FLOPs count useful work only: 4 * D * (pairs
    attended) summed over the sequences."""

    n: int
    lo: int
    hi: int
    hq: int
    hkv: int
    d: int
    causal: bool
    recipe: str = "bf16"
    backend: str | None = None
    seed: int = 0

    @property
    def lengths(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(self.lo, self.hi + 1, (self.n,), generator=g).tolist()

    @property
    def shape(self) -> str:
        heads = f"H{self.hq}" if self.hq == self.hkv else f"H{self.hq}/{self.hkv}"
        return (f"{self.n} seqs {self.lo}-{self.hi} (total {sum(self.lengths)}) {heads} D{self.d}"
                f"{' causal' if self.causal else ''}{_forced(self.backend)}")

    @property
    def flops(self) -> int:
        pairs = sum(n * (n + 1) // 2 if self.causal else n * n for n in self.lengths)
        return 4 * self.d * self.hq * pairs

    @property
    def nbytes(self) -> int:
        return 2 * self.d * sum(self.lengths) * (2 * self.hq + 2 * self.hkv)

    def inputs(self, device: str, seed: int = 0):
        """(q, k, v, cu_seqlens, max_seqlen): q (total, Hq, D), k and v (total, Hkv, D)."""
        total = sum(self.lengths)
        dtype = ATTENTION_RECIPES[self.recipe].io_dtype
        q, k, v = attention_inputs(1, self.hq, total, total, self.d, dtype, device, hkv=self.hkv, seed=seed)
        q, k, v = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        cu = torch.tensor([0, *torch.tensor(self.lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        return q, k, v, cu, max(self.lengths)

    def padded(self, inputs):
        """The batch padded to its longest sequence, (n, H, max, D) each: what a caller without varlen runs."""
        q, k, v, cu, longest = inputs[:5]
        return tuple(_pad(t, cu, longest) for t in (q, k, v))

    def run(self, inputs, out: torch.Tensor | None = None, return_lse: bool = False):
        q, k, v, cu, longest = inputs
        return xkernels.attention_varlen(q, k, v, cu, cu, longest, longest, is_causal=self.causal,
                                         precision=self.recipe, return_lse=return_lse, backend=self.backend)

    def check(self, inputs) -> Comparison:
        q, k, v, cu, _ = inputs
        out, lse = self.run(inputs, return_lse=True)
        ref_o, ref_lse = reference_attention_varlen(q, k, v, cu, cu, is_causal=self.causal)
        c = compare_attention(out, ref_o, ATTENTION_RECIPES[self.recipe])
        c_lse = compare_lse(lse, ref_lse)
        return c if c_lse.passed else dataclasses.replace(c, passed=False, reason=f"lse: {c_lse.reason}")


@dataclass(frozen=True)
class VarlenGradCase(_GradStep, VarlenCase):
    """`VarlenCase`'s backward or training step; inputs (q, k, v, cu_seqlens, max_seqlen, dO)."""

    step: str = "bwd"

    def inputs(self, device: str, seed: int = 0):
        q, k, v, cu, longest = super().inputs(device, seed)
        return q, k, v, cu, longest, _grad_out(q, seed)

    def padded(self, inputs):
        """(q, k, v, dO) padded to the longest sequence (dO zero on the padding, so no gradient comes from it)."""
        return (*super().padded(inputs), _pad(inputs[5], inputs[3], inputs[4]))

    def forward(self, inputs):
        q, k, v, cu, longest, _ = inputs
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        return VarlenCase.run(self, (*leaves, cu, longest)), leaves

    def references(self, inputs, out=None):
        q, k, v, cu, _, do = inputs
        return reference_attention_varlen_grads(q, k, v, do, cu, cu, is_causal=self.causal, out=out)


@dataclass(frozen=True)
class GemmCase:
    m: int
    n: int
    k: int
    dtype: str
    b_layout: str = "kn"
    walk: str = "auto"
    backend: str | None = None  # e.g. "portable", "hopper:stages=4" (xkernels.select); None: the default choice

    @property
    def recipe(self) -> str:
        return self.dtype

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k} {self.b_layout} {self.walk}{_forced(self.backend)}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def nbytes(self) -> int:
        return 2 * (self.m * self.k + self.k * self.n + self.m * self.n)

    def inputs(self, device: str, seed: int = 0):
        return gemm_inputs(self.m, self.n, self.k, DTYPES[self.dtype], device, self.b_layout, seed=seed)

    def run(self, inputs, out: torch.Tensor | None = None) -> torch.Tensor:
        a, b = inputs
        return xkernels.matmul(a, b, b_layout=self.b_layout, walk=self.walk, out=out, backend=self.backend)

    def check(self, inputs) -> Comparison:
        a, b = inputs
        out = self.run(inputs, out=torch.full((self.m, self.n), float("nan"), dtype=a.dtype, device=a.device))
        return compare_gemm(out, reference_matmul(a, b, self.b_layout), self.k)


Case = AttentionCase | AttentionGradCase | DecodeCase | VarlenCase | VarlenGradCase | GemmCase


def kernel_name(case: Case) -> str:
    if isinstance(case, DecodeCase):
        return "decode"
    if isinstance(case, VarlenGradCase):
        return "varlen-" + case.step
    if isinstance(case, VarlenCase):
        return "varlen"
    if isinstance(case, AttentionGradCase):
        return "attention-" + case.step
    return "attention" if isinstance(case, AttentionCase) else "gemm"


def threshold(case: Case) -> str:
    if isinstance(case, AttentionGradCase | VarlenGradCase):
        r = ATTENTION_RECIPES[case.recipe]
        return f"grad rms<{r.grad_rel_rms:g} row<{r.grad_row_rel:g}"
    if isinstance(case, AttentionCase | DecodeCase | VarlenCase):
        r = ATTENTION_RECIPES[case.recipe]
        return f"rms<{r.rel_rms:g} max<{r.max_abs_diff:g}"
    return "rms<5e-3 elem<5%"
