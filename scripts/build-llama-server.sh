#!/usr/bin/env bash
# Build llama.cpp's llama-server for the CPU from the llama-cpp-python source distribution and cache the binary.
#
#   scripts/build-llama-server.sh            -> prints the cached binary's path on its last stdout line
#
# Cache root: $AUTOTUNE_CACHE, default <repo>/.cache (gitignored). The binary lands in <cache>/llama/bin/llama-server,
# statically linked against libllama/libggml, so it runs after the build directory is gone. Re-running when the
# binary exists (and was built with the same flags) is a fast no-op. Nothing is downloaded except through pip.
#
# Environment:
#   AUTOTUNE_CACHE     cache root (default: <repo>/.cache)
#   LLAMA_CPP_PY_VER   llama-cpp-python version whose sdist vendors llama.cpp (default 0.3.36)
#   BUILD_JOBS         parallel compile jobs (default: nproc)
#   KEEP_BUILD=1       keep the temporary source/build directory (its path is printed on stderr)
set -euo pipefail

log() { printf 'build-llama-server: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${AUTOTUNE_CACHE:-$repo_root/.cache}"
version="${LLAMA_CPP_PY_VER:-0.3.36}"
jobs="${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
dest_dir="$cache_root/llama/bin"
binary="$dest_dir/llama-server"
stamp="$dest_dir/llama-server.build"

for tool in cmake python3 tar; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not installed (needed to build llama-server)"
done
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || die "no C++ compiler (c++/g++) on PATH"

# GGML_OPENMP stays at its default (ON): one OpenMP thread team serves both the target and the draft context, where
# ggml's own threadpools (OFF) give each context a pool whose idle workers spin while the other computes; on 2 cores
# that made draft-simple 3-10x slower. The binary then needs the system's libgomp (installed with gcc).
#
# CPU features: GGML_NATIVE=OFF so the binary never enables AMX (ggml_backend_amx_mul_mat segfaults on these VMs);
# the x86 SIMD levels are switched on explicitly, AVX-512 only where this CPU has it (an AVX-512 build dies with
# SIGILL on a CPU without it, e.g. the AMD EPYC CI machines).
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$cpu_flags" == *" $1 "* ]]; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_AVX="$(onoff avx)"
    -DGGML_AVX2="$(onoff avx2)"
    -DGGML_FMA="$(onoff fma)"
    -DGGML_F16C="$(onoff f16c)"
    -DGGML_AVX512="$(onoff avx512f)"
    -DGGML_AMX_TILE=OFF
    -DGGML_AMX_INT8=OFF
    -DGGML_AMX_BF16=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
)
want_stamp="llama-cpp-python==$version ${cmake_flags[*]}"

if [[ -x "$binary" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
    if "$binary" --version >/dev/null 2>&1; then
        log "cached binary is up to date"
        echo "$binary"
        exit 0
    fi
    log "cached binary does not run; rebuilding"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")"
cleanup() {
    if [[ "${KEEP_BUILD:-0}" == 1 ]]; then log "kept build directory $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

log "downloading llama-cpp-python==$version source distribution with pip"
# --no-binary for this package only: its sdist, while pip's metadata step may use wheels of its build backend
# (--no-binary :all: also compiles scikit-build-core's own build dependencies from source: 75 s instead of 11 s)
python3 -m pip download --quiet --no-binary llama-cpp-python --no-deps \
    --dest "$work/dl" "llama-cpp-python==$version" >&2 \
    || die "pip could not download llama-cpp-python==$version (is the package index reachable?)"
sdist="$(find "$work/dl" -maxdepth 1 -name 'llama[_-]cpp[_-]python-*.tar.gz' | head -n1)"
[[ -n "$sdist" ]] || die "pip produced no llama-cpp-python sdist in $work/dl"

log "unpacking $(basename "$sdist")"
tar -xzf "$sdist" -C "$work"
src="$(find "$work" -maxdepth 4 -type f -path '*/vendor/llama.cpp/CMakeLists.txt' | head -n1)"
[[ -n "$src" ]] || die "no vendor/llama.cpp/CMakeLists.txt in $(basename "$sdist")"
src="$(dirname "$src")"

log "configuring llama.cpp in $src"
cmake -S "$src" -B "$work/build" "${cmake_flags[@]}" >"$work/cmake-configure.log" 2>&1 \
    || { tail -n 40 "$work/cmake-configure.log" >&2; die "cmake configure failed (log above)"; }

log "building target llama-server with $jobs jobs (about 9 minutes on 2 idle cores, longer on a busy machine)"
start=$SECONDS
cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/cmake-build.log" 2>&1 \
    || { tail -n 60 "$work/cmake-build.log" >&2; die "cmake build failed (log above)"; }
log "built in $((SECONDS - start)) s"

built="$work/build/bin/llama-server"
[[ -x "$built" ]] || built="$(find "$work/build" -type f -name llama-server -perm -u+x | head -n1)"
[[ -n "$built" && -x "$built" ]] || die "the build produced no llama-server binary"

mkdir -p "$dest_dir"
tmp_bin="$(mktemp "$dest_dir/.llama-server.XXXXXX")"
cp "$built" "$tmp_bin"
chmod 755 "$tmp_bin"
# static build: copy any shared lib it still names from the build tree anyway, then check it runs on its own
if command -v ldd >/dev/null 2>&1 && ldd "$tmp_bin" | grep -q 'not found'; then
    find "$work/build" -name 'lib*.so*' -exec cp -P {} "$dest_dir/" \;
fi
mv -f "$tmp_bin" "$binary"
rm -rf "$work/build"
"$binary" --version >/dev/null 2>&1 || die "the cached binary $binary does not run (try: $binary --version)"
printf '%s\n' "$want_stamp" >"$stamp"
log "cached $binary ($(du -h "$binary" | cut -f1))"
echo "$binary"
