#!/usr/bin/env bash
# Makes (idempotently) the ordinary user the e2e suite starts the adapter as, with what iii
# Compose's user has: read/write on /dev/kvm (through the `kvm` group, as Debian's udev rule
# gives it), the subordinate id ranges Debian's useradd gives every new user (/etc/subuid,
# /etc/subgid: the sandbox's ids 1..65535, mapped by uidmap's newuidmap/newgidmap), and
# nothing else: no sudo, no delegated cgroup on a host that has none. Prints the user's
# name. Root only.
set -euo pipefail
user=iii-sandbox
if ! id "$user" >/dev/null 2>&1; then
  useradd --create-home --shell /usr/sbin/nologin "$user"
fi
# useradd adds the ranges only where /etc/subuid exists; a user made without them gets one.
if ! grep -q "^$user:" /etc/subuid 2>/dev/null || ! grep -q "^$user:" /etc/subgid 2>/dev/null; then
  usermod --add-subuids 300000-365535 --add-subgids 300000-365535 "$user"
fi
if [ -e /dev/kvm ]; then
  getent group kvm >/dev/null || groupadd --system kvm
  chgrp kvm /dev/kvm
  chmod 0660 /dev/kvm
  usermod -aG kvm "$user"
fi
echo "$user"
