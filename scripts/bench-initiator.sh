#!/usr/bin/env bash
# The initiator against libiscsi, in one run on one tgt LUN:
#  1. PostMark on ext4 mounted -o sync (through a loop device) over `stics mount` and over
#     qemu-storage-daemon's FUSE export (libiscsi), alternating, each on a fresh mkfs;
#     e2fsck -fn after every run; then fio's 4 KiB write + fsync at depth 1 on each exported file
#     (stics mount with one and with two I/O threads, qemu-storage-daemon);
#  2. 4 KiB random-read IOPS through the library at queue depth 1 and 32, against tgt, against
#     stics target, and against stics target across `stics wan` (1 ms each way).
# Prints tables; absolute numbers move between runs and machines, ratios in one run do not.
#
# Environment: SIZE_MIB (LUN size, 256), NUMBER (PostMark files, 300), TRANSACTIONS (3000),
# ROUNDS (PostMark runs per export, alternating which goes first, 2), QD_SECONDS (seconds per depth, 5),
# IMAGE_DIR (where tgt's backing file lives: /tmp, a disk, by default; /dev/shm takes the disk's
# fdatasync out of every SYNCHRONIZE CACHE and leaves the two initiator stacks to compare),
# HOGS (busy-looping processes kept running during PostMark and fio, to compare under CPU
# contention; 0), FIO_SECONDS (per export for the depth-1 write + fsync latency, 5),
# CARGO_TARGET_DIR.
# Needs root, tgt, qemu-system-common (qemu-storage-daemon), qemu-block-extra, postmark, fuse3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIZE_MIB=${SIZE_MIB:-256}
NUMBER=${NUMBER:-300}
TRANSACTIONS=${TRANSACTIONS:-3000}
ROUNDS=${ROUNDS:-2}
QD_SECONDS=${QD_SECONDS:-5}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
IMAGE_DIR=${IMAGE_DIR:-/tmp}
HOGS=${HOGS:-0}
FIO_SECONDS=${FIO_SECONDS:-5}
HOG_PIDS=()
IQN=iqn.2024-01.org.stics.bench:disk

(cd "$ROOT" && cargo build --quiet --release -p stics && cargo build --quiet --release -p stics-initiator --example qd)
STICS=$TARGET_DIR/release/stics
QD=$TARGET_DIR/release/examples/qd

WORK=$(mktemp -d /tmp/bench-initiator.XXXXXX)
PORT=$((20000 + RANDOM % 30000))
CTL=$((10000 + RANDOM % 20000))
TGT_PID=""
EXPORT_PID=""
STICS_TARGET_PID=""

cleanup() {
    set +e
    for p in "${HOG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    mountpoint -q "$WORK/fs" 2>/dev/null && umount -l "$WORK/fs"
    grep -q " $WORK/lun " /proc/mounts && umount -l "$WORK/lun"
    [ -n "$EXPORT_PID" ] && kill -TERM "$EXPORT_PID" 2>/dev/null && wait "$EXPORT_PID" 2>/dev/null
    [ -n "$TGT_PID" ] && kill -KILL "$TGT_PID" 2>/dev/null && wait "$TGT_PID" 2>/dev/null
    [ -n "$STICS_TARGET_PID" ] && kill -TERM "$STICS_TARGET_PID" 2>/dev/null && wait "$STICS_TARGET_PID" 2>/dev/null
    rm -f "/var/run/tgtd/socket.$CTL" "/var/run/tgtd/socket.$CTL.lock"
    rm -rf "$WORK"
    [ -n "${IMG:-}" ] && rm -f "$IMG"
}
trap cleanup EXIT

# Written out in full, so that the export measured first does not pay for allocating the image.
IMG=$(mktemp "$IMAGE_DIR/bench-initiator-lun.XXXXXX")
dd if=/dev/zero of="$IMG" bs=1M count="$SIZE_MIB" conv=fsync status=none
tgtd -f -C "$CTL" --iscsi "portal=127.0.0.1:$PORT" >/dev/null 2>&1 &
TGT_PID=$!
for _ in $(seq 100); do
    tgtadm -C "$CTL" --lld iscsi --op new --mode target --tid 1 -T "$IQN" 2>/dev/null && break
    sleep 0.1
done
tgtadm -C "$CTL" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$IMG"
tgtadm -C "$CTL" --lld iscsi --op bind --mode target --tid 1 -I ALL
URL="iscsi://127.0.0.1:$PORT/$IQN/1"
mkdir -p "$WORK/fs"
printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' "$WORK/fs" "$NUMBER" "$TRANSACTIONS" >"$WORK/pm.cfg"

wait_mount() {
    for _ in $(seq 200); do
        grep -q " $WORK/lun " /proc/mounts && return 0
        sleep 0.05
    done
    echo "export of $WORK/lun never appeared" >&2
    return 1
}

# start_export KIND: stics (stics mount, defaults), stics-io2 (--io-threads 2) or qsd.
start_export() {
    : >"$WORK/lun"
    case $1 in
        stics) "$STICS" mount "$URL" "$WORK/lun" 2>"$WORK/export-$1.log" & ;;
        stics-io2) "$STICS" mount --io-threads 2 "$URL" "$WORK/lun" 2>"$WORK/export-$1.log" & ;;
        qsd) qemu-storage-daemon \
            --blockdev "driver=iscsi,transport=tcp,portal=127.0.0.1:$PORT,target=$IQN,lun=1,node-name=disk,cache.direct=on" \
            --export "type=fuse,id=exp0,node-name=disk,mountpoint=$WORK/lun,writable=on" 2>"$WORK/export-$1.log" & ;;
    esac
    EXPORT_PID=$!
    wait_mount
}

stop_export() {
    kill -TERM "$EXPORT_PID"
    wait "$EXPORT_PID" || true
    EXPORT_PID=""
}

# postmark_on KIND: prints "seconds fsck-result".
postmark_on() {
    start_export "$1"
    mkfs.ext4 -F -q "$WORK/lun"
    mount -o loop,sync "$WORK/lun" "$WORK/fs"
    local t0 t1 fsck
    t0=$(date +%s.%N)
    postmark "$WORK/pm.cfg" >"$WORK/postmark-$1.out"
    t1=$(date +%s.%N)
    umount "$WORK/fs"
    if e2fsck -fn "$WORK/lun" >"$WORK/fsck-$1.out" 2>&1; then fsck=clean; else fsck=ERRORS; fi
    stop_export
    echo "$(echo "$t1 - $t0" | bc -l) $fsck"
}

# fio_on KIND: mean microseconds per 4 KiB random write + fsync at depth 1, straight on the file.
fio_on() {
    start_export "$1"
    fio --name=wsync --filename="$WORK/lun" --direct=1 --bs=4k --ioengine=psync --rw=randwrite --fsync=1 \
        --size=64M --runtime="$FIO_SECONDS" --time_based --output-format=json >"$WORK/fio-$1.json"
    stop_export
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]
print("%.1f" % ((j["write"]["lat_ns"]["mean"]*j["write"]["total_ios"] + j["sync"]["lat_ns"]["mean"]*j["sync"]["total_ios"]) / j["write"]["total_ios"] / 1000))' "$WORK/fio-$1.json"
}

for _ in $(seq "$HOGS"); do
    sh -c 'while :; do :; done' &
    HOG_PIDS+=($!)
done
declare -A TOTAL=([stics]=0 [qsd]=0)
declare -A NAME=([stics]="stics mount" [qsd]="qemu-storage-daemon fuse")
ROWS=()
for r in $(seq "$ROUNDS"); do
    order="stics qsd"
    [ $((r % 2)) -eq 0 ] && order="qsd stics"
    for kind in $order; do
        read -r secs fsck < <(postmark_on "$kind")
        TOTAL[$kind]=$(echo "${TOTAL[$kind]} + $secs" | bc -l)
        ROWS+=("$(printf '%-5s %-28s %10.2f  %s' "$r" "${NAME[$kind]}" "$secs" "$fsck")")
    done
done

# What PostMark's chain of round trips is made of: one write and one flush at a time.
FIO_ROWS=()
for kind in stics stics-io2 qsd; do
    FIO_ROWS+=("$(printf '%-34s %10s' "$kind" "$(fio_on "$kind")")")
done

for p in "${HOG_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
HOG_PIDS=()

echo
echo "PostMark (number $NUMBER, transactions $TRANSACTIONS) on ext4 -o sync via loop, tgt LUN of $SIZE_MIB MiB in $IMAGE_DIR, $HOGS busy loops beside"
printf '%-5s %-28s %10s  %s\n' round export seconds e2fsck
printf '%s\n' "${ROWS[@]}"
printf 'total seconds: stics mount %.2f, qemu-storage-daemon fuse %.2f\n' "${TOTAL[stics]}" "${TOTAL[qsd]}"
printf 'time ratio qemu-storage-daemon / stics: %.2f  (above 1: stics faster)\n' "$(echo "${TOTAL[qsd]} / ${TOTAL[stics]}" | bc -l)"

echo
echo "fio on the exported file: 4 KiB random write + fsync, depth 1, $FIO_SECONDS s, $HOGS busy loops beside"
printf '%-34s %10s\n' export "us/write"
printf '%s\n' "${FIO_ROWS[@]}"

echo
echo "4 KiB random reads through stics-initiator (examples/qd.rs), same tgt LUN, $QD_SECONDS s per depth"
"$QD" "$URL" --depths 1,32 --seconds "$QD_SECONDS"

# tgt itself tops out near 40k IOPS here, which caps the depth-32 figure above; a stics target
# serving the same image from the page cache shows what the initiator's pipelining reaches.
SPORT=$((PORT + 1))
"$STICS" target --listen "127.0.0.1:$SPORT" --iqn "$IQN" --lun "file:$IMG" 2>"$WORK/stics-target.log" &
STICS_TARGET_PID=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$SPORT") 2>/dev/null && break; sleep 0.1; done
echo
echo "4 KiB random reads through stics-initiator, same image served by stics target, $QD_SECONDS s per depth"
"$QD" "iscsi://127.0.0.1:$SPORT/$IQN/0" --depths 1,32 --seconds "$QD_SECONDS"

# Seed 003's point: on a long path, interleaving requests on one session is worth more than a
# faster network. The same measurement across `stics wan` with WAN_DELAY each way.
WAN_DELAY=${WAN_DELAY:-1ms}
WAN_NAME=qdbench$$
kill -TERM "$STICS_TARGET_PID" 2>/dev/null && wait "$STICS_TARGET_PID" 2>/dev/null
STICS_TARGET_PID=""
"$STICS" wan up --name "$WAN_NAME" --delay "$WAN_DELAY" >/dev/null
trap '"$STICS" wan down --name "$WAN_NAME" >/dev/null 2>&1; cleanup' EXIT
SADDR=$("$STICS" wan addr storage --name "$WAN_NAME")
"$STICS" wan exec storage --name "$WAN_NAME" -- "$STICS" target --listen "$SADDR:3260" --iqn "$IQN" \
    --lun "file:$IMG" 2>"$WORK/stics-target-wan.log" &
STICS_TARGET_PID=$!
sleep 1
echo
echo "4 KiB random reads through stics-initiator across stics wan ($WAN_DELAY each way), $QD_SECONDS s per depth"
"$STICS" wan exec host --name "$WAN_NAME" -- "$QD" "iscsi://$SADDR:3260/$IQN/0" --depths 1,32 --seconds "$QD_SECONDS"
