# shellcheck shell=bash
# Sourced by the lab's inner script (libkrun-e2e.sh writes it): runs the lab's test passes,
# keeps going when one fails, and says at the end why each failed.
#
#   pass LABEL COMMAND...   runs a libtest binary's COMMAND; a failed pass is remembered
#   finish                  prints why each failed pass failed (last, where a CI log's
#                           tail shows it) and exits 1 if any failed
#
# The emulated lab resets an L2 guest now and then (libkrun logs `Received KVM_EXIT_SHUTDOWN`
# and the VM ends with no status from the guest; seen on bare runner boots with no code of
# ours too), or hangs silently: a boot whose runner entered the VM and then showed nothing at
# all until the agent's wait ran out (the S300's runner log ends at `entering the VM (...)`,
# no console line), or the same silence later: a microVM whose agent answered and then, mid-exec,
# answered nothing more until the client's wait ran out (S500 "agent did not answer request N
# in time"; the same tests, agent and core pass on bwrap in test.sh's host passes). A failed
# test whose own output shows one of these is run again, alone, by name (`--exact`, appended
# to COMMAND without the names it listed), saying so, up to LAB_RERUNS times (default 2: on a
# loaded 2-core host a test's rerun met a reset again, both of its boots), each after a pause
# of LAB_RERUN_PAUSE seconds (default 15: the resets come in bursts, both boots of one create
# a second apart, then none for minutes); the pass fails if a test fails otherwise, or is
# still cut by a reset after the last run.
# The worker-VM rounds are never run again here: they run a reset round again themselves.
#
# What each pass ended with is kept in the scratch share ($lab_state), which outlives the lab
# guest: when the whole lab guest resets (its L1 kernel under emulated nested SVM panics now and
# then) and lab.sh boots it again, the inner script runs again from the top, and every pass
# that had already ended (passed or failed) is not run again: its result stands, saying so.
# Only the pass the reset interrupted runs again, from its start.

lab_failed=""
lab_failed_logs=""
lab_reruns=${LAB_RERUNS:-2}
lab_rerun_pause=${LAB_RERUN_PAUSE:-15}
lab_state=/tmp/vm-lab/passes
mkdir -p "$lab_state"

# The names libtest lists under its last `failures:` heading.
lab_failed_tests() {
  awk '/^failures:$/ {names = ""; listing = 1; next}
    listing && /^    [A-Za-z0-9_:]+$/ {names = names " " $1; next}
    listing {listing = 0}
    END {print names}' "$1"
}

# Whether test $2's own section of log $1 shows the lab's guest reset: its captured stdout
# (`---- NAME stdout ----`), or, for a pass run with --nocapture (no such section), its panic
# message and what follows it up to its own result line (`test NAME ... FAILED`).
lab_reset_in() {
  awk -v name="$2" '$0 == "---- " name " stdout ----" {inside = 1; next}
    index($0, "thread '\''" name "'\'' (") == 1 && /panicked at/ {inside = 1; next}
    inside && (/^---- .* stdout ----$/ || /^failures:$/ || /^successes:$/ || index($0, "test " name " ... ") == 1) {inside = 0}
    inside && /Received KVM_EXIT_SHUTDOWN/ {found = 1}
    inside && /the agent did not connect within/ && /entering the VM \([0-9]+ vCPUs, [0-9]+ MiB\)\\",/ {found = 1}
    inside && /agent did not answer request [0-9]+ in time/ {found = 1}
    END {exit found ? 0 : 1}' "$1"
}

pass() {
  local label=$1 out again="" key
  shift
  key=$(printf '%s' "$label" | tr -c 'A-Za-z0-9' _)
  if [ -f "$lab_state/$key.passed" ]; then
    echo "[lab] $label: passed before the lab guest reset (its log: $(cat "$lab_state/$key.passed")), not run again"
    return 0
  fi
  if [ -f "$lab_state/$key.failed" ]; then
    echo "[lab] $label: failed before the lab guest reset, not run again (its result stands)"
    lab_failed="$lab_failed; $label"
    lab_failed_logs="$lab_failed_logs $(cat "$lab_state/$key.failed")"
    return 0
  fi
  out=$lab_state/$key.1.log
  local started=$SECONDS
  echo "[lab] $label: started at $(date +%T)"
  "$@" 2>&1 | tee "$out"
  local status=${PIPESTATUS[0]}
  echo "[lab] $label: ended (status $status) after $((SECONDS - started)) s"
  if [ "$status" = 0 ]; then echo "$out" > "$lab_state/$key.passed"; return 0; fi
  # Only the failed tests run again: a command that names its tests (the network passes:
  # `NAME... --exact`) loses the names the first run ran, which would otherwise all run again
  # beside the failed ones (each again exposed to a reset). libtest refuses `--exact` twice
  # ("Option 'exact' given more than once"): a command that has it already gets only the names.
  local ran arg exact=--exact
  ran=" $(awk '/^test [A-Za-z0-9_:]+ \.\.\. / {printf "%s ", $2}' "$lab_state/$key.1.log")"
  local rerun=() previous=""
  for arg in "$@"; do
    # A `--skip NAME` stays whole, whatever NAME is.
    if [ "$previous" != --skip ]; then
      case $ran in *" $arg "*) continue ;; esac
    fi
    [ "$arg" = --exact ] && exact=""
    rerun+=("$arg")
    previous=$arg
  done
  local run=1
  while [ "$run" -le "$lab_reruns" ]; do
    again=""
    for name in $(lab_failed_tests "$out"); do
      case $name in *round_after_round*) again=""; break ;; esac
      if lab_reset_in "$out" "$name"; then again="$again $name"; else again=""; break; fi
    done
    [ -n "$again" ] || break
    run=$((run + 1))
    echo "[lab] $label: every failed test ended by the lab's guest reset (KVM_EXIT_SHUTDOWN) or silent hang, run again in ${lab_rerun_pause} s (run $run of at most $((lab_reruns + 1))):$again"
    sleep "$lab_rerun_pause"
    out=$lab_state/$key.$run.log
    # shellcheck disable=SC2086 # $exact and $again are lists of words
    "${rerun[@]}" $exact $again 2>&1 | tee "$out"
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      echo "[lab] $label: passed when run again after the lab's guest reset:$again"
      echo "$out" > "$lab_state/$key.passed"
      return 0
    fi
  done
  lab_failed="$lab_failed; $label"
  lab_failed_logs="$lab_failed_logs $out"
  echo "$label" > "$out.label"
  echo "$out" > "$lab_state/$key.failed"
}

finish() {
  [ -z "$lab_failed" ] && return 0
  for out in $lab_failed_logs; do
    echo "[lab] why $(cat "$out.label") failed (panic messages, each cut at 30 lines of 300 characters):"
    awk '/panicked at/ {p = 1; n = 0} /^stack backtrace:|^note: |^ +[0-9]+: / {p = 0}
      p {print substr($0, 1, 300); n++} n >= 30 {p = 0}' "$out"
  done
  echo "[lab] FAILED passes:${lab_failed#;}"
  exit 1
}
