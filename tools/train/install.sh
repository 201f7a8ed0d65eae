#!/bin/bash
# Install a training run's results into the repository:
#   tools/train/install.sh <dir holding ferrite-tiny.tgz.partNN | unpacked run dir>
# Model files go to builtin/model/, the reference fixture to testdata/models/ferrite-tiny/
# (whose config.json, generation_config.json and model.safetensors are links to builtin/model/).
set -euo pipefail
src=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
if ls "$src"/ferrite-tiny.tgz.part* >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  cat "$src"/ferrite-tiny.tgz.part* | tar xzf - -C "$tmp"
  src=$tmp
fi
m="$root/builtin/model"
fx="$root/testdata/models/ferrite-tiny"
mkdir -p "$m" "$fx"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja; do
  cp "$src/model/$f" "$m/$f"
done
for f in reference.safetensors reference.json tokenizer_cases.json answers.json; do
  cp "$src/fixture/$f" "$fx/$f"
done
for f in config.json generation_config.json model.safetensors; do
  ln -sfn "../../../builtin/model/$f" "$fx/$f"
done
mkdir -p "$root/tools/train/results"
for f in summary.json eval_results.json log.txt; do
  if [ -f "$src/$f" ]; then cp "$src/$f" "$root/tools/train/results/$f"; fi
done
ls -la "$m" "$fx"
