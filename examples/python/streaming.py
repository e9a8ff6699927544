"""A long program whose output is printed as it streams, with the official Python iii-sdk.

The caller makes an engine channel and passes its write end as `stream` on `run`: the adapter
writes the program's output into it as newline-delimited JSON while the program runs
({"stream": "stdout", "data_b64": ...} per chunk, then {"exit": {...}}), and the call's reply
comes after the program ends. III_URL names the engine (default ws://127.0.0.1:49134).
"""

import asyncio
import base64
import json
import os
import time

from iii import InitOptions, register_worker
from iii.helpers import create_channel

URL = os.environ.get("III_URL", "ws://127.0.0.1:49134")

# A program that works for a while and reports as it goes.
PROGRAM = """
import time
for step in range(1, 6):
    print(f"step {step} of 5 done", flush=True)
    time.sleep(0.5)
"""


async def main():
    iii = register_worker(URL, InitOptions(worker_name="streaming-example"))
    channel = create_channel(iii)
    run = asyncio.create_task(asyncio.to_thread(iii.trigger, {
        "function_id": "sandbox-libkrun::run",
        "payload": {"image": "python", "lang": "python", "code": PROGRAM, "timeout_ms": 60000,
                    "stream": channel.writer_ref.model_dump()},
        "timeout_ms": 120000,
    }))
    first_line_at = None
    # Two levels of lines: the channel carries JSON events one per line, and the program's
    # stdout arrives in chunks as it writes them (a line may come in pieces).
    pending, text = b"", ""
    async for chunk in channel.reader:
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            event = json.loads(line)
            if "exit" in event:
                streamed_for = time.monotonic() - first_line_at
                print(f"exit code {event['exit']['exit_code']}; the first line came "
                      f"{'well before' if streamed_for > 1.0 else 'only at'} the end")
            elif event.get("stream") == "stdout":
                text += base64.b64decode(event["data_b64"]).decode()
                while "\n" in text:
                    complete, text = text.split("\n", 1)
                    first_line_at = first_line_at or time.monotonic()
                    print("streamed:", complete, flush=True)
    reply = await run
    print(f"reply: success {reply['success']}, {reply['stdout'].count(chr(10))} lines")
    iii.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
