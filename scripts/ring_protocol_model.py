"""A CPU model of the Hopper GEMM's ring protocol with two consumer partitions (ping-pong): one loader and two
consumers under random interleavings, mbarriers modelled by their phase parity (`try_wait.parity`), the stage
positions computed with the kernel's formulas (`hopper/gemm.py`), and every stage checked against the position it
holds when it is waited on and when it is released (a wgmma reads its stage until it retires). Each partition is one
agent: in the kernel every single-thread arrive follows a barrier of the partition's own threads. Without the
consumers' turns the second consumer waits for stages two laps ahead of the loader and reads an older lap's data;
with them every schedule completes and reads right.

    python scripts/ring_protocol_model.py
"""

from __future__ import annotations

import random


class Barrier:
    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, 0, 0

    def arrive(self) -> None:
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phase = 0, self.phase + 1

    def passed(self, parity: int) -> bool:  # the phase of this parity has completed
        return (self.phase & 1) != parity


def run(unit_steps: list[int], stages: int, seed: int, turns_on: bool = True) -> None:
    rnd = random.Random(seed)
    ready = [Barrier(1) for _ in range(stages)]
    empty = [Barrier(1) for _ in range(stages)]
    turns = [Barrier(1), Barrier(1)]
    holds: list[object] = [None] * stages

    def loader():
        it = 0
        for steps in unit_steps:
            for _ in range(steps):
                s = it % stages
                while not empty[s].passed(((it // stages) & 1) ^ 1):
                    yield
                holds[s] = "loading"
                yield
                holds[s] = it
                ready[s].arrive()
                it += 1

    def consumer(c: int):
        it = 0
        for n, steps in enumerate(unit_steps):
            if n % 2 == c:
                if turns_on and n > 0:
                    while not turns[c].passed(((n - 1) // 2) & 1):
                        yield
                for j in range(steps):
                    s = (it + j) % stages
                    while not ready[s].passed(((it + j) // stages) & 1):
                        yield
                    assert holds[s] == it + j, f"consumer {c} waited on stage {s} for {it + j}: {holds[s]}"
                    yield  # the wgmma of k-step j is issued; the one before it retires
                    if j > 0:
                        release(it + j + stages - 1, it + j - 1, c)
                    yield
                if turns_on:
                    turns[1 - c].arrive()
                yield
                release(it + steps + stages - 1, it + steps - 1, c)
                yield
            it += steps

    def release(at: int, wanted: int, c: int) -> None:
        """The kernel's `a.release(at)`: arrive on stage at % STAGES, which must still hold k-step `wanted`."""
        s = at % stages
        assert holds[s] == wanted, f"consumer {c} released stage {s} for {wanted}: it holds {holds[s]}"
        empty[s].arrive()

    alive = [loader(), consumer(0), consumer(1)]
    for _ in range(200_000):
        if not alive:
            return
        agent = rnd.choice(alive)
        try:
            next(agent)
        except StopIteration:
            alive.remove(agent)
    raise RuntimeError("deadlock")


def main() -> None:
    cases = 0
    for stages in (2, 3, 4, 8):
        for seed in range(60):
            rnd = random.Random(seed)
            run([rnd.choice([1, 2, 3, 5, 8, 16, 17, 24]) for _ in range(rnd.randint(0, 8))], stages, seed)
            cases += 1
    print(f"with turns: {cases} random schedules complete, every read right")
    broken = 0
    for seed in range(40):
        try:
            run([16, 16, 16], 8, seed, turns_on=False)
        except (AssertionError, RuntimeError):
            broken += 1
    print(f"without turns: {broken} of 40 schedules read a wrong stage or deadlock")
    assert broken > 0


if __name__ == "__main__":
    main()
