#!/usr/bin/env bash
# Compiles kernels/cuda/src for sm_90 with a local nvcc (Debian's
# nvidia-cuda-toolkit, CUDA 11.8, and clang-14 as its host compiler; no
# GPU needed) and prints, for every kernel whose name matches PATTERN
# (an awk regular expression, default: all), the registers a thread, the
# bytes of stack frame and spill stores ptxas reports, the CALL
# instructions left in its SASS (functions not inlined: their array
# arguments live in local memory), its local-memory instructions (STL/LDL)
# and its SASS instructions in all:
#
#	tools/cuda/regs.sh [PATTERN]     # e.g. 'moe_(few|gt)'
#
# Register use, spills and calls are what device time is too scarce to
# find out on the GPU (session 21: a form at 255 registers, and capped, at
# a kilobyte of stack, measured 1.4–2.7× slower). CUDA 13's ptxas on the
# GPU machine allocates a little differently; the build takes ~2 minutes.
# Setup: enable contrib and non-free in /etc/apt/sources.list.d/debian.sources,
# then apt-get install nvidia-cuda-toolkit clang-14.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kdir="$here/../../kernels/cuda"
pattern="${1:-.}"
for tool in nvcc cuobjdump clang-14; do
	command -v "$tool" >/dev/null || {
		echo "regs.sh: $tool not found (apt-get install nvidia-cuda-toolkit clang-14)" >&2
		exit 2
	}
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
{
	echo '#include <cuda_runtime.h>'
	echo '#include <cuda_fp16.h>'
	(cd "$kdir" && ls src/*.cu | LC_ALL=C sort) | while read -r f; do echo "#include \"$(cd "$kdir" && pwd)/$f\""; done
} >"$tmp/all.cu"
nvcc -ccbin clang-14 -cubin -O3 -std=c++17 -arch=sm_90 -Xptxas -v -o "$tmp/all.cubin" "$tmp/all.cu" >"$tmp/ptxas.log" 2>&1 || {
	tail -20 "$tmp/ptxas.log" >&2
	exit 1
}
printf '%-44s %5s %7s %7s %5s %6s %7s\n' kernel regs stack spill calls local sass
awk -v pat="$pattern" '
	/Compiling entry function/ { f = $0; sub(/.*function ./, "", f); sub(/. for .*/, "", f) }
	/bytes stack frame/ { stack = $1; spill = $5 }
	/Used [0-9]+ registers/ { if (f ~ pat) print f, $5, stack, spill }
' "$tmp/ptxas.log" | sort | while read -r name regs stack spill; do
	sass="$(cuobjdump -sass -fun "$name" "$tmp/all.cubin")"
	calls=$(grep -c 'CALL\.REL' <<<"$sass" || true)
	local_ops=$(grep -cE '\b(STL|LDL)' <<<"$sass" || true)
	instrs=$(grep -cE '^ +/\*[0-9a-f]{4,}\*/' <<<"$sass" || true)
	printf '%-44s %5s %7s %7s %5s %6s %7s\n' "$name" "$regs" "$stack" "$spill" "$calls" "$local_ops" "$instrs"
done
