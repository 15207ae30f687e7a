#!/usr/bin/env bash
# Installs the Debian packages that stics' tests and benchmarks use (the real peers: libiscsi's
# tools, tgt, qemu, PostMark, Ceph; FUSE and network tools). Needs root; does nothing when all
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
