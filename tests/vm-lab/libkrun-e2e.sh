#!/bin/bash
# The libkrun plugin end to end inside the VM lab: the real adapter with
# `--plugin libplugin_libkrun.so` serving sandboxes as real microVMs through the test engine
# (tests/e2e/tests/libkrun.rs), with the fixture registry running inside the lab too.
#
#   tests/vm-lab/libkrun-e2e.sh              the end-to-end test (fails if no microVM boots)
#   tests/vm-lab/libkrun-e2e.sh --measure [N] create->first exec and run(print(6*7)) on
#                                             libkrun against bwrap in the same lab run
#   LAB_TESTS="microvm_sandboxes" LAB_AS_USER=0 LAB_INSTALL=0 tests/vm-lab/libkrun-e2e.sh
#                                             only those tests, no ordinary-user or install run
#   LAB_NETWORK_TESTS="a_sandbox_cannot_reach_the_bus_but_a_worker_vm_can_and_nothing_else"
#                                             only those network tests (root, ordinary user)
#   LAB_SUITE=more tests/vm-lab/libkrun-e2e.sh
#                                             what does not fit in CI's 60 minutes instead
#                                             (.ci/lab-more): the network policy's narrowing,
#                                             DNS and name tests, the code runner's flow, and
#                                             preview URLs (expose.rs; LAB_EXPOSE=0 leaves
#                                             them out, LAB_NETWORK=0 LAB_BUS=0 runs them alone,
#                                             LAB_EXPOSE_TESTS="word" only those tests), the
#                                             boundary following the host's addresses and the
#                                             link test (host_addresses.rs; LAB_HOST_ADDRESSES=0
#                                             leaves them out), the family flow (family.rs;
#                                             LAB_FAMILY=0 leaves it out) and a guest's
#                                             mountinfo (escape.rs; LAB_MOUNTINFO=0 leaves it
#                                             out)
#   LAB_SUITE=more LAB_NETWORK=0 LAB_BUS=0 LAB_EXPOSE=0 tests/vm-lab/libkrun-e2e.sh
#                                             only the bus guard's attacks from microVMs
#                                             (bus_guard_attacks.rs, in the "more" suite;
#                                             LAB_BUS_ATTACKS=0 leaves them out)
#
# Builds what it needs (honours CARGO_TARGET_DIR); the static agent comes from
# SANDBOX_AGENT_PATH, else agent/build-static.sh builds it. Binaries and the prebuilt fixture
# layouts travel through the lab's scratch share, so any target directory works. Needs
# tests/vm-lab/install.sh and tests/fixtures/install.sh. Exit status: the test's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
log() { echo "[vm-lab libkrun-e2e] $*" >&2; }

mode="test"; n=3
if [ "${1:-}" = "--measure" ]; then mode=measure; n=${2:-3}; fi
# `ci`: the passes .ci/run runs. `more`: those its 60 minutes leave out, a job of their own
# (.ci/lab-more): the network tests that narrow the policy, DNS and names in the lists (as on
# bwrap, whose host passes run them in CI), and the code runner's flow on the bus.
suite=${LAB_SUITE:-ci}
case "$suite" in ci|more) ;; *) log "LAB_SUITE must be ci or more, not $suite"; exit 2 ;; esac
# Who the network tests run the adapter as: root and the ordinary user in CI, root in `more`.
network_users='"" iii-sandbox'
[ "$suite" = ci ] || network_users='""'
# Who the "more" suite's expose, host address and family passes run the adapter as: root,
# then the ordinary user (LAB_MORE_AS_USER=0: root only).
more_users='"" iii-sandbox'
[ "${LAB_MORE_AS_USER:-1}" = 1 ] || more_users='""'


log "building the adapter, both plugins, the VM runner and the libkrun e2e test"
cargo build -q -p sandbox-libkrun -p plugin-libkrun -p plugin-bwrap -p vm-runner
build_json=$(cargo test -p e2e-tests --test libkrun --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test libkrun --no-run; exit 1; }
test_bin=$(grep -o '"executable":"[^"]*/libkrun-[0-9a-f]*"' <<<"$build_json" | tail -1 | cut -d'"' -f4)
# The install test (one file, as Compose installs it) on libkrun by name: the
# release archive is scripts/test.sh's (SANDBOX_RELEASE_DIR) or built here, the lab only
# extracts and boots.
install_json=$(cargo test -p e2e-tests --test install --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test install --no-run; exit 1; }
install_bin=$(grep -o '"executable":"[^"]*/install-[0-9a-f]*"' <<<"$install_json" | tail -1 | cut -d'"' -f4)
# The network test's first check (a network that never opens the bus) on libkrun microVMs.
network_json=$(cargo test -p e2e-tests --test network --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test network --no-run; exit 1; }
network_bin=$(grep -o '"executable":"[^"]*/network-[0-9a-f]*"' <<<"$network_json" | tail -1 | cut -d'"' -f4)
# The posture of the runner and its helpers from the host (posture.rs, tests/e2e/posture/).
posture_json=$(cargo test -p e2e-tests --test posture --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test posture --no-run; exit 1; }
posture_bin=$(grep -o '"executable":"[^"]*/posture-[0-9a-f]*"' <<<"$posture_json" | tail -1 | cut -d'"' -f4)
# A microVM sandbox on the bus through the adapter's guard (bus_guard.rs), its guest's
# connection through pasta's port of the runner's network namespace.
bus_json=$(cargo test -p e2e-tests --test bus_guard --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test bus_guard --no-run; exit 1; }
bus_bin=$(grep -o '"executable":"[^"]*/bus_guard-[0-9a-f]*"' <<<"$bus_json" | tail -1 | cut -d'"' -f4)
# The bus guard's attacks (bus_guard_attacks.rs) from microVM sandboxes and worker VMs.
attacks_json=$(cargo test -p e2e-tests --test bus_guard_attacks --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test bus_guard_attacks --no-run; exit 1; }
attacks_bin=$(grep -o '"executable":"[^"]*/bus_guard_attacks-[0-9a-f]*"' <<<"$attacks_json" | tail -1 | cut -d'"' -f4)
# Snapshots and fork (snapshots.rs) of microVM sandboxes: the runner's upper directory
# copied through its own root, a snapshot's layers stacked by the runner.
snapshots_json=$(cargo test -p e2e-tests --test snapshots --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test snapshots --no-run; exit 1; }
snapshots_bin=$(grep -o '"executable":"[^"]*/snapshots-[0-9a-f]*"' <<<"$snapshots_json" | tail -1 | cut -d'"' -f4)
# Preview URLs (expose.rs) of microVM sandboxes: the host's listener relays each connection
# over the agent link to a server in the guest.
expose_json=$(cargo test -p e2e-tests --test expose --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test expose --no-run; exit 1; }
expose_bin=$(grep -o '"executable":"[^"]*/expose-[0-9a-f]*"' <<<"$expose_json" | tail -1 | cut -d'"' -f4)
# The boundary following the host's addresses, and no link of ours (host_addresses.rs), and
# the sandbox family's flow through a router stand-in (family.rs), on microVMs.
hosts_json=$(cargo test -p e2e-tests --test host_addresses --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test host_addresses --no-run; exit 1; }
hosts_bin=$(grep -o '"executable":"[^"]*/host_addresses-[0-9a-f]*"' <<<"$hosts_json" | tail -1 | cut -d'"' -f4)
family_json=$(cargo test -p e2e-tests --test family --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test family --no-run; exit 1; }
family_bin=$(grep -o '"executable":"[^"]*/family-[0-9a-f]*"' <<<"$family_json" | tail -1 | cut -d'"' -f4)
# A guest's mountinfo names nothing of the host (escape.rs), on microVMs.
escape_json=$(cargo test -p e2e-tests --test escape --no-run --message-format=json 2>/dev/null) \
  || { cargo test -p e2e-tests --test escape --no-run; exit 1; }
escape_bin=$(grep -o '"executable":"[^"]*/escape-[0-9a-f]*"' <<<"$escape_json" | tail -1 | cut -d'"' -f4)
profile=$(dirname "$(dirname "$test_bin")")
agent=${SANDBOX_AGENT_PATH:-}
if [ -z "$agent" ]; then agent=$(sh "$repo/agent/build-static.sh"); fi
for f in "$test_bin" "$install_bin" "$network_bin" "$posture_bin" "$bus_bin" "$attacks_bin" "$snapshots_bin" "$expose_bin" "$hosts_bin" "$family_bin" "$escape_bin" "$profile/sandbox-libkrun" \
  "$profile/libplugin_libkrun.so" "$profile/libplugin_bwrap.so" "$profile/sandbox-bwrap-launch" "$profile/sandbox-libkrun-vm" \
  "$agent"; do
  [ -f "$f" ] || { log "missing build output: $f"; exit 1; }
done

# The lab's /tmp is its own tmpfs: binaries go through the scratch share, laid out as the
# harness expects them (the test's profile directory holds the adapter and the plugins).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/debug/deps" "$scratch/fixtures"
cp "$test_bin" "$install_bin" "$network_bin" "$posture_bin" "$bus_bin" "$attacks_bin" "$snapshots_bin" "$expose_bin" "$hosts_bin" "$family_bin" "$escape_bin" "$scratch/debug/deps/"
if [ "$mode" = test ] && [ "$suite" = ci ] && [ "${LAB_INSTALL:-1}" = 1 ]; then
  if [ -n "${SANDBOX_RELEASE_DIR:-}" ]; then
    # scripts/test.sh's archive, built in the background: its lock is free once it is made.
    log "release archive for the install test: scripts/test.sh's ($SANDBOX_RELEASE_DIR)"
    if [ -f "$SANDBOX_RELEASE_DIR/.lock" ]; then
      flock -s "$SANDBOX_RELEASE_DIR/.lock" true
      [ "$(cat "$SANDBOX_RELEASE_DIR/.status" 2>/dev/null)" = 0 ] \
        || { log "scripts/release.sh failed:"; cat "$SANDBOX_RELEASE_DIR/.log" >&2; exit 1; }
    fi
    mkdir -p "$scratch/release"
    cp "$SANDBOX_RELEASE_DIR"/sandbox-libkrun-*.tar.gz "$SANDBOX_RELEASE_DIR"/*.sha256 "$scratch/release/"
  else
    log "release archive for the install test (scripts/release.sh)"
    bash scripts/release.sh "$scratch/release" >&2
  fi
fi
cp "$profile/sandbox-libkrun" "$profile/libplugin_libkrun.so" "$profile/libplugin_bwrap.so" \
  "$profile/sandbox-bwrap-launch" "$profile/sandbox-libkrun-vm" "$scratch/debug/"
cp "$agent" "$scratch/sandbox-agent"
cp "$here/lab-passes.sh" "$scratch/"
# Fixture layouts are built here (emulated, the build takes minutes); the lab only pushes.
host_fixtures=${FIXTURE_CACHE:-${TMPDIR:-/tmp}/sandbox-libkrun-fixtures}
for kind in busybox python; do
  /usr/bin/python3 tests/fixtures/mkimage.py --kind "$kind" --out "$host_fixtures/$kind" >&2
  cp -a "$host_fixtures/$kind" "$scratch/fixtures/"
done
# The python image with the official iii-sdk (its wheels come from PyPI, here on the host).
pysdk=0
if FIXTURE_CACHE=$host_fixtures bash tests/fixtures/build-fixtures.sh --layouts-only pysdk >&2; then
  cp -a "$host_fixtures/pysdk" "$host_fixtures/iii-sdk-py-wheels" "$scratch/fixtures/"
  pysdk=1
else
  log "the pysdk fixture could not be built (PyPI?): the bus guard on libkrun will say DID NOT RUN"
fi
# The official Python SDK for family.rs's caller, installed here (the lab has no network).
pysdk_host=0
if [ "$mode" = test ] && [ "$suite" = more ] && [ "${LAB_FAMILY:-1}" = 1 ]; then
  if /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --require-hashes \
    --only-binary=:all: --target "$scratch/pysdk-host" -r tests/fixtures/iii-sdk-py.txt >&2; then
    pysdk_host=1
  else
    log "pip could not install the Python iii-sdk here: family.rs's SDK caller will say DID NOT RUN"
  fi
fi

if [ "$mode" = measure ]; then
  test_args="measure_libkrun_against_bwrap --ignored --exact --nocapture --test-threads=1"
else
  # LAB_TESTS: only the tests whose names hold one of these words (a quicker look at one).
  test_args="--test-threads=2 --show-output ${LAB_TESTS:-}"
fi
cat > "$scratch/inner.sh" <<INNER
set -eu
reg=\$(REGISTRY_PARENT_PID=\$\$ bash $(printf '%q' "$repo")/tests/fixtures/start-registry.sh /tmp/registry)
export SANDBOX_TEST_REGISTRY=\${reg#* }
FIXTURE_CACHE=/tmp/vm-lab/fixtures bash $(printf '%q' "$repo")/tests/fixtures/build-fixtures.sh \
  "\$SANDBOX_TEST_REGISTRY" python >/dev/null
echo "[lab] registry \$SANDBOX_TEST_REGISTRY holds the python fixture"
export SANDBOX_AGENT_PATH=/tmp/vm-lab/sandbox-agent SANDBOX_EXPECT_MICROVMS=1 LIBKRUN_BENCH_N=$n
export LIBKRUN_WORKER_ROUNDS=${LIBKRUN_WORKER_ROUNDS:-20} SANDBOX_E2E_START_WAIT_S=300
# Boots under the lab's emulation, two tests at a time, took over the default 60 s in CI (as
# root and as the ordinary user): every pass waits up to 180 s (LAB_BOOT_TIMEOUT_SECS).
export SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS=${LAB_BOOT_TIMEOUT_SECS:-180}
# A lab guest reset (the L1 kernel under emulated nested SVM panics now and then) boots the
# lab again and runs this again: passes that had ended keep their result (lab-passes.sh), and
# if the ordinary user's worker-VM rounds are the pass that runs again, they are cut to 3,
# saying so, so the run stays within CI's 90 minutes (the reset says nothing about the rounds).
# CI runs 5 rounds in a row (each 30-75 s under the emulation); the soak of 20 in a row is a
# job of its own: LIBKRUN_USER_WORKER_ROUNDS=20 bash tests/vm-lab/run-tests.sh.
user_rounds=${LIBKRUN_USER_WORKER_ROUNDS:-5}
if [ -f /tmp/vm-lab/attempted ]; then
  user_rounds=3
  echo "[lab] this is a run again after a lab guest reset: if the ordinary user's worker-VM rounds run in it, they are cut to \$user_rounds to stay within CI's time"
fi
touch /tmp/vm-lab/attempted
# A failing pass does not stop the later ones (the ordinary user's rounds, the install test);
# a test ended by the lab's own guest reset runs once more; why each failed pass failed is
# printed last (lab-passes.sh).
. /tmp/vm-lab/lab-passes.sh
# pasta copies the host's uplink (an interface with the default route); the lab has no
# network, so a dummy one stands in for network: true (the network test's servers are on
# their own veths; the measure's creates with network reach nothing).
ip link add lab0 type dummy && ip addr add 203.0.113.1/24 dev lab0 && ip link set lab0 up \
  && ip route add default via 203.0.113.254 dev lab0 || echo "[lab] could not make the stand-in uplink lab0"
# /dev/kvm as Debian's udev rule leaves it (root:kvm 0660; there is no udev here): a root
# adapter's runner gives host root up and keeps only that group (vm-runner's drop_root.rs).
kvm_gid=\$(getent group kvm | cut -d: -f3)
chgrp "\${kvm_gid:-36}" /dev/kvm && chmod 0660 /dev/kvm
skip=""
if [ "$mode" = test ] && [ "${LAB_WORKER_ROUNDS:-0}" != 1 ]; then
  # The worker-VM rounds run once per lab run, as the ordinary user below (how Compose runs
  # the adapter; ~75 s a round under the lab's emulation). LAB_WORKER_ROUNDS=1 runs them as
  # root here too.
  echo "[lab] worker_vms_connect_back...round_after_round: as the ordinary user below, not as root (LAB_WORKER_ROUNDS=1 adds a root run)"
  skip="--skip worker_vms_connect_back"
fi
if [ "$mode" = measure ] && id iii-sandbox >/dev/null 2>&1; then
  # As the ordinary user (how Compose runs it): a root bwrap adapter idmaps the image cache,
  # and the lab's kernel (6.1) cannot idmap its tmpfs (6.3 can), so bwrap's side as root
  # fails there with EINVAL.
  echo "[lab] measure: both plugins started as the ordinary user iii-sandbox"
  chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
  pass "libkrun measure (ordinary user)" env SANDBOX_E2E_ADAPTER_USER=iii-sandbox SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug \
    /tmp/vm-lab/debug/deps/$(basename "$test_bin") $test_args
  finish
  exit 0
fi
if [ "$suite" = ci ]; then
  pass "libkrun e2e (root)" /tmp/vm-lab/debug/deps/$(basename "$test_bin") $test_args \$skip
fi
if [ "$mode" = test ] && [ "${LAB_NETWORK:-1}" != 1 ]; then
  echo "[lab] the network test on libkrun DID NOT RUN: LAB_NETWORK is not 1"
elif [ "$mode" = test ]; then
  # The test makes its servers' namespaces as root; the adapter runs as root, then as the
  # ordinary user (whose runner makes its network namespace in a user namespace of its own).
  echo "[lab] egress behind the policy on microVMs, sandboxes and worker VMs (network.rs, SANDBOX_E2E_NETWORK_PLUGIN=libkrun)"
  for as_user in $network_users; do
    if [ -n "\$as_user" ] && ! id "\$as_user" >/dev/null 2>&1; then
      echo "[lab] the network test as the ordinary user DID NOT RUN: no user \$as_user"; continue
    fi
    [ -z "\$as_user" ] || { chgrp kvm /dev/kvm && chmod 0660 /dev/kvm; }
    # In CI, as root and as the ordinary user (what differs: who owns the runner's
    # namespaces), the boundary: the first test and the bus test. The policy's narrowing, DNS
    # and names (the egress crate's, as on bwrap, whose host passes run them) as root in the
    # "more" suite.
    tests="network_on_reaches_the_public_side_only_and_off_reaches_nothing a_sandbox_cannot_reach_the_bus_but_a_worker_vm_can_and_nothing_else"
    more="allow_and_deny_narrow_the_policy_and_a_create_cannot_widen_it dns_goes_to_our_proxy_whatever_server_is_asked_and_survives_a_flood a_name_in_network_deny_or_allow_judges_the_addresses_it_resolved_to"
    [ "$suite" = ci ] || tests="\$more"
    # LAB_NETWORK_TESTS: only these network tests (a quicker look at one).
    tests="${LAB_NETWORK_TESTS:-\$tests}"
    pass "network on libkrun (\${as_user:-root})" env SANDBOX_E2E_NETWORK_PLUGIN=libkrun \
      \${as_user:+SANDBOX_E2E_ADAPTER_USER=\$as_user SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug} \
      /tmp/vm-lab/debug/deps/$(basename "$network_bin") \$tests --exact --nocapture
  done
fi
if [ "$mode" = test ] && [ "${LAB_BUS:-1}" != 1 ]; then
  echo "[lab] the bus guard on libkrun DID NOT RUN: LAB_BUS is not 1"
elif [ "$mode" = test ] && [ "$pysdk" != 1 ]; then
  echo "[lab] the bus guard on libkrun DID NOT RUN: no pysdk fixture (its wheels need PyPI on the host)"
elif [ "$mode" = test ]; then
  # The code runner's flow, the refusals, reaping, and no connection without access or
  # network, with microVM guests (as root). The flood test stays on bwrap: its 2x median
  # bound means nothing under the lab's emulation, where one exec already varies more.
  echo "[lab] sandboxes on the bus through the guard, on libkrun (bus_guard.rs, SANDBOX_E2E_NETWORK_PLUGIN=libkrun)"
  FIXTURE_CACHE=/tmp/vm-lab/fixtures bash $(printf '%q' "$repo")/tests/fixtures/build-fixtures.sh \
    "\$SANDBOX_TEST_REGISTRY" pysdk >/dev/null
  # The code runner's whole flow on libkrun runs in the "more" suite (or with LAB_BUS_FLOW=1):
  # its guest serves guest::hello, calls host::allowed and is refused the rest; once it waited
  # without end after the guest's calls, cause unknown (a watchdog now names the step), so CI
  # leaves it out; the "more" suite runs it alone.
  flow="--skip the_code_runners_flow"
  if [ "$suite" = more ]; then flow="the_code_runners_flow"
  elif [ "${LAB_BUS_FLOW:-0}" = 1 ]; then flow=""; else
    echo "[lab] the_code_runners_flow_serves_and_calls_through_the_guard_only on libkrun DID NOT RUN in this suite: once it waited without end after the guest's calls (LAB_SUITE=more, .ci/lab-more, runs it)"
  fi
  pass "bus guard on libkrun (root)" env SANDBOX_E2E_NETWORK_PLUGIN=libkrun FIXTURE_CACHE=/tmp/vm-lab/fixtures \
    /tmp/vm-lab/debug/deps/$(basename "$bus_bin") --skip a_guest_flooding_the_guard \$flow --nocapture --test-threads=1
fi
if [ "$suite" = more ] && [ "$mode" = test ] && [ "${LAB_BUS_ATTACKS:-1}" != 1 ]; then
  echo "[lab] the bus guard's attacks on libkrun DID NOT RUN: LAB_BUS_ATTACKS is not 1"
elif [ "$suite" = more ] && [ "$mode" = test ] && [ "$pysdk" != 1 ]; then
  echo "[lab] the bus guard's attacks on libkrun DID NOT RUN: no pysdk fixture (its wheels need PyPI on the host)"
elif [ "$suite" = more ] && [ "$mode" = test ]; then
  # The attacks a hostile guest makes through the guard (name claims on the adapter and a
  # host worker, HTTP-invoked functions, floods, refusal churn, namespaces) from a microVM
  # sandbox and a worker VM, whose guests reach it through TSI and pasta's port (as root).
  echo "[lab] attacks through the bus guard from microVMs (bus_guard_attacks.rs, SANDBOX_E2E_NETWORK_PLUGIN=libkrun)"
  FIXTURE_CACHE=/tmp/vm-lab/fixtures bash $(printf '%q' "$repo")/tests/fixtures/build-fixtures.sh \
    "\$SANDBOX_TEST_REGISTRY" pysdk >/dev/null
  pass "bus guard attacks on libkrun (root)" env SANDBOX_E2E_NETWORK_PLUGIN=libkrun FIXTURE_CACHE=/tmp/vm-lab/fixtures \
    /tmp/vm-lab/debug/deps/$(basename "$attacks_bin") --nocapture --test-threads=1
fi
if [ "$suite" = more ] && [ "$mode" = test ] && [ "${LAB_EXPOSE:-1}" != 1 ]; then
  echo "[lab] preview URLs on libkrun DID NOT RUN: LAB_EXPOSE is not 1"
elif [ "$suite" = more ] && [ "$mode" = test ]; then
  # Preview URLs of microVM sandboxes, with and without network (under network: true the
  # guest's sockets go through TSI), as root: the page, a WebSocket, the connection ceilings,
  # the URL closed by port::close, pause and stop; a Chromium screenshot (the host's, through
  # the shared root) and the benchmark. The two tests take turns (they share one lock).
  echo "[lab] preview URLs of microVM sandboxes (expose.rs, SANDBOX_E2E_PLUGIN=libkrun)"
  for as_user in $more_users; do
    if [ -n "\$as_user" ] && ! id "\$as_user" >/dev/null 2>&1; then
      echo "[lab] preview URLs as the ordinary user DID NOT RUN: no user \$as_user"; continue
    fi
    pass "expose on libkrun (\${as_user:-root})" env SANDBOX_E2E_PLUGIN=libkrun \
      \${as_user:+SANDBOX_E2E_ADAPTER_USER=\$as_user SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug} \
      /tmp/vm-lab/debug/deps/$(basename "$expose_bin") --test-threads=1 --nocapture ${LAB_EXPOSE_TESTS:-}
  done
fi
if [ "$suite" = more ] && [ "$mode" = test ] && [ "${LAB_HOST_ADDRESSES:-1}" != 1 ]; then
  echo "[lab] the host's addresses and links on libkrun DID NOT RUN: LAB_HOST_ADDRESSES is not 1"
elif [ "$suite" = more ] && [ "$mode" = test ]; then
  # An address the host gains while microVMs run is refused to their guests (TSI makes their
  # connections the runner's, judged in its namespace) and released once gone; an AnyIP
  # prefix likewise; no link of ours on libkrun (as root: the test numbers the host). The
  # policy-routing table's test is about the choice of a gate's link, which libkrun has not.
  echo "[lab] the host's addresses and links on microVMs (host_addresses.rs, SANDBOX_E2E_NETWORK_PLUGIN=libkrun)"
  for as_user in $more_users; do
    if [ -n "\$as_user" ] && ! id "\$as_user" >/dev/null 2>&1; then
      echo "[lab] the host's addresses as the ordinary user DID NOT RUN: no user \$as_user"; continue
    fi
    pass "host addresses on libkrun (\${as_user:-root})" env SANDBOX_E2E_NETWORK_PLUGIN=libkrun \
      \${as_user:+SANDBOX_E2E_ADAPTER_USER=\$as_user SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug} \
      /tmp/vm-lab/debug/deps/$(basename "$hosts_bin") --skip a_link_avoids_a_route_of_a_policy_routing_table \
      --test-threads=1 --nocapture ${LAB_HOST_ADDRESSES_TESTS:-}
  done
fi
if [ "$suite" = more ] && [ "$mode" = test ] && [ "${LAB_MOUNTINFO:-1}" != 1 ]; then
  echo "[lab] a guest's mountinfo on libkrun DID NOT RUN: LAB_MOUNTINFO is not 1"
elif [ "$suite" = more ] && [ "$mode" = test ]; then
  # A guest's kernel sees its virtio-fs shares by tag: its mountinfo names no path of the
  # host (the adapter's state, cache, home, binaries), with and without network.
  echo "[lab] a guest's mountinfo on microVMs (escape.rs, SANDBOX_E2E_PLUGIN=libkrun)"
  for as_user in $more_users; do
    if [ -n "\$as_user" ] && ! id "\$as_user" >/dev/null 2>&1; then
      echo "[lab] a guest's mountinfo as the ordinary user DID NOT RUN: no user \$as_user"; continue
    fi
    pass "mountinfo on libkrun (\${as_user:-root})" env SANDBOX_E2E_PLUGIN=libkrun \
      \${as_user:+SANDBOX_E2E_ADAPTER_USER=\$as_user SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug} \
      /tmp/vm-lab/debug/deps/$(basename "$escape_bin") --exact a_sandbox_mountinfo_names_no_host_path \
      --test-threads=1 --nocapture
  done
fi
if [ "$suite" = more ] && [ "$mode" = test ] && [ "${LAB_FAMILY:-1}" != 1 ]; then
  echo "[lab] the family flow on libkrun DID NOT RUN: LAB_FAMILY is not 1"
elif [ "$suite" = more ] && [ "$mode" = test ]; then
  # iii's sandbox family through a router stand-in on microVMs: create, exec, list, fs,
  # snapshot and a create from it, branch, expose_port, stop; and the official Python SDK.
  echo "[lab] the sandbox family's flow on microVMs (family.rs, SANDBOX_E2E_PLUGIN=libkrun)"
  pysdk_dir=""
  [ "$pysdk_host" != 1 ] || pysdk_dir=/tmp/vm-lab/pysdk-host
  for as_user in $more_users; do
    if [ -n "\$as_user" ] && ! id "\$as_user" >/dev/null 2>&1; then
      echo "[lab] the family flow as the ordinary user DID NOT RUN: no user \$as_user"; continue
    fi
    pass "family on libkrun (\${as_user:-root})" env SANDBOX_E2E_PLUGIN=libkrun \
      \${pysdk_dir:+SANDBOX_E2E_PYSDK_DIR=\$pysdk_dir} \
      \${as_user:+SANDBOX_E2E_ADAPTER_USER=\$as_user SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug} \
      /tmp/vm-lab/debug/deps/$(basename "$family_bin") --test-threads=1 --nocapture ${LAB_FAMILY_TESTS:-}
  done
fi
# The "more" suite runs the network, bus, bus attack, expose, host address and family passes
# above only.
if [ "$suite" = ci ]; then
  if [ "$mode" = test ] && [ "${LAB_SNAPSHOTS:-1}" != 1 ]; then
    echo "[lab] snapshots on libkrun DID NOT RUN: LAB_SNAPSHOTS is not 1"
  elif [ "$mode" = test ]; then
    # One test at a time: the first boots four microVMs, the fork test four. As the ordinary
    # user (whose runner's files are all its own, copied from a user namespace of its own)
    # the snapshot's round trip and the guest's bait.
    echo "[lab] snapshots and fork of microVM sandboxes (snapshots.rs, SANDBOX_E2E_PLUGIN=libkrun)"
    pass "snapshots on libkrun (root)" env SANDBOX_E2E_PLUGIN=libkrun \
      /tmp/vm-lab/debug/deps/$(basename "$snapshots_bin") --test-threads=1 --nocapture
    if id iii-sandbox >/dev/null 2>&1; then
      chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
      pass "snapshots on libkrun (ordinary user)" env SANDBOX_E2E_PLUGIN=libkrun \
        SANDBOX_E2E_ADAPTER_USER=iii-sandbox SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug \
        /tmp/vm-lab/debug/deps/$(basename "$snapshots_bin") --test-threads=1 --nocapture \
        snapshots_keep_a_sandboxs_files a_guests_links_fifos
    fi
  fi
  if [ "$mode" = test ] && [ "${LAB_POSTURE:-1}" = 1 ]; then
    # Every host process of a microVM sandbox (with and without network) and a worker VM
    # against tests/e2e/posture/libkrun-{root,user}.toml; a drift prints the observed table.
    echo "[lab] the host processes' posture on libkrun (posture.rs), as root and as iii-sandbox"
    pass "posture on libkrun (root)" /tmp/vm-lab/debug/deps/$(basename "$posture_bin") \
      libkrun_host_processes_match_their_table --exact --nocapture
    if id iii-sandbox >/dev/null 2>&1; then
      chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
      pass "posture on libkrun (ordinary user)" env SANDBOX_E2E_ADAPTER_USER=iii-sandbox SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug \
        /tmp/vm-lab/debug/deps/$(basename "$posture_bin") libkrun_host_processes_match_their_table --exact --nocapture
    fi
  fi
  if [ "$mode" = test ] && [ "${LAB_AS_USER:-1}" != 1 ]; then
    echo "[lab] the ordinary-user libkrun run DID NOT RUN: LAB_AS_USER is not 1"
  elif [ "$mode" = test ] && id iii-sandbox >/dev/null 2>&1; then
    # How Compose runs the adapter: an ordinary user with /dev/kvm through its group. The
    # sandbox and worker VM tests (the escape and tuning ones ran as root above), and the
    # worker-VM rounds in a row (LIBKRUN_USER_WORKER_ROUNDS: 5 in CI, 20 in the soak job).
    echo "[lab] the libkrun e2e again, the adapter as the ordinary user iii-sandbox"
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    pass "libkrun e2e (ordinary user)" env SANDBOX_E2E_ADAPTER_USER=iii-sandbox SANDBOX_E2E_BIN_DIR=/tmp/vm-lab/debug \
      LIBKRUN_WORKER_ROUNDS=\$user_rounds \
      /tmp/vm-lab/debug/deps/$(basename "$test_bin") $test_args microvm_sandboxes worker_vm
  elif [ "$mode" = test ]; then
    echo "[lab] ordinary-user libkrun e2e DID NOT RUN: no user iii-sandbox (tests/e2e/ordinary-user.sh makes it)"
  fi
  if [ "$mode" = test ] && [ "${LAB_INSTALL:-1}" != 1 ]; then
    echo "[lab] the install test on libkrun DID NOT RUN: LAB_INSTALL is not 1"
  elif [ "$mode" = test ]; then
    echo "[lab] installed as Compose installs it, on libkrun by name"
    pass "install test" env SANDBOX_RELEASE_DIR=/tmp/vm-lab/release /tmp/vm-lab/debug/deps/$(basename "$install_bin") \
      installed_like_compose_it_boots_print_42_in_a_microvm --exact --nocapture
  fi
fi
# A VM runner killed by its seccomp filter (vm-runner: a system call libkrun made that its
# allowlist lacks) shows in the kernel's log with the call's number.
if dmesg 2>/dev/null | grep -q 'type=1326'; then
  echo "[lab] system calls the VM runner's seccomp filter refused (kernel log):"
  dmesg | grep 'type=1326' | grep -o 'comm="[^"]*".*syscall=[0-9]*' | sort | uniq -c | head -40
fi
finish
INNER

# mktemp made the scratch directory 0700 for root: the ordinary user must reach the binaries.
chmod 0755 "$scratch" && chmod -R a+rX "$scratch"
log "lab run ($mode): microVM sandboxes through the engine inside a QEMU guest with working KVM"
LAB_SCRATCH_DIR=$scratch LAB_TIMEOUT=${LAB_TIMEOUT:-3600} LAB_MEM=${LAB_MEM:-3072} \
  "$here/lab.sh" -- bash /tmp/vm-lab/inner.sh
