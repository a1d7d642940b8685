#!/usr/bin/env bash
# Set up this machine for autotune's tests: everything the whole suite needs, so that nothing in it is skipped.
#
#   scripts/setup.sh          (as root, or with sudo for the system packages; about 15 minutes the first time,
#                              seconds once everything is cached)
#
# Idempotent: each step checks what is there and does only what is missing. Nothing is downloaded except through
# apt, pip and their registries. What it sets up:
#   - Debian packages: OpenSSH's server and client (the SSH targets' tests run a real sshd on 127.0.0.1), PostgreSQL's
#     binaries (the several-workers tests start a throw-away cluster), cmake and g++ (to build llama-server)
#   - Python packages: autotune itself with the test extra, and the [gp] extra on torch's CPU build
#     (torch==2.13.0: this machine kind carries that CPU build as a local file; PyPI's default torch is a CUDA build
#     of several GB)
#   - llama.cpp's llama-server and SmolLM2-135M (scripts/build-llama-server.sh, scripts/fetch-smollm2.sh), cached
#   - SGLang 0.5.23 serving on this CPU, in a virtual environment of its own with this project's torch kernels and
#     SmolLM2 with a draft (scripts/build-sglang-cpu.sh), cached: the tests drive the real server with it, and ask
#     its argument resolution whether the engine rules and the emulator agree with real SGLang
# Caches live under $AUTOTUNE_CACHE (default <repo>/.cache). A Python 3.6 for the oldest-target tests is looked for
# (this machine kind has one under ~/.pyenv); the script says so when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
step() { printf '\n== setup: %s (%ss)\n' "$*" "$(( $(date +%s) - started ))"; }
python=${PYTHON:-python}

step "system packages"
missing=()
[ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1 || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "all present"
fi

step "python packages"
if "$python" -c 'import torch' >/dev/null 2>&1; then
    "$python" -m pip install --quiet -e '.[test,gp]'
else
    "$python" -m pip install --quiet torch==2.13.0 -e '.[test,gp]'
fi

step "llama-server and SmolLM2"
scripts/build-llama-server.sh
scripts/fetch-smollm2.sh

step "SGLang 0.5.23 on this CPU (the real server and the oracle)"
scripts/build-sglang-cpu.sh

step "an old Python for the oldest-target tests"
old=$(ls ~/.pyenv/versions/3.6*/bin/python3.6 2>/dev/null | head -n1 || true)
[ -n "$old" ] || old=$(command -v python3.6 || true)
if [ -n "$old" ] && "$old" -c pass 2>/dev/null; then
    echo "$old"
else
    echo "setup: no Python 3.6 here: the oldest-target tests will fail (install one as python3.6 on the PATH)" >&2
fi

step "done"
