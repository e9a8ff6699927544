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
# no console line). A failed test whose own output shows either is run once more, by name
# (`--exact`, appended to COMMAND), saying so; the pass then fails only if a test fails again.
# The worker-VM rounds are never run again here: they run a reset round once more themselves.

lab_failed=""
lab_failed_logs=""
lab_passes=0

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
    END {exit found ? 0 : 1}' "$1"
}

pass() {
  local label=$1 out again=""
  shift
  lab_passes=$((lab_passes + 1))
  out=/tmp/vm-lab-pass-$lab_passes.log
  "$@" 2>&1 | tee "$out"
  [ "${PIPESTATUS[0]}" = 0 ] && return 0
  for name in $(lab_failed_tests "$out"); do
    case $name in *round_after_round*) again=""; break ;; esac
    if lab_reset_in "$out" "$name"; then again="$again $name"; else again=""; break; fi
  done
  if [ -n "$again" ]; then
    echo "[lab] $label: every failed test ended by the lab's guest reset (KVM_EXIT_SHUTDOWN) or silent hang, run once more:$again"
    lab_passes=$((lab_passes + 1))
    out=/tmp/vm-lab-pass-$lab_passes.log
    "$@" --exact $again 2>&1 | tee "$out"
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      echo "[lab] $label: passed when run again after the lab's guest reset:$again"
      return 0
    fi
  fi
  lab_failed="$lab_failed; $label"
  lab_failed_logs="$lab_failed_logs $out"
  echo "$label" > "$out.label"
}

finish() {
  [ -z "$lab_failed" ] && return 0
  for out in $lab_failed_logs; do
    echo "[lab] why $(cat "$out.label") failed (panic messages, each cut at 30 lines of 300 characters):"
    awk '/panicked at/ {p = 1; n = 0} p {print substr($0, 1, 300); n++}
      /^stack backtrace:|^note: / || n >= 30 {p = 0}' "$out"
  done
  echo "[lab] FAILED passes:${lab_failed#;}"
  exit 1
}
