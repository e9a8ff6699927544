#!/bin/bash
# Checks lab-passes.sh's rules on a stand-in for a libtest binary, in a second, on the host:
# the lab itself takes half an hour, and its rules only show when a guest resets there.
#   - a test that ended in the lab's reset, or with its microVM silent mid-exec, runs again
#     alone, however the pass named its tests, up to twice;
#   - a `--skip NAME` of the pass stays whole in those runs;
#   - a failure that is not the lab's reset, a reset after the last run, or a failure of
#     another kind in a later run, fails the pass;
#   - a pass that ended is not run again when the inner script starts over after a reset.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The stand-in: runs the tests its arguments name (words that are not options nor the value
# of --skip), each "ok" unless its name is in $scratch/reset or $scratch/hang (it then fails,
# its panic showing the lab's reset or a microVM gone silent mid-exec, and one line naming it
# is taken off the list: a name listed twice fails twice) or in $scratch/broken (fails every
# time, with neither). Each call's arguments are appended to $scratch/calls.
cat > "$scratch/libtest" <<'EOF'
#!/bin/bash
scratch=$(dirname "$0")
echo "$*" >> "$scratch/calls"
names=() skip=""
for arg in "$@"; do
  if [ "$skip" = 1 ]; then skip=""; continue; fi
  case $arg in --skip) skip=1 ;; --*) ;; *) names+=("$arg") ;; esac
done
# listed NAME LIST: whether NAME is in LIST; a list of failures that happen once a line
# (reset, hang) loses one line naming NAME as it answers.
listed() {
  grep -qx "$1" "$scratch/$2" 2>/dev/null || return 1
  case $2 in
    broken) ;;
    *) awk -v name="$1" '!gone && $0 == name {gone = 1; next} {print}' "$scratch/$2" > "$scratch/$2.new"
       mv "$scratch/$2.new" "$scratch/$2" ;;
  esac
}
failed=()
for name in "${names[@]}"; do
  if listed "$name" reset; then
    panic="runner log tail: [...] Received KVM_EXIT_SHUTDOWN signal"
  elif listed "$name" hang; then
    panic='exec {...}: RemoteError { code: "S500", message: "internal error: agent did not answer request 1 in time" }'
  elif listed "$name" broken; then
    panic="assertion failed"
  else
    echo "test $name ... ok"
    continue
  fi
  echo "thread '$name' (7) panicked at tests/e2e/tests/x.rs:1:1:"
  echo "$panic"
  echo "test $name ... FAILED"
  failed+=("$name")
done
[ ${#failed[@]} = 0 ] && exit 0
echo
echo "failures:"
printf '    %s\n' "${failed[@]}"
echo
exit 101
EOF
chmod +x "$scratch/libtest"

checks=0
fail() { echo "lab-passes-check: FAILED: $*"; echo "calls:"; cat "$scratch/calls"; exit 1; }
expect_calls() {
  local want
  want=$(printf '%s\n' "$@")
  [ "$(cat "$scratch/calls")" = "$want" ] || fail "the calls were not: $want"
  checks=$((checks + 1))
}

# Each case in a subshell of its own, as the lab's inner script: `finish` exits.
run_case() {
  rm -rf "$scratch/calls" "$scratch/state" "$scratch/reset" "$scratch/hang" "$scratch/broken"
  touch "$scratch/calls" "$scratch/reset" "$scratch/hang" "$scratch/broken"
  mkdir -p "$scratch/state"
}
lab() {
  (
    # shellcheck source=tests/vm-lab/lab-passes.sh
    . "$here/lab-passes.sh"
    lab_state=$scratch/state
    lab_rerun_pause=0
    "$@"
    finish
  ) > "$scratch/out" 2>&1
}

# A pass naming its tests (as the network passes do): only the reset one runs again.
run_case
echo b > "$scratch/reset"
lab pass "named" env X=1 "$scratch/libtest" a b c --exact --nocapture || fail "named: the pass failed"
expect_calls "a b c --exact --nocapture" "--exact --nocapture b"

# A pass filtering by substring, with a --skip: the skip stays, the one test runs exactly.
run_case
echo b > "$scratch/reset"
lab pass "filtered" "$scratch/libtest" a b --skip a || fail "filtered: the pass failed"
expect_calls "a b --skip a" "--skip a --exact b"

# A microVM gone silent mid-exec (S500, its agent's answer never came): run again alone too.
run_case
echo c > "$scratch/hang"
lab pass "silent" "$scratch/libtest" a b c --exact --nocapture || fail "silent: the pass failed"
expect_calls "a b c --exact --nocapture" "--exact --nocapture c"

# A failure that is not a reset fails the pass, and is not run again.
run_case
echo b > "$scratch/broken"
if lab pass "broken" "$scratch/libtest" a b c --exact; then fail "broken: the pass succeeded"; fi
expect_calls "a b c --exact"
grep -q "FAILED passes: broken" "$scratch/out" || fail "broken: finish did not name the pass"

# A reset, then a failure in the second run: the pass fails.
run_case
echo b > "$scratch/reset"
echo b > "$scratch/broken"
if lab pass "twice" "$scratch/libtest" a b --exact; then fail "twice: the pass succeeded"; fi
expect_calls "a b --exact" "--exact b"

# Cut by a reset in its first two runs (the rerun's boots met it again): a third run passes.
run_case
printf 'b\nb\n' > "$scratch/reset"
lab pass "reset twice" "$scratch/libtest" a b c --exact || fail "reset twice: the pass failed"
expect_calls "a b c --exact" "--exact b" "--exact b"
grep -q "run 3 of at most 3" "$scratch/out" || fail "reset twice: the third run not said"

# Cut by a reset in all three runs: the pass fails, and no fourth run starts.
run_case
printf 'b\nb\nb\n' > "$scratch/reset"
if lab pass "reset thrice" "$scratch/libtest" a b --exact; then fail "reset thrice: the pass succeeded"; fi
expect_calls "a b --exact" "--exact b" "--exact b"
grep -q "FAILED passes: reset thrice" "$scratch/out" || fail "reset thrice: finish did not name the pass"

# The inner script run again after a lab reset: the pass that ended is not run again.
run_case
lab pass "kept" "$scratch/libtest" a || fail "kept: the pass failed"
lab pass "kept" "$scratch/libtest" a || fail "kept: the second start failed"
expect_calls "a"
grep -q "passed before the lab guest reset" "$scratch/out" || fail "kept: not said"

echo "lab-passes-check: $checks checks passed"
