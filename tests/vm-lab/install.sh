#!/bin/bash
# Installs what the VM lab and vm-runner's boot tests need on a Debian bookworm host (root):
#   - qemu-system-x86 + qemu-utils from bookworm-backports, together (bookworm's QEMU would
#     remove a backports qemu-utils already on the machine)
#   - kmod cpio busybox-static from bookworm (initramfs building)
#   - libkrunfw5 from sid (scripts/install-libkrunfw.sh)
# Idempotent and fast when everything is present.
set -euo pipefail

log() { echo "[vm-lab install] $*"; }
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
from_backports() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null | grep -q '~bpo12'; }

if [ "$(id -u)" != 0 ]; then echo "install.sh: run as root (apt-get)" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
trap 'echo "[vm-lab install] FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

need_update=
backports_list=/etc/apt/sources.list.d/sandbox-libkrun-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  log "adding the bookworm-backports source"
  cat > "$backports_list" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  need_update=1
fi

missing_bookworm=()
for p in kmod cpio busybox-static; do have "$p" || missing_bookworm+=("$p"); done
qemu_ok=1
for p in qemu-system-x86 qemu-utils; do { have "$p" && from_backports "$p"; } || qemu_ok=; done

if [ -n "$need_update" ] || [ ${#missing_bookworm[@]} -gt 0 ] || [ -z "$qemu_ok" ]; then
  log "apt-get update"
  apt-get update -qq
fi
if [ ${#missing_bookworm[@]} -gt 0 ]; then
  log "installing ${missing_bookworm[*]} (bookworm)"
  apt-get install -y -qq -t bookworm --no-install-recommends "${missing_bookworm[@]}" >/dev/null 2>&1
fi
if [ -z "$qemu_ok" ]; then
  log "installing qemu-system-x86 qemu-utils (bookworm-backports)"
  apt-get install -y -qq -t bookworm-backports --no-install-recommends \
    qemu-system-x86 qemu-utils >/dev/null 2>&1
fi

bash "$(dirname "$0")/../../scripts/install-libkrunfw.sh"

log "ready: $(dpkg-query -W -f='${Package} ${Version}\n' qemu-system-x86 qemu-utils libkrunfw5 busybox-static | tr '\n' ' ')"
