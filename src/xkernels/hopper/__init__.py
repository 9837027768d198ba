"""Hopper (sm_90) fast path in Gluon: explicit TMA, mbarrier split-barrier pipelines, async wgmma, warp specialization.

Gluon's API moves between triton releases; this layer is used only with the version it was tested on (see
`runtime.available`), and the dispatcher says which layer ran.
"""
