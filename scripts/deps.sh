#!/usr/bin/env bash
# Installs the Debian packages that stics' tests and benchmarks use (the real peers: libiscsi's
# tools, tgt, qemu, PostMark, Ceph, nfs-ganesha; FUSE and network tools). Needs root; does nothing when all
# are there.
set -euo pipefail

PACKAGES=(
    libiscsi-bin tgt qemu-utils qemu-block-extra qemu-system-common postmark fio iperf3
    fuse3 e2fsprogs util-linux mount iproute2 iptables nftables iputils-ping procps python3 bc
    fonts-dejavu-core pkg-config psmisc curl
    # promtool, which checks the /metrics of the gateway and of the target in their tests.
    prometheus
    # Ceph: the throwaway cluster of the RBD tests (scripts/ceph-cluster.sh), librbd for the
    # `rbd` build feature, and tgt's rbd backing store (the peer of `stics bench rbd`).
    ceph-mon ceph-mgr ceph-osd ceph-common librbd-dev librados-dev tgt-rbd
    # `stics bench app` (seed 000 Table 2): OpenSSH's build and PostgreSQL's pgbench.
    gcc make libc6-dev zlib1g-dev libssl-dev postgresql
    # `stics bench nfs` (seed 002): NFS's server, exporting a file system with its VFS back end.
    nfs-ganesha nfs-ganesha-vfs rpcbind
    # libFuzzer, which the fuzz targets build (CI checks that they compile).
    g++
)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "missing packages: ${missing[*]} (run as root: apt-get install ${missing[*]})" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# OpenSSH's source for `stics bench app`'s SSH build, kept where the benchmark looks for it;
# apt fetches source packages only with a deb-src entry, added here beside the binary one.
CACHE=/var/cache/stics-bench
if ! ls "$CACHE"/openssh_*.orig.tar.gz >/dev/null 2>&1; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "OpenSSH's source is missing from $CACHE (run this script as root)" >&2
        exit 1
    fi
    if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
            sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
                >/etc/apt/sources.list.d/debian-src.sources
        else
            sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >/etc/apt/sources.list.d/debian-src.list
        fi
        apt-get update -qq
    fi
    mkdir -p "$CACHE"
    (cd "$CACHE" && apt-get source --download-only -qq openssh)
fi
