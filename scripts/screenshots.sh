#!/usr/bin/env bash
# The README's pictures: optuna-dashboard showing the demo study (overview, and a trial that ran out of memory with
# its artifacts) and two report plots, taken with headless Chromium.
#
#   scripts/screenshots.sh [STUDIES_DIR]
#
# STUDIES_DIR: a directory holding demo.toml and its finished study (demo.db, demo-artifacts/); without it the demo
# study is run first in a temporary directory (about two minutes). Needs Debian's chromium
# (apt-get install -y chromium); CI does not run this. Writes docs/images/*.png.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/docs/images"
mkdir -p "$out"
work="$(mktemp -d)"
dash_pid=""
cleanup() {
    if [ -n "$dash_pid" ]; then kill "$dash_pid" 2>/dev/null || true; wait "$dash_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { echo "screenshots.sh: chromium not found (apt-get install -y chromium)" >&2; exit 1; }

if [ $# -ge 1 ]; then
    studies="$(cd "$1" && pwd)"
else
    studies="$work/studies"
    mkdir -p "$studies"
    cp "$repo/studies/demo.toml" "$studies/"
    (cd "$work" && autotune run --study demo)
fi
cd "$studies/.."
study="$studies/demo.toml"

autotune report --study "$study" --out "$work/report"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
autotune dashboard --study "$study" --port "$port" > "$work/dashboard.log" 2>&1 &
dash_pid=$!
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/api/studies" > /dev/null 2>&1 && break
    sleep 0.2
done
study_id="$(curl -fsS "http://127.0.0.1:$port/api/studies" |
    python3 -c 'import json, sys; print(next(s["study_id"] for s in json.load(sys.stdin)["study_summaries"] if s["study_name"] == "demo"))')"
failed="$(autotune status --study "$study" --json |
    python3 -c 'import json, sys; print(next(t["number"] for t in json.load(sys.stdin)["trials"] if t["state"] != "COMPLETE" and t["reason"] not in (None, "pruned")))')"

shot() {  # shot URL FILE [WIDTH,HEIGHT]
    local profile
    profile="$(mktemp -d "$work/chromium.XXXXXX")"
    "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
        --disable-component-update --disable-sync --user-data-dir="$profile" --window-size="${3:-1400,900}" \
        --hide-scrollbars --virtual-time-budget=15000 --screenshot="$2" "$1" > /dev/null 2>&1
    [ -s "$2" ] || { echo "screenshots.sh: no screenshot of $1" >&2; exit 1; }
    echo "$2"
}

base="http://127.0.0.1:$port/dashboard/studies/$study_id"
shot "$base" "$out/dashboard.png"
shot "$base/trials?numbers=$failed" "$out/dashboard-failed-trial.png" 1400,1150
shot "file://$work/report/history.html" "$out/report-history.png" 1200,640
shot "file://$work/report/throughput.html" "$out/report-throughput.png" 1200,640
