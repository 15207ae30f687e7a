#!/usr/bin/env bash
# The STICS gateway against plain iSCSI across `stics wan`, side by side in one run. A stics
# target serves a file LUN in the `storage` namespace; in the `host` namespace the client talks
# either straight to it (plain) or to `stics gateway` (log and immediate modes) whose remote is
# that target. Plain iSCSI with no delay is the local reference. Per one-way delay in DELAYS:
#  1. PostMark on ext4 mounted -o sync through a loop device over `stics mount` (fresh mkfs per
#     run, e2fsck -fn after it): seconds, WAN packets and bytes in both directions (from
#     `stics wan status --json`, the gateway drained before and after so that its destage is
#     counted), bytes the host wrote (loop device, and the gateway's host_write_bytes);
#     ratios gateway/plain and gateway/undelayed, and at 8 ms the goals: gateway >= 10x plain,
#     >= 0.8x undelayed plain, WAN packets <= 1/4 of plain's, WAN bytes < host bytes written;
#  2. sequential 8 KiB reads at queue depth 1 (crates/initiator/examples/qd.rs --pattern seq)
#     over a region written beforehand: plain against the gateway's read-ahead, MB/s and latency;
#  3. (WORKLOADS containing 3) random 4 KiB writes at depth 32 through the gateway in log mode and
#     in write-through mode, 3x the log's size written at W3_DELAY: throughput ratio (goal >= 0.9x)
#     and each second's p99 latency as CSV;
#  4. (WORKLOADS containing 4) seed 004's EMC-tel-like open-loop trace (`stics bench replay
#     --emc-tel`: Poisson arrivals at 333 requests/s, 4 blocks of 512 bytes, 89 % writes, over
#     900 MB, seed 4) at W4_DELAY, plain iSCSI against the gateway in log and immediate modes:
#     mean, p99 and worst response, a histogram PNG per path in PLOTS; goals: mean >= 6x better
#     than plain, p99 < 5 ms in log mode, none over 50 ms (`stics bench trace` is the same
#     comparison with the paper's numbers and figures);
#  5. (WORKLOADS containing 5) recovery: with the WAN cut (100 % loss), random 4 KiB writes at
#     depth 32 fill a W5_LOG log (at most W5_SECONDS); the gateway is killed (SIGKILL), the WAN
#     restored at W5_DELAY, and the restart timed until it serves; then the log is drained and
#     the restart on the empty log timed the same way (recovery time follows the live log).
# Absolute numbers move with the machine's load; ratios within one run are what to read.
#
# Environment: DELAYS (one-way delays, "2ms 8ms"), WORKLOADS ("1 2"), NUMBER (PostMark files,
# 100), TRANSACTIONS (500), FS_MIB (ext4 size, 256), LUN_MIB (target LUN, sparse file in /tmp,
# 1024), LOG_SIZE (gateway write log, 512MiB; it must hold two epochs and a record, about 5x
# RAM), RAM (gateway --ram, 64MiB), READ_MIB (region read sequentially, 512),
# READ_SECONDS (per sequential run at most, 10), W3_LOG (256MiB), W3_RAM (16MiB), W3_MIB (written, 768),
# W3_DELAY (8ms), W3_SECONDS (at most, per mode, 300), W4_REQUESTS (20000), W4_DELAY (8ms),
# W5_LOG (1GiB), W5_DELAY (8ms), W5_SECONDS (90),
# PLOTS (where histograms go, /tmp/stics-bench-gateway), STICS (binary; else the release build in
# CARGO_TARGET_DIR, built here with examples/qd).
# Needs root, iproute2 and iptables (stics wan), fuse3, e2fsprogs, util-linux (nsenter, mount),
# postmark, curl and python3 (scripts/deps.sh installs them). Takes about 25 minutes by default
# (NUMBER=50 TRANSACTIONS=250: 12), mostly plain iSCSI and destage at 8 ms.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

DELAYS=${DELAYS:-"2ms 8ms"}
WORKLOADS=${WORKLOADS:-"1 2"}
NUMBER=${NUMBER:-100}
TRANSACTIONS=${TRANSACTIONS:-500}
FS_MIB=${FS_MIB:-256}
LUN_MIB=${LUN_MIB:-1024}
LOG_SIZE=${LOG_SIZE:-512MiB}
RAM=${RAM:-64MiB}
READ_MIB=${READ_MIB:-512}
READ_SECONDS=${READ_SECONDS:-10}
W3_LOG=${W3_LOG:-256MiB}
W3_RAM=${W3_RAM:-16MiB}
W3_MIB=${W3_MIB:-768}
W3_DELAY=${W3_DELAY:-8ms}
W3_SECONDS=${W3_SECONDS:-300}
W4_REQUESTS=${W4_REQUESTS:-20000}
W4_DELAY=${W4_DELAY:-8ms}
W5_LOG=${W5_LOG:-1GiB}
W5_DELAY=${W5_DELAY:-8ms}
W5_SECONDS=${W5_SECONDS:-90}
PLOTS=${PLOTS:-/tmp/stics-bench-gateway}

[[ $(id -u) -eq 0 ]] || die "needs root (stics wan, mount)"
need postmark mkfs.ext4 e2fsck nsenter curl python3 fusermount3
STICS=$(stics_bin)
(cd "$STICS_ROOT" && cargo build --quiet --release -p stics-initiator --example qd) || die "cargo build failed"
QD=$(dirname "$STICS")/examples/qd

NAME=gwbench$$
IQN=iqn.2024-01.org.stics.bench:remote
GW_IQN=iqn.2024-01.org.stics.bench:gateway
WORK=$(mktemp -d /tmp/bench-gateway.XXXXXX)
IMG=$WORK/lun.img
MNTNS=/proc/$$/ns/mnt
EXPORT_PID=""
GW_PID=""
GW_MODE=""

bench_cleanup() {
    mountpoint -q "$WORK/fs" 2>/dev/null && umount -l "$WORK/fs"
    grep -q " $WORK/lun " /proc/mounts && umount -l "$WORK/lun"
    [[ -n $EXPORT_PID ]] && stop_pid "$EXPORT_PID" TERM
    [[ -n $GW_PID ]] && stop_pid "$GW_PID" TERM
    local p
    for p in "${PIDS[@]}"; do stop_pid "$p"; done
    "$STICS" wan --name "$NAME" down
    rm -rf "$WORK"
}
CLEANUPS+=(bench_cleanup)

wan() { "$STICS" wan --name "$NAME" "$@"; }
in_host() { wan exec host -- "$@"; }
# For processes started in the background: a command, not a function, so that $! is the process
# itself (`stics wan exec` and `ip netns exec` replace themselves with the command).
IN_HOST=("$STICS" wan --name "$NAME" exec host --)
IN_STORAGE=("$STICS" wan --name "$NAME" exec storage --)

# wait_in ROLE ADDR PORT PID OUTPUT: waits until ADDR:PORT accepts connections from inside ROLE's
# namespace, while process PID (which writes to OUTPUT) lives.
wait_in() {
    local i
    for ((i = 0; i < 200; i++)); do
        wan exec "$1" -- bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || die "$(cat "$5")"
        sleep 0.1
    done
    die "nothing listens on $2:$3 in $1 after 20s"
}

# "packets bytes" that crossed the emulated link so far, both directions.
wan_counts() {
    wan status --json | python3 -c 'import json,sys; p=json.load(sys.stdin)["paths"]
print(sum(x["packets"] for x in p), sum(x["bytes"] for x in p))'
}

# start_gateway MODE LOG_SIZE RAM: `stics gateway` in the host namespace, a fresh log in $WORK.
start_gateway() {
    rm -f "$WORK/gw.log"
    "${IN_HOST[@]}" "$STICS" gateway --listen 127.0.0.1:3260 --iqn "$GW_IQN" --remote "$REMOTE" \
        --log "$WORK/gw.log:$2" --ram "$3" --mode "$1" --metrics 127.0.0.1:9100 >>"$WORK/gateway-$1.out" 2>&1 &
    GW_PID=$!
    GW_MODE=$1
    PIDS+=("$GW_PID")
    wait_in host 127.0.0.1 3260 "$GW_PID" "$WORK/gateway-$1.out"
    wait_in host 127.0.0.1 9100 "$GW_PID" "$WORK/gateway-$1.out"
}

# stop_gateway: stops it and throws its log away; its claim on the remote goes too, so that the
# next gateway, on a fresh log, may take the LUN.
stop_gateway() {
    local key
    stop_pid "$GW_PID" TERM
    GW_PID=""
    rm -f "$WORK/gw.log"
    key=$(grep -o 'key=0x[0-9a-f]*' "$WORK/gateway-$GW_MODE.out" | tail -1 | cut -d= -f2)
    [[ -n $key ]] && in_host "$STICS" release "$REMOTE" --holder "$key" >/dev/null
}

# gw_status FIELD: one number from the gateway's /status; gw_drain: destages everything.
gw_status() {
    in_host curl -sf http://127.0.0.1:9100/status | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"
}
gw_drain() { in_host curl -sf -X POST http://127.0.0.1:9100/drain >/dev/null; }

# start_export URL: `stics mount` in the host namespace's network but this script's mounts.
start_export() {
    : >"$WORK/lun"
    "${IN_HOST[@]}" nsenter --mount="$MNTNS" -- "$STICS" mount "$1" "$WORK/lun" 2>>"$WORK/mount.out" &
    EXPORT_PID=$!
    PIDS+=("$EXPORT_PID")
    local i
    for ((i = 0; i < 200; i++)); do
        grep -q " $WORK/lun " /proc/mounts && return 0
        sleep 0.1
    done
    die "stics mount of $1 never appeared (see $WORK/mount.out)"
}

stop_export() {
    stop_pid "$EXPORT_PID" TERM
    EXPORT_PID=""
}

now() { date +%s.%N; }

# postmark_on URL GATEWAY(0|1): sets PM to "seconds drain_seconds wan_packets wan_bytes
# loop_bytes gateway_host_bytes gateway_epochs e2fsck" (in this shell, so that cleanup knows the
# export).
postmark_on() {
    local url=$1 gw=$2 dev p0 b0 p1 b1 l0 l1 h0=0 h1=0 e0=0 e1=0 t0 t1 t2 fsck
    start_export "$url"
    # Inode tables and journal written now, not by ext4lazyinit during the run.
    mkfs.ext4 -F -q -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "$WORK/lun" "${FS_MIB}M"
    mount -o loop,sync "$WORK/lun" "$WORK/fs"
    dev=$(findmnt -n -o SOURCE "$WORK/fs")
    dev=${dev#/dev/}
    if ((gw)); then gw_drain; h0=$(gw_status host_write_bytes); e0=$(gw_status epoch); fi
    read -r p0 b0 < <(wan_counts)
    l0=$(awk '{printf "%.0f\n", $7 * 512}' "/sys/block/$dev/stat")
    t0=$(now)
    postmark "$WORK/pm.cfg" >"$WORK/postmark.out"
    t1=$(now)
    sync -f "$WORK/fs"
    l1=$(awk '{printf "%.0f\n", $7 * 512}' "/sys/block/$dev/stat")
    umount "$WORK/fs"
    if ((gw)); then gw_drain; h1=$(gw_status host_write_bytes); e1=$(gw_status epoch); fi
    t2=$(now)
    read -r p1 b1 < <(wan_counts)
    if e2fsck -fn "$WORK/lun" >"$WORK/fsck.out" 2>&1; then fsck=clean; else fsck=ERRORS; cat "$WORK/fsck.out" >&2; fi
    stop_export
    PM="$(bc -l <<<"$t1 - $t0") $(bc -l <<<"$t2 - $t1") $((p1 - p0)) $((b1 - b0)) $((l1 - l0)) $((h1 - h0)) $((e1 - e0)) $fsck"
}

# seqread URL: "MB/s avg_us" of sequential 8 KiB reads at depth 1 over the first READ_MIB.
seqread() {
    in_host "$QD" "$1" --pattern seq --bs 8192 --depths 1 --span-mib "$READ_MIB" --seconds "$READ_SECONDS" |
        awk '$1 == "1" {print $3, $4; exit}'
}

ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}' if b else 'inf')" "$1" "$2"; }
verdict() { python3 -c "import sys; print('pass' if eval(sys.argv[1]) else 'MISS')" "$1"; }

# The LUN, the emulated WAN and the remote target, up for the whole run.
truncate -s "${LUN_MIB}M" "$IMG"
# The region read in workload 2, written now (the target serves it from the page cache).
dd if=/dev/urandom of="$IMG" bs=1M count="$READ_MIB" conv=notrunc,fsync status=none
wan up --delay 0 >/dev/null
SADDR=$(wan addr storage)
REMOTE="iscsi://$SADDR:3260/$IQN/0"
"${IN_STORAGE[@]}" "$STICS" target --listen "$SADDR:3260" --iqn "$IQN" --lun "file:$IMG" >"$WORK/target.out" 2>&1 &
PIDS+=($!)
wait_in host "$SADDR" 3260 $! "$WORK/target.out"
mkdir -p "$WORK/fs"
printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' "$WORK/fs" "$NUMBER" "$TRANSACTIONS" >"$WORK/pm.cfg"
GW_URL="iscsi://127.0.0.1:3260/$GW_IQN/0"

echo "stics gateway bench ($(date -u +%FT%TZ), $(nproc) cores, kernel $(uname -r)); remote: stics target, file LUN of $LUN_MIB MiB in /tmp"

if [[ " $WORKLOADS " == *" 2 "* ]]; then
    echo
    echo "2. sequential 8 KiB reads, depth 1, first $READ_MIB MiB (written beforehand), at most $READ_SECONDS s per run; gateway log mode, log $LOG_SIZE, fresh per run"
    printf '%-7s %-22s %10s %10s %14s\n' delay path MB/s avg_us "gateway/plain"
    for d in 0 $DELAYS; do
        wan set --delay "$d" >/dev/null
        read -r pm pl < <(seqread "$REMOTE")
        printf '%-7s %-22s %10s %10s %14s\n' "$d" "plain iSCSI" "$pm" "$pl" ""
        [[ $d == 0 ]] && continue
        start_gateway log "$LOG_SIZE" "$RAM"
        read -r gm gl < <(seqread "$GW_URL")
        stop_gateway
        printf '%-7s %-22s %10s %10s %14s\n' "$d" "gateway (read-ahead)" "$gm" "$gl" "$(ratio "$gm" "$pm")x"
    done
fi

if [[ " $WORKLOADS " == *" 1 "* ]]; then
    ROWS=()
    declare -A SECS PKTS BYTES HOST
    for d in 0 $DELAYS; do
        wan set --delay "$d" >/dev/null
        paths=plain
        [[ $d == 0 ]] || paths="plain log immediate"
        for path in $paths; do
            if [[ $path == plain ]]; then
                postmark_on "$REMOTE" 0
                read -r s dr p b l h e f <<<"$PM"
                HOST[$d/$path]=$l
                h=- e=-
            else
                start_gateway "$path" "$LOG_SIZE" "$RAM"
                postmark_on "$GW_URL" 1
                read -r s dr p b l h e f <<<"$PM"
                stop_gateway
                HOST[$d/$path]=$h
            fi
            SECS[$d/$path]=$s PKTS[$d/$path]=$p BYTES[$d/$path]=$b
            ROWS+=("$(printf '%-7s %-20s %8.2f %8.2f %10s %12s %12s %12s %8s  %s' "$d" "$path" "$s" "$dr" "$p" "$b" "$l" "$h" "$e" "$f")")
        done
    done
    echo
    echo "1. PostMark (set number $NUMBER, set transactions $TRANSACTIONS) on ext4 ($FS_MIB MiB, -o sync, loop) over stics mount; gateway log $LOG_SIZE"
    echo "   seconds: PostMark alone; drain: after it, until the remote holds everything (gateway) or the unmount ends (plain)"
    echo "   WAN: both directions, from before PostMark to after the drain; loop: bytes written to the loop device; gw_host: gateway's host_write_bytes;"
    echo "   epochs: epochs the gateway cut (each destaged with its own writes and SYNCHRONIZE CACHE on the remote)"
    printf '%-7s %-20s %8s %8s %10s %12s %12s %12s %8s  %s\n' delay path seconds drain wan_pkts wan_bytes loop_bytes gw_host epochs e2fsck
    printf '%s\n' "${ROWS[@]}"
    echo
    printf '%-7s %-10s %14s %18s %16s %18s\n' delay mode "speed vs plain" "speed vs undelayed" "pkts gw/plain" "wan bytes/host"
    for d in $DELAYS; do
        for m in log immediate; do
            printf '%-7s %-10s %14s %18s %16s %18s\n' "$d" "$m" \
                "$(ratio "${SECS[$d/plain]}" "${SECS[$d/$m]}")x" "$(ratio "${SECS[0/plain]}" "${SECS[$d/$m]}")x" \
                "$(ratio "${PKTS[$d/$m]}" "${PKTS[$d/plain]}")" "$(ratio "${BYTES[$d/$m]}" "${HOST[$d/$m]}")"
        done
    done
    if [[ " $DELAYS " == *" 8ms "* ]]; then
        echo
        echo "goals at 8 ms (gateway >= 10x plain, >= 0.8x undelayed plain, WAN packets <= 1/4 of plain's, WAN bytes < host bytes):"
        for m in log immediate; do
            s=${SECS[8ms/$m]}
            printf '  %-10s %s %s %s %s\n' "$m" \
                "10x:$(verdict "${SECS[8ms/plain]} / $s >= 10")" "0.8x:$(verdict "${SECS[0/plain]} / $s >= 0.8")" \
                "pkts:$(verdict "${PKTS[8ms/$m]} * 4 <= ${PKTS[8ms/plain]}")" "bytes:$(verdict "${BYTES[8ms/$m]} < ${HOST[8ms/$m]}")"
        done
    fi
fi

if [[ " $WORKLOADS " == *" 3 "* ]]; then
    wan set --delay "$W3_DELAY" >/dev/null
    echo
    echo "3. random 4 KiB writes, depth 32, $W3_MIB MiB over the first $LUN_MIB MiB, log $W3_LOG, delay $W3_DELAY, at most $W3_SECONDS s"
    declare -A W3
    # Write-through first: log mode leaves a destage backlog on the remote when it is stopped.
    for m in write-through log; do
        start_gateway "$m" "$W3_LOG" "$W3_RAM"
        in_host "$QD" "$GW_URL" --write --depths 32 --bs 4096 --span-mib "$LUN_MIB" --limit-mib "$W3_MIB" \
            --seconds "$W3_SECONDS" --per-second >"$WORK/w3-$m.out"
        for f in remote_write_secs remote_sync_secs dirty_bytes epoch throttled_writes; do
            echo "$f $(gw_status "$f")" >>"$WORK/w3-$m.out"
        done
        stop_gateway
        W3[$m]=$(awk '$1 == "32" {print $2; exit}' "$WORK/w3-$m.out")
        echo "-- $m"
        cat "$WORK/w3-$m.out"
    done
    r=$(ratio "${W3[log]}" "${W3[write-through]}")
    echo "IOPS log ${W3[log]}, write-through ${W3[write-through]}: ratio ${r}x (goal >= 0.9x: $(verdict "$r >= 0.9"))"
fi

if [[ " $WORKLOADS " == *" 4 "* ]]; then
    wan set --delay "$W4_DELAY" >/dev/null
    mkdir -p "$PLOTS"
    echo
    echo "4. EMC-tel-like open loop: $W4_REQUESTS requests at 333/s, 4 x 512 B, 89 % writes, over 900 MB, seed 4; delay $W4_DELAY; gateway log $LOG_SIZE"
    declare -A W4M W4P W4X
    for path in plain log immediate; do
        url=$GW_URL
        if [[ $path == plain ]]; then url=$REMOTE; else start_gateway "$path" "$LOG_SIZE" "$RAM"; fi
        in_host "$STICS" bench replay "$url" --emc-tel --requests "$W4_REQUESTS" --json \
            --plot "$PLOTS/openloop-$path.png" >"$WORK/w4-$path.json" 2>"$WORK/w4-$path.err" ||
            die "replay through $path failed: $(cat "$WORK/w4-$path.err")"
        [[ $path == plain ]] || stop_gateway
        # requests writes% mean p50 p99 max (ms) >50ms seconds, from the replay's JSON.
        summary=$(python3 -c 'import json, sys
o = json.load(open(sys.argv[1]))
ms = ["%.3f" % (o[k] * 1e3) for k in ("mean", "p50", "p99", "max")]
print(o["requests"], "%.1f" % (100 * o["writes"] / o["requests"]), *ms, o["over_50ms"], "%.1f" % o["seconds"])' \
            "$WORK/w4-$path.json")
        read -r _ _ mean _ p99 max _ _ <<<"$summary"
        W4M[$path]=$mean W4P[$path]=$p99 W4X[$path]=$max
        echo "-- $path"
        printf '%8s %7s %9s %9s %9s %9s %7s %9s\n' requests writes% mean_ms p50_ms p99_ms max_ms ">50ms" seconds
        read -r -a f <<<"$summary"
        printf '%8s %7s %9s %9s %9s %9s %7s %9s\n' "${f[@]}"
    done
    for m in log immediate; do
        r=$(ratio "${W4M[plain]}" "${W4M[$m]}")
        echo "$m: mean ${W4M[$m]} ms against plain ${W4M[plain]} ms: ${r}x better (goal >= 6x: $(verdict "$r >= 6")); p99 ${W4P[$m]} ms (goal < 5 ms in log mode: $(verdict "${W4P[$m]} < 5")); worst ${W4X[$m]} ms (goal <= 50 ms: $(verdict "${W4X[$m]} <= 50"))"
    done
fi

if [[ " $WORKLOADS " == *" 5 "* ]]; then
    echo
    echo "5. recovery of a full $W5_LOG log (random 4 KiB writes at depth 32 with the WAN cut), then of the same log drained; delay $W5_DELAY"
    wan set --delay "$W5_DELAY" --loss 0 >/dev/null
    start_gateway log "$W5_LOG" "$RAM"
    wan set --loss 1 >/dev/null
    # Once the log is full, writes wait for destage, which cannot run: the client is stopped.
    timeout -s KILL "$((W5_SECONDS + 5))" "${IN_HOST[@]}" "$QD" "$GW_URL" --write --depths 32 --bs 4096 \
        --span-mib "$LUN_MIB" --seconds "$W5_SECONDS" >"$WORK/w5-fill.out" 2>&1 || true
    fill=$(gw_status log_fill)
    dirty=$(gw_status dirty_bytes)
    stop_pid "$GW_PID" KILL
    wan set --loss 0 >/dev/null
    declare -A W5
    for state in full empty; do
        t0=$(now)
        "${IN_HOST[@]}" "$STICS" gateway --listen 127.0.0.1:3260 --iqn "$GW_IQN" --remote "$REMOTE" \
            --log "$WORK/gw.log:$W5_LOG" --ram "$RAM" --mode log --metrics 127.0.0.1:9100 >>"$WORK/gateway-log.out" 2>&1 &
        GW_PID=$!
        GW_MODE=log
        PIDS+=("$GW_PID")
        wait_in host 127.0.0.1 3260 "$GW_PID" "$WORK/gateway-log.out"
        W5[$state]=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(now)")
        if [[ $state == full ]]; then
            echo "log fill at the kill $fill, dirty $((dirty >> 20)) MiB: serving again after ${W5[full]} s"
            t0=$(now)
            gw_drain
            echo "drained in $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(now)") s"
            stop_pid "$GW_PID" TERM
        else
            echo "empty log: serving again after ${W5[empty]} s"
            stop_gateway
        fi
    done
    grep -E "recovered|read back" "$WORK/gateway-log.out" | tail -3 || true
fi
