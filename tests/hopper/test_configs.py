"""HopperAttentionConfig.check: the configs the Gluon kernel cannot run fail with a ValueError naming the field (these
would otherwise be compile errors, spills or silently ignored switches); runs without a GPU."""

import dataclasses

import pytest

from xkernels.hopper.configs import ATTENTION_CONFIGS as CONFIGS
from xkernels.hopper.configs import HopperAttentionConfig
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
])
def test_rejected_configs_name_the_field(d, recipe, fields, match):
    cfg = dataclasses.replace(CONFIGS[d], **fields)
    with pytest.raises(ValueError, match=match):
        cfg.check(d, ATTENTION_RECIPES[recipe])


@pytest.mark.parametrize("d,recipe,fields", [
    (128, "fp16", dict(acc16=1)), (128, "bf16io", dict(acc16=1)),  # fp16 P.V: the switch applies
    (128, "bf16", dict(block_n=32)),  # no conversion, so no step size to cut
    (64, "bf16io", dict(consumers=3, convert_steps=2)), (128, "bf16io", dict(convert_steps=2)),
])
def test_accepted_overrides(d, recipe, fields):
    dataclasses.replace(CONFIGS[d], **fields).check(d, ATTENTION_RECIPES[recipe])


def test_name_shows_every_switch_off_its_default():
    assert str(HopperAttentionConfig(128, 2)) == "BM128-BN128-S2-ov"
    cfg = HopperAttentionConfig(64, 3, overlap=0, consumers=3, acc16=1, convert_steps=4)
    assert str(cfg) == "BM192-BN64-S3-acc16-cs4"
