#!/bin/bash
# Installs libkrunfw5 (the guest kernel libkrun boots) on a Debian bookworm host (root):
# bookworm has no libkrunfw, and sid is the only suite that does (it has no dependencies). The
# sid source is used for that one download only, through a private apt list, then dropped: the
# host's own sources stay as they were. Idempotent and instant when it is installed.
set -euo pipefail

have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
if have libkrunfw5; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "install-libkrunfw.sh: run as root (dpkg)" >&2; exit 1; fi

echo "[install-libkrunfw] fetching libkrunfw5 from sid (private source list, dropped afterwards)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/parts"
cat > "$tmp/parts/sid.sources" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
sid_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$tmp/parts"
          -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
          -o "APT::Sandbox::User=root")
apt-get "${sid_opts[@]}" update -qq
(cd "$tmp" && apt-get "${sid_opts[@]}" download libkrunfw5 >/dev/null)
dpkg -i "$tmp"/libkrunfw5_*.deb >/dev/null
