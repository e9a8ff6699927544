#!/usr/bin/env bash
# The worker::* calls iii Compose makes for examples/compose's `hello` worker, one after the
# other: prepare the VM on the worker's directory, start its program, wait for it to end, read
# its log, destroy it. Needs `trigger` (or $TRIGGER), III_URL, and the token the adapter was
# started with in III_SANDBOX_WORKER_TOKEN; the adapter's III_COMPOSE_DIR is this directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trigger=${TRIGGER:-trigger}
auth=${III_SANDBOX_WORKER_TOKEN:?set it to the token the adapter was started with}
call() { "$trigger" "sandbox-libkrun::worker::$1" "$2"; }
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get(sys.argv[1]))' "$1"; }
body() { python3 -c 'import json,sys; d={"auth":sys.argv[1],"vm_id":"hello"}; d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$auth" "$1"; }

echo "prepare: $(call prepare "$(body "{\"image\":\"python\",\"host_path\":\"$here/hello\"}")" | field state)"
echo "start: $(call start "$(body '{"command":["python3","main.py"]}')" | field state)"
for _ in $(seq 1 600); do
  status=$(call status "$(body '{}')")
  state=$(field state <<<"$status")
  [ "$state" = running ] || [ "$state" = prepared ] || break
  sleep 0.1
done
echo "status: $state, exit code $(field exit_code <<<"$status")"
echo "logs: $(call logs "$(body '{}')" | field content | tr -d '\n')"
echo "destroy: $(call destroy "$(body '{}')" | field destroyed)"
