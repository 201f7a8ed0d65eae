#!/usr/bin/env bash
# Runs kernels/cuda/src's kernels on the host against double-precision
# references, without a GPU (emu.h: one OS thread, the blocks one after
# another, a block's threads as fibers):
#
#	nice -n 19 tools/cuda/emu/run.sh [-quick]   # ops_decode.cu (main.cpp)
#	nice -n 19 tools/cuda/emu/run.sh -linattn   # the delta rule's kernels (linattn.cpp)
#	nice -n 19 tools/cuda/emu/run.sh -quant     # the quantized GEMV, decoding, experts' rows and MLA's projection (quant.cpp)
#	nice -n 19 tools/cuda/emu/run.sh -moe       # bf16 experts on the tensor cores, decode batches and prefill (moe.cpp)
#
# Checks logic (indices, splits, tiles, the merge, the counters), not speed
# or the GPU's exact bits.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/../../../kernels/cuda/src"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ "${1:-}" = "-linattn" ]; then
	shift
	{
		echo "#include \"$here/emu.h\""
		python3 "$here/extract.py" "$src" linattn
		echo "#define FERRITE_HOST_EMU"
		echo "#include \"$src/ops_linattn.cu\""
		echo "#include \"$src/ops_linattn_chunk.cu\""
		echo "#include \"$here/linattn.cpp\""
	} >"$tmp/emu.cpp"
elif [ "${1:-}" = "-quant" ]; then
	shift
	{
		echo "#include \"$here/emu.h\""
		python3 "$here/extract.py" "$src" quant
		echo "#define FERRITE_HOST_EMU"
		echo "#include \"$src/ops_common_quant.cu\""
		echo "#include \"$src/ops_quant.cu\""
		python3 "$here/extract.py" "$src" quant_mla
		echo "#include \"$here/quant.cpp\""
	} >"$tmp/emu.cpp"
elif [ "${1:-}" = "-moe" ]; then
	shift
	{
		echo "#include \"$here/emu.h\""
		python3 "$here/extract.py" "$src" moe
		echo "#define FERRITE_HOST_EMU"
		echo "#include \"$src/ops_moe_tc.cu\""
		echo "#include \"$here/moe.cpp\""
	} >"$tmp/emu.cpp"
else
	{
		echo "#include \"$here/emu.h\""
		python3 "$here/extract.py" "$src"
		echo "#define FERRITE_HOST_EMU"
		echo "#include \"$src/ops_decode.cu\""
		echo "#include \"$here/main.cpp\""
	} >"$tmp/emu.cpp"
fi
"${CXX:-g++}" -std=c++20 -O1 -ffp-contract=off -w -o "$tmp/emu" "$tmp/emu.cpp"
"$tmp/emu" "$@"
