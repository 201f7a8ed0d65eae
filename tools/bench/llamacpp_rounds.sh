#!/usr/bin/env bash
# Interleaved side-by-side rounds of `ferrite bench` against llama.cpp on
# the same GGUF files (BENCHMARKS.md section 13, issue 14). One round runs,
# for each file in turn, every command below as a fresh process, so a
# busy machine slows both tools alike: read the per-round ratios.
#
#   LLAMA=~/llama.cpp/build/bin FERRITE=./ferrite \
#     tools/bench/llamacpp_rounds.sh OUT ROUNDS FILE.gguf...
#
# LLAMA: the directory with llama-bench and llama-batched-bench (llama.cpp
# 34af94cd, see section 13 for the build). FERRITE: the ferrite binary.
# FERRITE_B (optional): a second ferrite binary (the build before) run
# after FERRITE in every round, for its own column. THREADS (2), NICE (-10:
# both tools get the same priority over the rest of the machine),
# BATCHED=0 skips llama-batched-bench. Writes each command's output to
# OUT/rROUND-FILE-WHAT.{json,txt} and the numbers (tok/s) to OUT/summary.tsv:
#
#   round file metric load1 llama.cpp ferrite ferrite÷llama.cpp [ferrite_b ferrite_b÷llama.cpp]
#
# metrics: pp512 (llama-bench pp512; ferrite's prompt tok/s of a lone
# 512-token request), tg128 (llama-bench tg128; ferrite decode after a
# 1-token prompt), tg128@d512 (llama-bench -d 512; ferrite decode after the
# 512-token prompt), agg8 (llama-batched-bench S_TG at 8 sequences;
# ferrite decode tok/s at concurrency 8). load1 is the 1-minute load
# average before and after the file's commands.
set -euo pipefail
out=${1:?usage: llamacpp_rounds.sh OUT ROUNDS FILE...}
rounds=${2:?rounds}
shift 2
: "${LLAMA:?set LLAMA to the llama.cpp build/bin directory}" "${FERRITE:?set FERRITE to the ferrite binary}"
threads=${THREADS:-2}
nice=${NICE:--10}
mkdir -p "$out"
load() { cut -d' ' -f1 /proc/loadavg; }
run() { # run LOGFILE CMD...: at the shared priority, output to LOGFILE
	local log=$1
	shift
	nice -n "$nice" "$@" >"$log" 2>"$log.err" || echo "failed ($?): $*" >&2
}
ferrite_runs() { # ferrite_runs BIN PREFIX FILE
	run "$2-512.json.out" "$1" bench --model "$3" --device cpu --threads "$threads" --bandwidth 50 \
		--concurrency 1 --prompt-len 512 --gen-len 128 --json "$2-512.json"
	run "$2-1.json.out" "$1" bench --model "$3" --device cpu --threads "$threads" --bandwidth 50 \
		--concurrency 1,8 --prompt-len 1 --gen-len 128 --json "$2-1.json"
}
# fer JSON CONC PROMPT FIELD: one number of a ferrite bench JSON file.
fer() { jq -r --argjson c "$2" --argjson p "$3" "[.runs[] | select(.concurrency == \$c and .prompt_len == \$p) | .$4][0] // empty" "$1" 2>/dev/null; }
# lla JSON PROMPT GEN DEPTH: llama-bench's mean tok/s of one test.
lla() { jq -r --argjson p "$2" --argjson g "$3" --argjson d "$4" "[.[] | select(.n_prompt == \$p and .n_gen == \$g and (.n_depth // 0) == \$d) | .avg_ts][0] // empty" "$1" 2>/dev/null; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else printf "-" }'; }

summary=$out/summary.tsv
[ -e "$summary" ] || printf 'round\tfile\tmetric\tload1\tllama.cpp\tferrite\tratio\tferrite_b\tratio_b\n' >"$summary"
for r in $(seq 1 "$rounds"); do
	for f in "$@"; do
		b=$(basename "$f" .gguf)
		p=$out/r$r-$b
		l0=$(load)
		run "$p-llama.json" "$LLAMA/llama-bench" -m "$f" -t "$threads" -p 512 -n 128 -r 1 -o json
		ferrite_runs "$FERRITE" "$p-ferrite" "$f"
		run "$p-llama-d512.json" "$LLAMA/llama-bench" -m "$f" -t "$threads" -p 0 -n 128 -d 512 -r 1 -o json
		[ -z "${FERRITE_B:-}" ] || ferrite_runs "$FERRITE_B" "$p-ferrite_b" "$f"
		if [ "${BATCHED:-1}" != 0 ]; then
			run "$p-batched.txt" "$LLAMA/llama-batched-bench" -m "$f" -t "$threads" -c 2048 -b 512 -ub 512 \
				-npp 1 -ntg 128 -npl 8
		fi
		l1=$(load)
		agg=$(awk -F'|' '$4 + 0 == 8 && $2 + 0 == 1 { gsub(/ /, "", $9); print $9 }' "$p-batched.txt" 2>/dev/null | tail -1 || true) # no file with BATCHED=0
		for m in pp512 tg128 tg128@d512 agg8; do
			case $m in
			pp512) a=$(lla "$p-llama.json" 512 0 0) ;;
			tg128) a=$(lla "$p-llama.json" 0 128 0) ;;
			tg128@d512) a=$(lla "$p-llama-d512.json" 0 128 512) ;;
			agg8) a=$agg ;;
			esac
			row=""
			for who in ferrite ferrite_b; do
				[ "$who" = ferrite ] || [ -n "${FERRITE_B:-}" ] || continue
				case $m in
				pp512) v=$(fer "$p-$who-512.json" 1 512 prompt_tok_per_s) ;;
				tg128) v=$(fer "$p-$who-1.json" 1 1 decode_tok_per_s) ;;
				tg128@d512) v=$(fer "$p-$who-512.json" 1 512 decode_tok_per_s) ;;
				agg8) v=$(fer "$p-$who-1.json" 8 1 decode_tok_per_s) ;;
				esac
				row+=$'\t'"${v:--}"$'\t'"$(ratio "${a:-0}" "${v:-0}")"
			done
			printf '%s\t%s\t%s\t%s–%s\t%s%s\n' "$r" "$b" "$m" "$l0" "$l1" "${a:--}" "$row" >>"$summary"
		done
		tail -4 "$summary"
	done
done
