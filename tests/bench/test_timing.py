"""`bench.timing.interleaved_graph_ms` without a GPU: `graph_ms` stubbed to record the call order."""

from xkernels.bench import timing


def test_interleaved_rounds_shuffle_the_order_and_keep_medians(monkeypatch):
    calls = []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0]), "c": iter([7.0, 9.0, 8.0]),
             "d": iter([1.0, 1.0, 1.0])}

    def fake_graph_ms(fn):
        name = fn()
        calls.append(name)
        return next(times[name])

    monkeypatch.setattr(timing, "graph_ms", fake_graph_ms)
    fns = {name: (lambda n=name: n) for name in times}
    med = timing.interleaved_graph_ms(fns, rounds=3, seed=1)
    assert med == {"a": 2.0, "b": 5.0, "c": 8.0, "d": 1.0}
    rounds = [calls[i:i + 4] for i in range(0, 12, 4)]
    assert all(sorted(r) == sorted(fns) for r in rounds)  # every function once per round
    assert len({tuple(r) for r in rounds}) > 1, "the order changes between rounds"


def test_time_rounds_pools_interleaved_runs_and_keeps_a_failure(monkeypatch):
    """`time_rounds`: every function once per round in a changing order, inside its own context, each round
    iters / rounds runs; a function's Timing over all its runs; one that raises RuntimeError keeps its error text
    and is not called again."""
    import contextlib

    calls, entered = [], []
    per_round = {"ours": [1.0, 3.0], "peer": [4.0, 6.0]}

    def fake_samples(fn, sets, *, warmup, iters):
        name = fn(sets[0])
        calls.append((name, iters, warmup))
        return list(per_round[name][: iters // 5]) * 5, 1e-6

    @contextlib.contextmanager
    def ctx(name):
        entered.append(name)
        yield

    def broken(_):
        raise RuntimeError("no kernel for this shape\nmore")

    def make(name):
        return lambda s: name

    monkeypatch.setattr(timing, "_samples", fake_samples)
    runs = {"ours": (make("ours"), [0], lambda: ctx("ours")), "peer": (make("peer"), [0, 1], lambda: ctx("peer")),
            "broken": (broken, [0], contextlib.nullcontext)}
    out = timing.time_rounds(runs, rounds=3, warmup=20, iters=30, seed=0)
    assert [c[0] for c in calls].count("ours") == 3 and [c[0] for c in calls].count("peer") == 3
    assert all(c[1] == 10 for c in calls)  # 30 runs over 3 rounds
    assert [c[2] for c in calls if c[0] == "ours"] == [20, 20, 20]  # a warm-up in every round
    assert entered.count("ours") == 3 and entered.count("peer") == 3
    assert out["broken"] == "no kernel for this shape"
    assert out["ours"].runs == 30 and out["ours"].min_ms == 1.0 and out["ours"].max_ms == 3.0
    assert out["peer"].median_ms == 5.0 and out["peer"].input_sets == 2
    orders = [[c[0] for c in calls][i:i + 2] for i in range(0, 6, 2)]
    assert len({tuple(o) for o in orders}) > 1, "the order changes between rounds"
