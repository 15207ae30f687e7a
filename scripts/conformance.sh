#!/usr/bin/env bash
# Runs libiscsi's conformance suite (iscsi-test-cu --test=ALL) against `stics target` with a
# mem:1GiB LUN (or the --lun spec, e.g. mem:1GiB:4096 for 4 KiB blocks) and, unless --stics-only,
# against tgt in the same run, and prints a table.
# Exit status: non-zero if stics fails any test, or (with tgt) has fewer than tgt + 20 real passes.
#
#   scripts/conformance.sh [--stics-only] [--lun SPEC] [--logs DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"

with_tgt=1
lun=mem:1GiB
logs=""
while (($#)); do
    case $1 in
        --stics-only) with_tgt=0 ;;
        --lun) lun=$2; shift ;;
        --logs) logs=$2; shift ;;
        -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
need iscsi-test-cu iscsi-readcapacity16 python3
logs=${logs:-$(mktemp -d /tmp/stics-conformance.XXXXXX)}
mkdir -p "$logs"

port=$(free_port)
start_stics "$port" "$logs/stics-target.log" "$lun"
url="iscsi://127.0.0.1:$port/$STICS_IQN/0"
block=$(iscsi-readcapacity16 "$url" | sed -n 's/^LOGICAL BLOCK LENGTH IN BYTES://p')
echo "LUN under test: $lun, block size $block"
iscsi-test-cu -d --test=ALL "$url" >"$logs/stics.log" 2>&1 || true
stics_json=$(python3 "$(dirname "$0")/cu-parse.py" "$logs/stics.log")

if ((with_tgt)); then
    tport=$(free_port)
    img="$logs/tgt-lun.img"
    truncate -s 1G "$img"
    CLEANUPS+=("rm -f '$img'")
    start_tgt "$tport" "$img"
    iscsi-test-cu -d --test=ALL "iscsi://127.0.0.1:$tport/$TGT_IQN/1" >"$logs/tgt.log" 2>&1 || true
    tgt_json=$(python3 "$(dirname "$0")/cu-parse.py" "$logs/tgt.log")
else
    tgt_json=null
fi

python3 - "$stics_json" "$tgt_json" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); t = json.loads(sys.argv[2])
rows = [("stics", s)] + ([("tgt", t)] if t else [])
print(f"{'target':8} {'tests':>6} {'real passes':>12} {'skipped':>8} {'failed':>7} {'by design':>10}")
for name, r in rows:
    print(f"{name:8} {r['tests']:>6} {r['real_passes']:>12} {r['skipped']:>8} {len(r['failed']):>7} {len(r['by_design']):>10}")
if t:
    print(f"stics - tgt real passes: {s['real_passes'] - t['real_passes']:+d} (required: at least +20)")
for name, r in rows:
    for f in r["failed"]:
        print(f"{name} FAILED: {f}")
    for f in r["by_design"]:
        print(f"{name} printed [FAILED] by the test's design (assertions passed): {f}")
PY
echo "logs: $logs"

python3 - "$stics_json" "$tgt_json" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); t = json.loads(sys.argv[2])
ok = s["tests"] > 200 and not s["failed"] and (t is None or s["real_passes"] >= t["real_passes"] + 20)
sys.exit(0 if ok else 1)
PY
