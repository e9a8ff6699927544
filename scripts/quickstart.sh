#!/usr/bin/env bash
# The README's first command: installs, builds, and runs the main job on a fresh Debian machine:
# an engine, the adapter connected to it, and `sandbox-libkrun::run` of print(6*7).
#
# This machine reaches no public image registry, so a local registry on 127.0.0.1 serves a
# python image the project builds itself, and the configuration mirrors docker.io to it.
# On a host with hardware KVM it installs libkrunfw and runs the sandbox as a libkrun microVM.
# Where libkrun cannot boot (no hardware KVM), the bubblewrap plugin stands in for it under
# the same function ids, and the script says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-libkrun-quickstart.XXXXXX")
pids=()
# Everything lives in $work and goes with it (SANDBOX_KEEP_WORK=1 keeps it, logs included).
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${SANDBOX_KEEP_WORK:-0}" = 1 ]; then echo "kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

SKIP_VM_LAB=${SKIP_VM_LAB:-1} bash "$root/scripts/install-deps.sh"
# Where KVM is hardware virtualisation (kvm_intel or kvm_amd), the product itself can run: it
# needs libkrunfw, the guest kernel libkrun boots (not in bookworm; from sid).
if [ -c /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
  bash "$root/scripts/install-libkrunfw.sh"
fi
# A debug build: quick to make, and scripts/test.sh reuses it.
dist=$(bash "$root/scripts/build.sh" --debug "$work/dist")

read -r reg_pid reg_addr < <(REGISTRY_PARENT_PID=$$ bash "$root/tests/fixtures/start-registry.sh" "$work/registry")
pids+=("$reg_pid")
bash "$root/tests/fixtures/build-fixtures.sh" "$reg_addr" python >/dev/null

cat > "$work/config.json" <<JSON
{"registry_mirrors": {"docker.io": "$reg_addr"}, "insecure_registries": ["$reg_addr"],
 "image_cache_dir": "$work/cache", "state_dir": "$work/state"}
JSON
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export III_URL="ws://127.0.0.1:$port"
"$dist/iii-test-engine" --listen "127.0.0.1:$port" --config "sandbox-libkrun=$work/config.json" \
  >"$work/engine.log" 2>&1 &
pids+=($!)

wait_ready() {
  for _ in $(seq 1 300); do
    "$dist/trigger" sandbox-libkrun::adapter::info >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the adapter did not come up; its log:" >&2; cat "$work/adapter.log" >&2; return 1
}
# Ask the libkrun plugin itself whether this host can boot its microVMs.
"$dist/sandbox-libkrun" --plugin "$dist/libplugin_libkrun.so" >"$work/adapter.log" 2>&1 &
adapter=$!; pids+=("$adapter")
wait_ready
verdict=$("$dist/trigger" sandbox-libkrun::adapter::info | python3 -c \
  'import json,sys; b=json.load(sys.stdin)["backend"]; print("ready" if b["ready"] else b["reason"])')
if [ "$verdict" != ready ]; then
  echo "libkrun cannot boot here: $verdict"
  echo "-> the bubblewrap plugin stands in, serving the same sandbox-libkrun::* functions"
  kill "$adapter"; wait "$adapter" 2>/dev/null || true
  "$dist/sandbox-libkrun" --plugin "$dist/libplugin_bwrap.so" --prefix sandbox-libkrun \
    >"$work/adapter.log" 2>&1 &
  pids+=($!)
  wait_ready
fi
echo '$ trigger sandbox-libkrun::run {"image":"python","code":"print(6*7)","lang":"python"}'
"$dist/trigger" sandbox-libkrun::run '{"image":"python","code":"print(6*7)","lang":"python"}'
