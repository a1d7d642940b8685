#!/usr/bin/env bash
# Build SGLang's own argument resolution (server_args) into a virtual environment on a CPU-only machine and cache it.
#
#   scripts/build-sglang-oracle.sh           -> prints the venv's python path on its last stdout line
#
# The venv answers "what would SGLang 0.5.23 do with these flags on this GPU" (autotune/testing/sglang_oracle.py):
# ServerArgs.resolve_once() runs without a GPU or weights, given --device cuda, a platform override and a directory
# holding only a config.json. Only what importing sglang.srt.server_args needs is installed:
#   - torch==2.13.0, the CPU build this machine carries as a local wheel (any other torch is a CUDA build of GBs);
#   - sglang itself with --no-deps;
#   - the ~20 packages server_args imports, pinned as sglang's own metadata pins them;
#   - an import-only torchvision stand-in (PyPI's torchvision links a CUDA torch; resolution never calls it).
# Re-running when the venv answers is a fast no-op. Nothing is downloaded except through pip.
#
# Cache root: $AUTOTUNE_CACHE, default <repo>/.cache (gitignored); the venv is <cache>/sglang-oracle/venv.
#
# Environment:
#   AUTOTUNE_CACHE        cache root (default: <repo>/.cache)
#   SGLANG_ORACLE_VER     sglang version (default 0.5.23)
#   SGLANG_ORACLE_TORCH   torch version (default 2.13.0, the local CPU build)
set -euo pipefail

log() { printf 'build-sglang-oracle: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${AUTOTUNE_CACHE:-$repo_root/.cache}"
version="${SGLANG_ORACLE_VER:-0.5.23}"
torch_version="${SGLANG_ORACLE_TORCH:-2.13.0}"
dest="$cache_root/sglang-oracle"
venv="$dest/venv"
python="$venv/bin/python"
stamp="$dest/oracle.build"
want_stamp="sglang==$version torch==$torch_version torchvision-stand-in 2 deps 2"

# The packages resolution imports (found by resolving configs in a bare venv until they resolve): server_args's, then
# openai, partial-json-parser and einops, which DFLASH's and DSPARK's draft-config readers import.
import_deps=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm IPython
    aiohttp transformers dill apache-tvm-ffi sentencepiece gguf compressed-tensors triton openai partial-json-parser
    einops)

# The check a cached venv must pass (quick: the package is there at the right version) and the one a new build must
# pass (ServerArgs resolves a speculative config for a directory holding only a config.json, as an H100 would).
quick="from importlib.metadata import version; assert version('sglang') == '$version'"
smoke='
import json, sys, tempfile, pathlib
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import override_platform
model = pathlib.Path(tempfile.mkdtemp())
(model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8,
    "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
with override_platform(is_cuda=True, is_hip=False, is_hopper_with_cuda_12_3=True, is_sm90=True, is_sm100=False,
                       has_flashinfer=True):
    args = prepare_server_args(["--model-path", str(model), "--device", "cuda", "--speculative-algorithm", "EAGLE",
                                "--speculative-draft-model-path", str(model)])
    args.resolve_once()
    resolved = args.resolved_dict()
assert resolved["speculative_num_steps"] == 5, resolved["speculative_num_steps"]
'

mkdir -p "$dest"
# One build at a time per cache (two test sessions starting together wait for each other instead of racing).
exec 9>"$dest/.lock"
command -v flock >/dev/null 2>&1 && flock 9

if [[ -x "$python" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
    if "$python" -c "$quick" >/dev/null 2>&1; then
        log "cached oracle venv is up to date"
        echo "$python"
        exit 0
    fi
    log "cached venv does not import sglang==$version; rebuilding"
fi

command -v python3 >/dev/null 2>&1 || die "'python3' is not installed (needed to build the SGLang oracle)"
rm -rf "$venv" "$stamp"
log "creating $venv"
python3 -m venv "$venv" || die "python3 -m venv failed (is the venv module installed?)"
pip=("$python" -m pip install --quiet --disable-pip-version-check)

start=$SECONDS
log "installing torch==$torch_version (the CPU build)"
"${pip[@]}" "torch==$torch_version" >&2 || die "pip could not install torch==$torch_version"
torch_installed="$("$python" -c 'import torch; print(torch.__version__)')"
[[ "$torch_installed" == *+cpu* ]] || die "pip installed torch $torch_installed, not a CPU build"

log "installing sglang==$version without its dependencies"
"${pip[@]}" --no-deps "sglang==$version" >&2 || die "pip could not install sglang==$version"

# Pin each import dependency as sglang's metadata pins it; torch is held at the installed CPU build so that no
# dependency (triton, compressed-tensors, ...) can pull another one.
mapfile -t pinned < <("$python" - "${import_deps[@]}" <<'EOF'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

pins = {}
for line in requires("sglang") or []:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        pins[canonicalize_name(req.name)] = str(req.specifier)
for name in sys.argv[1:]:
    print(name + pins.get(canonicalize_name(name), ""))
EOF
)
constraints="$dest/constraints.txt"
printf 'torch==%s\n' "$torch_installed" >"$constraints"
log "installing the import dependencies: ${pinned[*]}"
PIP_CONSTRAINT="$constraints" "${pip[@]}" "${pinned[@]}" >&2 \
    || die "pip could not install sglang's import dependencies (${pinned[*]})"

# torchvision: an import-only stand-in (sglang's multimodal helpers and transformers' image utilities import names
# from it at module level; argument resolution never calls them). Every name exists and fails only when used.
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/torchvision"
for module in "" io transforms transforms/functional transforms/v2 transforms/v2/functional; do
    mkdir -p "$site/torchvision/$module"
    cat >"$site/torchvision/$module/__init__.py" <<'STUB'
"""Import-only stand-in for torchvision in the SGLang oracle venv (scripts/build-sglang-oracle.sh): argument
resolution imports names from it but never calls them; using one raises."""
import enum

__version__ = "0.0.0+oracle.stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    class Unavailable:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"torchvision.{name} is a stand-in in the SGLang oracle venv")

    Unavailable.__name__ = name
    return Unavailable
STUB
done

log "checking that SGLang resolves a config"
"$python" -c "$smoke" >"$dest/smoke.log" 2>&1 \
    || { tail -n 30 "$dest/smoke.log" >&2; die "the oracle venv does not resolve SGLang's arguments (output above)"; }
printf '%s\n' "$want_stamp" >"$stamp"
log "built in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
echo "$python"
