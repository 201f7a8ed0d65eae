#!/usr/bin/env bash
# Type-checks kernels/cuda/src as CUDA device code with clang, on a machine
# without nvcc or a GPU (apt-get install clang), before a fatbin build on
# the GPU machine costs device time. It compiles the same single
# translation unit build_fatbin.sh does, for sm_80 (clang 14 knows no sm_90a), with the
# declarations in tools/cuda/stub/ standing in for the CUDA headers:
#
#	tools/cuda/check_cuda.sh [KERNEL_DIR]
#
# Syntax, types, overloads and host/device placement are checked; code
# generation, register use and nvcc-only diagnostics are not.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kdir="$(cd "${1:-$here/../../kernels/cuda}" && pwd)"
CLANG="${CLANG:-clang++}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
{
	echo "#include \"$here/stub/cuda_runtime_stub.h\""
	(cd "$kdir" && ls src/*.cu | LC_ALL=C sort) | while read -r f; do echo "#include \"$kdir/$f\""; done
} >"$tmp/ferrite.cu"
for arch in sm_80; do
	"$CLANG" -x cuda --cuda-device-only --cuda-gpu-arch="$arch" -nocudainc -nocudalib \
		-std=c++17 -fsyntax-only -Wall -Wno-unknown-cuda-version -I "$here/stub" "$tmp/ferrite.cu"
done
echo "check_cuda: $(cd "$kdir" && ls src/*.cu | wc -l) sources type-check as device code"
