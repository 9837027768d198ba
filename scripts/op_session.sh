#!/usr/bin/env bash
# The op layer on the device, in one call: install, a smoke test of both launch paths under a timeout, the op tests
# (CUDA graphs, torch.compile, direct vs generic launch), `xkernels bench --suite host` with the direct launcher and
# with XKERNELS_DIRECT_LAUNCH=0 (Triton's generic path), leaving everything under $OUT. Exit code: failed stages.
#   bash scripts/op_session.sh "[smoke] [optests] [tests] [host] [floor] [check] [sanitize] [bench] [grad] [tiles]
#                              [train] [trainpacked] [bwdbench] [gradacc] [memory] [decode] [decodebench] [varlenbench] [hf] [dq] [gpuinf] [sweep] [skinny] [ring] [persistent] [persistentab] [chain] [varlenp] [varlendebug] [varlenab] [varlenbwd] [persistent256] [l2chunk] [acc16] [bwd256] [bwdab] [gputests]
#                              [fusedab] [hosttime] [window] [windowbwd] [varlenwindow] [sinkscap] [varlenhost] [varlenplan] [decodeseq]"
#                              (default: smoke host)
# XK_TRITON_TARBALL=path: first unpack a carried triton build (a tar.xz of site-packages, see benchmarks/README.md)
# and run everything on it.
set -uo pipefail
. "$(dirname "$0")/session_lib.sh"
if [ -n "${XK_TRITON_TARBALL:-}" ]; then
  mkdir -p /tmp/xk-triton && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$XK_TRITON_TARBALL" /tmp/xk-triton && export PYTHONPATH=/tmp/xk-triton${PYTHONPATH:+:$PYTHONPATH}
fi
stage python3 -m pip install -q --no-deps --no-build-isolation -e .
stage python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
for part in "${@:-smoke host}"; do
  for p in $part; do
    case "$p" in
      smoke) stage timeout 180 python3 scripts/small_shapes.py --check ;;
      host)
        stage timeout 240 xkernels bench --suite host --out "$OUT/host-direct"
        XKERNELS_DIRECT_LAUNCH=0 stage timeout 240 xkernels bench --suite host --out "$OUT/host-generic" ;;
      tests) stage timeout 480 python3 -m pytest -q -p no:cacheprovider $XDIST --durations=10 tests ;;
      optests) stage timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_ops_gpu.py tests/test_ops.py ;;
      floor) stage timeout 150 python3 scripts/host_floor.py --json "$OUT/host_floor.json" ;;
      check) stage timeout 150 xkernels check --json "$OUT/check.json" ;;
      sanitize)  # memcheck and synccheck over every variant's first (compiling) and cached (direct) launch
        for tool in memcheck synccheck; do
          stage timeout 170 compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 20 \
            python3 scripts/small_shapes.py --check
        done ;;
      grad) stage timeout 420 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_backward.py tests/test_ops.py \
              tests/gpu ;;
      tiles) stage timeout 300 python3 scripts/bwd_tiles.py --json "$OUT/bwd_tiles.json" ;;
      gradacc) stage timeout 300 python3 scripts/grad_accuracy.py --json "$OUT/grad_accuracy.json" ;;
      memory) stage timeout 120 python3 scripts/bwd_memory.py --json "$OUT/bwd_memory.json" ;;
      train) stage timeout 300 python3 examples/train_bytes.py --steps 300 --out "$OUT/train" ;;
      trainpacked) stage timeout 300 python3 examples/train_bytes.py --steps 300 --packed --out "$OUT/train-packed" ;;
      dq) stage timeout 200 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_dq.py
          stage timeout 300 python3 scripts/dq_ab.py --json "$OUT/dq_ab.json" ;;
      gpuinf)  # the inference ops and integrations on the GPU, the graph-captured decode step among the op tests
        stage timeout 300 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_varlen.py tests/gpu \
          tests/integrations ;;
      skinny)  # the few-row GEMM on the device: its tests, then its tile sweep against torch.matmul
        stage timeout 200 python3 -m pytest -q -p no:cacheprovider $XDIST tests/portable/test_gemm_skinny.py \
          tests/portable/test_gemm.py tests/test_ops.py
        stage timeout 330 python3 scripts/skinny_tiles.py --json "$OUT/skinny_tiles.json" ;;
      ring)  # needs the 2-GPU kind (nvidia-h200-x2): ring attention against one GPU, with compute and transfers apart
        stage timeout 300 python3 scripts/ring_bench.py --gpus 2 --json "$OUT/ring.json" ;;
      persistent)  # the persistent Hopper forward's GPU tests and the attention kernel tests that name configs
        stage timeout 300 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_persistent.py \
          tests/gpu/test_gpu_kernels.py -k "persistent or attention" ;;
      persistentab) stage timeout 400 python3 scripts/persistent_ab.py --json "$OUT/persistent_ab.json" \
          --md "$OUT/persistent_ab.md" ;;
      chain)  # the persistent kernel's variants on the short rows (where tiles are many) against the dense one and
              # cuDNN; the shipped configs chain tiles
        stage timeout 170 python3 scripts/persistent_ab.py --dims 128 --lengths 512 1024 2048 4096 \
          --variants hopper:persistent=2,chained=0 hopper:persistent=2 --json "$OUT/chain_ab_d128.json" \
          --md "$OUT/chain_ab_d128.md"
        stage timeout 150 python3 scripts/persistent_ab.py --dims 64 --lengths 512 1024 2048 4096 \
          --variants hopper:persistent=2,consumers=3,overlap=0 hopper:persistent=2 \
          --json "$OUT/chain_ab_d64.json" --md "$OUT/chain_ab_d64.md" ;;
      l2chunk)  # the persistent walk's head chunk (K/V bytes walked together) on the sweep's 1K-4K rows
        stage timeout 300 python3 scripts/persistent_ab.py --dims 128 64 --lengths 1024 2048 4096 \
          --variants hopper:persistent=2,walk=0 hopper:persistent=2,walk=0,l2_budget_kib=32768 \
          hopper:persistent=2,walk=0,l2_budget_kib=8192 --json "$OUT/l2chunk_ab.json" --md "$OUT/l2chunk_ab.md" ;;
      persistent256)  # the persistent walk at D256 (one Q slot, 64-key tiles, O through the Q slot or from registers;
        # the 32-key tiles with O buffers, and chained with O through the Q slots) against the dense kernel, 512-4K
        stage timeout 300 python3 scripts/persistent_ab.py --dims 256 --lengths 512 1024 2048 4096 \
          --variants hopper:persistent=2 hopper:persistent=2,o_store=1 hopper:persistent=2,block_n=32,stages=3,o_store=0 \
          hopper:persistent=2,block_n=32,stages=3,chained=1 --json "$OUT/persistent256_ab.json" \
          --md "$OUT/persistent256_ab.md" ;;
      gemmtiles) stage timeout 330 python3 scripts/gemm_tiles.py --json "$OUT/gemm_tiles.json" --md "$OUT/gemm_tiles.md" ;;
      varlenp)  # the persistent varlen forward: its GPU tests and the varlen tests, then the packed-batch bench
        stage timeout 140 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_varlen_persistent.py \
          tests/test_varlen.py
        stage timeout 100 xkernels bench --suite varlen --iters 20 --out "$OUT/bench-varlen" ;;
      varlendebug)  # the persistent varlen forward's faults localized: every variant and small batch, per 64-row block
        stage timeout 420 python3 scripts/varlen_persistent_debug.py --json "$OUT/varlen_debug.json"
        # the illegal address of run 36 (D128, full): memcheck names the faulting instruction and address
        stage timeout 240 compute-sanitizer --tool memcheck --print-limit 10 \
          python3 scripts/varlen_persistent_debug.py --one 128 0 1 2 ;;
      bwd256)  # the D256 backward (split_d dK/dV tiles, the Gluon dQ): its GPU tests, then variants vs portable, cuDNN
        stage timeout 240 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_dq.py \
          tests/test_backward.py -k "256 or larger"
        stage timeout 300 python3 scripts/bwd_ab.py --dims 256 --json "$OUT/bwd_d256_ab.json" --md "$OUT/bwd_d256_ab.md" ;;
      bwdab)  # the D64 and D128 backward's ring depths and dQ key tiles, against the portable backward and cuDNN
        stage timeout 400 python3 scripts/bwd_ab.py --dims 128 64 --json "$OUT/bwd_ab.json" --md "$OUT/bwd_ab.md" ;;
      gputests)  # every GPU test, the op, backward (dense, varlen, matmul) and varlen tests on the device
        stage timeout 420 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu tests/test_varlen.py \
          tests/test_backward.py tests/test_varlen_backward.py tests/test_matmul_backward.py tests/test_ops.py ;;
      varlenab) stage timeout 200 python3 scripts/varlen_ab.py --json "$OUT/varlen_ab.json" --md "$OUT/varlen_ab.md" ;;
      varlenbwd)  # the packed backward: the Gluon VARLEN variants' float64 tests, then timing against padded SDPA
        stage timeout 240 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_varlen_bwd.py \
          tests/test_varlen_backward.py
        stage timeout 300 python3 scripts/varlen_bwd_ab.py --json "$OUT/varlen_bwd_ab.json" --md "$OUT/varlen_bwd_ab.md" ;;
      acc16) stage timeout 300 python3 scripts/acc16_ab.py --json "$OUT/acc16_ab.json" ;;
      sweep) stage timeout 560 xkernels bench --suite sweep --iters 20 --out "$OUT/bench-sweep" ;;
      bwdbench) stage timeout 300 xkernels bench --suite attention-bwd --quick --iters 20 --out "$OUT/bench-bwd" ;;
      decode)  # the inference ops' tests on the GPU, then the split-KV sweep against SDPA
        stage timeout 200 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_kvcache.py tests/test_varlen.py \
          tests/integrations tests/test_ops.py
        stage timeout 330 python3 scripts/decode_sweep.py ${DECODE_SWEEP_ARGS:-} --json "$OUT/decode_sweep.json" ;;
      decodebench) stage timeout 240 xkernels bench --suite decode --iters 40 --out "$OUT/bench-decode" ;;
      hf) stage python3 -c "import transformers; print('transformers', transformers.__version__)" && \
            stage timeout 300 python3 scripts/transformers_1b.py --json "$OUT/transformers_1b.json" ;;
      varlenbench) stage timeout 240 xkernels bench --suite varlen --iters 20 --out "$OUT/bench-varlen" ;;
      fusedab)  # the split-KV decode with its merge fused into the kernel against the combine kernel, D128 and D64
        stage timeout 120 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_kvcache.py -k "merge"
        stage timeout 240 python3 scripts/decode_paged_ab.py --fused --configs 128,8,3 --json "$OUT/fused_ab.json" \
          --md "$OUT/fused_ab.md"
        stage timeout 150 python3 scripts/decode_paged_ab.py --fused --dim 64 --caches dense --configs 128,8,3,64,2 \
          --json "$OUT/fused_ab_d64.json" --md "$OUT/fused_ab_d64.md" ;;
      hosttime)  # host time: the backward's, a 1B Llama's generate() against sdpa, the host floor
        stage timeout 60 python3 scripts/bwd_host_profile.py --calls 100
        stage timeout 60 python3 scripts/host_floor.py --json "$OUT/host_floor.json"
        stage timeout 240 bash -c "cd scripts && python3 generate_host.py --rounds 3 --json '$OUT/generate_host.json'" ;;
      window)  # windows, soft caps, sinks: the Gluon band's GPU tests, the portable kernels' tests compiled, the suite
        stage timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hopper_window.py
        stage timeout 300 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_window.py tests/test_softcap.py \
          tests/test_sinks.py \
          tests/test_fuzz.py tests/integrations -k "window or softcap or soft_capped or sinks"
        stage timeout 280 xkernels bench --suite window --iters 20 --out "$OUT/bench-window" ;;
      windowbwd)  # the Gluon backward's band: its GPU tests, the CPU suite's window and backward tests, the suite
        stage timeout 200 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_window.py
        stage timeout 170 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_window.py tests/test_backward.py \
          tests/gpu/test_backward_plan.py tests/integrations -k "not generate or window"
        stage timeout 200 xkernels bench --suite window --iters 20 --out "$OUT/bench-window" ;;
      varlenwindow)  # the varlen forward's Gluon band: its GPU tests, then against the portable band
        stage timeout 110 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_window.py -k varlen
        stage timeout 50 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_window.py -k "varlen or forcing"
        stage timeout 60 python3 scripts/varlen_window_ab.py --json "$OUT/varlen_window_ab.json" \
          --md "$OUT/varlen_window_ab.md" ;;
      sinkscap)  # the Gluon forwards' sinks and soft caps: their GPU tests, the band's, then the window suite
        stage timeout 200 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_hopper_sinks_softcap.py \
          tests/gpu/test_hopper_window.py
        stage timeout 120 python3 -m pytest -q -p no:cacheprovider $XDIST tests/test_softcap.py tests/test_sinks.py
        stage timeout 240 xkernels bench --suite window --iters 20 --out "$OUT/bench-window" ;;
      varlenhost)  # the cu_seqlens device check: the varlen tests on the GPU, then host time (dense and varlen)
        stage timeout 240 python3 -m pytest -q -p no:cacheprovider $XDIST tests/portable/test_cu_seqlens.py \
          tests/test_varlen.py tests/test_varlen_backward.py tests/gpu/test_hopper_varlen_bwd.py \
          tests/gpu/test_hopper_varlen_persistent.py tests/gpu/test_hopper_window.py -k "varlen or cu_seqlens or bad"
        stage timeout 120 python3 scripts/bwd_host_profile.py --calls 200 ;;
      varlenplan)  # the packed backward's plan: its GPU tests, the varlen and backward GPU tests, host time, the suite
        stage timeout 240 python3 -m pytest -q -p no:cacheprovider $XDIST tests/gpu/test_varlen_backward_plan.py \
          tests/gpu/test_hopper_varlen_bwd.py tests/gpu/test_backward_plan.py tests/test_varlen_backward.py \
          tests/test_varlen.py tests/test_backward.py tests/portable/test_cu_seqlens.py
        stage timeout 120 python3 scripts/bwd_host_profile.py --calls 200
        stage timeout 200 xkernels bench --suite varlen --iters 20 --out "$OUT/bench-varlen" ;;
      decodeseq)  # paged decode with the pages shuffled and in order (an identity table), shipped and BN64 tiles
        stage timeout 300 python3 scripts/decode_paged_ab.py --caches paged16 paged16seq paged64 dense \
          --configs 128,8,3 64,4,4 64,8,4 --json "$OUT/decode_seq.json" --md "$OUT/decode_seq.md" ;;
      bench)
        stage timeout 280 xkernels bench --suite attention --quick --iters 40 --out "$OUT/bench-attention"
        stage timeout 200 xkernels bench --suite gemm --quick --iters 40 --out "$OUT/bench-gemm" ;;
      *) echo "unknown part $p"; failed=$((failed + 1)) ;;
    esac
  done
done
echo "=== failed stages: $failed" | tee -a "$LOG"
exit "$failed"
