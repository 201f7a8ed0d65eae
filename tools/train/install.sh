#!/bin/bash
# Install a training run's results into the repository:
#   tools/train/install.sh <dir holding ferrite-tiny.tgz.partNN | unpacked run dir>
# The bf16 checkpoint (model/) is packed into builtin/model/model.gguf (Q8_0 matrices, F32 norms:
# tools/packtiny), beside its config and tokenizer files; the reference fixture goes to
# builtin/testdata/reference/, the summary, evaluation and log to tools/train/results/.
# The bf16 checkpoint itself stays out of the repository: keep the run's archive.
set -euo pipefail
src=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
if ls "$src"/ferrite-tiny.tgz.part* >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  cat "$src"/ferrite-tiny.tgz.part* | tar xzf - -C "$tmp"
  src=$tmp
fi
m="$root/builtin/model"
fx="$root/builtin/testdata/reference"
mkdir -p "$m" "$fx"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  cp "$src/model/$f" "$m/$f"
done
(cd "$root" && go run ./tools/packtiny -checkpoint "$src/model" -out "$m/model.gguf")
for f in reference.safetensors reference.json tokenizer_cases.json answers.json; do
  cp "$src/fixture/$f" "$fx/$f"
done
mkdir -p "$root/tools/train/results"
for f in summary.json eval_results.json log.txt; do
  if [ -f "$src/$f" ]; then cp "$src/$f" "$root/tools/train/results/$f"; fi
done
ls -la "$m" "$fx"
echo "next: check the Q8_0 model against the bf16 run's evaluation (MODEL_CARD.md, Retraining)"
