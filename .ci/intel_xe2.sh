#!/usr/bin/env bash
# Intel Xe2 compile gate: the portable kernels compiled offline for Xe2 by the Intel backend on the package registry
# (triton-xpu 3.3.0b1, a pre-release), `xkernels inspect --target xe2` counting DPAS in each config's LLVM IR.
# triton-xpu ships the same top-level `triton` module as the CUDA/ROCm wheel, so it gets its own venv.
# Step 1 needs root (apt): the Level Zero loader the backend links its SYCL helper against, and g++ to build it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libze-dev g++ >/dev/null
elif ! ldconfig -p | grep -q libze_loader; then
  echo "intel_xe2.sh: needs libze-dev and g++ (apt-get install -y libze-dev g++ as root)" >&2
  exit 1
fi
python3 -m venv .venv-xpu && . .venv-xpu/bin/activate
pip install -q torch==2.13.0 "numpy<2.4" rich
pip install -q --pre "triton-xpu==3.3.0b1" "intel-sycl-rt==2025.0.4" "intel-cmplr-lib-rt==2025.0.4" \
  "intel-cmplr-lib-ur==2025.0.4" "intel-cmplr-lic-rt==2025.0.4" "umf==0.9.1" "tcmlib==1.2.0"
pip install -q --no-deps -e .  # keeps triton-xpu: the package's triton pin names the CUDA/ROCm wheel
python -c "import triton.backends.intel, triton; print('triton', triton.__version__)"
# a fresh cache: a helper built earlier with a C compiler would be reused broken
CC=g++ TRITON_CACHE_DIR="$(mktemp -d)" xkernels inspect --target xe2 -j 2
