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
export FERRITE_CUDA_FATBIN="$dev/k/ferrite.fatbin" FERRITE_TEST_DEVICE=cuda

# kernels/cuda from its copy k/ (the manifest test reads src/ there).
(cd k && timeout 75 ../cuda.test -test.v -test.count 1 2>&1; echo "cuda.test rc=$?") >"$out/cuda-tests.log"
(timeout 20 ./device.test -test.v 2>&1; echo "device.test rc=$?") >>"$out/cuda-tests.log"

# The fixtures are found through the build path of the test binary.
if [ ! -e /work/wt/cudaops ]; then mkdir -p /work/wt && ln -s "$root" /work/wt/cudaops; fi
(cd "$root/engine" && timeout 75 "$dev/engine.test" -test.v -test.count 1 -test.run 'TestFixtures|TestAutoDevice' 2>&1; echo "engine.test rc=$?") >"$out/fixtures.log"
grep -E '^(---|ok|FAIL|PASS)|rc=' "$out/cuda-tests.log" "$out/fixtures.log" | grep -v -- '--- PASS' | tail -40

# The decode-step benchmarks (STEP_BENCH: the bare-GEMV step of BENCHMARKS.md
# section 9 and the op-set step, split into its Linear ops and the rest,
# with graphs and eager).
(cd k && timeout 60 ../cuda.test -test.run XXX -test.bench "${STEP_BENCH:-DecodeStep8B}" -test.benchtime 20x \
	-test.count "${STEP_COUNT:-2}" 2>&1; echo "bench rc=$?") >>"$out/cuda-tests.log"
grep -E '^Benchmark' "$out/cuda-tests.log"

(timeout "$(( ${BENCH_END:-340} - SECONDS > 30 ? ${BENCH_END:-340} - SECONDS : 30 ))" ./ferrite bench --model "$dev/qwen3-8b" --device cuda --concurrency 1,8,32,64 \
	--prompt-len 128 --gen-len 128 --bandwidth 4300 --json "$out/bench.json" 2>&1; echo "bench rc=$?") >"$out/bench.log"
cat "$out/bench.log" | tail -20
tail -3 "$out/build.log"

# MTP at batch 1 (issue 13 item 5): speculative greedy == plain greedy on the
# device for ferrite-tiny (builtin/model in the tree) and the MTP fixtures,
# with tok/s and acceptance per draft length (engine TestMTPOnDevice; ~30 s),
# then `ferrite bench` on ferrite-tiny with --mtp on,off (random-token
# prompts: acceptance is low there, the test's chat prompts are the measure).
(cd "$root/engine" && timeout 150 "$dev/engine.test" -test.v -test.count 1 -test.run 'TestMTPOnDevice' 2>&1; echo "mtp test rc=$?") >"$out/mtp.log"
(timeout 60 ./ferrite bench --model "$root/builtin/model" --device cuda --concurrency 1 --prompt-len 32 --gen-len 128 \
	--mtp on,off --draft 3 --bandwidth 4300 --json "$out/mtp-bench.json" 2>&1; echo "mtp bench rc=$?") >>"$out/mtp.log"
grep -E 'draft [0-9]|^ +1 +32|^(---|ok|FAIL)|rc=' "$out/mtp.log" | cut -c1-240 | head -60
