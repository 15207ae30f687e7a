#!/usr/bin/env bash
# Interoperability of `stics target` (and, for comparison, tgt) with peers nobody here wrote:
# libiscsi's iscsi-ls, iscsi-inq and iscsi-readcapacity16; qemu-img convert of a 64 MiB random
# image to and from the LUN; ext4 made on the LUN through qemu-storage-daemon's FUSE export,
# mounted with -o sync, PostMark run on it, then e2fsck -fn. Needs root (FUSE and loop mounts).
# Prints one line per check and a table; exits non-zero if any check fails.
#
#   scripts/interop.sh [--target stics|tgt|both] [--logs DIR]      (default: both)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

which=both
logs=""
while (($#)); do
    case $1 in
        --target) which=$2; shift ;;
        --logs) logs=$2; shift ;;
        -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
case $which in
    stics) targets=(stics) ;;
    tgt) targets=(tgt) ;;
    both) targets=(stics tgt) ;;
    *) die "--target takes stics, tgt or both" ;;
esac
need iscsi-ls iscsi-inq iscsi-readcapacity16 qemu-img qemu-storage-daemon mkfs.ext4 e2fsck postmark \
    sha256sum mount umount python3
[[ $(id -u) -eq 0 ]] || die "needs root (FUSE export and loop mount)"
logs=${logs:-$(mktemp -d /tmp/stics-interop.XXXXXX)}
mkdir -p "$logs"
work=$(mktemp -d /tmp/stics-interop-work.XXXXXX)
CLEANUPS+=("rm -rf '$work'")

LUN_BYTES=$((256 << 20))
failures=0
declare -A RESULT=() PM=()

# check TARGET NAME STATUS DETAIL: records one check (STATUS 0 is a pass) and prints it.
check() {
    local t=$1 name=$2 ok=$3 detail=$4
    if ((ok == 0)); then
        echo "  ok    $t $name: $detail"
        RESULT[$t,$name]=ok
    else
        echo "  FAIL  $t $name: $detail (logs in $logs)"
        RESULT[$t,$name]=FAIL
        failures=$((failures + 1))
    fi
}

now() { date +%s.%N; }

# A 64 MiB random image, the same for both targets.
head -c $((64 << 20)) /dev/urandom >"$work/random.img"
src_sum=$(sha256sum "$work/random.img" | cut -d' ' -f1)

for t in "${targets[@]}"; do
    echo "== $t"
    port=$(free_port)
    if [[ $t == stics ]]; then
        start_stics "$port" "$logs/stics-target.log" "file:$work/stics-lun.img:$LUN_BYTES"
        pid=$STICS_PID iqn=$STICS_IQN lun=0 vendor=STICS
    else
        truncate -s "$LUN_BYTES" "$work/tgt-lun.img"
        start_tgt "$port" "$work/tgt-lun.img"
        pid=$TGT_PID iqn=$TGT_IQN lun=1 vendor=IET
    fi
    url="iscsi://127.0.0.1:$port/$iqn/$lun"

    # libiscsi's tools: the target and its LUN are listed, the LUN describes itself.
    out=$(iscsi-ls -s "iscsi://127.0.0.1:$port" 2>&1 | tee "$logs/$t-iscsi-ls.txt") || true
    st=1; grep -q "Target:$iqn" <<<"$out" && grep -q "Lun:$lun " <<<"$out" && st=0
    check "$t" iscsi-ls $st "$(grep -m1 "Lun:$lun " <<<"$out" | sed 's/^ *//')"
    out=$(iscsi-inq "$url" 2>&1 | tee "$logs/$t-iscsi-inq.txt") || true
    st=1; grep -q "Vendor:$vendor" <<<"$out" && grep -q "Peripheral Device Type:DIRECT_ACCESS" <<<"$out" && st=0
    check "$t" iscsi-inq $st "$(grep -E '^(Vendor|Product|Revision):' <<<"$out" | tr '\n' ' ')"
    out=$(iscsi-readcapacity16 "$url" 2>&1 | tee "$logs/$t-readcapacity16.txt") || true
    st=1; grep -q "LOGICAL BLOCK LENGTH IN BYTES:512" <<<"$out" && grep -q "Total size:$LUN_BYTES" <<<"$out" && st=0
    check "$t" iscsi-readcapacity16 $st "$(grep -E 'Total size|LOGICAL BLOCK LENGTH' <<<"$out" | tr '\n' ' ')"

    # qemu-img convert there and back.
    t0=$(now)
    rc=0
    qemu-img convert -n -f raw -O raw "$work/random.img" "$url" >"$logs/$t-convert.txt" 2>&1 || rc=$?
    qemu-img convert -f raw -O raw "$url" "$work/back.img" >>"$logs/$t-convert.txt" 2>&1 || rc=$?
    t1=$(now)
    back_sum=none
    ((rc == 0)) && back_sum=$(head -c $((64 << 20)) "$work/back.img" | sha256sum | cut -d' ' -f1)
    st=1; [[ $rc -eq 0 && $back_sum == "$src_sum" ]] && st=0
    check "$t" qemu-img-convert $st "sha256 ${src_sum:0:16}… in, ${back_sum:0:16}… back, $(python3 -c "print(f'{$t1-$t0:.1f}')") s"
    rm -f "$work/back.img"

    # ext4 + PostMark on a sync mount over qemu-storage-daemon's FUSE export of the LUN.
    exp="$work/$t-export"
    mnt="$work/$t-mnt"
    : >"$exp"
    mkdir -p "$mnt"
    qemu-storage-daemon \
        --blockdev "driver=iscsi,transport=tcp,portal=127.0.0.1:$port,target=$iqn,lun=$lun,node-name=lun,cache.direct=on" \
        --export "type=fuse,id=exp,node-name=lun,mountpoint=$exp,writable=on" >"$logs/$t-qsd.log" 2>&1 &
    qsd=$!
    PIDS+=("$qsd")
    # Stop in reverse order on any exit: the loop mount, qemu-storage-daemon (its FUSE mount goes
    # with it), then the lazy FUSE unmount in case it was killed hard.
    saved=("${CLEANUPS[@]}")
    CLEANUPS=("umount '$mnt'" "kill -TERM $qsd" "sleep 1" "umount -l '$exp'" "${CLEANUPS[@]}")
    for ((i = 0; i < 200; i++)); do
        awk -v f="$exp" '$5 == f {found = 1} END {exit !found}' /proc/self/mountinfo && break
        sleep 0.1
    done
    rc=0
    mkfs.ext4 -q -F "$exp" >"$logs/$t-ext4.txt" 2>&1 || rc=$?
    ((rc == 0)) && { mount -o loop,sync "$exp" "$mnt" >>"$logs/$t-ext4.txt" 2>&1 || rc=$?; }
    pm_secs=-
    if ((rc == 0)); then
        printf 'set location %s\nset number 300\nset transactions 3000\nset seed 42\nrun\nquit\n' "$mnt" >"$work/pm.cfg"
        t0=$(now)
        postmark "$work/pm.cfg" >"$logs/$t-postmark.txt" 2>&1 || rc=$?
        t1=$(now)
        pm_secs=$(python3 -c "print(f'{$t1-$t0:.1f}')")
        grep -q "transactions" "$logs/$t-postmark.txt" || rc=1
        umount "$mnt" >>"$logs/$t-ext4.txt" 2>&1 || rc=$?
    fi
    ((rc == 0)) && { e2fsck -fn "$exp" >>"$logs/$t-ext4.txt" 2>&1 || rc=$?; }
    check "$t" ext4-postmark-fsck $((rc != 0)) "PostMark 300 files / 3000 transactions on -o sync in $pm_secs s, e2fsck -fn clean"
    PM[$t]=$pm_secs

    stop_pid "$qsd" TERM
    umount -l "$exp" 2>/dev/null || true
    CLEANUPS=("${saved[@]}")
    stop_pid "$pid"
    rm -f "$work/$t-lun.img"
done

echo
printf '%-22s' check
for t in "${targets[@]}"; do printf ' %-6s' "$t"; done
echo
for c in iscsi-ls iscsi-inq iscsi-readcapacity16 qemu-img-convert ext4-postmark-fsck; do
    printf '%-22s' "$c"
    for t in "${targets[@]}"; do printf ' %-6s' "${RESULT[$t,$c]:-not run}"; done
    echo
done
printf '%-22s' "PostMark seconds"
for t in "${targets[@]}"; do printf ' %-6s' "${PM[$t]:-}"; done
echo
echo "logs: $logs"
((failures == 0))
