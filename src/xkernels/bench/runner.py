"""Run bench rows with the seeds' method: check at the bench shape first (a FAIL is not timed), then time ours and
every peer on the same rotating input sets."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from xkernels.bench.ceilings import Ceilings
from xkernels.bench.peers import peers_for
from xkernels.bench.timing import Timing, rotation_count, time_rounds
from xkernels.testing.cases import Case, kernel_name

OURS = "xkernels"  # ours' name among a row's timed functions
ROUNDS = 3  # interleaved timing rounds per row


@dataclass
class Row:
    kernel: str
    recipe: str
    shape: str
    flops: int
    check: dict
    backend: str | None = None
    ours: Timing | None = None
    peers: dict[str, Timing | str] = field(default_factory=dict)  # a peer that cannot run gets its error text
    bytes_read: int = 0  # memory-bound rows (decode): their figure of merit is bytes_read / time

    @property
    def passed(self) -> bool:
        return bool(self.check["passed"])

    def tflops(self, t: Timing | str | None) -> float | None:
        return t.tflops(self.flops) if isinstance(t, Timing) else None

    def tbps(self, t: Timing | str | None) -> float | None:
        return self.bytes_read / t.median_ms / 1e9 if isinstance(t, Timing) and self.bytes_read else None

    def speedup(self, peer: str) -> float | None:
        """ours / peer in throughput (peer time / our time): > 1 means ours is faster."""
        p = self.peers.get(peer)
        return p.median_ms / self.ours.median_ms if isinstance(p, Timing) and self.ours else None

    def best_peer(self) -> str | None:
        timed = {n: t for n, t in self.peers.items() if isinstance(t, Timing)}
        return min(timed, key=lambda n: timed[n].median_ms) if timed else None

    def as_dict(self, ceilings: Ceilings) -> dict:
        ours = self.tflops(self.ours)
        best = self.best_peer()
        return {
            "kernel": self.kernel, "recipe": self.recipe, "shape": self.shape, "flops": self.flops,
            "backend": self.backend, "check": self.check,
            "ours": self.ours.__dict__ if self.ours else None, "ours_tflops": ours, "bytes_read": self.bytes_read,
            "ours_tbps": self.tbps(self.ours),
            "pct_copy_ceiling": 100 * self.tbps(self.ours) / ceilings.copy_tbps if self.tbps(self.ours) else None,
            "pct_datasheet": 100 * ours / ceilings.datasheet_tflops if ours and ceilings.datasheet_tflops else None,
            "pct_matmul_ceiling": 100 * ours / ceilings.matmul_tflops if ours else None,
            "peers": {n: (t.__dict__ | {"tflops": self.tflops(t), "tbps": self.tbps(t)} if isinstance(t, Timing)
                          else {"error": t})
                      for n, t in self.peers.items()},
            "speedup": {n: self.speedup(n) for n in self.peers},
            "best_peer": best, "speedup_vs_best": self.speedup(best) if best else None,
        }


def rotated_inputs(case: Case, first: object) -> list:
    """`first` and more input sets of `case`, enough to span 4x the L2 (`timing.rotation_count`): calls cycling
    through them read their operands from HBM, as a model's layers do."""
    return [first] + [case.inputs("cuda", seed=i) for i in range(1, rotation_count(case.nbytes))]


def run_case(case: Case, *, timed: bool, warmup: int, iters: int, sleep_s: float) -> Row:
    import xkernels

    first = case.inputs("cuda", seed=0)
    try:
        check = case.check(first).row()
    except Exception as e:  # e.g. a forced config that cannot compile or launch here: a failed row, not a lost bench
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        check = {"passed": False, "reason": reason, "rel_rms": float("nan")}
    row = Row(kernel_name(case), case.recipe, case.shape, case.flops, check, xkernels.last_backend(),
              bytes_read=getattr(case, "bytes_read", 0))
    if not (timed and row.passed):
        return row
    sets = rotated_inputs(case, first)
    prepare = getattr(case, "prepare", None)  # a backward row times the backward of a forward run beforehand
    runs = {OURS: (case.run, [prepare(s) for s in sets] if prepare else sets, contextlib.nullcontext)}
    errors: dict[str, str] = {}
    peers = peers_for(case)
    for peer in peers:
        try:
            runs[peer.name] = (peer.fn, [peer.prepare(s) for s in sets], peer.context)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:  # e.g. a peer that cannot take these inputs
            errors[peer.name] = str(e).splitlines()[0][:160]
    if sleep_s:
        time.sleep(sleep_s)  # the seeds' pre-sleep: start each row's timings from a settled GPU
    # ours and the peers in interleaved rounds (`timing.time_rounds`): a row's ratio does not depend on who ran first
    timed = time_rounds(runs, rounds=ROUNDS, warmup=warmup, iters=iters)
    ours = timed.pop(OURS)
    if not isinstance(ours, Timing):
        raise RuntimeError(f"{row.kernel} {row.shape}: ours failed to run after passing its check: {ours}")
    row.ours = ours
    row.peers.update({peer.name: timed.get(peer.name) or errors[peer.name] for peer in peers})
    del sets
    torch.cuda.empty_cache()
    return row
