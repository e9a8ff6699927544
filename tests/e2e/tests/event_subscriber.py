"""A subscriber of the adapter's lifecycle events with the official Python iii-sdk, as an iii
user writes one: a function bound to the trigger type with `register_trigger`. Each event it
receives is appended to OUT as one JSON line {received_at, event}; the Rust test (events.rs)
judges them.

Usage: event_subscriber.py ENGINE_URL TRIGGER_TYPE OUT NAME [CONFIG_JSON] [SLEEP_SECONDS]

Prints "subscribed" once the binding is sent, then runs until its stdin closes.
"""

import asyncio
import json
import sys
import time

from iii import InitOptions, register_worker

URL, TRIGGER_TYPE, OUT, NAME = sys.argv[1:5]
CONFIG = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
SLEEP = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0


def main():
    iii = register_worker(URL, InitOptions(worker_name=f"event-subscriber-{NAME}"))
    out = open(OUT, "a", buffering=1)

    async def on_event(event):
        received_at = time.time()
        event = {k: v for k, v in event.items() if k != "_caller_worker_id"}
        out.write(json.dumps({"received_at": received_at, "event": event}) + "\n")
        if SLEEP:
            await asyncio.sleep(SLEEP)
        return {}

    function_id = f"event-subscriber::{NAME}"
    iii.register_function(function_id, on_event)
    iii.register_trigger({"type": TRIGGER_TYPE, "function_id": function_id, "config": CONFIG})
    print("subscribed", flush=True)
    sys.stdin.read()
    iii.shutdown()


if __name__ == "__main__":
    main()
