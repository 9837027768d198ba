#!/usr/bin/env bash
# Pack a triton release for the device machine (no network, 64 MB per call): the cp312 wheel unpacked, without CUPTI,
# the sm_100 ptxas, the instrumentation and plugin test libraries, FileCheck and AMD headers, its shared libraries
# stripped of debug info, as one tar.xz (3.7.1: 198 MB wheel -> 50 MB). Run from the repo root; .carry/ is
# git-excluded. On the device: XK_TRITON_TARBALL=.carry/t<ver>/triton<ver>.tar.xz bash scripts/op_session.sh ...
# (the call's `carry` names .carry/t<ver>).
#   bash scripts/carry_triton.sh 3.7.1
set -euo pipefail
version=${1:?usage: carry_triton.sh VERSION}
tag=${version//./}
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$work" "triton==$version"
mkdir "$work/site" && (cd "$work/site" && unzip -q "$work"/triton-*.whl)
rm -rf "$work/site/triton/backends/nvidia/lib/cupti" "$work/site/triton/backends/nvidia/bin/ptxas-blackwell" \
  "$work/site/triton/instrumentation" "$work/site/triton/plugins" "$work/site/triton/FileCheck" \
  "$work/site/triton/backends/amd/include"
strip --strip-unneeded "$work"/site/triton/_C/*.so
mkdir -p ".carry/t$tag"
tar -C "$work/site" -cf - . | xz -9 -T0 > ".carry/t$tag/triton$tag.tar.xz"
rm -rf "$work"
ls -la ".carry/t$tag"
