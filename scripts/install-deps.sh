#!/usr/bin/env bash
# Installs everything the project builds and tests with on a Debian bookworm machine (root).
# Idempotent: fast when everything is there. Packages come from bookworm, except QEMU
# (bookworm-backports) and libkrunfw5 (sid), see tests/vm-lab/install.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" != 0 ]; then echo "install-deps.sh: run as root (apt-get)" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v file >/dev/null || need+=(file)
command -v unshare >/dev/null || need+=(util-linux)
# Sandbox egress (network: true): pasta, the policy's nftables; the tests' namespaces: ip.
command -v pasta >/dev/null || need+=(passt)
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
# An ordinary-user adapter maps the sandbox's ids 1..65535 onto the user's subordinate range
# (/etc/subuid, /etc/subgid) through the setuid newuidmap/newgidmap.
command -v newuidmap >/dev/null || need+=(uidmap)
# An ordinary-user adapter's bwrap worker VMs keep their layer in an ext4 image served by
# FUSE (plugin-bwrap/src/fuse_disk.rs): fuse2fs for the image, fuse-overlayfs for the root.
command -v fuse2fs >/dev/null || need+=(fuse2fs)
command -v fuse-overlayfs >/dev/null || need+=(fuse-overlayfs)
# The bus tests' guest image carries the official Python iii-sdk, downloaded with pip
# (tests/fixtures/build-fixtures.sh pysdk).
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if [ ${#need[@]} -gt 0 ]; then
  echo "[install-deps] installing ${need[*]} (bookworm)"
  apt-get update -qq
  apt-get install -y -qq -t bookworm --no-install-recommends "${need[@]}" >/dev/null
fi
# The FUSE daemons open /dev/fuse as the adapter's user: Debian's udev rule makes it 0666; a
# host without that rule (a container) has it root-only.
if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
  echo "[install-deps] /dev/fuse -> 0666 (Debian's default; fuse2fs and fuse-overlayfs need it)"
  chmod 0666 /dev/fuse
fi
# pasta opens /dev/net/tun as the adapter's user: Debian's udev rule makes it 0666; a host
# without that rule (a container, a minimal VM) has it root-only.
if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
  echo "[install-deps] /dev/net/tun -> 0666 (Debian's default; pasta needs it)"
  chmod 0666 /dev/net/tun
fi
# pasta answers a sandbox's ping with an ICMP datagram ("ping") socket of the host's, which
# the kernel opens only to the groups in net.ipv4.ping_group_range: systemd's default on Debian
# is every group; a host without systemd's sysctl files (a container) keeps the kernel's `1 0`.
if [ "$(sysctl -n net.ipv4.ping_group_range 2>/dev/null | tr -s ' \t' ' ')" = "1 0" ]; then
  echo "[install-deps] net.ipv4.ping_group_range -> 0 2147483647 (systemd's default; pasta relays ping with it)"
  sysctl -qw net.ipv4.ping_group_range="0 2147483647" || true
fi
# Test images and the local registry (docker-registry, skopeo, umoci, busybox-static, ...).
bash "$here/tests/fixtures/install.sh"
# The VM lab: QEMU, initramfs tools, libkrunfw5.
if [ "${SKIP_VM_LAB:-0}" != 1 ]; then
  bash "$here/tests/vm-lab/install.sh"
fi
