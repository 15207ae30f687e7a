#!/usr/bin/env bash
# A throwaway Ceph cluster for tests and benchmarks: one monitor, one manager and one or three
# memstore OSDs on 127.0.0.1, everything (config, data, logs, sockets, PIDs) inside DIR, and a
# pool `rbd` whose size matches the OSDs. Nothing here touches /etc/ceph or /var/lib/ceph.
#
#   scripts/ceph-cluster.sh start DIR [--osds 1|3] [--port PORT] [--osd-bytes BYTES]
#       prints DIR/ceph.conf as its last line (use it as CEPH_CONF or `rbd -c`)
#   scripts/ceph-cluster.sh kill-osd DIR N     SIGKILL osd.N (a node lost)
#   scripts/ceph-cluster.sh stop DIR           SIGTERM every daemon by PID, then removes DIR
#
# Needs ceph-mon, ceph-mgr, ceph-osd and ceph-common (scripts/deps.sh installs them).
set -euo pipefail

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# The cluster being started, so that a failure can show its logs and stop what did start.
starting=

die() {
    echo "ceph-cluster: $*" >&2
    if [[ -n $starting ]]; then
        local f
        for f in "$starting"/log/*.log; do
            [[ -s $f ]] && { echo "--- ${f##*/} (last lines)"; tail -n 15 "$f"; } >&2
        done
        # The daemons' own last error, repeated after the logs below so that a caller showing
        # only the last lines shows why.
        local why
        why=$(grep -hiE 'error|fail|unable' "$starting/log/setup.log" 2>/dev/null | tail -n 1 || true)
        starting_dir=$starting
        starting=
        stop "$starting_dir" || true
        echo "ceph-cluster: $*${why:+ (${why#* * })}" >&2
    fi
    exit 1
}

# PIDs of this cluster's daemons, from their PID files.
pids() {
    local f
    for f in "$1"/run/*.pid; do
        [[ -f $f ]] && cat "$f"
    done
    return 0
}

# True when every placement group is active+clean.
all_clean() {
    ceph pg stat -f json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)["pg_summary"]
clean = sum(p["num"] for p in s["num_pg_by_state"] if p["name"] == "active+clean")
sys.exit(0 if s["num_pgs"] > 0 and clean == s["num_pgs"] else 1)' 2>/dev/null
}

# Returns once every placement group is active+clean; dies after 2 minutes.
wait_clean() {
    local _
    for _ in $(seq 240); do
        all_clean && return 0
        sleep 0.5
    done
    die "the placement groups did not all become active+clean within 2 minutes"
}

stop() {
    local dir=$1 pid left
    [[ -f $dir/ceph.conf ]] || die "$dir holds no cluster started by this script (no ceph.conf)"
    # Read once: a daemon removes its PID file as soon as it starts shutting down, long before
    # it has exited.
    local all
    all=$(pids "$dir")
    for pid in $all; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for _ in $(seq 100); do
        left=0
        for pid in $all; do
            kill -0 "$pid" 2>/dev/null && left=1
        done
        ((left)) || break
        sleep 0.1
    done
    for pid in $all; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    # Bounded: a zombie nobody reaps still answers kill -0.
    for _ in $(seq 50); do
        left=0
        for pid in $all; do
            [[ $(ps -o stat= -p "$pid" 2>/dev/null) == [^Z]* ]] && left=1
        done
        ((left)) || break
        sleep 0.1
    done
    rm -rf "$dir"
}

kill_osd() {
    local dir=$1 n=$2 f
    f=$dir/run/osd.$n.pid
    [[ -f $f ]] || die "no osd.$n in $dir"
    kill -KILL "$(cat "$f")"
}

start() {
    local dir=$1
    shift
    local osds=1 port=6789 bytes=$((1536 << 20))
    while (($#)); do
        case $1 in
        --osds) osds=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --osd-bytes) bytes=$2; shift 2 ;;
        *) usage ;;
        esac
    done
    [[ $osds == 1 || $osds == 3 ]] || die "--osds must be 1 or 3"
    local tool
    for tool in ceph-mon ceph-mgr ceph-osd ceph monmaptool ceph-authtool rbd; do
        command -v "$tool" >/dev/null ||
            die "$tool is missing: install ceph-mon ceph-mgr ceph-osd ceph-common (scripts/deps.sh does)"
    done
    [[ -e $dir/ceph.conf ]] && die "$dir already holds a cluster (stop it first)"
    mkdir -p "$dir"/{run,log,mon,mgr,osd}
    dir=$(cd "$dir" && pwd)
    starting=$dir
    local conf=$dir/ceph.conf fsid
    fsid=$(cat /proc/sys/kernel/random/uuid)
    cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
mon initial members = a
public addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
crash dir = $dir/log
mon data = $dir/mon/\$id
mgr data = $dir/mgr/\$id
osd data = $dir/osd/\$id
osd objectstore = memstore
memstore device bytes = $bytes
osd pool default size = $osds
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
# The OSDs keep their data in memory; the monitor's few megabytes must not stop a throwaway
# cluster from starting on a shared disk that is nearly full, or on a thin volume whose free share
# reads far lower than its free bytes (the default refuses at 5 %, and an integer share of 0 % still
# leaves gigabytes): -1 turns the check off.
mon data avail crit = -1
mon data avail warn = 0
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd crush update on start = false
# Racy at start (a command sent before the monitor map is in answers 'wrong fsid'); not needed.
osd class update on start = false
# A writer killed without a goodbye loses its watches (and so RBD's exclusive lock) after this.
osd client watch timeout = 10
# Three OSDs on one host: a killed one is marked down quickly, never out (its data stays counted).
osd heartbeat grace = 6
osd heartbeat interval = 2
mon osd down out interval = 0
mon osd min down reporters = 1
mgr initial modules =
EOF
    ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$port]" "$dir/monmap" >/dev/null
    ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" 2>>"$dir/log/setup.log" ||
        die "ceph-mon --mkfs failed"
    ceph-mon -c "$conf" -i a 2>>"$dir/log/setup.log" || die "the monitor did not start"
    export CEPH_CONF=$conf
    ceph --connect-timeout 30 mon stat >/dev/null 2>>"$dir/log/setup.log" || die "the monitor did not answer"
    mkdir -p "$dir/mgr/x"
    ceph-mgr -c "$conf" -i x 2>>"$dir/log/setup.log" || die "the manager did not start"
    local n uuid
    for ((n = 0; n < osds; n++)); do
        uuid=$(cat /proc/sys/kernel/random/uuid)
        [[ $(ceph osd create "$uuid" 2>>"$dir/log/setup.log") == "$n" ]] || die "ceph osd create did not give osd.$n"
        mkdir -p "$dir/osd/$n"
        ceph-osd -c "$conf" -i "$n" --mkfs --osd-uuid "$uuid" 2>>"$dir/log/setup.log" >/dev/null ||
            die "ceph-osd --mkfs of osd.$n failed"
        local try=0
        until ceph-osd -c "$conf" -i "$n" 2>>"$dir/log/setup.log"; do
            ((++try < 3)) || die "osd.$n did not start"
            sleep 1
        done
        # Unchecked, a lost command leaves the OSD outside the CRUSH map: every placement group
        # stays unknown and `rbd pool init` waits for them forever.
        try=0
        until ceph osd crush add "osd.$n" 1 root=default host=localhost >/dev/null 2>>"$dir/log/setup.log"; do
            ((++try < 5)) || die "osd.$n could not be added to the CRUSH map"
            sleep 1
        done
    done
    [[ $(ceph osd crush ls localhost 2>>"$dir/log/setup.log" | grep -c '^osd\.') == "$osds" ]] ||
        die "the CRUSH map does not hold all $osds OSDs under host localhost"
    for _ in $(seq 120); do
        [[ $(ceph osd stat -f json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["num_up_osds"])' 2>/dev/null) == "$osds" ]] && break
        sleep 0.5
    done
    ceph osd pool create rbd 8 8 >/dev/null 2>&1 || die "cannot create pool rbd"
    ceph osd pool set rbd size "$osds" --yes-i-really-mean-it >/dev/null 2>&1
    # Clean before `rbd pool init` too: it writes to the pool and would wait without end for a
    # placement group that cannot become active. After it again, since the manager's statistics
    # may not have counted the new pool yet at the first check.
    wait_clean
    timeout 60 rbd pool init rbd 2>>"$dir/log/setup.log" || die "rbd pool init failed or took over 60 s"
    wait_clean
    starting=
    echo "$conf"
}

(($# >= 2)) || usage
cmd=$1
shift
case $cmd in
# A throwaway cluster now and then fails to come up on a busy machine (a daemon's first command
# racing the monitor); one more try from scratch, with what went wrong on stderr.
start) ( start "$@" ) || { echo "ceph-cluster: trying once more" >&2; start "$@"; } ;;
stop) stop "$1" ;;
kill-osd) (($# == 2)) || usage; kill_osd "$1" "$2" ;;
*) usage ;;
esac
