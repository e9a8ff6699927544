"""A caller of iii's sandbox family with the official Python iii-sdk, as an iii user writes one:
every call goes to the router's `sandbox::<leaf>` with `provider` set. It does a short flow and
prints one JSON object of what it saw; the Rust test (family.rs) judges it.

Usage: family_caller.py ENGINE_URL PROVIDER
"""

import base64
import json
import sys

from iii import InitOptions, register_worker

URL, PROVIDER = sys.argv[1], sys.argv[2]
BLOB = bytes(range(256)) * 3


def main():
    iii = register_worker(URL, InitOptions(worker_name="family-python-caller"))

    def call(leaf, payload):
        payload = dict(payload, provider=PROVIDER)
        return iii.trigger({"function_id": f"sandbox::{leaf}", "payload": payload,
                            "timeout_ms": 120000})

    def error_of(leaf, payload):
        try:
            return {"answered": call(leaf, payload)}
        except Exception as e:  # the SDK raises the router's error; its text is what we judge
            return {"error": str(e)}

    seen = {}
    created = call("create", {"image": "python"})
    sandbox = created["sandbox_id"]
    seen["create"] = created
    seen["exec"] = call("exec", {"sandbox_id": sandbox, "cmd": "sh",
                                 "args": ["-c", 'pwd; echo "$GREETING"'], "cwd": "/tmp",
                                 "env": {"GREETING": "from python"}})
    call("fs::write", {"sandbox_id": sandbox, "path": "/tmp/py.bin",
                       "bytes_base64": base64.b64encode(BLOB).decode(), "mode": 0o640})
    read = call("fs::read", {"sandbox_id": sandbox, "path": "/tmp/py.bin"})
    seen["read_back_equal"] = base64.b64decode(read["bytes_base64"]) == BLOB
    seen["read_mode"] = read.get("mode")
    seen["list"] = call("list", {})
    seen["stops"] = [call("stop", {"sandbox_id": sandbox}),
                     call("stop", {"sandbox_id": sandbox}),
                     call("stop", {"sandbox_id": "00000000-0000-4000-8000-000000000000"})]
    seen["exec_after_stop"] = error_of("exec", {"sandbox_id": sandbox, "cmd": "true"})
    iii.shutdown()
    print(json.dumps(seen, sort_keys=True))


if __name__ == "__main__":
    main()
