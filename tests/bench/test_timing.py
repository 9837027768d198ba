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
