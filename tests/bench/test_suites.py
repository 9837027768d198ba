"""The benchmark suites' cases: the decode suite times each cache call with and without the host read of its checks,
and a `sync_checks=False` case runs and passes its float64 check like the synchronized one."""

from xkernels.bench.suites import DECODE_ROWS, decode_suite
from xkernels.testing.cases import DecodeCase


def test_decode_suite_has_each_cache_call_with_and_without_the_host_read():
    for quick in (True, False):
        shapes = [c.shape for c in decode_suite(quick)]
        synced = [s for s in shapes if " dense" in s and "nosync" not in s and "dense-api" not in s]
        assert len(synced) == len(DECODE_ROWS)
        assert all(s + " nosync" in shapes for s in synced)
        assert not any("dense-api nosync" in s for s in shapes)  # the dense API has no cache checks


def test_nosync_decode_case_runs_and_passes(device):
    for cache in ("dense", "paged16"):
        case = DecodeCase(2, 4, 2, 80, 64, cache=cache, sync_checks=False)
        assert case.check(case.inputs(device)).passed
