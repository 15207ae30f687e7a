#!/usr/bin/env bash
# Draws the curves of seed 003 Figs. 3-9 (and the TCP and capacity curves behind them) with `stics model`,
# as PNG files plus the CSV tables they come from.
#
# Usage: scripts/model-figures.sh [OUT_DIR]       (default OUT_DIR: model-figures)
# Env:   STICS=path/to/stics (default: build the release binary), REQUESTS (simulated per point, default 200000)
# Needs a TrueType font for the labels (Debian: fonts-dejavu-core) or STICS_PLOT_FONT=/path/to/font.ttf.
set -euo pipefail

out=${1:-model-figures}
requests=${REQUESTS:-200000}
if [[ -z "${STICS:-}" ]]; then
    cargo build --release -q -p stics
    STICS="${CARGO_TARGET_DIR:-target}/release/stics"
fi
mkdir -p "$out"

fig() {
    local name=$1
    shift
    echo "== $name: stics model $*" >&2
    "$STICS" model "$@" --plot "$out/$name.png" --csv >"$out/$name.csv"
}

losses=1e-2,1e-3,1e-6
fig fig3-tcp tcp --loss "$losses" --sweep rtt=0.05ms..100ms --log --points 60
fig fig3-throughput-vs-rtt write --size 6KiB,264KiB,inf --loss "$losses" --sweep rtt=0.05ms..100ms --log --points 60
fig fig4-write-time-vs-rtt write --y time --size 6KiB,264KiB,1024KiB --loss "$losses" --sweep rtt=0.05ms..100ms --log --points 60
fig fig5-throughput-vs-proc write --rtt 2ms --size 6KiB,264KiB --loss "$losses" --sweep proc=0.1ms..10ms --log --points 30
fig fig6-traffic-model simulate --mode non-interleaved --arrivals lognormal,poisson --loss "$losses" \
    --sweep rtt=0.1ms..20ms --log --points 12 --requests "$requests"
fig fig7-interleaving simulate --loss "$losses" --sweep rtt=0.1ms..20ms --log --points 12 --requests "$requests"
fig fig8-large-requests simulate --size 264KiB --loss "$losses" --sweep rtt=0.1ms..20ms --log --points 12 \
    --requests "$requests"
fig fig9-offered-traffic simulate --rtt 2ms --loss 1e-6 --proc 0ms,1ms,5ms --sweep load=0.001..0.3 --log --points 15 \
    --requests "$requests"
fig capacity-vs-rtt capacity --loss "$losses" --sweep rtt=0.05ms..100ms --log --points 60
fig seed000-latency latency --sweep delay=0ms..8ms --points 17 --disk 0.24ms,6ms
echo "figures in $out/" >&2
