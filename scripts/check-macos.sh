#!/usr/bin/env bash
# `cargo check` of the crates a macOS build carries (the shell, plugin-api, sandbox-core, the
# libkrun plugin and the VM runner, whose runner is a refusing stub there) for
# aarch64-apple-darwin, on this Linux host: it proves that the Linux-only code is gated
# (README, "Hosts", macOS) and nothing more. Nothing is linked, nothing runs.
#
#   scripts/check-macos.sh [CARGO_CHECK_ARG...]
#
# rustup has no macOS standard library here, so std is compiled from source (`-Zbuild-std`,
# RUSTC_BOOTSTRAP=1) in the cross chroot of scripts/cross-aarch64.sh (trixie's Rust 1.96), with
# Debian's `rust-web-src` added. There is no Apple SDK: the C sources that build scripts compile
# (ring's, zstd-sys's) are replaced by empty objects (cc-darwin-stub below), which only a link
# would notice. Crates, std's own dependencies too, come from the host's cargo registry, fetched
# on the host first; the chroot's cargo is offline. Idempotent: a marker file skips the
# installs. Measured here: 4.5 minutes cold (std from source included; 2 cores, one job),
# under a second once checked; making the chroot and its packages, when they are not there
# yet, takes minutes more (not timed with the packages added here).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
cross=$root/scripts/cross-aarch64.sh

log() { echo "check-macos: $(date -u +%H:%M:%S) $*" >&2; }

chroot_dir=$("$cross" setup)
if [ ! -e "$chroot_dir/.macos-done" ]; then
  log "installing rust-web-src, clang-19 and llvm-19 in the chroot"
  "$cross" run sh -euc 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends rust-web-src clang-19 llvm-19' >&2
  # A C "compiler" for build scripts: an empty object for each source (there are no macOS C
  # headers here), clang itself for anything else (cc-rs's probes).
  cat >"$chroot_dir/usr/local/bin/cc-darwin-stub" <<'EOF'
#!/bin/sh
out=; compile=; prev=
for a in "$@"; do
  [ "$prev" = -o ] && out=$a
  [ "$a" = -c ] && compile=1
  prev=$a
done
if [ -n "$compile" ] && [ -n "$out" ]; then
  exec clang-19 --target=arm64-apple-macosx11.0 -x c -c /dev/null -o "$out"
fi
exec clang-19 --target=arm64-apple-macosx11.0 "$@"
EOF
  chmod 755 "$chroot_dir/usr/local/bin/cc-darwin-stub"
  touch "$chroot_dir/.macos-done"
fi

log "fetching crates on the host"
(cd "$root" && cargo fetch -q)
RUSTC_BOOTSTRAP=1 cargo fetch -q \
  --manifest-path "$chroot_dir/usr/lib/rustlib/src/rust/library/Cargo.toml"

log "cargo check --target aarch64-apple-darwin"
"$cross" run env CARGO_TARGET_DIR="$target_dir/macos" CARGO_NET_OFFLINE=true \
  RUSTC_BOOTSTRAP=1 CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}" \
  CC_aarch64_apple_darwin=/usr/local/bin/cc-darwin-stub AR_aarch64_apple_darwin=llvm-ar-19 \
  sh -euc 'cd "$1"; shift; exec cargo check -Zbuild-std=std,panic_abort \
    --target aarch64-apple-darwin -p plugin-api -p sandbox-core -p plugin-libkrun \
    -p sandbox-libkrun -p vm-runner "$@"' sh "$root" "$@"
log "ok: they compile for aarch64-apple-darwin"
