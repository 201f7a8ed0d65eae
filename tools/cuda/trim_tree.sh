#!/usr/bin/env bash
# Trims this checkout's working tree for a GPU-machine run, whose copy of
# the tree (tracked files, untracked ones git does not ignore, and what
# `carry` names: .device-out) may hold 64 MiB at most, and puts it back:
#
#	tools/cuda/trim_tree.sh            # delete what device runs do not read, print the size
#	tools/cuda/trim_tree.sh restore    # bring every deleted tracked file back from git
#
# It deletes tracked files only (git restores them): the tokenizer's and
# GGUF reader's test data, the built-in model's reference outputs, the
# training results, the generated AVX-512 tiles, the committed fatbin (the
# test binaries embed it, device_run.sh builds or carries its own), and the
# transformers fixtures except KEEP_FIXTURES (default "qwen3 qwen3_next
# glm5_next", the ones the device suites use most). Commit before trimming,
# restore before the next commit: `git add -A` on a trimmed tree commits
# the deletions.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = restore ]; then
	git ls-files -d -z | xargs -0 -r git checkout --
	echo "restored; $(git status --short | wc -l) paths differ from HEAD"
	exit 0
fi
if [ -n "$(git status --short --untracked-files=no | grep -v '^ D' || true)" ]; then
	echo "trim_tree: commit or stash the changes first (a trimmed tree must not be committed)" >&2
	exit 2
fi
rm -rf tokenizer/testdata engine/gguf/testdata builtin/testdata tools/train/results \
	kernels/cpu/tile_amd64.s kernels/cuda/ferrite.fatbin
keep=" ${KEEP_FIXTURES:-qwen3 qwen3_next glm5_next} "
for d in testdata/models/*/; do
	name=$(basename "$d")
	[[ "$keep" == *" $name "* ]] || rm -rf "$d"
done
size=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] && size=$((size + $(stat -c %s "$f")))
done < <(git ls-files -co --exclude-standard -z)
carry=0
[ -d .device-out ] && carry=$(du -sb .device-out | cut -f1)
total=$((size + carry))
awk -v t="$total" -v s="$size" -v c="$carry" \
	'BEGIN { printf "travels: %.1f MiB (tree %.1f, .device-out %.1f) of 64 MiB\n", t / 1048576, s / 1048576, c / 1048576 }'
if ((total > 64 << 20)); then
	echo "trim_tree: over 64 MiB: delete test binaries from .device-out or set KEEP_FIXTURES to fewer fixtures" >&2
	exit 1
fi
