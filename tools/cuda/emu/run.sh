#!/usr/bin/env bash
# Runs kernels/cuda/src/ops_decode.cu's kernels on the host against
# double-precision references, without a GPU (emu.h: one OS thread, the
# blocks one after another, a block's threads as fibers):
#
#	nice -n 19 tools/cuda/emu/run.sh [-quick]
#
# Checks logic (indices, splits, tiles, the merge, the counters), not speed
# or the GPU's exact bits.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/../../../kernels/cuda/src"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
{
	echo "#include \"$here/emu.h\""
	python3 "$here/extract.py" "$src"
	echo "#define FERRITE_HOST_EMU"
	echo "#include \"$src/ops_decode.cu\""
	echo "#include \"$here/main.cpp\""
} >"$tmp/emu.cpp"
"${CXX:-g++}" -std=c++20 -O1 -ffp-contract=off -w -o "$tmp/emu" "$tmp/emu.cpp"
"$tmp/emu" "$@"
