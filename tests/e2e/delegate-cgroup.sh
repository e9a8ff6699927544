#!/usr/bin/env bash
# Gives USER a delegated cgroup where the host has one, as iii Compose's service manager
# would (systemd's Delegate=yes: a group of the service's own, owned by its user), and prints
# the group's directories, one a hierarchy, space-separated; prints nothing where the host
# has no cgroup to delegate (then an ordinary-user adapter runs without limits and says so).
#   cgroup v1: a group `iii-sandbox-e2e` beneath this script's own group in each of the
#              memory, cpu and pids hierarchies, its directory, cgroup.procs and tasks owned
#              by USER (v1 delegation is ownership: USER may make child groups there and
#              move its own processes into them; the group's own limits stay root's);
#   cgroup v2: `iii-sandbox-e2e` at the root with the memory, cpu and pids controllers, its
#              directory, cgroup.procs, cgroup.subtree_control and cgroup.threads owned by USER.
# The adapter is then started inside it (tests/e2e's harness, SANDBOX_E2E_ADAPTER_CGROUPS).
# Root only; idempotent.
set -euo pipefail
user=${1:?usage: delegate-cgroup.sh USER}
root=/sys/fs/cgroup
name=iii-sandbox-e2e
made=()
if [ -f "$root/cgroup.controllers" ]; then
  wanted=""
  for c in memory cpu pids; do
    grep -qw "$c" "$root/cgroup.controllers" && wanted="$wanted +$c"
  done
  if [ -n "$wanted" ] && echo "$wanted" > "$root/cgroup.subtree_control" 2>/dev/null; then
    if mkdir -p "$root/$name" \
      && chown "$user:" "$root/$name" "$root/$name"/cgroup.{procs,subtree_control,threads}; then
      made+=("$root/$name")
    fi
  fi
else
  for c in memory cpu pids; do
    [ -d "$root/$c" ] || continue
    # This script's own group in that hierarchy (`N:cpu,cpuacct:/path`).
    own=$(awk -F: -v c="$c" '{ n = split($2, cs, ","); for (i = 1; i <= n; i++) if (cs[i] == c) print $3 }' /proc/self/cgroup | head -n 1)
    dir="$root/$c${own%/}/$name"
    mkdir -p "$dir" 2>/dev/null || continue
    # The group and what moving processes needs, not its own limit files (as systemd does).
    chown "$user:" "$dir" "$dir/cgroup.procs" "$dir/tasks" || continue
    made+=("$dir")
  done
fi
[ ${#made[@]} -gt 0 ] || echo "delegate-cgroup.sh: no cgroup hierarchy to delegate on this host" >&2
echo "${made[*]:-}"
