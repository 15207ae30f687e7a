# Shared helpers for the scripts in this folder: free ports, starting and stopping the targets
# under test (stics and tgt), and cleanup. Source it; every process is stopped by its PID.

STICS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STICS_IQN=${STICS_IQN:-iqn.2024-01.org.stics:target0}
TGT_IQN=${TGT_IQN:-iqn.2024-01.org.tgt:peer}

die() { echo "error: $*" >&2; exit 1; }

need() {
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || die "$t is missing (Debian: apt-get install $(pkg_of "$t"))"
    done
}

pkg_of() {
    case $1 in
        iscsi-*) echo libiscsi-bin ;;
        tgtd | tgtadm) echo tgt ;;
        qemu-img | qemu-io) echo "qemu-utils qemu-block-extra" ;;
        qemu-storage-daemon) echo "qemu-system-common qemu-block-extra" ;;
        *) echo "$1" ;;
    esac
}

# A TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_port PORT [SECONDS]: waits until 127.0.0.1:PORT accepts connections.
wait_port() {
    local port=$1 secs=${2:-20} i
    for ((i = 0; i < secs * 10; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    die "nothing listens on 127.0.0.1:$port after ${secs}s"
}

# The stics binary: $STICS if set, else the release build (built on demand).
stics_bin() {
    if [[ -n ${STICS:-} ]]; then echo "$STICS"; return; fi
    local dir=${CARGO_TARGET_DIR:-$STICS_ROOT/target}
    if [[ ! -x $dir/release/stics || -n ${STICS_REBUILD:-} ]]; then
        (cd "$STICS_ROOT" && cargo build --release -q -p stics) >&2 || die "cargo build failed"
    fi
    echo "$dir/release/stics"
}

PIDS=()
CLEANUPS=()
cleanup() {
    local p c
    for c in "${CLEANUPS[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# stop_pid PID [SIGNAL]: stops one process this script started (SIGKILL unless told) and forgets it.
stop_pid() {
    local pid=$1 sig=${2:-KILL} p keep=()
    kill "-$sig" "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# start_stics PORT LOG LUNSPEC...: starts `stics target`; sets STICS_PID.
start_stics() {
    local port=$1 log=$2
    shift 2
    local args=() l
    for l in "$@"; do args+=(--lun "$l"); done
    "$(stics_bin)" target --listen "127.0.0.1:$port" --iqn "$STICS_IQN" "${args[@]}" >"$log" 2>&1 &
    STICS_PID=$!
    PIDS+=("$STICS_PID")
    wait_port "$port"
}

# start_tgt PORT FILE: starts tgtd with FILE as LUN 1 of $TGT_IQN; sets TGT_PID.
start_tgt() {
    local port=$1 file=$2 ctl
    need tgtd tgtadm
    ctl=$((port % 30000 + 1000))
    tgtd -f -C "$ctl" --iscsi "portal=127.0.0.1:$port" >/dev/null 2>&1 &
    TGT_PID=$!
    PIDS+=("$TGT_PID")
    wait_port "$port"
    tgtadm -C "$ctl" --lld iscsi --op new --mode target --tid 1 -T "$TGT_IQN"
    tgtadm -C "$ctl" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$file"
    tgtadm -C "$ctl" --lld iscsi --op bind --mode target --tid 1 -I ALL
}

# cpu_ticks PID: user+system clock ticks the process has used.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}
