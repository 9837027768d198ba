"""Hopper (sm_90) fast path in Gluon: explicit TMA, mbarrier split-barrier pipelines, async wgmma, warp specialization.

Gluon's API moves between triton releases; this layer is used only with the version it was tested on (see
`common/runtime.TESTED_TRITON`), and `last_backend()` says which layer ran.
"""
