#!/usr/bin/env bash
# Remakes docs/report-screenshot.png: the report of the embedded default sweep, cut to its
# capacity and memory-budget sections (the encodings of docs/report.md: one colour per policy,
# identical series dashed, the GB axis on top, tok/s against memory), rendered by headless
# Chromium.
#
#   report-screenshot.sh [PNG]        (default: docs/report-screenshot.png)
#
# Environment: MOE_OFFLOAD, the binary (default: $CARGO_TARGET_DIR/release/moe-offload, else
# `moe-offload` on PATH); CHROMIUM, the browser (default: chromium on PATH).
set -euo pipefail

die() { echo "report-screenshot.sh: $*" >&2; exit 2; }
png=$(realpath -m "${1:-docs/report-screenshot.png}")
target=${CARGO_TARGET_DIR:-target}
bin=${MOE_OFFLOAD:-$target/release/moe-offload}
[[ -x $bin ]] || bin=$(command -v moe-offload) || die "no moe-offload binary: build it (cargo build --release) or set MOE_OFFLOAD"
chrome=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n $chrome ]] || die "chromium is not installed (apt-get install -y chromium) or set CHROMIUM"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin" sweep --threads 2 -o "$work/sweep" >/dev/null
"$bin" report "$work/sweep" --log-x -o "$work/report.html" >/dev/null
# The page up to its first section (styles, title), the two sections, the end of the page.
awk '
  /<section id="/ { keep = ($0 ~ /<section id="(capacity|budget)"/); started = 1 }
  !started || keep { print }
  /<\/section>/ { keep = 0 }
  END { print "</body></html>" }
' "$work/report.html" >"$work/cut.html"
"$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$work/profile" \
  --screenshot="$png" --window-size=1300,2600 "file://$work/cut.html" >/dev/null 2>&1
echo "wrote $png"
