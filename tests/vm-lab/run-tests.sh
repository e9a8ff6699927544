#!/bin/bash
# Runs vm-runner's tests: on this host (unit tests; the boot test checks the fast refusal
# when KVM is unusable here), then the boot test again inside the VM lab, where libkrun
# microVMs really boot; then the libkrun plugin end to end inside the lab
# (libkrun-e2e.sh). Exit status: non-zero if any run failed.
# Needs tests/vm-lab/install.sh first. Honours CARGO_TARGET_DIR and LAB_* (see lab.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
log() { echo "[vm-lab run-tests] $*" >&2; }

log "building vm-runner and its tests"
build_json=$(cargo test -p vm-runner --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p vm-runner --no-run; exit 1; }
cargo build -p vm-runner --bins -q
target=${CARGO_TARGET_DIR:-$repo/target}
runner=$target/debug/sandbox-libkrun-vm
boot_test=$(grep -o '"executable":"[^"]*/boot-[0-9a-f]*"' <<<"$build_json" | tail -1 | cut -d'"' -f4)
out_dir=$(grep '"reason":"build-script-executed"' <<<"$build_json" | grep 'vm-runner' \
  | grep -o '"out_dir":"[^"]*"' | tail -1 | cut -d'"' -f4)
for f in "$runner" "$boot_test" "$out_dir/vsock-helper"; do
  [ -x "$f" ] || { log "missing build output: $f"; exit 1; }
done

log "host run (no usable KVM here means: the refusal is checked, boot checks print NOT RUN)"
host_rc=0
cargo test -p vm-runner -q 2>&1 || host_rc=$?

# The lab's /tmp is its own tmpfs, so the binaries travel through the scratch share.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/bin"
cp "$runner" "$boot_test" "$out_dir/vsock-helper" "$scratch/bin/"
log "lab run: the boot test inside a QEMU guest with working KVM"
lab_rc=0
LAB_SCRATCH_DIR=$scratch LAB_ENV="VM_RUNNER_BIN VM_RUNNER_VSOCK_HELPER" \
  VM_RUNNER_BIN=/tmp/vm-lab/bin/sandbox-libkrun-vm \
  VM_RUNNER_VSOCK_HELPER=/tmp/vm-lab/bin/vsock-helper \
  LAB_TIMEOUT=${LAB_TIMEOUT:-600} \
  "$here/lab.sh" -- "/tmp/vm-lab/bin/$(basename "$boot_test")" --test-threads=2 || lab_rc=$?

# The same boot checks with the runner started as an ordinary user (how Compose runs the
# adapter: /dev/kvm through its group, nothing else); the user is tests/e2e/ordinary-user.sh's.
user_rc=0
if id iii-sandbox >/dev/null 2>&1; then
  log "lab run: the boot test again, the runner as the ordinary user iii-sandbox"
  # mktemp made the scratch directory 0700 for root: the user must reach the binaries.
  chmod 0755 "$scratch" && chmod -R a+rX "$scratch"
  LAB_SCRATCH_DIR=$scratch LAB_ENV="VM_RUNNER_BIN VM_RUNNER_VSOCK_HELPER" \
    VM_RUNNER_BIN=/tmp/vm-lab/bin/sandbox-libkrun-vm \
    VM_RUNNER_VSOCK_HELPER=/tmp/vm-lab/bin/vsock-helper \
    LAB_TIMEOUT=${LAB_TIMEOUT:-600} \
    "$here/lab.sh" -- sh -c 'chgrp kvm /dev/kvm && chmod 0660 /dev/kvm &&
      exec setpriv --reuid iii-sandbox --regid iii-sandbox --init-groups \
        env HOME=/tmp VM_RUNNER_BIN="$VM_RUNNER_BIN" VM_RUNNER_VSOCK_HELPER="$VM_RUNNER_VSOCK_HELPER" \
        "$0" --test-threads=2' "/tmp/vm-lab/bin/$(basename "$boot_test")" || user_rc=$?
else
  log "ordinary-user lab run DID NOT RUN: no user iii-sandbox (tests/e2e/ordinary-user.sh makes it)"
fi

log "libkrun plugin end to end in the lab (tests/vm-lab/libkrun-e2e.sh)"
e2e_rc=0
"$here/libkrun-e2e.sh" || e2e_rc=$?

log "host tests exit $host_rc, lab boot tests exit $lab_rc (as iii-sandbox: $user_rc), lab libkrun e2e exit $e2e_rc"
[ "$host_rc" = 0 ] && [ "$lab_rc" = 0 ] && [ "$user_rc" = 0 ] && [ "$e2e_rc" = 0 ]
