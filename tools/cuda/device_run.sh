#!/usr/bin/env bash
# One GPU-machine run for kernels/cuda, prepared here by
# tools/cuda/prepare_device_run.sh into .device-out/ of the checkout that
# travels, run there from the checkout's root:
#
#	STAGES="build tests bench8b" DEADLINE=540 bash .device-out/device_run.sh
#
# STAGES names what runs, in this order (default: all of them):
#   build      the fatbin (nvcc; skipped when the prepared one came along)
#   llama      llama.cpp's CUDA build and GGUFs in the background (CPU only,
#              niced), its benchmarks last (tools/cuda/llamacpp_gpu.sh)
#   tests      kernels/cuda (the op-set conformance suite; CUDA_TEST_RUN=regexp
#              runs those of its tests only), kernels/device,
#              the engine fixtures (ENGINE_TEST_RUN=regexp: those tests
#              only), qwen3next, glm5next and the mla family (not with
#              TESTS_QUICK=1)
#   linattn    hybrid prefill: BenchmarkLinearAttention, then ferrite bench,
#              qwen3_next (small) at 512 and 2,048 tokens (1 and 8 requests)
#              and ferrite-tiny at 512, each by default, with ShortConv row by
#              row (FERRITE_CUDA_CONV_ROWS=0) and with the chunked delta rule
#              (FERRITE_CUDA_DELTA_CHUNK=1), interleaved twice (~1 min)
#   steps      (after hybrid) the decode-step, sampling, linear-attention, prefill-attention
#              and MoE kernel benchmarks
#   bench8b    ferrite bench, Qwen3-8B, concurrency 1/8/32/64, 128+128
#   prefill    ferrite bench, Qwen3-8B, prompts of 512 and 4,096 tokens
#   rows8      ferrite bench, Qwen3-8B batch 1 with the 8-rows-a-block decode
#              GEMV (FERRITE_CUDA_GEMV_ROWS=8; bench8b runs the default layout)
#   moe        ferrite bench, Qwen3-30B-A3B (1/8) and GLM-4.7-Flash (1/8/32;
#              32 again with FERRITE_MLA_TC=0)
#   glm5       ferrite bench, glm5_next at transformers' default shape cut to
#              8 of 45 layers (engine/testdata/glm5next-8l, 78 GB of bf16),
#              concurrency 1/8/32, 128+64 (~45 s)
#   hybrid     engine TestMTPOnDevice (speculative == plain on the device, MTP
#              speed-up per draft length; ferrite-tiny again with
#              FERRITE_CUDA_FEWROWS=0 and SPIN=0), ferrite bench, qwen3_next (small)
#              and ferrite-tiny with MTP on/off at draft 1 (cost-aware, forced)
#   quant      (not in the default list) BenchmarkQuantGEMV (int8 and
#              float32 x), engine TestMTPOnDevice/ferrite-tiny, then ferrite
#              bench, Qwen3-8B with --quant q4_k and q8_0 (random blocks),
#              each with int8 x (the default) and float32 x
#              (FERRITE_CUDA_QX8=0), interleaved twice, and bf16, at 1/8
#              sequences (128+128) (~4 min)
#   mmq        (not in the default list) BenchmarkQuantGEMV at 32 and 64
#              rows of x (the tensor-core product; "/fx": the bf16
#              decoding's), then ferrite bench, Qwen3-8B --quant q4_k at
#              8/32/64 sequences (128+128) with the tensor-core product
#              (the default), its integer-combining forms
#              (FERRITE_CUDA_MMQ_INT=1) and without it
#              (FERRITE_CUDA_MMQ_ROWS=0), interleaved twice, and bf16 at
#              32/64; prefill of 512 and 4,096 tokens with the product at
#              every row count against the default (~6 min)
#   qmoe       (not in the default list) BenchmarkMoE and BenchmarkMoEQuant
#              (bf16 and Q4_K/Q6_K experts in their blocks) at 1/8/32
#              tokens, BenchmarkMoEQuant at 32 again without the grouped
#              tensor-core product (FERRITE_CUDA_MOE_MMQ=0), then ferrite
#              bench, Qwen3-30B-A3B, --quant q4_k (random blocks) at 1/8/32
#              (128+64), and at 32 without it; prefill of 512 and 4,096
#              tokens with the products at every size against the default
#              (~4 min)
#   tcmoe      (not in the default list) BenchmarkMoEGLM and BenchmarkMoE at
#              4/8/32/64 tokens with the bf16 experts' tensor-core decode
#              kernels (the default), their _u4 forms ("/tc-u4",
#              FERRITE_MOE_TC_U4=1) and without them ("/notc",
#              FERRITE_MOE_TC=0), BenchmarkMoEGLMShared at 16/32/64
#              (GLM's shared expert folded in; "/tc" forces the kernels,
#              FERRITE_MOE_TC_SHARED=1), then ferrite bench, GLM-4.7-Flash
#              at 8/32/64 (the kernels forced onto its folded shared
#              expert) and Qwen3-30B-A3B at 8/32 (128+64), with and without
#              them, interleaved twice, GLM with the _u4 forms once
#              (~8 min: give it a call of its own; GLM fails at 64 until
#              the MoE failure of session 26 is mended, BENCHMARKS.md 9)
#   kvb        (not in the default list) ferrite bench on a GGUF of
#              GLM-4.7-Flash's shape cut to 4 layers (randgguf, Q8_0,
#              attn_k_b and attn_v_b in Q8_0: written first, ~1 min), 1/8
#              sequences (128+128), with the halves in their blocks (the
#              default) and as the float32 kv_b_proj (FERRITE_CUDA_KVB=0),
#              interleaved twice
#   qgguf      (not in the default list) after the llama stage's prep:
#              ferrite bench on the Q4_K_M GGUF llama-quantize wrote
#              (Qwen3-8B shape), 1/8 sequences, int8 and float32 x
#   fuseattn   (not in the default list) ferrite bench, Qwen3-8B batch 1 with
#              the fused attention on (FERRITE_CUDA_FUSE=1: PrepareQKV and
#              the split merge in the attention kernel; off by default) for
#              an A/B against bench8b (~40 s)
#   attnpf0    (not in the default list) the same without the attention's
#              key/value prefetch (FERRITE_CUDA_ATTN_PREFETCH=0) (~40 s)
#   fusenorm   (not in the default list) the same with the norm-fused GEMVs
#              on (FERRITE_CUDA_FUSE_NORM=1; off by default) (~40 s)
#   prof       (not in the default list) per-kernel GPU time tables
#              (FERRITE_CUDA_PROFILE=$PROF_MODE: 1 (default) times eager
#              launches with CUDA events, graph the replayed step graphs
#              with event record nodes between kernels)
#              of ferrite bench cases: Qwen3-8B 1/32/64, Qwen3-30B-A3B 1/8,
#              GLM-4.7-Flash 1/32 (128+32), glm5next-8l 1/32 (128+32),
#              ferrite-tiny as shipped with MTP on and off (128+64); all
#              into prof.log (~110-190 s)
# Each stage runs under its own timeout and is skipped once DEADLINE seconds
# (default 540) have passed, so a hang still returns the fatbin and the logs.
# Writes to $OUT: ferrite.fatbin, fatbin.sha256, and logs.tgz (every
# *.log and *.json, packed at the end; do not tar $OUT again after it:
# that overwrote a run's results in session 22).
set -uo pipefail
root="$PWD"
dev="$root/.device-out"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
STAGES=" ${STAGES:-build llama tests linattn steps bench8b prefill rows8 moe glm5 hybrid} "
DEADLINE="${DEADLINE:-540}"
want() { [[ "$STAGES" == *" $1 "* ]]; }
# run NAME SECONDS LOG CMD...: CMD under a timeout of at most SECONDS, not
# past the deadline, its output appended to $out/LOG.
run() {
	local name=$1 limit=$2 log=$3
	shift 3
	local left=$((DEADLINE - SECONDS))
	if ((left < 15)); then
		echo "== $name: skipped, deadline" | tee -a "$out/$log"
		return
	fi
	((limit > left)) && limit=$left
	echo "== $name (limit ${limit}s, at ${SECONDS}s)" >>"$out/$log"
	timeout "$limit" "$@" >>"$out/$log" 2>&1
	echo "$name rc=$? (${SECONDS}s)" | tee -a "$out/$log"
}
cd "$dev"
for f in *.xz; do
	[ -e "$f" ] || continue
	xz -dkf "$f" 2>/dev/null || python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$f"
done
chmod +x ./*.test ferrite randgguf 2>/dev/null


if want llama && [ -f llama/llamacpp_gpu.sh ]; then
	OUT="$out" setsid nice -n 19 bash llama/llamacpp_gpu.sh prep >/dev/null 2>&1 &
fi
{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
} >"$out/build.log" 2>&1
if [ -f k/ferrite.fatbin ] || ! want build; then
	echo "using the prepared fatbin" >>"$out/build.log"
else
	run build 330 build.log bash tools/cuda/build_fatbin.sh k k
fi
cp k/ferrite.fatbin k/fatbin.sha256 "$out/" 2>/dev/null
export FERRITE_CUDA_FATBIN="$dev/k/ferrite.fatbin"
# The fixtures are found through the build path of the test binaries.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$root" /work/main; fi

if want tests; then
	export FERRITE_TEST_DEVICE=cuda
	(cd k && run cuda.test 160 cuda-tests.log ../cuda.test -test.v -test.count 1 -test.run "${CUDA_TEST_RUN:-.}")
	run device.test 20 cuda-tests.log ./device.test -test.v
	(cd "$root/engine" && run engine.test 90 fixtures.log "$dev/engine.test" -test.v -test.count 1 \
		-test.run "${ENGINE_TEST_RUN:-TestFixtures|TestAutoDevice|TestBuiltinOnDevice|TestQuantizedOnDevice|TestPrefillOnDevice|TestMTPOnDevice|TestMoEManySeqsOnDevice|TestGGUFKVBParts}")
	if [ "${TESTS_QUICK:-}" != 1 ]; then
		for p in qwen3next glm5next; do
			(cd "$root/engine/models/$p" && run "$p.test" 60 "$p.log" "$dev/$p.test" -test.v -test.count 1 -test.run '/device')
		done
		(cd "$root/engine/models/mla" && run mla.test 45 mla.log "$dev/mla.test" -test.v -test.count 1 -test.run 'TestConformance')
	fi
	unset FERRITE_TEST_DEVICE
	grep -hE '^(--- FAIL|FAIL|ok|panic)|rc=' "$out"/cuda-tests.log "$out"/fixtures.log "$out"/qwen3next.log \
		"$out"/glm5next.log "$out"/mla.log | tail -60
fi

bench() { # bench NAME SECONDS ARGS...: ferrite bench into NAME.log and NAME.json
	local name=$1 limit=$2
	shift 2
	run "$name" "$limit" "$name.log" ./ferrite bench --device cuda --bandwidth 4300 --json "$out/$name.json" "$@"
	grep -vE '^\s*$' "$out/$name.log" | tail -12
}
if want linattn; then
	(cd k && run linattn-bench 60 linattn.log ../cuda.test -test.run XXX -test.bench LinearAttention -test.benchtime 5x)
	grep -hE '^Benchmark|rc=' "$out/linattn.log"
	for pass in 1 2; do
		for v in default FERRITE_CUDA_CONV_ROWS=0 FERRITE_CUDA_DELTA_CHUNK=1; do
			echo "== pass $pass $v" >>"$out/linattn-bench.log"
			env ${v/default/} ./ferrite bench --device cuda --bandwidth 4300 --json "$out/qwen3next-${v%%=*}-$pass.json" \
				--model "$root/engine/testdata/qwen3next-small" --concurrency 1,8 --prompt-len 512,2048 --gen-len 8 \
				>>"$out/linattn-bench.log" 2>&1
			env ${v/default/} ./ferrite bench --device cuda --bandwidth 4300 --json "$out/tiny-${v%%=*}-$pass.json" \
				--model "$root/builtin/model" --concurrency 1,8 --prompt-len 512 --gen-len 8 --mtp off \
				>>"$out/linattn-bench.log" 2>&1
		done
	done
	grep -hE '^== pass|^ +[0-9]+ +[0-9]+ +8 ' "$out/linattn-bench.log"
fi
if want quant; then
	(cd k && run quant-gemv 120 quant.log ../cuda.test -test.run XXX -test.bench QuantGEMV -test.benchtime 5x)
	grep -hE '^Benchmark|rc=' "$out/quant.log"
	FERRITE_TEST_DEVICE=cuda bash -c "cd '$root/engine' && '$dev/engine.test' -test.v -test.count 1 \
		-test.run 'TestMTPOnDevice/ferrite-tiny'" >"$out/quant-mtp.log" 2>&1
	grep -E '^(--- |ok|FAIL)' "$out/quant-mtp.log" | tail -5
	# int8 x (the default) and float32 x (FERRITE_CUDA_QX8=0) interleaved, twice; bf16 beside them
	for pass in 1 2; do
		for v in q4_k q4_k-fx q8_0 q8_0-fx bf16; do
			q=(--quant "${v%-fx}")
			[ "$v" = bf16 ] && q=()
			fx=1
			[ "$v" != "${v%-fx}" ] && fx=0
			[ "$v" = bf16 ] && [ "$pass" = 2 ] && continue
			FERRITE_CUDA_QX8=$fx bench "quant-$v-$pass" 60 --model "$dev/qwen3-8b" "${q[@]}" --concurrency 1,8 --prompt-len 128 --gen-len 128
		done
	done
fi
if want mmq; then
	(cd k && run quant-mmq 150 mmq.log ../cuda.test -test.run XXX -test.bench 'QuantGEMV/.*/n=(32|64)' -test.benchtime 5x)
	grep -hE '^Benchmark|rc=' "$out/mmq.log"
	for pass in 1 2; do
		for v in mmq mmqi dec; do
			m=255 i=0
			[ "$v" = dec ] && m=0
			[ "$v" = mmqi ] && i=1
			FERRITE_CUDA_MMQ_ROWS=$m FERRITE_CUDA_MMQ_INT=$i bench "mmq-$v-$pass" 70 --model "$dev/qwen3-8b" --quant q4_k \
				--concurrency 8,32,64 --prompt-len 128 --gen-len 128
		done
	done
	bench mmq-bf16 60 --model "$dev/qwen3-8b" --concurrency 32,64 --prompt-len 128 --gen-len 128
	# prefill: the tensor-core product at every row count against the bf16 decoding's product (the default from 256)
	for v in dec mmq; do
		m=255
		[ "$v" = mmq ] && m=1000000
		FERRITE_CUDA_MMQ_ROWS=$m bench "mmq-prefill-$v" 60 --model "$dev/qwen3-8b" --quant q4_k --concurrency 1 \
			--prompt-len 512,4096 --gen-len 1
	done
fi
if want qmoe; then
	(cd k && run moe-quant 90 qmoe.log ../cuda.test -test.run XXX -test.bench '^BenchmarkMoE(Quant)?$/^n=(1|8|32)$' \
		-test.benchtime 5x)
	(cd k && FERRITE_CUDA_MOE_MMQ=0 run moe-quant-nommq 60 qmoe.log ../cuda.test -test.run XXX \
		-test.bench '^BenchmarkMoEQuant$/^n=32$' -test.benchtime 5x)
	grep -hE '^Benchmark|rc=|^== ' "$out/qmoe.log"
	bench qmoe-q4_k 70 --model "$dev/qwen3-30b-a3b" --quant q4_k --concurrency 1,8,32 --prompt-len 128 --gen-len 64
	FERRITE_CUDA_MOE_MMQ=0 bench qmoe-q4_k-nommq 60 --model "$dev/qwen3-30b-a3b" --quant q4_k --concurrency 32 --prompt-len 128 \
		--gen-len 64
	# prefill: the grouped tensor-core product at every token count against the chosen experts decoded into bf16
	FERRITE_CUDA_MOE_MMQ=1000000 FERRITE_CUDA_MMQ_ROWS=1000000 bench qmoe-prefill-mmq 60 --model "$dev/qwen3-30b-a3b" \
		--quant q4_k --concurrency 1 --prompt-len 512,4096 --gen-len 1
	bench qmoe-prefill-dec 60 --model "$dev/qwen3-30b-a3b" --quant q4_k --concurrency 1 --prompt-len 512,4096 --gen-len 1
fi
if want tcmoe; then
	(cd k && run tc-moe-glm 110 tcmoe.log ../cuda.test -test.run XXX \
		-test.bench '^BenchmarkMoEGLM$/^n=(4|8|32|64)(/notc|/tc-u4)?$' -test.benchtime 10x)
	(cd k && run tc-moe-30b 100 tcmoe.log ../cuda.test -test.run XXX -test.bench '^BenchmarkMoE$/^n=(8|32|64)(/notc|/tc-u4)?$' \
		-test.benchtime 10x)
	(cd k && run tc-moe-glm-shared 100 tcmoe.log ../cuda.test -test.run XXX -test.bench '^BenchmarkMoEGLMShared$/^n=(16|32|64)(/tc)?$' \
		-test.benchtime 10x)
	grep -hE '^Benchmark|rc=|^== ' "$out/tcmoe.log"
	# ferrite bench: the kernels (tc), their _u4 forms and without them (notc), most telling first
	for pass in a b; do
		for v in tc notc u4; do
			[ "$pass" = b ] && [ "$v" = u4 ] && continue
			t=256 u=0
			[ "$v" = notc ] && t=0
			[ "$v" = u4 ] && u=1
			FERRITE_MOE_TC=$t FERRITE_MOE_TC_U4=$u FERRITE_MOE_TC_SHARED=1 bench "tcmoe-glm-$v-$pass" 80 --model "$root/engine/testdata/glm4.7-flash" \
				--concurrency 8,32,64 --prompt-len 128 --gen-len 64
		done
		for v in tc notc; do
			t=256
			[ "$v" = notc ] && t=0
			FERRITE_MOE_TC=$t bench "tcmoe-30b-$v-$pass" 60 --model "$dev/qwen3-30b-a3b" --concurrency 8,32 --prompt-len 128 \
				--gen-len 64
		done
	done
fi
if want kvb; then
	g=/tmp/glm47flash-4l-q8_0.gguf
	[ -s "$g" ] || run kvb-gguf 180 kvb.log ./randgguf -config "$root/engine/testdata/glm4.7-flash" -layers 4 -type q8_0 \
		-kvb q8_0 -o "$g"
	for pass in a b; do
		for v in parts f32; do
			k=1
			[ "$v" = f32 ] && k=0
			FERRITE_CUDA_KVB=$k bench "kvb-$v-$pass" 50 --model "$g" --concurrency 1,8 --prompt-len 128 --gen-len 128
		done
	done
fi
if want qgguf; then
	# ferrite on the Q4_K_M file llama.cpp quantized (the llama stage's prep), int8 and float32 x
	gguf=/tmp/llamacpp/qwen3-8b-q4_k_m.gguf
	while [ ! -f "$out/llama/prep.done" ] && ((SECONDS < DEADLINE - 150)); do sleep 2; done
	if [ -s "$gguf" ]; then
		bench qgguf 60 --model "$gguf" --concurrency 1,8 --prompt-len 128 --gen-len 128
		FERRITE_CUDA_QX8=0 bench qgguf-fx 60 --model "$gguf" --concurrency 1,8 --prompt-len 128 --gen-len 128
	else
		echo "qgguf: no $gguf" | tee -a "$out/qgguf.log"
	fi
fi
want bench8b && bench bench8b 150 --model "$dev/qwen3-8b" --concurrency 1,8,32,64 --prompt-len 128 --gen-len 128
want prefill && bench prefill 100 --model "$dev/qwen3-8b" --concurrency 1 --prompt-len 512,4096 --gen-len 1
want fuseattn && FERRITE_CUDA_FUSE=1 bench fuseattn 60 --model "$dev/qwen3-8b" --concurrency 1 --prompt-len 128 \
	--gen-len 128
want attnpf0 && FERRITE_CUDA_ATTN_PREFETCH=0 bench attnpf0 60 --model "$dev/qwen3-8b" --concurrency 1 --prompt-len 128 \
	--gen-len 128
want fusenorm && FERRITE_CUDA_FUSE_NORM=1 bench fusenorm 60 --model "$dev/qwen3-8b" --concurrency 1 --prompt-len 128 \
	--gen-len 128
want rows8 && FERRITE_CUDA_GEMV_ROWS="${ROWS8_GEMV_ROWS:-8}" bench rows8 60 --model "$dev/qwen3-8b" \
	--concurrency 1 --prompt-len 128 --gen-len 128
if want moe; then
	bench moe 100 --model "$dev/qwen3-30b-a3b" --concurrency 1,8 --prompt-len 128 --gen-len 64
	bench glmflash 90 --model "$root/engine/testdata/glm4.7-flash" --concurrency 1,8,32 --prompt-len 128 --gen-len 64
	# The same at 32 with the CUDA-core MLA kernels (src/ops_mla.cu) instead
	# of the tensor-core ones (src/tensor_mla.cu): the A/B of the model step.
	FERRITE_MLA_TC=0 bench glmflash-cores 60 --model "$root/engine/testdata/glm4.7-flash" --concurrency 32 \
		--prompt-len 128 --gen-len 64
fi
want glm5 && bench glm5bench 60 --model "$root/engine/testdata/glm5next-8l" --concurrency 1,8,32 --prompt-len 128 --gen-len 64
if want prof; then
	# profbench SECONDS ARGS...: a profiled ferrite bench, appended to prof.log.
	profbench() {
		local limit=$1
		shift
		FERRITE_CUDA_PROFILE="${PROF_MODE:-1}" run "prof ${2##*/}" "$limit" prof.log ./ferrite bench --device cuda --bandwidth 4300 "$@"
	}
	profbench 50 --model "$dev/qwen3-8b" --concurrency 1,32,64 --prompt-len 128 --gen-len 32
	profbench 45 --model "$dev/qwen3-30b-a3b" --concurrency 1,8 --prompt-len 128 --gen-len 32
	profbench 40 --model "$root/engine/testdata/glm4.7-flash" --concurrency 1,32 --prompt-len 128 --gen-len 32
	profbench 35 --model "$root/engine/testdata/glm5next-8l" --concurrency 1,32 --prompt-len 128 --gen-len 32
	# ferrite-tiny as shipped (the tree's builtin/model: trained weights,
	# so drafts are accepted as in the chat), with MTP on and off;
	# with PROF_MODE=graph the replayed graphs are timed instead.
	profbench 25 --model "$root/builtin/model" --concurrency 1 --prompt-len 128 --gen-len 64 --mtp on,off
	grep -E '^GPU profile|^mode|^ *total \(' "$out/prof.log" | cut -c1-160
fi
if want hybrid; then
	# MTP at batch 1 (issue 13 item 5): speculative greedy == plain greedy on
	# the device for ferrite-tiny (chat prompts) and the MTP fixtures, with
	# tok/s and acceptance per draft length (~30 s).
	(cd "$root/engine" && FERRITE_TEST_DEVICE=cuda run mtp-test 120 mtp.log "$dev/engine.test" -test.v -test.count 1 \
		-test.run 'TestMTPOnDevice')
	grep -hE 'draft [0-9]|row-|^\s*--- (FAIL|PASS)' "$out/mtp.log" | cut -c1-300 | head -50
	# The same on ferrite-tiny with 2-4 row products on the 8-row GEMV and
	# cuBLASLt again (FERRITE_CUDA_FEWROWS=0), then with the device
	# thread's hand-overs parking at once (FERRITE_CUDA_SPIN=0), for
	# comparison (~10 s each).
	for ab in FERRITE_CUDA_FEWROWS FERRITE_CUDA_SPIN; do
		echo "== $ab=0" >>"$out/mtp-ab.log"
		(cd "$root/engine" && FERRITE_TEST_DEVICE=cuda run "mtp-$ab" 40 mtp-ab.log env "$ab=0" "$dev/engine.test" \
			-test.v -test.count 1 -test.run 'TestMTPOnDevice/ferrite-tiny')
	done
	grep -hE '^== |draft [0-9]' "$out/mtp-ab.log" | cut -c1-300
	# ferrite bench on ferrite-tiny with MTP off/on at draft 1 (a chat
	# question, --chat; cost-aware drafting as the CLI runs it, then
	# drafting on every step, --draft-always; step-graph counts per case),
	# ~15 s each; a CPU profile of the host work.
	bench tiny-mtp1 40 --model "$root/builtin/model" --chat --concurrency 1 --gen-len 192 --mtp off,on --draft 1 \
		--cpuprofile "$out/tiny-mtp1.pprof"
	bench tiny-mtp1f 40 --model "$root/builtin/model" --chat --concurrency 1 --gen-len 192 --mtp off,on --draft 1 --draft-always
	bench qwen3next 45 --model "$root/engine/testdata/qwen3next-small" --concurrency 1,8 --prompt-len 512 --gen-len 32
fi
if want steps; then
	(cd k && run step-bench 60 steps.log ../cuda.test -test.run XXX -test.bench "${STEP_BENCH:-DecodeStep8B|TopKRows}" \
		-test.benchtime 20x -test.count "${STEP_COUNT:-1}")
	(cd k && run linattn-bench 40 steps.log ../cuda.test -test.run XXX -test.bench LinearAttention -test.benchtime 5x)
	(cd k && run prefill-bench 60 steps.log ../cuda.test -test.run XXX -test.bench PrefillAttention -test.benchtime 3x)
	(cd k && run moe-bench 75 steps.log ../cuda.test -test.run XXX -test.bench 'BenchmarkMoE$|BenchmarkOpsDecodeStep30BA3B' -test.benchtime 20x)
	(cd k && run moe-glm-bench 60 steps.log ../cuda.test -test.run XXX -test.bench 'BenchmarkMoEGLM' -test.benchtime 20x)
	(cd k && run mla-bench 45 steps.log ../cuda.test -test.run XXX -test.bench MLADecode -test.benchtime 20x)
	grep -hE '^Benchmark|rc=' "$out/steps.log"
fi
if want llama && [ -f llama/llamacpp_gpu.sh ]; then
	OUT="$out" run llama-bench 240 llama.log bash llama/llamacpp_gpu.sh bench
	tail -30 "$out/llama/bench-summary.log" 2>/dev/null
fi
tail -4 "$out/build.log"
# The device returns at most 8 files: everything but the fatbin and its
# manifest goes back as logs.tgz.
(cd "$out" && tar czf /tmp/logs.tgz --exclude=ferrite.fatbin --exclude=fatbin.sha256 . &&
	find . -mindepth 1 -maxdepth 1 ! -name ferrite.fatbin ! -name fatbin.sha256 -exec rm -rf {} + &&
	mv /tmp/logs.tgz .)
