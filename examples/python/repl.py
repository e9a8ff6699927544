"""A Python REPL in a sandbox, driven line by line through `stdin_stream`, with the official
Python iii-sdk.

Two engine channels: the read end of one is the program's stdin (`stdin_stream`; the caller
writes lines into it, and closing it ends the REPL), the write end of the other its output
(`stream`). Each line is sent only after the answer to the one before has come back, as a
notebook or an agent would. III_URL names the engine (default ws://127.0.0.1:49134).
"""

import asyncio
import base64
import json
import os

from iii import InitOptions, register_worker
from iii.helpers import create_channel

URL = os.environ.get("III_URL", "ws://127.0.0.1:49134")

# Each input, and the output it must produce before the next is sent.
SESSION = [
    ("x = 6 * 7", None),
    ("print(x)", "42"),
    ("words = ['sandbox', 'repl']", None),
    ("print(' '.join(w.upper() for w in words))", "SANDBOX REPL"),
]


async def main():
    iii = register_worker(URL, InitOptions(worker_name="repl-example"))
    stdin, output = create_channel(iii), create_channel(iii)
    sandbox = iii.trigger({"function_id": "sandbox-libkrun::create",
                           "payload": {"image": "python"}})["sandbox_id"]
    execution = asyncio.create_task(asyncio.to_thread(iii.trigger, {
        "function_id": "sandbox-libkrun::exec",
        "payload": {"sandbox_id": sandbox, "argv": ["python3", "-i", "-u", "-q"],
                    "timeout_ms": 60000, "stdin_stream": stdin.reader_ref.model_dump(),
                    "stream": output.writer_ref.model_dump()},
        "timeout_ms": 120000,
    }))
    lines = asyncio.Queue()

    async def read_output():
        # Two levels of lines: the channel carries JSON events one per line, and the program's
        # stdout arrives in chunks as it writes them (`print` may send "42" and "\n" apart).
        pending, text = b"", ""
        async for chunk in output.reader:
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                event = json.loads(line)
                if event.get("stream") == "stdout":
                    text += base64.b64decode(event["data_b64"]).decode()
                    while "\n" in text:
                        complete, text = text.split("\n", 1)
                        await lines.put(complete)

    reader = asyncio.create_task(read_output())
    for source, answer in SESSION:
        print(">>>", source)
        await stdin.writer.write((source + "\n").encode())
        if answer is not None:
            got = await asyncio.wait_for(lines.get(), 30)
            print(got)
    await stdin.writer.close_async()
    reply = await execution
    await reader
    print(f"the REPL ended with exit code {reply['exit_code']}")
    iii.trigger({"function_id": "sandbox-libkrun::stop", "payload": {"sandbox_id": sandbox}})
    iii.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
