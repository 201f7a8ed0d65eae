#!/usr/bin/env bash
# One GPU-machine run for kernels/cuda: build the fatbin, run the kernel
# tests (the op-set conformance suite included), the GQA-family fixtures
# and `ferrite bench` on random Qwen3-8B weights, each stage under its own
# timeout so a hang still returns the fatbin and the logs. Prepared here by
# tools/cuda/prepare_device_run.sh into .device-out/ of the checkout that
# travels; run there from the checkout's root:
#
#	bash .device-out/device_run.sh
#
# Writes to $OUT: ferrite.fatbin, fatbin.sha256 and the logs. `ferrite
# bench` gets what is left until BENCH_END seconds (340) after the start.
set -uo pipefail
root="$PWD"
dev="$root/.device-out"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
cd "$dev"
for f in *.xz; do
	[ -e "$f" ] || continue
	xz -dkf "$f" 2>/dev/null || python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$f"
done
chmod +x ./*.test ferrite

{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
	if [ -f k/ferrite.fatbin ]; then
		echo "using the prepared fatbin (sources unchanged since it was built)"
	else
		timeout 150 bash tools/cuda/build_fatbin.sh k k
		echo "build rc=$?"
	fi
} >"$out/build.log" 2>&1
cp k/ferrite.fatbin k/fatbin.sha256 "$out/" 2>/dev/null

# The MLA family's random-weight suite (decode, chunked prefill, batches,
# fork, rollback; dense and DSA) on the device.
(FERRITE_CUDA_FATBIN="$dev/k/ferrite.fatbin" FERRITE_TEST_DEVICE=cuda timeout 40 ./mla.test -test.v -test.count 1 \
	-test.run 'TestConformance//device' 2>&1; echo "mla.test rc=$?") >"$out/mla.log"
grep -E '^(---|ok|FAIL|PASS)|rc=' "$out/mla.log" | grep -v -- '--- PASS' | tail -20

export FERRITE_CUDA_FATBIN="$dev/k/ferrite.fatbin" FERRITE_TEST_DEVICE=cuda

# kernels/cuda from its copy k/ (the manifest test reads src/ there).
(cd k && timeout 75 ../cuda.test -test.v -test.count 1 2>&1; echo "cuda.test rc=$?") >"$out/cuda-tests.log"
(timeout 20 ./device.test -test.v 2>&1; echo "device.test rc=$?") >>"$out/cuda-tests.log"

# The fixtures are found through the build path of the test binary.
if [ ! -e /work/wt/cudaops ]; then mkdir -p /work/wt && ln -s "$root" /work/wt/cudaops; fi
(cd "$root/engine" && timeout 75 "$dev/engine.test" -test.v -test.count 1 -test.run 'TestFixtures|TestAutoDevice|TestBuiltinOnDevice|TestPrefillOnDevice' 2>&1; echo "engine.test rc=$?") >"$out/fixtures.log"
# The hybrids on the GPU (linear attention, mHC, k-pool): their fixture and
# suite subtests on "device" (the built-in ferrite-tiny, a glm5_next, is
# engine.test's TestBuiltinOnDevice).
for p in qwen3next glm5next; do
	(cd "$root/engine/models/$p" && timeout 60 "$dev/$p.test" -test.v -test.count 1 -test.run '/device' 2>&1; echo "$p.test rc=$?") >"$out/$p.log"
done
grep -E '^(---|ok|FAIL|PASS)|rc=' "$out/cuda-tests.log" "$out/fixtures.log" "$out/qwen3next.log" "$out/glm5next.log" |
	grep -v -- '--- PASS' | tail -60

# The decode-step benchmarks (STEP_BENCH: the bare-GEMV step of BENCHMARKS.md
# section 9 and the op-set step, split into its Linear ops and the rest,
# with graphs and eager).
(cd k && timeout 60 ../cuda.test -test.run XXX -test.bench "${STEP_BENCH:-DecodeStep8B}" -test.benchtime 20x \
	-test.count "${STEP_COUNT:-2}" 2>&1; echo "bench rc=$?") >>"$out/cuda-tests.log"
# The linear-attention layer (Qwen3-Next shape): decode batches and prefill.
(cd k && timeout 40 ../cuda.test -test.run XXX -test.bench LinearAttention -test.benchtime 5x 2>&1; echo "linattn bench rc=$?") >>"$out/cuda-tests.log"
grep -E '^Benchmark' "$out/cuda-tests.log"

# Prefill (issue 13): one layer's attention at 512 and 4,096 tokens, the
# prefill kernel against the split-KV kernel alone; then whole prompts of
# 512 and 4,096 tokens through `ferrite bench` (prompt tok/s and TTFT).
(cd k && timeout 60 ../cuda.test -test.run XXX -test.bench PrefillAttention -test.benchtime 3x 2>&1; echo "prefill bench rc=$?") >"$out/prefill.log"
(timeout 100 ./ferrite bench --model "$dev/qwen3-8b" --device cuda --concurrency 1 --prompt-len 512,4096 --gen-len 1 \
	--bandwidth 4300 --json "$out/prefill-bench.json" 2>&1; echo "prefill ferrite bench rc=$?") >>"$out/prefill.log"
grep -E '^Benchmark|rc=|^ +1 ' "$out/prefill.log"
# Qwen3-30B-A3B through the op set: the experts alone (decode and prefill
# sizes), then whole batch-1 steps (all, MoE only, the rest).
(cd k && timeout 90 ../cuda.test -test.run XXX -test.bench 'BenchmarkMoE|BenchmarkOpsDecodeStep30BA3B' -test.benchtime 20x 2>&1; echo "moe bench rc=$?") >"$out/moe.log"
grep -E '^Benchmark|rc=' "$out/moe.log"

(timeout "$(( ${BENCH_END:-340} - SECONDS > 30 ? ${BENCH_END:-340} - SECONDS : 30 ))" ./ferrite bench --model "$dev/qwen3-8b" --device cuda --concurrency 1,8,32,64 \
	--prompt-len 128 --gen-len 128 --bandwidth 4300 --json "$out/bench.json" 2>&1; echo "bench rc=$?") >"$out/bench.log"
cat "$out/bench.log" | tail -20
# qwen3_next end to end on the GPU (BENCHMARKS.md section 11's scaled-down
# shape, random bf16 weights): linear attention, gated attention, MoE.
(timeout 45 ./ferrite bench --model "$root/engine/testdata/qwen3next-small" --device cuda --concurrency 1,8 \
	--prompt-len 512 --gen-len 32 --bandwidth 4300 --json "$out/bench-qwen3next.json" 2>&1; echo "bench qwen3next rc=$?") >"$out/bench-qwen3next.log"
tail -8 "$out/bench-qwen3next.log"

# Qwen3-30B-A3B (MoE, 128 experts top 8) on random bf16 weights.
(timeout "${MOE_BENCH_S:-150}" ./ferrite bench --model "$dev/qwen3-30b-a3b" --device cuda --concurrency 1,8 \
	--prompt-len 128 --gen-len 64 --bandwidth 4300 --json "$out/bench-moe.json" 2>&1; echo "moe bench rc=$?") >"$out/bench-moe.log"
tail -12 "$out/bench-moe.log"
tail -3 "$out/build.log"

# Batch-1 decode with programmatic dependent launch on (FERRITE_CUDA_PDL=1)
# and the n = 1 GEMV variant PDL_GEMV_ROWS (0: four warps a row), against
# the concurrency-1 row above (about 40 s; PDL_BENCH=0 skips it).
if [ "${PDL_BENCH:-1}" = 1 ]; then
	(FERRITE_CUDA_PDL=1 FERRITE_CUDA_GEMV_ROWS="${PDL_GEMV_ROWS:-0}" timeout 60 ./ferrite bench --model "$dev/qwen3-8b" --device cuda \
		--concurrency 1 --prompt-len 128 --gen-len 128 --bandwidth 4300 2>&1; echo "bench rc=$?") >"$out/bench-pdl.log"
	tail -8 "$out/bench-pdl.log"
fi
