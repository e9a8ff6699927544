#!/usr/bin/env bash
# Fails when a crate reaches a dependency it must not have, as the builds that ship it resolve
# features (Cargo unifies them over every package of one build):
#   - the VM runner `sandbox-libkrun-vm`, the process confined like a jailed VMM, built as
#     scripts/release.sh builds it: in one `cargo build` with both plugins. It must not link
#     the adapter's crates (sandbox-core, the bus guard, the engine's SDK) nor the image
#     puller's (oci-client, rustls): none of them is code it runs, all of them attack surface;
#   - image-store as the library the adapter links (default features): not the crates only its
#     command-line tools use (their `cli` feature).
# Reads only Cargo.toml files and Cargo.lock (`cargo tree`): seconds.
# usage: scripts/check-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
fail() {
  echo "check-deps: $*" >&2
  failed=1
}

# The packages, one per line, of the tree printed for ROOT by `cargo tree ARGS...`.
crates_under() {
  local root=$1
  shift
  cargo tree "$@" -e normal --prefix none --no-dedupe \
    | awk -v root="$root" 'BEGIN { RS = "" } $1 == root { print }' \
    | awk 'NF { print $1 }' | sort -u
}

# Release targets: the host's (x86_64) and the cross build's (aarch64); the runner's Linux-only
# dependencies are per target.
for target in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
  # As release.sh step 1: `cargo build -p plugin-libkrun -p plugin-bwrap -p vm-runner`.
  release=(-p plugin-libkrun -p plugin-bwrap -p vm-runner --target "$target")
  runner=$(crates_under vm-runner "${release[@]}")
  # An empty list would pass every check below: the tree must be the runner's.
  for expected in libkrun layer-capture egress; do
    grep -qx "$expected" <<<"$runner" ||
      fail "$target: the tree of vm-runner read from cargo tree lacks $expected; is the check still reading the right tree?"
  done
  for banned in sandbox-core plugin-api bus-guard iii-sdk image-store oci-client rustls; do
    if grep -qx "$banned" <<<"$runner"; then
      fail "$target: the VM runner, built with the plugins as release.sh builds it, depends on $banned. How (cargo tree -i):"
      { cargo tree "${release[@]}" -e normal -i "$banned" | head -n 40; } >&2 || true
    fi
  done
  echo "vm-runner ($target, built with the plugins): $(wc -l <<<"$runner") crates"
done

library=$(crates_under image-store -p image-store)
grep -qx oci-client <<<"$library" ||
  fail "the tree of image-store read from cargo tree lacks oci-client; is the check still reading the right tree?"
for banned in clap anyhow indicatif tracing-subscriber; do
  if grep -qx "$banned" <<<"$library"; then
    fail "image-store as a library (default features) depends on $banned, which only its tools need: make it optional, in the \`cli\` feature. How (cargo tree -i):"
    { cargo tree -p image-store -e normal -i "$banned" | head -n 40; } >&2 || true
  fi
done
echo "image-store (library, default features): $(wc -l <<<"$library") crates"

if [ "$failed" != 0 ]; then
  exit 1
fi
echo "check-deps: ok"
