#!/bin/bash
# One training run of ferrite-tiny on the GPU machine (see MODEL_CARD.md, "Retraining").
# Run from the repository root with the corpus in tools/train/data/corpus (build_corpus.py).
# Leaves the model, fixture, summary and log in $W and, when $OUT is set, the split archive
# $OUT/ferrite-tiny.tgz.partNN (join with cat, then tar xzf).
set -o pipefail
export PYTHONUNBUFFERED=1
W=${W:-/tmp/ft}
TRAIN_UNTIL=${TRAIN_UNTIL:-360}   # seconds after the script's start when training stops
LIMIT=${LIMIT:-470}               # hard limit for the whole Python run
mkdir -p "$W"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
timeout -s INT "$LIMIT" python3 tools/train/train.py --corpus tools/train/data/corpus --out "$W" \
  --train-until "$TRAIN_UNTIL" --eval-deadline "$((LIMIT - 28))" "$@" 2>&1 | tee "$W/log.txt"
rc=$?
if [ -n "$OUT" ]; then
  (cd "$W" && tar czf /tmp/ferrite-tiny.tgz --ignore-failed-read model fixture summary.json eval_results.json log.txt)
  split -b 15M -d /tmp/ferrite-tiny.tgz "$OUT/ferrite-tiny.tgz.part"
  ls -la "$OUT"
fi
exit $rc
