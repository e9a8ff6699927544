#!/usr/bin/env bash
# Makes (idempotently) the ordinary user the e2e suite starts the adapter as, with what iii
# Compose's user has: read/write on /dev/kvm (through the `kvm` group, as Debian's udev rule
# gives it) and nothing else: no sudo, no subordinate ids, no delegated cgroup on a host
# that has none. Prints the user's name. Root only.
set -euo pipefail
user=iii-sandbox
if ! id "$user" >/dev/null 2>&1; then
  useradd --create-home --shell /usr/sbin/nologin "$user"
fi
if [ -e /dev/kvm ]; then
  getent group kvm >/dev/null || groupadd --system kvm
  chgrp kvm /dev/kvm
  chmod 0660 /dev/kvm
  usermod -aG kvm "$user"
fi
echo "$user"
