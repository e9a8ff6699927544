#!/usr/bin/env bash
# Builds what the adapter needs at run time into one directory:
#   sandbox-libkrun, libplugin_libkrun.so, libplugin_bwrap.so (+ sandbox-bwrap-launch),
#   sandbox-agent (static),
#   sandbox-libkrun-vm, sandbox-libkrun-pull, iii-test-engine, trigger.
# usage: scripts/build.sh [--debug] [OUT_DIR]   (default OUT_DIR: dist/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
profile=release; flag=--release
if [ "${1:-}" = --debug ]; then profile=debug; flag=; shift; fi
out=${1:-$root/dist}
target_dir=${CARGO_TARGET_DIR:-$root/target}
cargo build --manifest-path "$root/Cargo.toml" $flag \
  -p sandbox-libkrun -p plugin-libkrun -p plugin-bwrap -p vm-runner \
  -p iii-test-engine -p sandbox-examples >&2
# The pull tool needs image-store's `cli` feature, asked of that package alone: its
# `required-features` are judged by the features the command line gives the package.
cargo build --manifest-path "$root/Cargo.toml" $flag -p image-store --features cli \
  --bin sandbox-libkrun-pull >&2
agent=$(sh "$root/agent/build-static.sh")
mkdir -p "$out"
for f in sandbox-libkrun libplugin_libkrun.so libplugin_bwrap.so sandbox-bwrap-launch sandbox-libkrun-vm \
         sandbox-libkrun-pull iii-test-engine trigger; do
  cp -f "$target_dir/$profile/$f" "$out/"
done
cp -f "$agent" "$out/sandbox-agent"
echo "$out"
