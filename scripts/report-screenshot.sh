#!/usr/bin/env bash
# Remakes docs/report-screenshot.png: the report of the embedded default sweep, cut to its
# capacity and memory-budget sections (the encodings of docs/report.md: one colour per policy,
# identical series dashed, the GB axis on top, tok/s against memory), rendered by headless
# Chromium. With a sweep directory, that sweep's report cut to the sections named.
#
#   report-screenshot.sh [PNG [SWEEP_DIR SECTION...]]   (default: docs/report-screenshot.png,
#                                                        the default sweep, capacity budget)
#
# docs/report-hybrid.png is `report-screenshot.sh docs/report-hybrid.png DIR hybrid` with DIR the
# sweep of docs/hybrid.md's grid (section "The report's hybrid plot").
#
# Environment: MOE_OFFLOAD, the binary (default: $CARGO_TARGET_DIR/release/moe-offload, else
# `moe-offload` on PATH); CHROMIUM, the browser (default: chromium on PATH).
set -euo pipefail

die() { echo "report-screenshot.sh: $*" >&2; exit 2; }
png=$(realpath -m "${1:-docs/report-screenshot.png}")
sweep_dir=${2:-}
sections="capacity|budget"
if [[ $# -gt 2 ]]; then sections=$(IFS='|'; echo "${*:3}"); fi
target=${CARGO_TARGET_DIR:-target}
bin=${MOE_OFFLOAD:-$target/release/moe-offload}
[[ -x $bin ]] || bin=$(command -v moe-offload) || die "no moe-offload binary: build it (cargo build --release) or set MOE_OFFLOAD"
chrome=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n $chrome ]] || die "chromium is not installed (apt-get install -y chromium) or set CHROMIUM"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ -z $sweep_dir ]]; then
  "$bin" sweep --threads 2 -o "$work/sweep" >/dev/null
  "$bin" report "$work/sweep" --log-x -o "$work/report.html" >/dev/null
else
  [[ -f $sweep_dir/results.json ]] || die "$sweep_dir has no results.json: give a sweep's output directory"
  "$bin" report "$sweep_dir" -o "$work/report.html" >/dev/null
fi
# The page up to its first section (styles, title), the sections named, the end of the page.
awk -v sections="$sections" '
  /<section id="/ { keep = ($0 ~ ("<section id=\"(" sections ")\"")); started = 1 }
  !started || keep { print }
  /<\/section>/ { keep = 0 }
  END { print "</body></html>" }
' "$work/report.html" >"$work/cut.html"
"$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$work/profile" \
  --screenshot="$png" --window-size=1300,2600 "file://$work/cut.html" >/dev/null 2>&1
echo "wrote $png"
