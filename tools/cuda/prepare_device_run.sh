#!/usr/bin/env bash
# Prepares DEST (default .device-out/ of this checkout, git-ignored) for
# tools/cuda/device_run.sh on the GPU machine: the test binaries of
# kernels/cuda, kernels/device, engine, engine/models/qwen3next and
# engine/models/glm5next, a ferrite binary for `ferrite
# bench`, tools/randgguf (the kvb stage's GGUF), kernels/cuda's CUDA sources, build_fatbin.sh and the Qwen3-8B
# config, binaries xz-compressed to fit the 64 MiB the working tree may
# take. With KEEP_FATBIN=1 the committed fatbin and manifest go along and
# device_run.sh uses them instead of building (for runs that change no
# CUDA source). The ferrite binary is built from a copy of the checkout whose
# built-in model weights are emptied (megabytes the bench never reads).
#
#	[BINS="cuda engine"] [KEEP_FATBIN=1] tools/cuda/prepare_device_run.sh [DEST]
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
dest="$(realpath -m "${1:-$src/.device-out}")"
rm -rf "$dest"
mkdir -p "$dest/k" "$dest/tools/cuda" "$dest/qwen3-8b" "$dest/qwen3-30b-a3b"
cd "$src"
export CGO_ENABLED=0
# BINS names the test binaries to build (default: all of them); the
# travelling tree holds 64 MiB, and each binary is 7–9 MB compressed.
bins=" ${BINS:-mla cuda device engine qwen3next glm5next} "
declare -A pkg=([mla]=./engine/models/mla [cuda]=./kernels/cuda [device]=./kernels/device [engine]=./engine
	[qwen3next]=./engine/models/qwen3next [glm5next]=./engine/models/glm5next) # the last two: the hybrids' own suites
for b in mla cuda device engine qwen3next glm5next; do
	[[ "$bins" == *" $b "* ]] && go test -c -ldflags=-s -o "$dest/$b.test" "${pkg[$b]}"
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tmp"
for f in "$tmp"/builtin/model/model.*; do : >"$f"; done
(cd "$tmp" && go build -ldflags=-s -o "$dest/ferrite" . && go build -ldflags=-s -o "$dest/randgguf" ./tools/randgguf)
cp -r kernels/cuda/src "$dest/k/"
if [ "${KEEP_FATBIN:-0}" = 1 ]; then
	cp kernels/cuda/ferrite.fatbin kernels/cuda/fatbin.sha256 "$dest/k/"
fi
cp tools/cuda/build_fatbin.sh "$dest/tools/cuda/"
cp tools/cuda/device_run.sh "$dest/"
cp engine/testdata/qwen3-8b/config.json "$dest/qwen3-8b/"
cp engine/testdata/qwen3-30b-a3b/config.json "$dest/qwen3-30b-a3b/"
xz -T2 -6 "$dest"/*.test "$dest/ferrite" "$dest/randgguf"
du -sh "$dest"
