#!/usr/bin/env bash
# Checks the WAN emulator against its three promises and measures its own overhead:
#   1. --delay 5ms: median `ping -U` RTT within 10.0 ms + 0.5 ms;
#   2. --delay 1ms --rate 100mbit: iperf3 gets 85-100 Mbit/s;
#   3. --delay 5ms --loss 1e-2: Reno within 0.5x-2.5x of Mathis (C = 0.93), loss per segment
#      within 4 sigma of the setting; cubic and bbr reported beside it;
# plus zero-delay RTT and top throughput against a plain veth pair, and iperf3 under background load.
# Needs root, iproute2, iptables, iperf3, ping (iputils-ping) and python3. Takes about 3 minutes.
# Usage: scripts/wan-check.sh [SECONDS_PER_MATHIS_RUN]   (environment: STICS=path/to/stics)
set -euo pipefail

cd "$(dirname "$0")/.."
SECS=${1:-20}
if [[ -z "${STICS:-}" ]]; then
    cargo build --release -q -p stics
    STICS="${CARGO_TARGET_DIR:-target}/release/stics"
fi
NAME="wanchk$$"
PLAIN_A="wanplain$$-a"
PLAIN_B="wanplain$$-b"
PORT=$((20000 + RANDOM % 30000))
FAILS=0

wan() { "$STICS" wan --name "$NAME" "$@"; }
# Command prefixes (not shell functions, so `timeout` can run them).
IN_HOST="$STICS wan --name $NAME exec host --"
IN_STORAGE="$STICS wan --name $NAME exec storage --"
cleanup() {
    wan down >/dev/null 2>&1 || true
    ip netns del "$PLAIN_A" 2>/dev/null || true
    ip netns del "$PLAIN_B" 2>/dev/null || true
}
trap cleanup EXIT

# median RTT in ms of COUNT pings: ping_median NS-EXEC-PREFIX... ADDR COUNT
ping_median() {
    local addr=$1 count=$2; shift 2
    timeout 60 "$@" ping -U -n -i 0.02 -c "$count" "$addr" |
        python3 -c 'import sys,statistics; r=[float(l.split("time=")[1].split()[0]) for l in sys.stdin if "time=" in l]; print(f"{statistics.median(r):.3f}")'
}

# iperf3 receive rate in Mbit/s: iperf_rate SECONDS SERVER-PREFIX -- CLIENT-PREFIX
iperf_rate() {
    local secs=$1 server=$2 client=$3 addr=$4
    $server iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
    local spid=$!
    local out="" ok=0 start=$SECONDS
    for _ in $(seq 1 25); do
        # iperf3's client has no timeout of its own: a lost control connection would hang the run.
        if out=$(timeout $((secs + 30)) $client iperf3 -c "$addr" -p "$PORT" -t "$secs" -J 2>&1); then ok=1; break; fi
        # Only a server that is not listening yet is worth another try.
        if ((SECONDS - start > 10)); then break; fi
        sleep 0.2
    done
    # A server no client reached would wait for ever.
    if [[ $ok == 0 ]]; then kill "$spid" 2>/dev/null || true; echo "iperf3 client failed: $out" >&2; fi
    wait "$spid" 2>/dev/null || true
    PORT=$((PORT + 1))
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.2f" % (d["end"]["sum_received"]["bits_per_second"] / 1e6))' <<<"$out"
}

counters() { wan status --json; }

row() { printf '%-44s %-22s %-18s %s\n' "$@"; }

echo "stics wan check ($(date -u +%FT%TZ), $(nproc) cores, kernel $(uname -r))"
row "measurement" "result" "bound" "verdict"
row "-----------" "------" "-----" "-------"

# Overhead: a plain veth pair between two namespaces, default offloads.
ip netns add "$PLAIN_A"; ip netns add "$PLAIN_B"
ip link add eth0 netns "$PLAIN_A" type veth peer name eth0 netns "$PLAIN_B"
ip -n "$PLAIN_A" addr add 10.202.0.1/24 dev eth0; ip -n "$PLAIN_B" addr add 10.202.0.2/24 dev eth0
for n in "$PLAIN_A" "$PLAIN_B"; do ip -n "$n" link set eth0 up; ip -n "$n" link set lo up; done
plain_rtt=$(ping_median 10.202.0.2 200 ip netns exec "$PLAIN_A")
plain_bw=$(iperf_rate 5 "ip netns exec $PLAIN_B" "ip netns exec $PLAIN_A" 10.202.0.2)
row "plain veth: ping -U median RTT" "${plain_rtt} ms" "" "(baseline)"
row "plain veth: iperf3, 1 stream" "${plain_bw} Mbit/s" "" "(baseline)"

wan up --delay 0 --seed 1 >/dev/null
emu_rtt=$(ping_median 10.201.2.2 200 $IN_HOST)
emu_bw=$(iperf_rate 5 "$IN_STORAGE" "$IN_HOST" 10.201.2.2)
row "emulator, zero delay: ping -U median RTT" "${emu_rtt} ms" "" "(overhead)"
row "emulator, zero delay: iperf3, 1 stream" "${emu_bw} Mbit/s" "" "(overhead)"

# 1. Delay.
wan set --delay 5ms >/dev/null
m=$(ping_median 10.201.2.2 200 $IN_HOST)
if python3 -c "import sys; sys.exit(0 if 10.0 <= $m <= 10.5 else 1)"; then v=PASS; else v=FAIL; FAILS=$((FAILS + 1)); fi
row "--delay 5ms: ping -U median RTT" "${m} ms" "10.0-10.5 ms" "$v"

# 2. Rate.
wan set --delay 1ms --rate 100mbit >/dev/null
r=$(iperf_rate 10 "$IN_STORAGE" "$IN_HOST" 10.201.2.2)
if python3 -c "import sys; sys.exit(0 if 85 <= $r <= 100 else 1)"; then v=PASS; else v=FAIL; FAILS=$((FAILS + 1)); fi
row "--delay 1ms --rate 100mbit: iperf3" "${r} Mbit/s" "85-100 Mbit/s" "$v"

# Background load shares the bottleneck queue.
for load in 30 60; do
    wan set --background "$load%" >/dev/null
    r=$(iperf_rate 5 "$IN_STORAGE" "$IN_HOST" 10.201.2.2)
    row "  same, --background $load%: iperf3" "${r} Mbit/s" "(about $((100 - load)) or less)" "info"
done
wan set --background 0 --rate none >/dev/null

# 3. Mathis, per congestion control.
wan set --delay 5ms --loss 1e-2 >/dev/null
for cc in reno cubic bbr; do
    wan set --cc "$cc" >/dev/null
    before=$(counters)
    r=$(iperf_rate "$SECS" "$IN_STORAGE" "$IN_HOST" 10.201.2.2)
    after=$(counters)
    read -r ratio p n lost ok_loss < <(python3 - "$r" "$before" "$after" <<'PY'
import json, math, sys
bps = float(sys.argv[1]) * 1e6
a, b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
n = b["paths"][0]["packets"] - a["paths"][0]["packets"]
lost = b["paths"][0]["dropped"] - a["paths"][0]["dropped"]
mathis = 0.93 * 1448 * 8 / (0.010 * math.sqrt(0.01))
sigma = math.sqrt(n * 0.01 * 0.99)
ok = abs(lost - n * 0.01) <= 4 * sigma + 1
print(f"{bps / mathis:.2f} {lost / max(n, 1):.5f} {n} {lost} {int(ok)}")
PY
)
    if [[ $cc == reno ]]; then
        if python3 -c "import sys; sys.exit(0 if 0.5 <= $ratio <= 2.5 else 1)"; then v=PASS; else v=FAIL; FAILS=$((FAILS + 1)); fi
        bound="0.5-2.5x Mathis"
    else
        v=info; bound="(reported)"
    fi
    row "--delay 5ms --loss 1e-2, $cc: iperf3" "${r} Mbit/s = ${ratio}x" "$bound" "$v"
    if [[ $ok_loss == 1 ]]; then v=PASS; else v=FAIL; FAILS=$((FAILS + 1)); fi
    row "  $cc: measured loss per segment" "$p ($lost/$n)" "0.01 +- 4 sigma" "$v"
done

echo "Mathis model: 0.93 * 1448 B * 8 / (10 ms * sqrt(0.01)) = $(python3 -c 'print(f"{0.93*1448*8/(0.010*0.1)/1e6:.2f}")') Mbit/s"
wan down
if [[ $FAILS -eq 0 ]]; then echo "all checks passed"; else echo "$FAILS check(s) failed"; exit 1; fi
