#!/usr/bin/env bash
# The cross toolchain for aarch64-unknown-linux-gnu, made from Debian's packages only (rustup
# cannot fetch another target's standard library here), and the way to run commands in it.
#
#   scripts/cross-aarch64.sh setup          make it, or reuse it; prints the chroot's path
#   scripts/cross-aarch64.sh run CMD ARG... run CMD in it (the repository at the same path)
#   scripts/cross-aarch64.sh binfmt         let this host run aarch64 programs (qemu-aarch64)
#   scripts/cross-aarch64.sh arm64-root     make or reuse a bookworm arm64 root (python3,
#                                           busybox-static, bubblewrap, ...), prints its path
#   scripts/cross-aarch64.sh arm64-run CMD  run CMD in that root, emulated through binfmt
#
# What it is: a trixie chroot (debootstrap and packages, about 90 s here) under
# target/cross/trixie with trixie's rustc-web/cargo-web (1.96; bookworm's 1.85 is older than
# the locked crates allow), the aarch64 standard library (libstd-rust-web-dev:arm64) and
# bookworm's gcc-aarch64-linux-gnu (gcc 12) with its cross C library (glibc 2.36), not
# trixie's (2.41): what links against it runs on bookworm and later, as the x86_64 build
# does (the binaries ask for glibc 2.34 at most). Crates come from the
# host's cargo registry (bind-mounted, `cargo fetch`ed on the host first), so the chroot needs
# no crates.io. Each step leaves a marker file; a step whose marker exists is skipped.
#
# The host needs root, apt, and Debian's debootstrap, qemu-user-static and binfmt-support
# (installed here when missing). `binfmt` also makes /etc/qemu-binfmt/aarch64 (the library
# prefix Debian's qemu-aarch64 looks in) a link to target/cross/bookworm-arm64, bookworm's
# arm64 C runtime (libc6, libgcc-s1), so dynamically linked aarch64 programs start with the
# glibc a bookworm arm64 host has; a prefix that is not a link is left alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
cross=$target_dir/cross
chroot_dir=$cross/trixie
runtime=$cross/bookworm-arm64
arm64_root=$cross/bookworm-arm64-root
# What the arm64 root holds: python3 and busybox-static make the tests' aarch64 python image
# (tests/fixtures/mkimage.py run there); the rest is what the adapter's bwrap plugin uses
# (its image client wants the system's CA certificates).
arm64_packages=python3,busybox-static,ca-certificates,bubblewrap,passt,uidmap,iproute2,kmod,fuse-overlayfs,fuse2fs,libc-bin,file,procps
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "cross-aarch64: $(date -u +%H:%M:%S) $*" >&2; }

host_packages() {
  local missing=()
  for p in debootstrap qemu-user-static binfmt-support; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
  fi
}

# Runs "$@" inside the chroot, in a mount namespace of its own so that nothing stays mounted
# when it ends. The repository, the target directory, the host's cargo registry and git
# checkouts and any directories in $CROSS_BIND (space-separated) appear at their host paths.
in_chroot() { in_root "$chroot_dir" "$@"; }
in_root() {
  local dir=$1; shift
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  mkdir -p "$cargo_home/registry" "$cargo_home/git"
  local binds="$root $target_dir ${CROSS_BIND:-}"
  unshare --mount --propagation private -- /bin/sh -eu -c '
    c=$1; reg=$2; git=$3; binds=$4; shift 4
    mount -t proc proc "$c/proc"
    mount --rbind /dev "$c/dev"
    mount -t tmpfs tmpfs "$c/tmp"
    mkdir -p "$c/root/.cargo/registry" "$c/root/.cargo/git"
    mount --bind "$reg" "$c/root/.cargo/registry"
    mount --bind "$git" "$c/root/.cargo/git"
    for d in $binds; do mkdir -p "$c$d"; mount --bind "$d" "$c$d"; done
    cp /etc/resolv.conf "$c/etc/resolv.conf"
    exec chroot "$c" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 "$@"' sh "$dir" "$cargo_home/registry" "$cargo_home/git" "$binds" "$@"
}

setup() {
  host_packages
  mkdir -p "$cross"
  if [ ! -e "$chroot_dir/.debootstrap-done" ]; then
    log "debootstrap trixie into $chroot_dir"
    rm -rf "$chroot_dir"
    debootstrap --variant=minbase trixie "$chroot_dir" "$mirror" >"$cross/debootstrap.log" 2>&1 ||
      { tail -20 "$cross/debootstrap.log" >&2; exit 1; }
    touch "$chroot_dir/.debootstrap-done"
  fi
  if [ ! -e "$chroot_dir/.toolchain-done" ]; then
    log "installing the toolchain in the chroot"
    # bookworm is listed for its cross C library and arm64 runtime only: trixie, the newer
    # release, wins everywhere else.
    printf 'deb %s trixie main\ndeb %s bookworm main\n' "$mirror" "$mirror" \
      >"$chroot_dir/etc/apt/sources.list"
    in_chroot sh -euc '
      export DEBIAN_FRONTEND=noninteractive
      dpkg --add-architecture arm64
      apt-get update -q
      apt-get install -y -q --no-install-recommends rustc-web cargo-web gcc libc6-dev \
        libstd-rust-web-dev:arm64 file ca-certificates
      # The C cross toolchain is the bookworm one (gcc 12, glibc 2.36), so the binaries need
      # no glibc newer than bookworm has. Its packages run on trixie; trixie s own cross gcc
      # would insist on its glibc 2.41. Its C library headers are named (gcc only recommends
      # them, and the C of ring needs them). Its binutils are trixie s: bookworm s want their own
      # binutils-common, which trixie s native binutils (for gcc) have replaced, and apt s
      # solver, told to prefer bookworm, may pick them and give up.
      apt-get install -y -q --no-install-recommends --allow-downgrades -t bookworm \
        gcc-aarch64-linux-gnu/bookworm cpp-aarch64-linux-gnu/bookworm \
        libc6-dev-arm64-cross/bookworm linux-libc-dev-arm64-cross/bookworm \
        binutils-aarch64-linux-gnu/trixie
      mkdir -p /var/cache/bookworm-arm64 && cd /var/cache/bookworm-arm64
      apt-get download libc6:arm64/bookworm libgcc-s1:arm64/bookworm
    ' >&2
    touch "$chroot_dir/.toolchain-done"
  fi
  if [ ! -e "$runtime/.done" ]; then
    log "unpacking bookworm's arm64 C runtime into $runtime"
    rm -rf "$runtime" && mkdir -p "$runtime"
    for deb in "$chroot_dir"/var/cache/bookworm-arm64/*.deb; do dpkg-deb -x "$deb" "$runtime"; done
    touch "$runtime/.done"
  fi
  echo "$chroot_dir"
}

binfmt() {
  host_packages
  if [ ! -d /proc/sys/fs/binfmt_misc ] || [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 >&2
  [ -e "$runtime/.done" ] || setup >/dev/null
  mkdir -p /etc/qemu-binfmt
  if [ -L /etc/qemu-binfmt/aarch64 ] || [ ! -e /etc/qemu-binfmt/aarch64 ]; then
    ln -sfn "$runtime" /etc/qemu-binfmt/aarch64
  else
    log "/etc/qemu-binfmt/aarch64 is not a link: left as it is"
  fi
}

arm64_root() {
  if [ ! -e "$arm64_root/.debootstrap-done" ]; then
    binfmt
    log "debootstrap bookworm arm64 into $arm64_root (its second stage runs emulated)"
    rm -rf "$arm64_root"
    debootstrap --arch=arm64 --variant=minbase --include="$arm64_packages" bookworm \
      "$arm64_root" "$mirror" >"$cross/debootstrap-arm64.log" 2>&1 ||
      { tail -20 "$cross/debootstrap-arm64.log" >&2; exit 1; }
    touch "$arm64_root/.debootstrap-done"
  fi
  echo "$arm64_root"
}

case "${1:-}" in
  setup) setup ;;
  arm64-root) arm64_root ;;
  arm64-run) shift; arm64_root >/dev/null; binfmt; in_root "$arm64_root" "$@" ;;
  run) shift; [ -e "$chroot_dir/.toolchain-done" ] || setup >/dev/null; in_chroot "$@" ;;
  binfmt) binfmt ;;
  *) echo "usage: scripts/cross-aarch64.sh setup | run CMD [ARG...] | binfmt | arm64-root | arm64-run CMD [ARG...]" >&2
     exit 2 ;;
esac
