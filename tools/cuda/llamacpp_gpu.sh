#!/usr/bin/env bash
# llama.cpp side by side with ferrite on the GPU machine (issue 13): builds
# llama.cpp commit 34af94cd for CUDA (sm_90 only, Release, the targets
# llama-bench, llama-batched-bench and llama-quantize) from the trimmed
# source tarball that tools/cuda/prepare_llamacpp.sh made, writes random
# Qwen3-8B weights as a BF16 GGUF with tools/randgguf (and a Q4_K_M copy
# with llama-quantize), then runs llama-bench and llama-batched-bench on
# them. Everything it needs lies beside it (llama.cpp.tar.xz, randgguf.xz,
# qwen3-8b/config.json); it needs cmake, ninja (or make), nvcc and no
# network. Two phases, so that the CPU work overlaps ferrite's GPU stages:
#
#	bash llamacpp_gpu.sh prep &   # build + GGUF (+ Q4_K_M), CPU only
#	...                           # ferrite's stages
#	bash llamacpp_gpu.sh bench    # waits for prep, then the GPU benchmarks
#	bash llamacpp_gpu.sh all      # both, one after the other
#
# Logs go to $OUT/llama/ (build.log, randgguf.log, quantize.log,
# llama-bench-*.log, batched-bench-*.log, prep.done); the build and the
# files to $LLAMA_WORK (default /tmp/llamacpp). Each step runs under its
# own timeout; Q4K=0 skips the Q4_K_M file, Q4K_ONLY=1 benchmarks only it,
# NPL sets batched-bench's sequence counts (1,8,32,64), PREP_WAIT (seconds, 480)
# bounds bench's wait for prep. For a dry run elsewhere: CONFIG (a config
# directory instead of qwen3-8b), LAYERS (keep that many), CUDA=OFF.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/out}/llama"
work="${LLAMA_WORK:-/tmp/llamacpp}"
mkdir -p "$out" "$work"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
	export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs="$(nproc)"
bf16="$work/qwen3-8b-bf16.gguf"
q4k="$work/qwen3-8b-q4_k_m.gguf"
bin="$work/llama.cpp/build/bin"

unxz_to() { # unxz_to FILE.xz DEST: xz, or Python's lzma where xz is missing
	xz -dc "$1" >"$2" 2>/dev/null ||
		python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2"
}

build() {
	local t0=$SECONDS gen=Ninja stamp
	stamp="$(cksum <"$here/llama.cpp.tar.xz") cuda=${CUDA:-ON}"
	if [ -x "$bin/llama-bench" ] && [ "$(cat "$work/build.stamp" 2>/dev/null)" = "$stamp" ]; then
		echo "reusing the build in $work (same tarball)"
		return 0
	fi
	command -v ninja >/dev/null || gen="Unix Makefiles"
	rm -rf "$work/llama.cpp"
	unxz_to "$here/llama.cpp.tar.xz" "$work/llama.cpp.tar" && tar -C "$work" -xf "$work/llama.cpp.tar" || return 1
	cd "$work/llama.cpp" || return 1
	[ "${CUDA:-ON}" = OFF ] || nvcc --version | tail -2
	cmake --version | head -1
	timeout 60 cmake -S . -B build -G "$gen" -DCMAKE_BUILD_TYPE=Release \
		-DGGML_CUDA="${CUDA:-ON}" -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DGGML_CUDA_FA_ALL_QUANTS=OFF \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF ||
		return 1
	echo "configure took $((SECONDS - t0)) s"
	timeout "${BUILD_TIMEOUT:-420}" cmake --build build -j "$jobs" --target llama-bench llama-batched-bench llama-quantize
	local rc=$?
	echo "build rc=$rc, $((SECONDS - t0)) s"
	[ $rc != 0 ] || echo "$stamp" >"$work/build.stamp"
	return $rc
}

gguf() {
	local t0=$SECONDS stamp
	stamp="$(cksum <"$here/randgguf.xz") ${CONFIG:-qwen3-8b} ${LAYERS:-0}"
	if [ -s "$bf16" ] && [ "$(cat "$work/gguf.stamp" 2>/dev/null)" = "$stamp" ]; then
		echo "reusing $bf16"
		return 0
	fi
	rm -f "$bf16" "$q4k" "$work/gguf.stamp"
	unxz_to "$here/randgguf.xz" "$work/randgguf" && chmod +x "$work/randgguf" || return 1
	# The writer holds the whole file (16.4 GB) until it writes it; the
	# limit keeps the garbage of the per-tensor conversions from doubling it.
	GOMEMLIMIT=24GiB timeout 300 "$work/randgguf" -config "${CONFIG:-$here/qwen3-8b}" -o "$bf16" \
		-type bf16 -seed 1 -layers "${LAYERS:-0}"
	local rc=$?
	ls -l "$bf16"
	echo "randgguf rc=$rc, $((SECONDS - t0)) s"
	[ $rc != 0 ] || echo "$stamp" >"$work/gguf.stamp"
	return $rc
}

quant() {
	local t0=$SECONDS
	[ ! -s "$q4k" ] || { echo "reusing $q4k"; return 0; }
	timeout 240 "$bin/llama-quantize" "$bf16" "$q4k" Q4_K_M "$jobs" 2>&1 | tail -15
	local rc=${PIPESTATUS[0]}
	ls -l "$q4k"
	echo "quantize rc=$rc, $((SECONDS - t0)) s"
	return $rc
}

prep() {
	rm -f "$out/prep.done"
	(build >"$out/build.log" 2>&1; echo $? >"$work/build.rc") &
	local b=$!
	gguf >"$out/randgguf.log" 2>&1
	local g=$?
	wait "$b"
	if [ "${Q4K:-1}" = 1 ] && [ "$g" = 0 ] && [ "$(cat "$work/build.rc")" = 0 ]; then
		quant >"$out/quantize.log" 2>&1
	fi
	echo "build rc=$(cat "$work/build.rc") randgguf rc=$g at $SECONDS s" >"$out/prep.done"
}

bench() {
	local waited=0
	while [ ! -f "$out/prep.done" ] && [ "$waited" -lt "${PREP_WAIT:-480}" ]; do
		sleep 2
		waited=$((waited + 2))
	done
	echo "waited $waited s for prep: $(cat "$out/prep.done" 2>/dev/null || echo 'not done')"
	nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv
	[ -x "$bin/llama-bench" ] || { echo "no llama-bench"; tail -20 "$out/build.log"; return 1; }
	local f name files=("$bf16" "$q4k")
	[ "${Q4K_ONLY:-0}" = 1 ] && files=("$q4k")
	for f in "${files[@]}"; do
		[ -s "$f" ] || continue
		name="$(basename "$f" .gguf)"
		(timeout 180 "$bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512,4096 -n 128 2>&1
			echo "llama-bench rc=$?") >"$out/llama-bench-$name.log"
		(timeout 180 "$bin/llama-batched-bench" -m "$f" -ngl 99 -fa 1 -c 40000 \
			-npp 128 -ntg 128 -npl "${NPL:-1,8,32,64}" 2>&1
			echo "batched-bench rc=$?") >"$out/batched-bench-$name.log"
		grep -E '^\|' "$out/llama-bench-$name.log" "$out/batched-bench-$name.log"
		tail -q -n 1 "$out/llama-bench-$name.log" "$out/batched-bench-$name.log"
	done
}

case "${1:-all}" in
prep) prep ;;
bench) bench 2>&1 | tee "$out/bench-summary.log" ;;
all)
	prep
	bench 2>&1 | tee "$out/bench-summary.log"
	;;
*)
	echo "usage: $0 prep|bench|all" >&2
	exit 2
	;;
esac
