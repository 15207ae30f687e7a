#!/usr/bin/env bash
# stics target against tgt, side by side in one run, both serving a file LUN from the page cache,
# measured with qemu-img bench (libiscsi) as the client. Prints IOPS, bandwidth, latency, the
# ratio stics/tgt, the share of loopback TCP bandwidth (iperf3, same run) and server CPU seconds
# per GiB moved (seed 002 Table 9, seed 001). A benchmark: it prints, it does not judge.
#
#   scripts/bench-target.sh [--rounds N] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"

rounds=3
out=""
while (($#)); do
    case $1 in
        --rounds) rounds=$2; shift ;;
        --out) out=$2; shift ;;
        -h | --help) sed -n '2,8p' "$0"; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
need qemu-img tgtd tgtadm iperf3 python3
out=${out:-$(mktemp -d /tmp/stics-bench.XXXXXX)}
mkdir -p "$out"
hz=$(getconf CLK_TCK)

work=$(mktemp -d /tmp/stics-bench-lun.XXXXXX)
CLEANUPS+=("rm -rf '$work'")
for f in stics tgt; do
    dd if=/dev/urandom of="$work/$f.img" bs=1M count=1024 status=none
    cat "$work/$f.img" >/dev/null
done
sport=$(free_port)
start_stics "$sport" "$out/stics-target.log" "file:$work/stics.img"
tport=$(free_port)
start_tgt "$tport" "$work/tgt.img"
declare -A URL=([stics]="iscsi://127.0.0.1:$sport/$STICS_IQN/0" [tgt]="iscsi://127.0.0.1:$tport/$TGT_IQN/1")
declare -A PID=([stics]=$STICS_PID [tgt]=$TGT_PID)

# Loopback TCP bandwidth, one stream, three times: the best run is the reference (the kindest
# to iperf3, so the "% of iperf3" column errs low).
iperf_runs=()
for i in 1 2 3; do
    iport=$(free_port)
    iperf3 -s -1 -B 127.0.0.1 -p "$iport" >/dev/null 2>&1 &
    ipid=$!
    PIDS+=("$ipid")
    sleep 0.5 # Not wait_port: its probe would be the one client that -s -1 serves.
    iperf_runs+=("$(iperf3 -c 127.0.0.1 -p "$iport" -t 2 -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')")
    stop_pid "$ipid"
done
iperf_bps=$(printf '%s\n' "${iperf_runs[@]}" | sort -g | tail -1)

# name count depth size
WORKLOADS=("4k-qd32 200000 32 4096" "8k-qd1 20000 1 8192" "1M-qd8 6000 8 1048576")
csv="$out/results.csv"
echo "workload,target,round,seconds,cpu_seconds,bytes" >"$csv"
for w in "${WORKLOADS[@]}"; do
    read -r name count depth size <<<"$w"
    for ((r = 1; r <= rounds; r++)); do
        order=(stics tgt)
        ((r % 2 == 0)) && order=(tgt stics)
        for t in "${order[@]}"; do
            c0=$(cpu_ticks "${PID[$t]}")
            secs=$(qemu-img bench -f raw -t none -n -c "$count" -d "$depth" -s "$size" "${URL[$t]}" 2>&1 |
                sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p')
            [[ -n $secs ]] || die "qemu-img bench against $t failed"
            c1=$(cpu_ticks "${PID[$t]}")
            echo "$name,$t,$r,$secs,$(python3 -c "print(($c1-$c0)/$hz)"),$((count * size))" >>"$csv"
        done
    done
done

python3 - "$csv" "$iperf_bps" <<'PY' | tee "$out/results.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
iperf = float(sys.argv[2])
need = {"4k-qd32": ("IOPS", 1.5), "8k-qd1": ("latency", 1.0), "1M-qd8": ("MB/s", 1.3)}
print(f"loopback TCP (iperf3, one stream, best of 3): {iperf / 1e9:.2f} Gbit/s\n")
print("| workload | target | IOPS | MB/s | mean latency µs | % of iperf3 | server CPU s/GiB |")
print("|---|---|---|---|---|---|---|")
res = {}
for w in need:
    for t in ("stics", "tgt"):
        rs = [r for r in rows if r["workload"] == w and r["target"] == t]
        secs = statistics.median(float(r["seconds"]) for r in rs)
        cpu = statistics.median(float(r["cpu_seconds"]) for r in rs)
        nbytes = int(rs[0]["bytes"])
        size = {"4k-qd32": 4096, "8k-qd1": 8192, "1M-qd8": 1 << 20}[w]
        ios = nbytes / size
        depth = {"4k-qd32": 32, "8k-qd1": 1, "1M-qd8": 8}[w]
        iops, mbs = ios / secs, nbytes / secs / 1e6
        lat = depth / iops * 1e6
        res[(w, t)] = (iops, lat, cpu / (nbytes / 2**30))
        print(f"| {w} | {t} | {iops:,.0f} | {mbs:,.0f} | {lat:,.1f} | {100 * nbytes * 8 / secs / iperf:.0f} % | {cpu / (nbytes / 2**30):.2f} |")
print("\n| workload | stics / tgt | issue asks | met | server CPU per GiB, stics / tgt |")
print("|---|---|---|---|---|")
for w, (kind, req) in need.items():
    s, t = res[(w, "stics")], res[(w, "tgt")]
    ratio = t[1] / s[1] if kind == "latency" else s[0] / t[0]
    label = "tgt latency / stics latency" if kind == "latency" else "IOPS ratio"
    print(f"| {w} | {ratio:.2f} ({label}) | ≥ {req} | {'yes' if ratio >= req else 'no'} | {s[2] / t[2]:.2f} |")
PY
echo "raw results: $csv"
