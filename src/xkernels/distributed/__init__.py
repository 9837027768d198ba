"""Context parallelism: attention over a sequence sharded across GPUs (ring attention over torch.distributed)."""

from xkernels.distributed.layout import LAYOUTS, shard, unshard
from xkernels.distributed.ring import ring_attention

__all__ = ["LAYOUTS", "ring_attention", "shard", "unshard"]
