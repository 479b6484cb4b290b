#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (`llama-server`, CPU) from the llama.cpp sources vendored in PyPI's
# llama-cpp-python sdist, for the remote-backend tests and for anyone who wants a local OpenAI-compatible
# engine. Idempotent: a finished build is found and reused; nothing is downloaded except the sdist (pip).
#
#   bash tests/remote/install_llama_server.sh            # prints the path of the built directory
#
# Result: $LSP_DSCODER_LLAMA_DIR (default ~/.cache/lsp-dscoder/llama.cpp-<version>) holding
#   bin/llama-server           the server binary (static, no shared libraries to find)
#   src/                       the llama.cpp tree: convert_hf_to_gguf.py and gguf-py/ for the GGUF conversion
# The tests find it there (or through $LSP_DSCODER_LLAMA_SERVER).
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dest="${LSP_DSCODER_LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lsp-dscoder/llama.cpp-$version}"
server="$dest/bin/llama-server"

if [[ -x "$server" && -f "$dest/src/convert_hf_to_gguf.py" ]] && "$server" --version >/dev/null 2>&1; then
    echo "$dest"
    exit 0
fi

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null || { echo "install_llama_server: '$tool' is needed (apt-get install cmake g++)" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# No web UI (the prebuilt one would be fetched from a hub), no HTTPS, no tests/examples: only the server.
cmake -S "$src" -B "$work/build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2

rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/bin" "$dest.tmp/src"
cp "$work/build/bin/llama-server" "$dest.tmp/bin/"
# The converter (a script, its `conversion` package and the matching `gguf` package), not the whole tree.
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$dest.tmp/src/"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
"$server" --version >&2
echo "$dest"
