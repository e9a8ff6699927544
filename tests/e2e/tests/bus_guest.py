# A guest program of the bus tests (tests/e2e/tests/bus_guard.rs), as the code runner's users
# write them: the official Python iii-sdk, III_URL from the sandbox's environment.
#
#   bus_guest.py serve [register:ID | CALL_ID]...
#       registers guest::hello and guest::stop (and each register:ID), then calls each
#       CALL_ID once ({"sandbox_id": $OTHER_SANDBOX} as its payload) and prints one JSON line
#       {CALL_ID: {"ok": answer} | {"code", "message"}, "ms"}; then "serving", and serves
#       until guest::stop is called (GUEST_SERVE_SECS from the environment at most, else 60)
#   bus_guest.py announce NAME
#       connects as worker NAME; prints "refused CODE" when the connection is refused, else
#       "accepted"
#   bus_guest.py flood COUNT
#       COUNT calls of sandbox::run on one connection (the refusals read by a thread), then
#       oversized frames, garbage and broken upgrades; prints "flood answered N"
import json
import os
import socket
import sys
import threading
import time
import uuid

URL = os.environ["III_URL"]


def serve(args):
    from iii import InitOptions, register_worker

    done = threading.Event()
    worker = register_worker(URL, InitOptions(worker_name="code-runner-guest"))

    def hello(data):
        return {"hello": data.get("name"), "from": "guest"}

    def stop(data):
        done.set()
        return {"stopping": True}

    worker.register_function("guest::hello", hello)
    worker.register_function("guest::stop", stop)
    for arg in args:
        if arg.startswith("register:"):
            worker.register_function(arg[len("register:"):], hello)
    results = {}
    payload = {"sandbox_id": os.environ.get("OTHER_SANDBOX", ""), "marker": "guest-payload-marker"}
    for function_id in args:
        if function_id.startswith("register:"):
            continue
        started = time.monotonic()
        try:
            answer = worker.trigger(
                {"function_id": function_id, "payload": payload, "timeout_ms": 10000}
            )
            result = {"ok": answer}
        except Exception as e:  # the SDK's InvocationError, or anything else, reported
            result = {"code": getattr(e, "code", type(e).__name__), "message": str(e)}
        result["ms"] = int((time.monotonic() - started) * 1000)
        results[function_id] = result
    print(json.dumps(results), flush=True)
    print("serving", flush=True)
    done.wait(float(os.environ.get("GUEST_SERVE_SECS", "60")))
    worker.shutdown()


def announce(name):
    from iii import InitOptions, register_worker

    try:
        worker = register_worker(URL, InitOptions(worker_name=name))
    except Exception as e:
        print("refused", getattr(e, "code", type(e).__name__), flush=True)
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if worker.get_connection_state() == "failed":
            error = getattr(worker, "_fatal_error", None)
            print("refused", getattr(error, "code", "unknown"), flush=True)
            worker.shutdown()
            return
        time.sleep(0.05)
    print("accepted", flush=True)
    worker.shutdown()


def flood(count):
    from websockets.sync.client import connect

    answered = 0
    with connect(URL, max_size=None, open_timeout=10) as ws:
        ws.recv(timeout=10)  # the greeting

        def read():
            nonlocal answered
            try:
                while answered < count:
                    message = json.loads(ws.recv(timeout=30))
                    if message.get("type") == "invocationresult":
                        answered += 1
            except Exception:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        for _ in range(count):
            ws.send(json.dumps({"type": "invokefunction", "invocation_id": str(uuid.uuid4()),
                                "function_id": "sandbox::run", "data": {"code": "x"}}))
        reader.join()
    for attempt in range(20):
        try:
            with connect(URL, max_size=None, open_timeout=10) as ws:
                if attempt % 2:
                    ws.send(b"\x00" * (17 << 20))  # above the guard's bound
                else:
                    ws.send("{garbage " * 1000)
                try:
                    while True:
                        ws.recv(timeout=10)
                except Exception:
                    pass
        except Exception:
            pass
        host, port = URL.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                raw.sendall(b"\xde\xad\xbe\xef" * 4096)
                raw.recv(1)
        except OSError:
            pass
    print("flood answered", answered, flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "serve":
        serve(sys.argv[2:])
    elif mode == "announce":
        announce(sys.argv[2])
    elif mode == "flood":
        flood(int(sys.argv[2]))
