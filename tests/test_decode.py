"""The split-KV host plan (`xkernels.decode`): how many key splits, and the span a windowed row block's splits cover."""

import pytest
import torch

from xkernels import decode
from xkernels.common.targets import TARGETS
from xkernels.portable.configs import DecodeConfig, decode_config
from xkernels.recipes import ATTENTION_RECIPES


@pytest.mark.parametrize("programs,keys,slots,want", [(64, 8192, 132, 2), (8, 8192, 132, 16), (128, 32768, 132, 1),
                                                      (512, 4096, 132, 1), (64, 8192, 264, 4), (8, 131072, 264, 33),
                                                      (8, 200, 264, 2), (1, 1 << 20, 264, decode.MAX_SPLITS)])
def test_splits_fill_one_wave_of_slots(programs, keys, slots, want):
    """One wave of `slots` (SMs x programs per SM), at most one split per key tile and MAX_SPLITS."""
    assert decode.num_splits(programs, keys, 128, slots) == want


def test_hopper_d64_splits_for_two_programs_per_sm():
    """The D64 tile (~70 KB, 97 registers) runs two programs per SM on sm_90; D128 and D256 (~140-200 KB) one."""
    hopper = TARGETS["sm_90"]
    assert decode_config(64, hopper, interpret=False).programs_per_sm == 2
    assert decode_config(128, hopper, interpret=False).programs_per_sm == 1
    assert decode_config(256, hopper, interpret=False).programs_per_sm == 1
    assert "-P2" in str(decode_config(64, hopper, interpret=False))


@pytest.mark.parametrize("d,pairs,want", [(128, 64, "BN128-W8-S3-ids4096"), (128, 132, "BN128-W8-S3-ids4096"),
                                          (128, 133, "BN64-W4-S4-P2-ids1024"), (128, 512, "BN64-W4-S4-P2-ids1024"),
                                          (64, 264, "BN128-W8-S3-P2"), (64, 265, "BN64-W4-S3-P3"),
                                          (256, 4096, "BN64-W8-S3")])
def test_many_pairs_take_the_smaller_tiles_on_hopper(d, pairs, want):
    """On sm_90 (132 SMs) a call over more (sequence, kv head) pairs than the head dim's config has resident
    programs takes `decode_many`'s (one split each, several waves: smaller tiles, more programs per SM); D256 has
    none; other targets and unknown SM counts keep the one config."""
    hopper = TARGETS["sm_90"]
    assert str(decode_config(d, hopper, interpret=False, pairs=pairs, sms=132)) == want + "-pdl"  # (sm_90 CUDA)
    assert decode_config(d, hopper, interpret=False, pairs=pairs) == decode_config(d, hopper, interpret=False)
    ampere = TARGETS["sm_80"]
    assert decode_config(d, ampere, interpret=False, pairs=pairs, sms=108) == decode_config(d, ampere, interpret=False)
    if want.startswith("BN64-W4"):  # just past the rule, the smaller tiles' slots hold each pair once: one split
        assert decode.num_splits(pairs, 4096, 64, 132 * decode_config(d, hopper, interpret=False, pairs=pairs,
                                                                       sms=132).programs_per_sm) == 1


def test_selection_passes_the_pairs_and_leaves_a_symbolic_count_alone(monkeypatch, device):
    """The dense API's few-row calls and the cache calls hand B * Hkv to the rule (`select._decode_config`); a
    symbolic count (a traced call with a dynamic batch) never reaches the rule, so it adds no guard."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from xkernels import select
    from xkernels.portable import configs

    passed = []
    real_choice = select._decode_config
    monkeypatch.setattr(select, "_decode_config", lambda q, d, pairs: passed.append(pairs) or real_choice(q, d, pairs))
    q = torch.zeros(3, 8, 1, 64, dtype=torch.float16, device=device)
    k = torch.zeros(3, 2, 40, 64, dtype=torch.float16, device=device)
    select.resolve_attention(q, k, k, None, enable_gqa=True, precision="auto", backend="auto")
    cache = torch.zeros(3, 40, 2, 64, dtype=torch.float16, device=device)
    lengths = torch.zeros(3, dtype=torch.int32, device=device)
    select.resolve_attention_kvcache(q.transpose(1, 2), cache, cache, lengths, None, None, None, None,
                                     precision="auto", backend="auto")
    assert passed == [6, 6]

    seen = []
    real = configs.decode_config
    monkeypatch.setattr(configs, "decode_config", lambda *a, **kw: seen.append(kw.get("pairs")) or real(*a, **kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(select, "sm_count", lambda index: 132)
    monkeypatch.setattr(select, "device_index", lambda device: 0)
    on_cuda = type("FakeQ", (), {"device": torch.device("cuda")})()
    real_choice(on_cuda, 128, 200)
    env = ShapeEnv()
    batch = env.create_unspecified_symint_and_symbol(64, ConstantSource("B"), DimDynamic.DYNAMIC)
    real_choice(on_cuda, 128, batch * 8)
    assert seen == [200, None] and not env.guards


@pytest.mark.parametrize("left,sq,block_n", [(37, 1, 32), (4096, 1, 128), (100, 5, 64), (0, 3, 32)])
def test_windowed_splits_cover_the_window_from_its_aligned_tile(left, sq, block_n):
    """The kernel starts a windowed row block's splits at the key tile holding its first key (up to block_n - 1 keys
    earlier), so the splits must cover window + rows + block_n - 1 keys."""
    capacity = 1 << 16
    g = decode.Geometry(1, sq, 8, 2, 64, capacity, 0, (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), 0, 1)
    cfg = DecodeConfig(block_n, 4, 2)
    plan = decode.DecodePlan(g, seq_lengths=True, is_causal=True, bottom_right=True,
                             recipe=ATTENTION_RECIPES["bf16"], cfg=cfg, write_lse=False, device=torch.device("cpu"),
                             window=(left, 0))
    split_keys = plan.ints[-3]
    assert plan.splits * split_keys >= left + sq + block_n - 1


@pytest.mark.parametrize("page,row_stride,wide", [(16, 1024, False), (256, 2**31 // 255 - 1, False),
                                                  (256, 2**31 // 255 + 1, True), (16, 2**31 // 15 + 1, True),
                                                  (0, 2**30, False)])
def test_wide_row_offsets_only_where_int32_could_wrap(page, row_stride, wide):
    """The kernel's offset inside a page, up to (page - 1) x row stride, is int32 unless the plan asks for int64."""
    strides = (0, row_stride, 64)
    g = decode.Geometry(1, 1, 8, 2, 64, 1 << 16, page, (0, 0, 0), strides, strides, (0, 0, 0), 0, 4)
    plan = decode.DecodePlan(g, seq_lengths=True, is_causal=True, bottom_right=True,
                             recipe=ATTENTION_RECIPES["bf16"], cfg=DecodeConfig(32, 4, 1),
                             write_lse=False, device=torch.device("cpu"))
    assert plan.constexprs["WIDE_ROWS"] is wide


def test_pdl_makes_the_combine_a_dependent_launch_on_cuda_only():
    """`DecodeConfig.pdl`: the split kernel (split, unfused) signals its dependents and the combine waits for it,
    compiled with Triton's launch_pdl; a plan off CUDA (the interpreter, other devices) keeps a plain launch."""
    recipe = ATTENTION_RECIPES["bf16"]
    cfg = DecodeConfig(64, 4, 2, pdl=True)
    flags = dict(rows=4, page=16, seq_lengths=True, causal=True, bottom_right=True, write_lse=True, interpret=False)
    assert cfg.constexprs(128, recipe, split=True, **flags)["LAUNCH_DEPENDENTS"]
    assert not cfg.constexprs(128, recipe, split=False, **flags)["LAUNCH_DEPENDENTS"]
    fused = DecodeConfig(64, 4, 2, pdl=True, fused_combine=True)  # no combine kernel to depend on
    assert not fused.constexprs(128, recipe, split=True, **flags)["LAUNCH_DEPENDENTS"]
    assert not cfg.constexprs(128, recipe, split=True, **(flags | dict(interpret=True)))["LAUNCH_DEPENDENTS"]
    assert str(cfg).endswith("-pdl")
    strides = (0, 64 * 2, 64)
    g = decode.Geometry(1, 1, 8, 2, 64, 1 << 12, 16, (0, 0, 0), strides, strides, (0, 0, 0), 0, 4)
    plan = decode.DecodePlan(g, seq_lengths=True, is_causal=True, bottom_right=True, recipe=recipe, cfg=cfg,
                             write_lse=False, device=torch.device("cpu"))
    assert not plan.combine_constexprs["WAIT_PRIMARY"] and "launch_pdl" not in plan.combine_options
    assert not plan.cfg.pdl and not plan.constexprs["LAUNCH_DEPENDENTS"]  # neither side of the pair


def test_a_growing_cache_keeps_its_plan(device):
    """The dense API with one query row over contiguous K/V that grow by a few keys per call (a decoding loop over
    transformers' caches) takes one plan for every key count, crossing key tiles and split counts; each call's
    output and LSE match float64 on its own keys. Non-contiguous K takes a plan of its own key."""
    import xkernels
    from xkernels import plans
    from xkernels.testing import attention_inputs, compare_attention, compare_lse, reference_attention, reference_lse

    q, k_all, v_all = attention_inputs(1, 2, 1, 300, 64, torch.float16, device, hkv=1, seed=11)
    recipe = ATTENTION_RECIPES["fp16"]
    plans._PLANS.clear()
    names = set()
    for s in (1, 2, 17, 64, 65, 129, 300, 40, 41, 42, 43, 44, 45, 46, 47, 65, 65, 129):  # > 8 counts, repeats
        k, v = k_all[:, :, :s].contiguous(), v_all[:, :, :s].contiguous()
        out, lse = xkernels.attention(q, k, v, enable_gqa=True, return_lse=True)
        names.add(xkernels.last_backend())
        c = compare_attention(out, reference_attention(q, k, v), recipe)
        assert c.passed, (s, c.reason)
        assert compare_lse(lse, reference_lse(q, k)).passed, s
    assert sum(1 for key, plan in plans._PLANS.items() if key[0] == "decode") == 1
    assert len(plans._PLANS) == 1 and len(names) > 1  # split counts changed with the key count
    k, v = k_all[:, :, ::2], v_all[:, :, ::2]  # every other key: not contiguous, keyed by its shape and strides
    c = compare_attention(xkernels.attention(q, k, v, enable_gqa=True), reference_attention(q, k, v), recipe)
    assert c.passed and len(plans._PLANS) == 2, c.reason


def test_resize_variants_follow_what_triton_specializes():
    """A resized launch shares its kernels with the plan's when Triton would compile the same variant: split or not,
    every int 32-bit, strides alike (1 / multiple of 16); an int from 2^31 up or an odd stride gets a variant."""
    g = decode.Geometry(1, 1, 8, 2, 128, 4096, 0, (1024, 1024, 128), (2 * 4096 * 128, 128, 4096 * 128),
                        (2 * 4096 * 128, 128, 4096 * 128), (1024, 1024, 128), 0, 1)
    plan = decode.DecodePlan(g, seq_lengths=False, is_causal=False, bottom_right=False,
                             recipe=ATTENTION_RECIPES["bf16"], cfg=DecodeConfig(128, 4, 3), write_lse=False,
                             device=torch.device("cpu"))
    grown = plan.resize(4097, (2 * 4097 * 128, 128, 4097 * 128), (2 * 4097 * 128, 128, 4097 * 128))
    assert grown.variant is plan.launch.variant and grown.ints[16] == 4097
    def contiguous(s: int, heads: int = 2) -> tuple[int, int, int]:  # (block, row, head) strides of (1, H, S, D)
        return heads * s * 128, 128, s * 128

    huge = plan.resize(2**23, contiguous(2**23), contiguous(2**23))
    assert huge.variant is not plan.launch.variant
    # Triton types each int on its own: with the block stride past 2^31 in both, the head stride crossing it too
    # (2^22 -> 2^24 keys) is another variant
    wide, wider = (plan.resize(s, contiguous(s, 8), contiguous(s, 8)) for s in (2**22, 2**24))
    assert wide.variant is not wider.variant
    odd = plan.resize(4097, (2 * 4097 * 129, 129, 4097 * 129), contiguous(4097))
    assert odd.variant is not plan.launch.variant and odd.variant is not huge.variant
