#!/usr/bin/env bash
# The README's second command: runs every test of the project.
#   1. the whole workspace's cargo tests (unit, integration, end to end through the test
#      engine on the bubblewrap plugin), against one local registry with the fixture images;
#   2. the libkrun microVM tests inside the VM lab (tests/vm-lab/run-tests.sh), where KVM works.
# Needs what scripts/install-deps.sh installs, and root (the bwrap backend mounts overlays).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-libkrun-tests.XXXXXX")
step() { echo; echo "=== $* ($(date +%T))"; }

# A failing cargo test run does not stop the script: the later passes still run, so one CI
# run shows every failure, and the failing tests' own output (their panics, what they
# printed) is repeated at the very end, where a truncated log still shows it.
failed=()
# $1 names the pass in the digest and its log file (so no "/"); the rest is its command.
cargo_tests() {
  local label=$1; shift
  local log="$work/$label.log"
  if ! "$@" 2>&1 | tee "$log"; then
    failed+=("$label")
  fi
}
failure_digest() {
  local label
  for label in "${failed[@]}"; do
    echo
    echo "=== failures of: $label"
    [ -f "$work/$label.log" ] || continue
    # For each failing test, its name and the first lines of its panic message: a message
    # may carry a whole adapter log after its first line, so each is cut at 12 lines (the
    # test's full output is in the log above). Then libtest's list of the failing names.
    # Backtrace frames are skipped (RUST_BACKTRACE may be set).
    awk '
      /^---- .* stdout ----$/ { name = $2; panic = 0; listing = 0; next }
      /^thread .* panicked at / { print "--- " name ": " $0; panic = 1; lines = 0; next }
      panic && (/^note: / || /^stack backtrace:$/ || /^---- / || /^failures:$/) { panic = 0 }
      panic { if (lines < 12) print "    " substr($0, 1, 400); else if (lines == 12) print "    [...]"; lines++ }
      /^failures:$/ { listing = 1; next }
      listing && /^    [^ ]/ { print "FAILED" $0 }
      /^test result:/ { listing = 0 }
    ' "$work/$label.log"
    # A pass that failed before any test ran (a build error) names its target instead.
    grep -E '^error(\[E[0-9]+\])?: |^    `-p ' "$work/$label.log" | head -n 40 || true
  done
  failure_summary
}
# The digest's panics may each carry a whole adapter log, so a log cut to its last screen
# shows only the last one: this prints, last of all, one line per failing test (its name and
# the first line of its panic message) and the lab's lines that say which pass ended how.
failure_summary() {
  local label
  echo
  echo "=== in short (each failing test: the first line of its panic; a lab test run again"
  echo "    after a guest reset is listed too, and the [lab] lines say whether it then passed)"
  for label in "${failed[@]}"; do
    echo "$label:"
    [ -f "$work/$label.log" ] || continue
    # Not under libtest's "successes:" heading (--show-output prints the passing tests' output
    # too); the name from the panic's own thread, which a pass run with --nocapture needs.
    awk '
      /^successes:$/ { passed = 1; next }
      /^failures:$/ || /^test result:/ || /^running [0-9]+ tests?$/ { passed = 0; next }
      !passed && /thread .* panicked at / {
        name = $0; sub(/^.*thread \047/, "", name); sub(/\047.*$/, "", name); want = 1; next
      }
      # A call that failed names what it sent first: its error is what says why.
      want {
        at = index($0, "RemoteError")
        if (at > 80) print "  " name ": " substr($0, 1, 60) " [...] " substr($0, at, 200)
        else print "  " name ": " substr($0, 1, 260)
        want = 0
      }
    ' "$work/$label.log" | sort -u | head -n 30
    # A test binary that ended without its list of failures (killed, aborted) shows only here.
    grep -a -E "^error: test failed|process didn't exit successfully" "$work/$label.log" \
      | cut -c1-220 | head -n 10 || true
    grep -a -E '^\[lab\] .*(ended \(status [1-9]|FAILED|run again)|LAB GUEST RESET|NOT BOOTED|lab boot tests exit' \
      "$work/$label.log" | cut -c1-220 | head -n 30 || true
  done
}

# Whatever ran before (the quickstart installs without the VM lab), this installs what the
# tests need; fast when everything is there.
step "install (scripts/install-deps.sh)"
bash scripts/install-deps.sh
# The preview test opens an exposed page in a browser (tests/e2e/tests/expose.rs); only the
# tests need it, so the quickstart does not install it.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[test.sh] installing chromium (bookworm) for the preview test"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm --no-install-recommends chromium >/dev/null
fi

step "build (workspace, static agent)"
cargo build --workspace --all-targets
SANDBOX_AGENT_PATH=$(sh agent/build-static.sh)
export SANDBOX_AGENT_PATH SANDBOX_AGENT_BIN="$SANDBOX_AGENT_PATH"

step "release archive, built in the background (the install tests and the VM lab wait for it)"
# Built once for every pass (and the lab), at the lowest priority, while the tests below run:
# they mostly wait on sandboxes, and the build fills the idle cores. The lock is taken here,
# before the build starts, and only the background shell keeps it, until the build has ended
# and its status is written: whoever takes it shared (install.rs, libkrun-e2e.sh) never sees
# a half-made archive.
# setsid: the build is a process group of its own, ended as a whole if this script ends first.
release=$work/release
mkdir -p "$release"
reg_pid=
exec 9>"$release/.lock"
flock 9
setsid bash -c 'nice -n 19 bash scripts/release.sh "$1" 9>&- >"$1/.log" 2>&1; echo $? >"$1/.status"' \
  release-build "$release" &
release_pid=$!
exec 9>&-
trap 'kill -- -$release_pid 2>/dev/null || true; kill $reg_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
export SANDBOX_RELEASE_DIR=$release

step "the VM lab's rules for its passes, on a stand-in (tests/vm-lab/lab-passes-check.sh)"
# A second here; in the lab they only show when a guest resets.
cargo_tests "lab pass rules" bash tests/vm-lab/lab-passes-check.sh

step "registry with the fixture images"
read -r reg_pid reg_addr < <(REGISTRY_PARENT_PID=$$ bash tests/fixtures/start-registry.sh "$work/registry")
bash tests/fixtures/build-fixtures.sh "$reg_addr" busybox python node >/dev/null
export SANDBOX_TEST_REGISTRY=$reg_addr

step "cargo test --workspace, but for the tests of the release archive"
# --show-output: a test that cannot run its real check on this host (no usable KVM, no
# writable cgroups) says so on stdout, and that must reach the log even when it passes.
# The tests that install the release archive run by themselves after the ordinary user's pass
# (see there).
archive_tests=(installed_like_compose_it_serves_reuses_its_files_and_repairs_them
  two_installed_adapters_starting_at_once_share_one_directory
  installed_like_compose_it_boots_print_42_in_a_microvm)
cargo_tests "cargo test --workspace (root)" \
  cargo test --workspace --no-fail-fast -- --test-threads=2 --show-output \
  --exact "${archive_tests[@]/#/--skip=}"

step "end to end again, the adapter started as an ordinary user (how Compose runs it)"
if [ "$(id -u)" != 0 ]; then
  echo "ordinary-user e2e run DID NOT RUN: test.sh is not root, so it cannot make the user"
else
  user=$(bash tests/e2e/ordinary-user.sh)
  # A delegated cgroup where the host has one (as Compose's service manager gives it), the
  # adapter started inside it: then its sandboxes' cpus, memory and pids limits hold too.
  cgroups=$(bash tests/e2e/delegate-cgroup.sh "$user" || true)
  echo "ordinary user $user, delegated cgroup: ${cgroups:-none on this host}"
  # Copies the ordinary user can reach, whatever the checkout's parents allow.
  bin="$work/bin"; mkdir -p "$bin"; chmod 755 "$work"
  for f in sandbox-libkrun libplugin_bwrap.so libplugin_libkrun.so sandbox-bwrap-launch sandbox-libkrun-vm; do
    cp "target/debug/$f" "$bin/"
  done
  cp "$SANDBOX_AGENT_PATH" "$bin/sandbox-agent"
  chmod -R a+rX "$bin"
  as_user=(env SANDBOX_E2E_ADAPTER_USER="$user" SANDBOX_E2E_BIN_DIR="$bin"
    SANDBOX_E2E_ADAPTER_CGROUPS="$cgroups" SANDBOX_AGENT_PATH="$bin/sandbox-agent")
  cargo_tests "e2e as the ordinary user" \
    "${as_user[@]}" cargo test -p e2e-tests --no-fail-fast -- --test-threads=2 --show-output \
    --exact "${archive_tests[@]/#/--skip=}"
fi

# The tests of the release archive last, as root and as the ordinary user: the archive's
# background build has then had both passes' time, and these tests, which wait for it, find it
# made (in either pass they would wait for it, and every test binary after theirs with them).
step "the release archive's tests (install.rs), the archive built"
cargo_tests "install.rs (root)" \
  cargo test -p e2e-tests --test install --no-fail-fast -- --test-threads=2 --show-output
if [ -n "${as_user+set}" ]; then
  cargo_tests "install.rs as the ordinary user" \
    "${as_user[@]}" cargo test -p e2e-tests --test install --no-fail-fast -- --test-threads=2 \
    --show-output
fi

step "libkrun microVMs in the VM lab"
if [ "${SKIP_VM_LAB:-0}" = 1 ]; then
  echo "VM lab tests DID NOT RUN: SKIP_VM_LAB=1"
else
  # Through cargo_tests too: the lab relays its guests' cargo output, so a failing lab test's
  # panic reaches the digest like any other.
  cargo_tests "VM lab (run-tests.sh)" bash tests/vm-lab/run-tests.sh
fi

step "checks that did not run (tests/skips-allowed.txt)"
# A check that cannot run on this host says DID NOT RUN and passes. Under
# SANDBOX_TESTS_NO_SKIPS=1 (CI sets it) every such line must match an entry of
# tests/skips-allowed.txt, which says why that check cannot run on a CI host; any other
# fails the run, so a host that lost user namespaces, bwrap or the lab cannot pass on an
# empty suite.
skipped=$work/skipped.txt
cat "$work"/*.log 2>/dev/null | grep -a "DID NOT RUN" | sed 's/^[ *]*//; s/[ *]*$//' | sort -u >"$skipped" || true
echo "$(wc -l <"$skipped") distinct checks did not run:"
sed 's/^/  /' "$skipped"
if [ "${SANDBOX_TESTS_NO_SKIPS:-0}" = 1 ]; then
  # Each entry's text before " | " (its reason follows); never an empty pattern, which
  # would match every line.
  allowed=$work/skips-allowed.patterns
  grep -v -e '^#' tests/skips-allowed.txt | sed 's/[[:space:]]*|.*$//' | grep -v '^[[:space:]]*$' >"$allowed" || true
  unexpected=$(grep -a -v -F -f "$allowed" "$skipped" || true)
  [ -s "$allowed" ] || unexpected=$(cat "$skipped")
  if [ -n "$unexpected" ]; then
    echo "checks that did not run and are not in tests/skips-allowed.txt:"
    printf '%s\n' "$unexpected" | sed 's/^/  /'
    failed+=("checks that did not run")
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  failure_digest
  echo
  echo "=== FAILED: ${failed[*]}"
  exit 1
fi
echo "=== all passes succeeded"
