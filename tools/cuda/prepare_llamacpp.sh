#!/usr/bin/env bash
# Prepares DEST (default .device-out-llama/llama/ of this checkout,
# git-ignored) for tools/cuda/llamacpp_gpu.sh on the GPU machine, which
# has no network and no Go: a trimmed source tarball of llama.cpp commit
# 34af94cd (what the targets llama-bench, llama-batched-bench and
# llama-quantize need: ggml with its CPU and CUDA backends, src, include,
# common, the three tools, and a tools/CMakeLists.txt that adds only
# them), a static tools/randgguf, the Qwen3-8B config and the script, the
# binaries xz-compressed (about 3 MB in all). LLAMA_GIT is a git directory
# holding that commit (a clone or mirror of llama.cpp). With CHECK=1 it
# then configures and builds the three targets from the tarball on this
# machine's CPU (-DGGML_CUDA=OFF, otherwise the GPU machine's flags).
#
#	LLAMA_GIT=/path/to/llama.cpp/.git tools/cuda/prepare_llamacpp.sh [DEST]
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${1:-$src/.device-out-llama/llama}"
commit=34af94cd9ab277632e27caeec2d41de2fd091b31
git_dir="${LLAMA_GIT:?LLAMA_GIT: a git directory of llama.cpp holding $commit}"
rm -rf "$dest"
mkdir -p "$dest/qwen3-8b"
dest="$(cd "$dest" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ggml's own sources, its CPU and CUDA backends (no other backend), and
# llama.cpp's library, common library and the three tools.
ggml_top=$(git --git-dir "$git_dir" ls-tree --name-only "$commit" ggml/src/ | grep -E '\.(c|cpp|h|txt)$')
# shellcheck disable=SC2086
git --git-dir "$git_dir" archive --prefix=llama.cpp/ "$commit" \
	CMakeLists.txt LICENSE cmake ggml/CMakeLists.txt ggml/cmake ggml/include $ggml_top \
	ggml/src/ggml-cpu ggml/src/ggml-cuda include src common \
	tools/llama-bench tools/batched-bench tools/quantize \
	vendor/cpp-httplib vendor/nlohmann vendor/sheredom | tar -C "$tmp" -xf -
cat >"$tmp/llama.cpp/tools/CMakeLists.txt" <<'EOF'
# Trimmed by ferrite's tools/cuda/prepare_llamacpp.sh: the benchmark tools only.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
add_subdirectory(quantize)
EOF
echo "$commit" >"$tmp/llama.cpp/COMMIT"
tar -C "$tmp" -cf - llama.cpp | xz -T2 -6 >"$dest/llama.cpp.tar.xz"

(cd "$src" && CGO_ENABLED=0 go build -ldflags=-s -o "$tmp/randgguf" ./tools/randgguf)
xz -T2 -6 -c "$tmp/randgguf" >"$dest/randgguf.xz"
cp "$src/engine/testdata/qwen3-8b/config.json" "$dest/qwen3-8b/"
cp "$src/tools/cuda/llamacpp_gpu.sh" "$dest/"
du -ab "$dest"

if [ "${CHECK:-0}" = 1 ]; then
	chk="$tmp/check"
	mkdir -p "$chk"
	xz -dc "$dest/llama.cpp.tar.xz" | tar -C "$chk" -xf -
	t0=$SECONDS
	cmake -S "$chk/llama.cpp" -B "$chk/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
		-DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DGGML_CUDA_FA_ALL_QUANTS=OFF \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null
	cmake --build "$chk/build" -j "$(nproc)" --target llama-bench llama-batched-bench llama-quantize >/dev/null
	"$chk/build/bin/llama-bench" --help | head -3
	echo "CPU configure + build of the three targets: $((SECONDS - t0)) s on $(nproc) cores"
fi
