"""HopperAttentionConfig.check: the configs the Gluon kernel cannot run fail with a ValueError naming the field (these
would otherwise be compile errors, spills or silently ignored switches); the shapes the persistent kernel serves.
Runs without a GPU."""

import dataclasses

import pytest
import torch

from xkernels import select
from xkernels.hopper.configs import (
    ATTENTION_BWD_CONFIGS,
    FUSED_BWD_CONFIGS,
    PERSISTENT_ATTENTION_CONFIGS,
    HopperAttentionConfig,
)
from xkernels.hopper.configs import ATTENTION_CONFIGS as CONFIGS
from xkernels.recipes import ATTENTION_RECIPES


@pytest.mark.parametrize("recipe", list(ATTENTION_RECIPES))
@pytest.mark.parametrize("d", sorted(CONFIGS))
def test_shipped_configs_pass(d, recipe):
    CONFIGS[d].check(d, ATTENTION_RECIPES[recipe])


@pytest.mark.parametrize("d,recipe,fields,match", [
    (128, "bf16", dict(consumers=3), "consumers=3 needs"),
    (64, "bf16", dict(consumers=4), "consumers=4 needs"),
    (128, "bf16", dict(acc16=1), "acc16 needs fp16 P.V"),
    (128, "bf16io", dict(convert_steps=3), "convert_steps=3 must be"),
    (128, "bf16io", dict(block_n=32), "fewer than 8 rows"),
    (256, "bf16io", dict(convert_steps=2), "spills registers"),
    (128, "bf16", dict(v_pass=1), "v_pass=1 must be 0, or 1 with a recipe that converts V"),
    (128, "bf16io", dict(v_pass=2), "v_pass=2 must be"),
])
def test_rejected_configs_name_the_field(d, recipe, fields, match):
    cfg = dataclasses.replace(CONFIGS[d], **fields)
    with pytest.raises(ValueError, match=match):
        cfg.check(d, ATTENTION_RECIPES[recipe])


@pytest.mark.parametrize("d,recipe,fields", [
    (128, "fp16", dict(acc16=1)), (128, "bf16io", dict(acc16=1)),  # fp16 P.V: the switch applies
    (128, "bf16", dict(block_n=32)),  # no conversion, so no step size to cut
    (64, "bf16io", dict(consumers=3, convert_steps=2)), (128, "bf16io", dict(convert_steps=2)),
    (128, "bf16io", dict(v_pass=1, block_n=32)),  # V converted before the kernel: no step size to cut
])
def test_accepted_overrides(d, recipe, fields):
    dataclasses.replace(CONFIGS[d], **fields).check(d, ATTENTION_RECIPES[recipe])


def test_name_shows_every_switch_off_its_default():
    assert str(HopperAttentionConfig(128, 2)) == "BM128-BN128-S2-ov"
    cfg = HopperAttentionConfig(64, 3, overlap=0, consumers=3, acc16=1, convert_steps=4)
    assert str(cfg) == "BM192-BN64-S3-acc16-cs4"


def test_v_pass_turns_the_producer_conversion_off():
    """bf16io with `v_pass` compiles the kernel that reads fp16 V (the fp16 recipe's producer and registers); its
    name says -vp; the override parses."""
    bf16io = ATTENTION_RECIPES["bf16io"]
    for d in sorted(CONFIGS):
        cfg = dataclasses.replace(CONFIGS[d], v_pass=1)
        assert CONFIGS[d].constexprs(d, bf16io, causal=False, positive_scale=True, write_lse=True)["CONVERT_V"]
        assert not cfg.constexprs(d, bf16io, causal=False, positive_scale=True, write_lse=True)["CONVERT_V"]
        assert str(cfg).endswith("-vp") and cfg.converts_in_kernel(bf16io) is False
    for d, pc in sorted(PERSISTENT_ATTENTION_CONFIGS.items()):
        on = dataclasses.replace(pc, v_pass=1, walk=1, flat=0).constexprs(d, bf16io, causal=True,
                                                                          positive_scale=True, write_lse=True,
                                                                          persistent=True)
        assert not on["CONVERT_V"]
    assert "v_pass" in dict(select.parse_backend("hopper:v_pass=1").config)
    # O through the V ring needs V in O's dtype: bf16io's V is fp16 with or without the pass
    ovs = dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], v_pass=1, o_store=3, block_n=64, chained=0)
    with pytest.raises(ValueError, match="o_store=3 .* needs the V ring in O's dtype"):
        ovs.check(128, bf16io, "persistent")
    with pytest.raises(ValueError, match="v_pass=1 must be 0, or 1 with a recipe that converts V"):
        select._hopper_forward(128, ATTENTION_RECIPES["bf16"], select.parse_backend("hopper:v_pass=1"))


def test_a_v_pass_plan_keeps_v_strides_or_leaves_the_conversion_to_the_producer():
    """The pass's fp16 copy must take V's strides (the plan's integer arguments): a dense layout in any dimension
    order does; one with gaps or overlaps leaves the plan on the producer's conversion."""
    from xkernels import plans

    v = torch.randn(2, 4, 33, 64).bfloat16()
    bshd = v.transpose(1, 2).contiguous().transpose(1, 2)
    for t in (v, bshd):
        assert plans._dense_layout(t)
        copy = t.to(torch.float16)  # as the plan's pass makes it
        assert copy.stride() == t.stride() and torch.equal(copy.float(), t.half().float())
    gaps = torch.randn(2, 8, 33, 64).bfloat16()[:, ::2]
    assert not plans._dense_layout(gaps) and not plans._dense_layout(v[:, :1].expand(2, 4, 33, 64))
    both = select.HopperForward(dataclasses.replace(CONFIGS[128], v_pass=1),
                                dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], v_pass=1))
    off = both.with_v_pass(0, 128, ATTENTION_RECIPES["bf16io"])
    assert off.dense == CONFIGS[128] and off.persistent == PERSISTENT_ATTENTION_CONFIGS[128]
    assert select.HopperForward(CONFIGS[64]).with_v_pass(0, 64, ATTENTION_RECIPES["bf16io"]).persistent is None


def test_persistent_kernel_eligibility():
    """The shapes and configs the persistent kernel serves (its views: `tests/hopper/test_views.py`)."""
    from xkernels.hopper import attention_persistent as hp

    cfg = PERSISTENT_ATTENTION_CONFIGS[128]
    assert cfg.persistent
    rec = ATTENTION_RECIPES["bf16"]
    q = torch.empty(1, 4, 256, 128, device="meta", dtype=torch.bfloat16)
    assert hp.eligible(q, q, q, cfg, rec, causal=False)
    assert hp.eligible(q[:, :, :192], q, q, cfg, rec, causal=True)  # a multiple of 64 rows is enough for queries
    assert not hp.eligible(q[:, :, :200], q, q, cfg, rec, causal=False)  # Sq not a multiple of 64
    assert not hp.eligible(q, q[:, :, :200], q[:, :, :200], cfg, rec, causal=False)  # Skv not a multiple of 128
    assert not hp.eligible(q, q, q, dataclasses.replace(cfg, persistent=0), rec, causal=False)
    assert hp.eligible(q, q, q, cfg, ATTENTION_RECIPES["bf16io"], causal=False)  # the producer converts V
    assert not hp.eligible(q[:, :0], q[:, :0], q[:, :0], cfg, rec, causal=False)  # empty calls never launch
    assert not hp.eligible(q[:, :, :0], q[:, :, :0], q[:, :, :0], cfg, rec, causal=False)
    long_kv = torch.empty(1, 4, 8192, 128, device="meta", dtype=torch.bfloat16)
    assert not hp.eligible(q, long_kv, long_kv, cfg, rec, causal=True)  # the measured rule: dense beyond 4K keys
    assert hp.eligible(q, long_kv[:, :1], long_kv[:, :1], cfg, rec, causal=True)  # ... except causal GQA
    assert hp.eligible(q, long_kv, long_kv, dataclasses.replace(cfg, persistent=2), rec, causal=True)
    with pytest.raises(ValueError, match="shared memory"):  # chained tiles hold two Q slots: too big at D256
        dataclasses.replace(CONFIGS[256], persistent=1, chained=1, o_store=2).check(256, rec, "persistent")
    with pytest.raises(ValueError, match="262144 bytes of shared memory"):  # 64-key tiles and the O buffers
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[256], persistent=2, o_store=0).check(256, rec, "persistent")
    dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[256], persistent=2).check(256, rec, "persistent")  # fits
    dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[256], persistent=2, o_store=1).check(256, rec, "persistent")
    dataclasses.replace(CONFIGS[256], block_n=32, stages=3, persistent=2).check(256, rec, "persistent")
    # the dense kernel has one Q slot (also O's), whatever the persistent fields say
    dataclasses.replace(CONFIGS[256], chained=1, persistent=2).check(256, rec)
    with pytest.raises(ValueError, match="o_store=1 is the dense persistent kernel's"):
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], o_store=1).check(128, rec, "varlen_persistent")
    with pytest.raises(ValueError, match="o_store=4"):
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], o_store=4).check(128, rec, "persistent")
    with pytest.raises(ValueError, match="needs block_n=64"):  # O through the V ring: one O tile per V stage
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], o_store=3, chained=0).check(128, rec, "persistent")
    with pytest.raises(ValueError, match="chained=0"):
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], o_store=3, block_n=64).check(128, rec, "persistent")
    dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[256], o_store=3).check(256, rec, "persistent")
    with pytest.raises(ValueError, match="recipe bf16io reads V as fp16 .* needs o_store 0-2"):
        dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[256], o_store=3).check(256, ATTENTION_RECIPES["bf16io"],
                                                                               "persistent")
    for d, cfg in PERSISTENT_ATTENTION_CONFIGS.items():  # the shipped configs fit every kernel that takes them
        cfg.check(d, rec, "persistent")
        if d <= 128:
            cfg.check(d, rec, "varlen_persistent")
    cfg256 = PERSISTENT_ATTENTION_CONFIGS[256]
    assert cfg256.persistent == 1  # the measured rule: D256 up to 4K keys
    q256 = torch.empty(1, 4, 2048, 256, device="meta", dtype=torch.bfloat16)
    assert hp.eligible(q256, q256, q256, cfg256, rec, causal=True)
    kv4k = q256.repeat(1, 1, 2, 1)
    assert hp.eligible(q256, kv4k, kv4k, cfg256, rec, causal=True)
    assert not hp.eligible(q256, kv4k.repeat(1, 1, 2, 1), kv4k.repeat(1, 1, 2, 1), cfg256, rec,
                           causal=True)  # 8K keys: the dense kernel
    bf16io = ATTENTION_RECIPES["bf16io"]
    assert hp.eligible(q256[:, :, :1024], q256[:, :, :1024], q256[:, :, :1024], cfg256, bf16io, causal=True)
    assert not hp.eligible(q256, q256, q256, cfg256, bf16io, causal=True)  # bf16io at D256: up to 1K keys


@pytest.mark.parametrize("m,n,k,tile,split", [
    (512, 512, 512, "tiny", 1), (1024, 1024, 1024, "small", 1), (1536, 1536, 1536, "rows3", 1),
    (256, 4096, 4096, "small", 1), (128, 6144, 4096, "small", 1), (128, 4096, 4096, "tiny", 1),
    (128, 4096, 14336, "small", 2), (100, 4096, 14336, "small", 2),
    (64, 4096, 14336, "narrow", 1), (64, 4096, 4096, "narrow", 1),  # one row block, 128 tiles of 64 x 32
    (64, 6144, 4096, "tiny", 1),  # 192 tiles of 64 x 32 > a wave; 64 k-steps: too short to split
    (48, 4096, 4096, "tiny", 1),  # a partial row block: 64 x 64
    (1, 4096, 8192, "small", 2),  # forced onto the Hopper kernel: 32 tiles
    (1024, 6144, 4096, "mid", 1),  # 1.45 waves of 128 x 256 tiles, 2.9 of 128 x 128
    (2304, 2048, 4096, "small", 1),  # 64 x 128 tiles fill their waves best
    (1024, 4608, 4096, "small", 1),  # 192 x 128 would fill 2 waves, over 1152 rows of 1024: 11 % wasted
    (3000, 3000, 3000, "rows3", 1), (3072, 3072, 3072, "rows3", 1),  # 3 whole waves of 192 x 128
    (2560, 2560, 2560, "big", 1),
    (2048, 2048, 2048, "big", 1), (1024, 4096, 4096, "big", 1), (128, 28672, 4096, "big", 1),
    (8192, 8192, 8192, "big", 1),
])
def test_gemm_tile_follows_the_wave(m, n, k, tile, split):
    """Outputs of 80 % of a wave of 128 x 128 tiles or more: the big tile with the best wave fill times its rate on
    132 SMs; below that, 64 rows over at most a wave of 64 x 32 tiles take those; else a long K split in two
    over 64 x 128 tiles that fill at most half the SMs, else 64 x 64 tiles where they fit one wave, else 64 x 128.
    The choice depends on the problem's shape and the SM count only."""
    import dataclasses

    from xkernels.hopper import configs

    want = dict(big=configs.GEMM_CONFIG, mid=configs.MID_GEMM_CONFIG, small=configs.SMALL_GEMM_CONFIG,
                tiny=configs.TINY_GEMM_CONFIG, narrow=configs.NARROW_GEMM_CONFIG,
                rows3=configs.ROWS3_GEMM_CONFIG)[tile]
    assert configs.gemm_config(m, n, k, 132) == dataclasses.replace(want, split_k=split)
    assert configs.gemm_config(m, n, k, 10_000).block_m == 64  # more SMs: every one of these is small
    assert configs.wave_fill(132, 132) == configs.wave_fill(264, 132) == 1.0 and configs.wave_fill(192, 132) < 0.73


def test_gemm_split_k_checks():
    import dataclasses

    from xkernels.hopper import gemm
    from xkernels.hopper.configs import SMALL_GEMM_CONFIG

    for bad, match in ((dict(split_k=0), "split_k=0 must be 1 to 8"), (dict(split_k=2, acc_fp16=True), "acc_fp16")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(SMALL_GEMM_CONFIG, **bad).check(torch.float16)
    assert str(dataclasses.replace(SMALL_GEMM_CONFIG, split_k=2)) == "BM64-BN128-BK64-S8-W4-SK2"
    with pytest.raises(ValueError, match="split_k=4 leaves a split of K=192 empty"):  # 3 k-steps over 4 splits
        gemm.launch_spec(64, 128, 192, b_layout="nk", walk="grouped", cfg=dataclasses.replace(SMALL_GEMM_CONFIG,
                                                                                                  split_k=4),
                         device_index=0)


def test_gemm_pingpong_and_shared_memory_checks():
    """Ping-pong needs 4-warp consumers (two 64-row tiles in flight); every config's ring and output tiles must fit
    an sm_90 CTA's shared memory (the shipped ones do; 8 stages of 64 x 128 with two output tiles fit, 9 do not)."""
    import dataclasses

    from xkernels.hopper import configs

    small = configs.SMALL_GEMM_CONFIG
    for cfg in (configs.GEMM_CONFIG, configs.MID_GEMM_CONFIG, small, configs.TINY_GEMM_CONFIG,
                configs.NARROW_GEMM_CONFIG, dataclasses.replace(small, consumers=2)):
        cfg.check(torch.bfloat16)
    assert dataclasses.replace(small, consumers=2).shared_bytes(torch.bfloat16) == 8 * 192 * 64 * 2 + 2 * 64 * 128 * 2
    for bad, match in ((dict(consumers=2, num_warps=8), "consumers=2 must be 1, or 2 with num_warps=4"),
                       (dict(consumers=3), "consumers=3 must be"), (dict(stages=1), "stages=1 must be at least 2"),
                       (dict(consumers=2, stages=9), "needs 253952 bytes of shared memory")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(small, **bad).check(torch.bfloat16)
    assert str(dataclasses.replace(small, consumers=2, split_k=2)) == "BM64-BN128-BK64-S8-W4-SK2-PP"
    assert configs.HopperGemmConfig().constexprs("nk", "grouped")["CONSUMERS"] == 1


def test_gemm_row_split_checks():
    """Row warpgroups: one-warpgroup partitions of 64 rows each (block_m = 64 * row_wgs), one consumer, no split-K;
    the A and C boxes are one warpgroup's rows, B's the whole tile's columns."""
    from xkernels.hopper import configs

    rows3 = configs.ROWS3_GEMM_CONFIG
    rows3.check(torch.bfloat16)
    assert rows3.shared_bytes(torch.bfloat16) == 4 * (192 + 128) * 64 * 2 + 192 * 128 * 2
    assert rows3.blocks("nk") == ([64, 64], [128, 64], [64, 128]) and rows3.blocks("kn")[1] == [64, 128]
    assert str(rows3) == "BM192-BN128-BK64-S4-W4-R3" and rows3.constexprs("kn", "row")["ROW_WGS"] == 3
    assert configs.HopperGemmConfig().blocks("kn")[0] == [128, 64]
    for bad in (dict(row_wgs=4, block_m=256), dict(num_warps=8), dict(block_m=128), dict(consumers=2),
                dict(split_k=2)):
        with pytest.raises(ValueError, match=r"row_wgs=\d must be 1, or 2 or 3 with num_warps=4"):
            dataclasses.replace(rows3, **bad).check(torch.bfloat16)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        dataclasses.replace(rows3, stages=5).check(torch.bfloat16)


def test_rotate_reaches_only_the_fused_dense_full_walk():
    """`rotate` (opt-in) turns ROTATE on only where the fused kernel walks a dense full mask in one loop: not causal,
    windowed, packed, split-walk (mask_split), split_d, even_keys or unfused configs."""
    from xkernels.common.seqlen import Band
    from xkernels.hopper.configs import ATTENTION_BWD_CONFIGS, FUSED_BWD_CONFIGS

    rot = dataclasses.replace(FUSED_BWD_CONFIGS[128], rotate=1)
    assert str(rot).endswith("-rot") and rot.constexprs(128, causal=False)["ROTATE"]
    assert not FUSED_BWD_CONFIGS[128].constexprs(128, causal=False)["ROTATE"]
    for off in (rot.constexprs(128, causal=True), rot.constexprs(128, causal=False, varlen=True),
                rot.constexprs(128, causal=False, band=Band.of(False, (100, 60))),
                dataclasses.replace(rot, mask_split=1).constexprs(128, causal=False),
                dataclasses.replace(rot, even_keys=1).constexprs(128, causal=False, whole_key_blocks=True),
                dataclasses.replace(rot, fused_dq=0).constexprs(128, causal=False),
                dataclasses.replace(ATTENTION_BWD_CONFIGS[256], rotate=1).constexprs(256, causal=False)):
        assert not off["ROTATE"]


def test_persistent_walk_head_chunks():
    """The L2-chunk walk's (`walk=0`) head chunk: query heads whose K/V fit the L2 budget together, whole GQA groups,
    at least one group. The budget follows the shape (8 MiB for full MHA at D128, else 32) unless the config names
    one (an A/B switch, shown in the name)."""
    from xkernels.hopper import attention_persistent as hp
    from xkernels.hopper import configs
    from xkernels.recipes import ATTENTION_RECIPES

    kv_2k_d128 = 2 * 2048 * 128 * 2  # 1 MiB of K and V per head
    assert hp.heads_per_chunk(2048, 128, 1, 2, 32 << 20) == 32
    assert hp.heads_per_chunk(2048, 128, 4, 2, 8 * kv_2k_d128) == 32  # 8 K/V heads, each shared by 4 query heads
    assert hp.heads_per_chunk(65536, 128, 2, 2, 32 << 20) == 2  # one group even over budget

    def walk(cfg, causal=False, group=1, d=128):
        return hp.launch_spec(8, 32, 2048, 2048, d, group, 2, 132, is_causal=causal,
                              recipe=ATTENTION_RECIPES["bf16"], positive_scale=True, write_lse=False, cfg=cfg)[1]

    default = dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], walk=0)
    assert "l2c" not in str(default) and default.l2_budget_kib == 0
    assert walk(default) == (16 * 256, 16, 256, 8, 0)  # full MHA: 8 MiB of K/V, 8 heads
    assert walk(default, causal=True) == (16 * 256, 16, 256, 32, 0)
    assert walk(default, group=4) == (16 * 256, 16, 256, 128, 0)  # 32 K/V heads' worth of query heads
    assert walk(dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[64], walk=0), d=64)[3] == 64
    assert configs.l2_budget_kib(128, causal=False, group=1) == configs.FULL_MHA_L2_BUDGET_KIB
    cfg = dataclasses.replace(default, l2_budget_kib=32 << 10)
    assert str(cfg).endswith("-l2c32768-l2") and walk(cfg) == (16 * 256, 16, 256, 32, 0)
    with pytest.raises(ValueError, match="l2_budget_kib=-1 must be positive"):
        dataclasses.replace(cfg, l2_budget_kib=-1).check(128, ATTENTION_RECIPES["bf16"])


def test_pair_walk_launch_spec_and_checks():
    """`walk=1`: the walk's fourth integer is the GQA group, the fifth whether causal blocks are paired (more tiles
    than SMs; a full mask never), the grid at most the units dealt; names say -hm / -l2 for an explicit walk; the
    packed kernel takes walk 1 too (its own head-major order); another value is refused. The default (walk=2)
    resolves per shape (`preferred_walk`; the packed kernel: `packed_walk`)."""
    from xkernels.hopper import attention_persistent as hp
    from xkernels.hopper import attention_varlen_persistent as hvp
    from xkernels.recipes import ATTENTION_RECIPES

    bf16 = ATTENTION_RECIPES["bf16"]
    default = PERSISTENT_ATTENTION_CONFIGS[128]
    cfg = dataclasses.replace(default, walk=1)
    assert default.walk == 2 and str(default).endswith("-ch") and str(cfg).endswith("-ch-hm")
    assert str(dataclasses.replace(cfg, walk=0)).endswith("-ch-l2")  # the L2-chunk walk, by override

    def spec(b, hq, sq, group, causal=True, sms=132):
        return hp.launch_spec(b, hq, sq, sq, 128, group, 2, sms, is_causal=causal, recipe=bf16, positive_scale=True,
                              write_lse=False, cfg=cfg)

    grid, walk, constexprs, _ = spec(32, 32, 512, 4)
    assert (grid, walk, constexprs["WALK"]) == (132, (4 * 1024, 4, 1024, 4, 1), 1)
    assert spec(32, 32, 512, 4, causal=False)[1][4] == 0  # a full mask's tiles cost alike: single tiles
    assert spec(1, 8, 512, 1)[:2] == (32, (32, 4, 8, 1, 0))  # one round: 32 single tiles on 32 programs
    assert spec(2, 32, 512, 1)[:2] == (128, (256, 4, 64, 1, 1))  # two rounds: 128 pairs
    assert spec(1, 8, 384, 2, sms=8)[:2] == (8, (24, 3, 8, 2, 1))  # 8 pairs + 8 middle blocks on 8 programs
    assert spec(1, 2, 128, 1)[0] == 2  # one block a head
    assert hp.launch_spec(1, 32, 512, 512, 128, 1, 2, 132, is_causal=True, recipe=bf16, positive_scale=True,
                          write_lse=False, cfg=dataclasses.replace(cfg, walk=0))[2]["WALK"] == 0
    with pytest.raises(ValueError, match="walk=3 must be 0, 1 or 2"):
        dataclasses.replace(cfg, walk=3).check(128, bf16, "persistent")
    with pytest.raises(ValueError, match="the kernel takes them resolved"):
        default.constexprs(128, bf16, causal=True, positive_scale=True, write_lse=False, persistent=True)

    def resolved(d, hq, hkv, s, causal):
        return hp.launch_spec(16384 // s, hq, s, s, d, hq // hkv, 2, 132, is_causal=causal, recipe=bf16,
                              positive_scale=True, write_lse=False, cfg=PERSISTENT_ATTENTION_CONFIGS[d])[2]["WALK"]

    # the measured rule: head-major, but GQA from 2K keys (D64/D128) and D64 causal at 512 keys
    assert [resolved(128, 32, 32, s, c) for s in (512, 2048, 4096) for c in (False, True)] == [1] * 6
    assert [resolved(128, 32, 8, s, c) for s in (512, 1024, 2048, 4096) for c in (False, True)] == [1] * 4 + [0] * 4
    assert [resolved(64, 32, 32, 512, c) for c in (False, True)] == [1, 0]
    assert resolved(64, 32, 32, 1024, True) == resolved(256, 32, 8, 2048, True) == 1
    assert hp.launch_spec(16, 32, 1024, 1024, 256, 1, 2, 132, is_causal=False, recipe=ATTENTION_RECIPES["bf16io"],
                          positive_scale=True, write_lse=False,
                          cfg=PERSISTENT_ATTENTION_CONFIGS[256])[2]["WALK"] == 0  # converting V in the producer
    # the packed kernel's rule: head-major units for full MHA, the L2-chunk walk for causal or GQA
    walks = [hvp.launch_spec(4, 32, 4096, 128, 132, is_causal=c, recipe=bf16, positive_scale=True, write_lse=False,
                             cfg=default, group=g)[2]["WALK"] for c, g in ((False, 1), (True, 1), (False, 4))]
    assert walks == [1, 0, 0]
    # a chunk budget implies the L2-chunk walk; with walk=1 it is refused
    budget = dataclasses.replace(default, l2_budget_kib=2560)
    assert hp.resolved(budget, bf16, 512, True, 1, 128).walk == 0
    with pytest.raises(ValueError, match="l2_budget_kib=2560 sizes the L2-chunk walk"):
        dataclasses.replace(budget, walk=1).check(128, bf16, "persistent")
    # D256 runs persistently to 4K keys on the head-major walk, to 2K on the L2-chunk walk (measured there)
    q256 = torch.empty(1, 4, 4096, 256, device="meta", dtype=torch.bfloat16)
    cfg256 = PERSISTENT_ATTENTION_CONFIGS[256]
    assert hp.eligible(q256, q256, q256, cfg256, bf16, causal=True)
    assert not hp.eligible(q256, q256, q256, dataclasses.replace(cfg256, walk=0), bf16, causal=True)
    cfg.check(128, bf16, "varlen_persistent")  # the packed kernel's head-major order
    assert hvp.launch_spec(4, 32, 4096, 128, 132, is_causal=False, recipe=bf16, positive_scale=True, write_lse=False,
                           cfg=cfg, group=4)[2]["WALK"] == 1


@pytest.mark.parametrize("walk", [0, 1, 2])
def test_launch_specs_name_every_constexpr(walk):
    """The fast launch passes constexprs by position (`launch.constexpr_tail`): each persistent kernel's launch spec
    names every one of them, defaults included, on either walk."""
    from xkernels.common.launch import constexpr_tail
    from xkernels.hopper import attention_persistent as hp
    from xkernels.hopper import attention_varlen_persistent as hvp

    bf16 = ATTENTION_RECIPES["bf16"]
    cfg = dataclasses.replace(PERSISTENT_ATTENTION_CONFIGS[128], walk=walk)
    for causal in (False, True):
        dense = hp.launch_spec(4, 32, 1024, 1024, 128, 1, 2, 132, is_causal=causal, recipe=bf16, positive_scale=True,
                               write_lse=True, cfg=cfg)[2]
        packed = hvp.launch_spec(4, 32, 1024, 128, 132, is_causal=causal, recipe=bf16, positive_scale=True,
                                 write_lse=True, cfg=cfg, group=1)[2]
        assert len(constexpr_tail(hp.attention_persistent_kernel, dense)) == len(dense)
        assert len(constexpr_tail(hvp.attention_varlen_persistent_kernel, packed)) == len(packed)


@pytest.mark.parametrize("hkv,s,d,causal,walk", [(8, 2048, 128, True, 0), (8, 1024, 128, True, 1),
                                                   (32, 2048, 128, True, 1), (32, 512, 64, True, 0),
                                                   (32, 512, 64, False, 1), (8, 4096, 256, False, 1)])
def test_persistent_plan_runs_and_names_the_resolved_walk(monkeypatch, hkv, s, d, causal, walk):
    """A call's plan (meta tensors, 132 SMs) launches the walk `preferred_walk` picks for the default config, with
    that walk's integers (walk 0: heads per L2 chunk; walk 1: the GQA group), and its name says which."""
    from xkernels import plans

    monkeypatch.setattr(plans, "sm_count", lambda index: 132)
    q = torch.empty(16384 // s, 32, s, d, device="meta", dtype=torch.bfloat16)
    k = torch.empty(16384 // s, hkv, s, d, device="meta", dtype=torch.bfloat16)
    plan = plans.PersistentAttention.make(q, k, k, None, ATTENTION_RECIPES["bf16"], PERSISTENT_ATTENTION_CONFIGS[d],
                                          is_causal=causal, return_lse=False, positive_scale=True)
    assert plan.name.endswith(f"persistent grid=132 walk={walk}]") and plan.constexprs["WALK"] == walk
    if walk:
        assert plan.ints[-2] == 32 // hkv


def test_an_override_is_not_checked_against_a_persistent_config_that_stays_off():
    """chained=1 is valid for the dense kernel (one Q slot whatever it says) and must not fail where the override
    turns the persistent kernel off; at D256, where two Q slots overflow the persistent kernel's shared memory, the
    override that leaves it on is refused."""
    from xkernels.select import _hopper_forward, parse_backend

    bf16 = ATTENTION_RECIPES["bf16"]
    forward = _hopper_forward(256, bf16, parse_backend("hopper:chained=1,persistent=0"))
    assert forward.dense.chained == 1 and forward.persistent is None
    with pytest.raises(ValueError, match="shared memory"):
        _hopper_forward(256, bf16, parse_backend("hopper:chained=1"))


def test_an_override_the_persistent_kernel_cannot_take_leaves_the_dense_kernel():
    """"hopper:stages=3" at D128 fits the dense kernel (one Q slot) but not the persistent one (two Q slots and O
    buffers): the forward runs the dense kernel for every shape rather than refusing the call; an override that
    also names a persistent-only field still gets the persistent kernel's error."""
    from xkernels.select import _hopper_forward, parse_backend

    bf16 = ATTENTION_RECIPES["bf16"]
    forward = _hopper_forward(128, bf16, parse_backend("hopper:stages=3"))
    assert forward.dense.stages == 3 and forward.persistent is None
    assert _hopper_forward(128, bf16, parse_backend("hopper:overlap=0")).persistent is not None
    for fields in ("stages=3,persistent=2", "stages=3,chained=1"):
        with pytest.raises(ValueError, match="shared memory"):
            _hopper_forward(128, bf16, parse_backend("hopper:" + fields))


def test_deterministic_false_takes_the_fused_dq_backward_where_it_exists(monkeypatch):
    """The backward's choice on a (pretended) sm_90: deterministic=False fuses dQ into the dK/dV kernel at D64 and
    D128 without a window on more than one query block; deterministic=True, one query block, a window, D256 (its
    head-dim split has no fused variant) and the packed backward keep the Gluon dQ kernel beside dK/dV (bitwise
    repeatable); a soft cap the portable kernels."""
    from xkernels import select

    monkeypatch.setattr(select, "hopper_available", lambda device: True)
    bf16 = torch.bfloat16

    def choice(d, backend="hopper", sq=65, **kw):  # a forced "hopper" fuses on more than one query block
        q = torch.zeros(1, 2, sq, d, dtype=bf16)
        k = torch.zeros(1, 2, 8, d, dtype=bf16)
        o, lse = torch.zeros_like(q), torch.zeros(1, 2, sq)
        return select.resolve_attention_backward(torch.zeros_like(q), q, k, k, o, lse, None, enable_gqa=False,
                                                 precision="auto", backend=backend, **kw)[1]

    for d in (64, 128):
        # causal without a window: (-1, 0) from the API's checked window (sinks, a soft cap), else (-1, -1)
        for kw in ({}, {"is_causal": True}, {"is_causal": True, "window": (-1, 0)}):
            fused = choice(d, deterministic=False, **kw)
            assert fused.layer == "hopper" and fused.config.dkdv == FUSED_BWD_CONFIGS[d] and fused.config.dq is None, kw
        for kw in ({}, {"deterministic": True}, {"deterministic": False, "window": (16, 0), "is_causal": True}):
            split = choice(d, **kw)
            assert split.config.dkdv.fused_dq == 0 and split.config.dq is not None, kw
    for d in (64, 128):  # one query block (64 rows) or less: the split pair, forced layer or not
        for sq in (1, 64):
            for backend in ("hopper", "auto"):
                split = choice(d, backend=backend, sq=sq, deterministic=False)
                assert split.config.dkdv.fused_dq == 0 and split.config.dq is not None, (d, sq, backend)
    assert choice(256, deterministic=False).config.dkdv.split_d
    assert choice(128, deterministic=False, softcap=30.0).layer == "portable"
    with pytest.raises(TypeError, match="deterministic"):
        choice(128, deterministic=0)
    assert select.hopper_backward(128, select.portable_configs.attention_bwd_config(128, None)).dq is not None
    # "auto": this shape is below every fused threshold but D128's and D64's full ones (none)
    for d in (64, 128):
        assert choice(d, backend="auto", deterministic=False).config.dkdv == FUSED_BWD_CONFIGS[d]
    for d, causal in ((128, True), (64, True)):
        assert choice(d, backend="auto", deterministic=False, is_causal=causal).config.dkdv.fused_dq == 0


@pytest.mark.parametrize(("d", "causal", "batch", "q_heads", "kv_heads", "skv", "fused"), [
    (128, False, 1, 1, 1, 128, True),  # D128 full: fused at every length
    (128, True, 4, 16, 16, 8192, True),  # 4 x 64 key blocks x 16 heads = 4096 units and CTAs
    (128, True, 1, 32, 32, 8192, False),  # 2048 units
    (128, True, 4, 15, 15, 8192, False),
    (128, True, 32, 16, 16, 4096, False),  # enough work, too few keys
    (128, True, 8, 32, 8, 8192, True),  # GQA: 16384 units on 4096 CTAs
    (128, True, 1, 32, 8, 16384, True),  # GQA: 4096 units on 1024 CTAs
    (128, True, 1, 32, 8, 8192, False),  # GQA: 2048 units on 512 CTAs
    (64, False, 1, 32, 8, 8192, True),  # D64 full: fused at every shape (512 CTAs)
    (64, False, 1, 1, 1, 128, True),
    (64, True, 1, 32, 8, 16384, True),  # GQA: 1024 CTAs
    (64, True, 1, 32, 8, 16256, False),  # one key block short of 1024 CTAs
    (64, True, 2, 16, 16, 16384, True),
    (64, True, 32, 16, 16, 1024, True),  # D64 causal: from 1024 CTAs at any length
    (64, True, 1, 32, 8, 8192, False),  # GQA: 512 CTAs
    (256, False, 8, 32, 32, 16384, False),  # no fused variant
])
def test_fused_dq_pays_where_the_sweep_measured_it_faster(d, causal, batch, q_heads, kv_heads, skv, fused):
    from xkernels import select

    assert select.fused_dq_pays(d, causal, batch, q_heads, kv_heads, skv) is fused


@pytest.mark.parametrize(("d", "hq", "hkv", "sq", "kw", "v_pass"), [
    (128, 1, 1, 2048, {}, True),  # 2048 query rows per KV head
    (128, 1, 1, 1024, {}, False),
    (128, 1, 1, 4096, {"is_causal": True}, True),  # a causal mask halves the work per V element
    (128, 1, 1, 2048, {"is_causal": True}, False),
    (128, 4, 1, 1024, {"is_causal": True}, True),  # GQA: the group's rows share V
    (128, 4, 2, 1024, {"is_causal": True}, False),
    (256, 1, 1, 2048, {}, True),
    (64, 1, 1, 8192, {}, True),  # D64's in-kernel conversion is cheap: the pass pays later
    (64, 1, 1, 8192, {"is_causal": True}, False),
    (128, 1, 1, 8192, {"window": (1024, 0), "is_causal": True}, False),  # a band bounds the work per V element
    (128, 1, 1, 8192, {"precision": "bf16"}, False),  # no conversion to move
    (128, 1, 1, 8192, {"backend": "hopper:v_pass=0"}, False),  # an explicit override decides alone
    (128, 1, 1, 64, {"backend": "hopper:v_pass=1"}, True),
    (128, 1, 1, 8192, {"backend": "hopper:stages=3"}, True),  # other fields keep the rule
    (128, 1, 1, 8192, {"backend": "hopper:convert_steps=4"}, False),  # the producer's conversion named
    (128, 1, 1, 8192, {"precision": "bf16io-acc16"}, False),  # never timed with the pass
    (128, 1, 1, 8192, {"softcap": 30.0}, False),  # calls it was not measured on
    (128, 1, 1, 8192, {"sinks": torch.zeros(1)}, False),
])
def test_bf16io_converts_v_by_a_pass_from_enough_query_rows_per_kv_head(monkeypatch, d, hq, hkv, sq, kw, v_pass):
    """`select.v_pass_pays` on a (pretended) sm_90: bf16io's V is converted by one pass before the kernel where the
    query rows of a KV head's group (halved by a causal mask) reach `V_PASS_MIN_ROWS`, for the dense and the
    persistent kernel alike; else the producer converts it."""
    monkeypatch.setattr(select, "hopper_available", lambda device: True)
    q = torch.zeros(1, hq, sq, d, dtype=torch.bfloat16)
    k = torch.zeros(1, hkv, sq, d, dtype=torch.bfloat16)
    kw = {"precision": "bf16io", "backend": "auto"} | kw
    _, choice = select.resolve_attention(q, k, k, None, enable_gqa=hq != hkv, **kw)
    assert choice.layer == "hopper" and choice.config.dense.v_pass == v_pass, (choice, kw)
    if choice.config.persistent is not None:
        assert choice.config.persistent.v_pass == v_pass


def test_pingpong_needs_the_chained_kernels_two_warpgroups():
    """`pingpong=1` (the warpgroups' turns): the chained persistent kernel at D64/D128 takes it (name -pp, constexpr
    PINGPONG); unchained, three warpgroups or D256 (one Q slot, not chained) are refused naming the field; the dense
    kernel ignores it as it ignores `chained`."""
    from xkernels.hopper.configs import PERSISTENT_ATTENTION_CONFIGS as P

    bf16 = ATTENTION_RECIPES["bf16"]
    for d in (64, 128):
        cfg = dataclasses.replace(P[d], pingpong=1, walk=1, flat=0)
        cfg.check(d, bf16, "persistent")
        assert "-ch-pp-hm" in str(cfg)
        assert cfg.constexprs(d, bf16, causal=True, positive_scale=True, write_lse=True, persistent=True)["PINGPONG"]
        dataclasses.replace(CONFIGS[d], pingpong=1).check(d, bf16)  # the dense kernel: ignored
    for d, fields in ((128, dict(chained=0)), (64, dict(consumers=3, overlap=0)), (256, {}), (128, dict(pingpong=2))):
        cfg = dataclasses.replace(P[d], **({"pingpong": 1} | fields))
        with pytest.raises(ValueError, match="pingpong="):
            cfg.check(d, bf16, "persistent")


def test_flat_needs_the_chained_kernel():
    """`flat=1` (one loop over a program's tiles): the chained persistent kernel takes it, with turns too (name
    -fl, constexpr FLAT); unchained (D256's config, or chained=0) it is refused naming the field."""
    from xkernels.hopper.configs import PERSISTENT_ATTENTION_CONFIGS as P

    bf16 = ATTENTION_RECIPES["bf16"]
    for d in (64, 128):
        cfg = dataclasses.replace(P[d], flat=1, pingpong=1, walk=0)
        cfg.check(d, bf16, "persistent")
        assert "-ch-pp-fl-l2" in str(cfg)
        assert cfg.constexprs(d, bf16, causal=False, positive_scale=True, write_lse=True, persistent=True)["FLAT"]
    for d, fields in ((128, dict(chained=0)), (256, {}), (64, dict(flat=3)), (64, dict(consumers=3, overlap=0))):
        with pytest.raises(ValueError, match="flat="):
            dataclasses.replace(P[d], **({"flat": 1} | fields)).check(d, bf16, "persistent")


def test_flat_rule_resolves_per_shape():
    """Config flat=2 (the default): the one-loop consumer for chained causal rows of up to 512 keys
    (`preferred_flat`), the chained consumer elsewhere; D256's unchained config never takes it."""
    from xkernels.hopper import attention_persistent as hp
    from xkernels.hopper.configs import PERSISTENT_ATTENTION_CONFIGS as P

    bf16 = ATTENTION_RECIPES["bf16"]
    assert P[128].flat == 2

    def flat(d, skv, causal, group=1):
        return hp.launch_spec(16384 // skv, 32, skv, skv, d, group, 2, 132, is_causal=causal, recipe=bf16,
                              positive_scale=True, write_lse=False, cfg=P[d])[2]["FLAT"]

    assert [flat(128, s, True) for s in (256, 512, 1024, 4096)] == [True, True, False, False]
    assert not flat(128, 512, False) and flat(64, 512, True) and flat(128, 512, True, group=4)
    assert not flat(256, 512, True)
    three = dataclasses.replace(P[64], consumers=3, overlap=0)  # measured with two warpgroups only
    assert hp.resolved(three, bf16, 512, True, 1, 64).flat == 0
    assert hp.resolved(P[128], ATTENTION_RECIPES["bf16io"], 512, True, 1, 128).flat == 0  # V converted in the kernel
    assert hp.resolved(dataclasses.replace(P[128], flat=0), bf16, 512, True, 1, 128).flat == 0  # an override holds


def test_the_packed_kernel_refuses_the_dense_consumers_switches():
    """`pingpong=1` and `flat=1` are the dense persistent kernel's consumers; the packed kernel has neither and
    refuses them naming the field (as it refuses `o_store`), instead of a name that claims them."""
    from xkernels.hopper.configs import PERSISTENT_ATTENTION_CONFIGS as P

    bf16 = ATTENTION_RECIPES["bf16"]
    P[128].check(128, bf16, "varlen_persistent")  # flat=2 (by shape) is the dense kernel's rule: not refused
    for fields in (dict(pingpong=1), dict(flat=1)):
        with pytest.raises(ValueError, match="the packed"):
            dataclasses.replace(P[128], **fields).check(128, bf16, "varlen_persistent")


def test_even_keys_reaches_only_dense_full_masks_over_whole_key_blocks():
    """EVEN_KEYS (config `even_keys`: full rows over whole key blocks walk one unmasked loop) is set only where the
    config opts in and the call is dense, its mask full and its keys a multiple of BLOCK_N: never for a packed
    batch, whose sequences end anywhere in a block, nor for a causal or windowed mask (no second program)."""
    from xkernels.common.seqlen import Band

    for shipped in (*ATTENTION_BWD_CONFIGS.values(), *FUSED_BWD_CONFIGS.values()):
        assert not shipped.even_keys  # opt-in until measured
        assert not shipped.constexprs(128, causal=False, whole_key_blocks=True)["EVEN_KEYS"]
        cfg = dataclasses.replace(shipped, even_keys=1)
        assert str(cfg).endswith("-ek")
        assert cfg.constexprs(128, causal=False, whole_key_blocks=True)["EVEN_KEYS"]
        assert not cfg.constexprs(128, causal=False)["EVEN_KEYS"]
        assert not cfg.constexprs(128, causal=False, varlen=True, whole_key_blocks=True)["EVEN_KEYS"]
        assert not cfg.constexprs(128, causal=True, whole_key_blocks=True)["EVEN_KEYS"]
        for window in ((16, -1), (-1, 16), (16, 16)):
            band = Band.of(False, window)
            assert not cfg.constexprs(128, causal=False, band=band, whole_key_blocks=True)["EVEN_KEYS"], window


@pytest.mark.parametrize(("d", "batch", "q_heads", "kv_heads", "s", "parts"), [
    (128, 1, 16, 4, 4096, 2),  # 128 dK/dV programs on 132 SMs, a part walks 2 heads x 64 query blocks
    (64, 1, 32, 4, 4096, 2),
    (128, 1, 8, 2, 4096, 2),  # 64 programs
    (128, 1, 8, 2, 8192, 2),
    (128, 1, 32, 8, 4096, 1),  # 256 programs: 2 parts pass two waves
    (128, 1, 32, 8, 2048, 1),  # 2 parts would walk 64 steps each
    (128, 4, 16, 4, 4096, 1),
    (128, 1, 16, 16, 4096, 1),  # no group to split (MHA)
    (128, 1, 6, 2, 8192, 1),  # a group of 3: only powers of two that divide it
    (128, 1, 12, 2, 8192, 2),  # a group of 6: 2 divides it
    (256, 1, 16, 4, 4096, 1),  # D256's split head dim: no parts
    (64, 1, 64, 1, 4096, 2),  # MQA on 32 programs: capped at GROUP_PARTS_MAX
])
def test_group_parts_rule(d, batch, q_heads, kv_heads, s, parts):
    from xkernels import select

    assert select.group_parts(d, batch, q_heads, kv_heads, s, s, 132) == parts


def test_group_parts_config_names_and_constexprs():
    from xkernels import select
    from xkernels.portable import configs as portable_configs

    hb = select.hopper_backward(128, portable_configs.attention_bwd_config(128, None), group_parts=2)
    assert "-gp2" in str(hb) and hb.dkdv.constexprs(128, causal=True)["GROUP_PARTS"] == 2
    assert select.hopper_backward(128, hb.portable).dkdv.group_parts == 1
    assert select.hopper_backward(64, hb.portable, fused_dq=True, group_parts=2).dkdv.group_parts == 1
