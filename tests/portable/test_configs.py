"""The portable config tables: every target family covers every head dim and output size, and a target picks its
family by backend and shared memory (the compile gate itself is tests/test_inspect.py)."""

import pytest
import torch

from xkernels.common.targets import TARGETS, Target
from xkernels.portable import configs
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.validation import HEAD_DIMS


@pytest.mark.parametrize("name,family", [("sm_90", configs.HOPPER), ("sm_80", configs.AMPERE), ("sm_89", configs.ADA),
                                         ("sm_120", configs.BLACKWELL_CONSUMER), ("gfx942", configs.CDNA),
                                         ("gfx950", configs.CDNA)])
def test_targets_pick_their_family(name, family):
    assert configs.table_for(TARGETS[name]) is family


def test_unknown_targets_fall_back_by_shared_memory():
    assert configs.table_for(Target("sm_100", "cuda", 100, 32, 232448, "HMMA")) is configs.HOPPER
    assert configs.table_for(Target("sm_86", "cuda", 86, 32, 101376, "HMMA")) is configs.ADA
    assert configs.table_for(None) is configs.HOPPER


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_family_covers_every_problem(name):
    target = TARGETS[name]
    for d in HEAD_DIMS:
        for recipe in ATTENTION_RECIPES.values():
            cfg = configs.attention_config(d, recipe, target, interpret=False)
            assert cfg.block_m % cfg.block_n == 0 or cfg.block_n % cfg.block_m == 0
    for dtype in (torch.float16, torch.float32):
        assert configs.gemm_config(dtype, target, interpret=False).block_k >= 16
    for d in HEAD_DIMS:
        bwd = configs.attention_bwd_config(d, target, interpret=False)
        assert min(bwd.kv_m, bwd.kv_n, bwd.q_m, bwd.q_n) >= 16


def test_bf16io_takes_its_own_tiles_where_the_conversion_needs_registers():
    hopper = TARGETS["sm_90"]
    assert configs.attention_config(256, ATTENTION_RECIPES["bf16io"], hopper, interpret=False).block_n == 32
    assert configs.attention_config(256, ATTENTION_RECIPES["bf16"], hopper, interpret=False).block_n == 64


def test_targets_are_hashable_and_intel_devices_get_the_xe2_tables(monkeypatch):
    from xkernels import select

    for target in TARGETS.values():
        hash(target)
    assert isinstance(TARGETS["xe2"].gpu_target[1]["sub_group_sizes"], list)  # the Intel backend's own form
    monkeypatch.setattr(select, "INTERPRET", False)
    assert select._target(torch.device("xpu")) is TARGETS["xe2"]
    assert configs.table_for(TARGETS["xe2"]) is configs.XE2


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_decode_key_tiles_are_powers_of_two_from_16(name):
    """The split-KV kernel addresses a page's rows as `key % PAGE` within tiles aligned to BLOCK_N: exact only when
    BLOCK_N and the page size (a power of two from 16) divide one another."""
    for d in HEAD_DIMS:
        bn = configs.decode_config(d, TARGETS[name], interpret=False).block_n
        assert bn >= 16 and bn & (bn - 1) == 0, (name, d, bn)
    assert configs.DECODE_INTERPRETED.block_n & (configs.DECODE_INTERPRETED.block_n - 1) == 0
