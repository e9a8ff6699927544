"""A code-interpreter loop on sandbox-libkrun, with the official Python iii-sdk.

Creates a sandbox, writes a data file into it, runs generated code against that file, reads
the result file the code wrote, and stops the sandbox. The engine's address comes from
III_URL (default ws://127.0.0.1:49134); the adapter serves sandbox-libkrun::*.
"""

import json
import os

from iii import InitOptions, register_worker

URL = os.environ.get("III_URL", "ws://127.0.0.1:49134")

# What a model would generate: read the data, compute, write a result file, print a summary.
GENERATED = """
import csv, json
rows = list(csv.DictReader(open("/work/sales.csv")))
total = sum(int(r["units"]) * float(r["price"]) for r in rows)
best = max(rows, key=lambda r: int(r["units"]))["item"]
json.dump({"rows": len(rows), "revenue": round(total, 2), "best_seller": best},
          open("/work/result.json", "w"), sort_keys=True)
print(f"analysed {len(rows)} rows")
"""

DATA = "item,units,price\napple,30,0.5\npear,12,0.75\nplum,45,0.2\n"


def main():
    iii = register_worker(URL, InitOptions(worker_name="code-interpreter-example"))

    def call(function, payload):
        return iii.trigger(
            {"function_id": f"sandbox-libkrun::{function}", "payload": payload, "timeout_ms": 120000}
        )

    sandbox = call("create", {"image": "python"})["sandbox_id"]
    print("created a python sandbox")
    try:
        call("fs::write", {"sandbox_id": sandbox, "path": "/work/sales.csv", "content": DATA,
                           "parents": True})
        call("fs::write", {"sandbox_id": sandbox, "path": "/work/job.py", "content": GENERATED})
        ran = call("exec", {"sandbox_id": sandbox, "argv": ["python3", "/work/job.py"],
                            "timeout_ms": 60000})
        print(f"exit code {ran['exit_code']}, stdout: {ran['stdout'].strip()}")
        result = call("fs::read", {"sandbox_id": sandbox, "path": "/work/result.json"})
        print("result:", json.dumps(json.loads(result["body"]), sort_keys=True))
    finally:
        call("stop", {"sandbox_id": sandbox})
        print("stopped")
        iii.shutdown()


if __name__ == "__main__":
    main()
