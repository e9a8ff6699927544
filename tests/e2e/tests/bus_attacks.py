# Attacks on the host through the adapter's bus guard, run inside a sandbox by
# tests/e2e/tests/bus_guard_attacks.rs. Raw protocol frames (websockets, which the pysdk image
# has for the iii SDK), so every field is the attacker's choice. Each mode prints one JSON line
# with what the guest saw; the host side judges whether the attack worked.
#
#   bus_attacks.py names NAME
#       announces itself as NAME with a control or bidi character added, once per variant, each
#       on its own connection: {"variants": [{"name", "frames", "owner_ids", "closed"}]}
#   bus_attacks.py claim OWN_NAME TARGET_ID...
#       for each TARGET_ID, four times, each on a connection of its own (a guard that refuses
#       one ends that connection, and the next form must still be tried): announces itself as
#       OWN_NAME, then sends engine::workers::register with ARRAY data whose first element is
#       the TARGET_ID (the engine reads it as the worker to apply the announcement to): once
#       renaming the target, once naming it OWN_NAME (a conflict, which refuses the target's
#       connection), once with a namespace; and once as an object with a forged
#       _caller_worker_id: {"connected", "sent", "frames", "closed"}, "connected" counting the
#       connections the engine's side greeted with a worker id, "closed" those that ended
#   bus_attacks.py http URL VAR HOLD_SECS
#       registers guest::hook-bearer, -apikey and -hmac as HTTP-invoked functions at URL, with
#       credentials read from the engine's variable VAR, and guest::hook-plain without any,
#       calls each, then keeps the connection for HOLD_SECS so the host can call them too:
#       {"answers", "frames", "closed"}
#   bus_attacks.py schemas COUNT BYTES HOLD_SECS
#       announces itself, then registers COUNT functions guest::big-N, each with a request_format
#       of BYTES: {"sent", "refusals", "closed"}; then keeps the connection (and so whatever the
#       engine took of it) for HOLD_SECS
#   bus_attacks.py channels COUNT
#       COUNT fire-and-forget engine::channels::create: {"sent", "closed"}
#   bus_attacks.py churn SECS
#       for SECS, from 4 threads, connection after connection, each making 20 refused calls
#       and leaving: {"connections", "calls"}
#   bus_attacks.py namespace NS FUNCTION
#       calls FUNCTION in namespace NS, then announces itself in NS and registers guest::ns:
#       {"answer", "frames", "closed"}
import json
import os
import sys
import threading
import time
import uuid

from websockets.sync.client import connect

URL = os.environ["III_URL"]


def open_ws():
    ws = connect(URL, max_size=None, open_timeout=10)
    greeting = json.loads(ws.recv(timeout=10))
    return ws, greeting


def send(ws, message):
    ws.send(json.dumps(message))


def announce(ws, data):
    send(ws, {"type": "invokefunction", "invocation_id": None,
              "function_id": "engine::workers::register", "data": data,
              "action": {"type": "void"}})


def drain(ws, seconds, until=None):
    """Frames received for `seconds` (or until `until(frame)`), and whether the connection
    ended."""
    frames = []
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return frames, False
        try:
            frame = json.loads(ws.recv(timeout=left))
        except TimeoutError:
            return frames, False
        except Exception:
            return frames, True
        if frame.get("type") == "ping":
            send(ws, {"type": "pong"})
            continue
        frames.append(frame)
        if until and until(frame):
            return frames, False


def names(name):
    variants = [name + "\u0007", "\u001b" + name, name + "\u202e", " \u2066" + name + "\u2029"]
    seen = []
    for variant in variants:
        ws, _ = open_ws()
        announce(ws, {"name": variant, "runtime": "python", "version": "0", "os": "linux",
                      "pid": os.getpid()})
        frames, closed = drain(ws, 3)
        ws.close()
        seen.append({"name": repr(variant), "frames": frames, "closed": closed,
                     "owner_ids": [f.get("owner_worker_id") for f in frames
                                   if f.get("owner_worker_id")]})
    print(json.dumps({"variants": seen}), flush=True)


def claim(own_name, targets):
    frames = []
    connected = sent = closed = 0
    for n, target in enumerate(targets):
        for data in (
            [target, "python", "0", f"guest-renamed-{n}", None, "linux", None],
            [target, "python", "0", own_name, None, "linux", None],
            [target, "python", "0", f"guest-renamed-ns-{n}", None, "linux", None, 1, None,
             "guest-ns"],
            {"_caller_worker_id": target, "name": f"guest-forged-{n}", "runtime": "python"},
        ):
            ws, greeting = open_ws()
            if greeting.get("worker_id"):
                connected += 1
            announce(ws, {"name": own_name, "runtime": "python", "version": "0",
                          "os": "linux", "pid": os.getpid()})
            more, ended = drain(ws, 0.3)
            if not ended:
                try:
                    announce(ws, data)
                    sent += 1
                    more2, ended = drain(ws, 1)
                    more += more2
                except Exception:
                    ended = True
            frames += more
            closed += ended
            try:
                ws.close()
            except Exception:
                pass
    print(json.dumps({"connected": connected, "sent": sent, "frames": frames,
                      "closed": closed}), flush=True)


def http(url, var, hold):
    ws, _ = open_ws()
    auths = {
        "guest::hook-bearer": {"type": "bearer", "token_key": var},
        "guest::hook-apikey": {"type": "api_key", "header": "x-api-key", "value_key": var},
        "guest::hook-hmac": {"type": "hmac", "secret_key": var},
        "guest::hook-plain": None,
    }
    announce(ws, {"name": "guest-http", "runtime": "python", "version": "0", "os": "linux",
                  "pid": os.getpid()})
    for function_id, auth in auths.items():
        invocation = {"url": url, "method": "POST"}
        if auth:
            invocation["auth"] = auth
        send(ws, {"type": "registerfunction", "id": function_id, "description": "hook",
                  "invocation": invocation})
    frames, closed = drain(ws, 1)
    answers = {}
    for function_id in auths:
        if closed:
            break
        call = str(uuid.uuid4())
        try:
            send(ws, {"type": "invokefunction", "invocation_id": call,
                      "function_id": function_id, "data": {"from": "guest"}})
        except Exception:
            closed = True
            break
        more, closed = drain(ws, 10, lambda f: f.get("invocation_id") == call)
        frames += more
        answers[function_id] = [f for f in more if f.get("invocation_id") == call]
    print(json.dumps({"answers": answers, "frames": frames, "closed": closed}), flush=True)
    if not closed:
        drain(ws, hold)
    try:
        ws.close()
    except Exception:
        pass


def schemas(count, size, hold):
    ws, _ = open_ws()
    announce(ws, {"name": "guest-schemas", "runtime": "python", "version": "0", "os": "linux",
                  "pid": os.getpid()})
    schema = {"type": "object", "description": "x" * size}
    sent = 0
    closed = False
    for n in range(count):
        try:
            send(ws, {"type": "registerfunction", "id": f"guest::big-{n}",
                      "request_format": schema})
            sent += 1
        except Exception:
            closed = True
            break
    frames, ended = drain(ws, 5) if not closed else ([], True)
    refusals = [f for f in frames if f.get("type") == "registrationrejected" or f.get("error")]
    print(json.dumps({"sent": sent, "refusals": len(refusals), "closed": closed or ended}),
          flush=True)
    if not (closed or ended):
        drain(ws, hold)
    try:
        ws.close()
    except Exception:
        pass


def channels(count):
    ws, _ = open_ws()
    sent = 0
    closed = False
    for _ in range(count):
        try:
            send(ws, {"type": "invokefunction", "invocation_id": None,
                      "function_id": "engine::channels::create", "data": {"buffer_size": 1024},
                      "action": {"type": "void"}})
            sent += 1
        except Exception:
            closed = True
            break
    if not closed:
        _, closed = drain(ws, 2)
    print(json.dumps({"sent": sent, "closed": closed}), flush=True)
    try:
        ws.close()
    except Exception:
        pass


def churn(seconds):
    counts = {"connections": 0, "calls": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def run():
        while time.monotonic() < deadline:
            try:
                ws, _ = open_ws()
            except Exception:
                time.sleep(0.05)
                continue
            made = 0
            try:
                for n in range(20):
                    function_id = ["sandbox::run", "engine::functions::list",
                                   "configuration::get", "sandbox-libkrun::list"][n % 4]
                    send(ws, {"type": "invokefunction", "invocation_id": str(uuid.uuid4()),
                              "function_id": function_id, "data": {"n": n}})
                    made += 1
                ws.close()
            except Exception:
                pass
            with lock:
                counts["connections"] += 1
                counts["calls"] += made

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(counts), flush=True)


def namespace(ns, function_id):
    ws, _ = open_ws()
    call = str(uuid.uuid4())
    send(ws, {"type": "invokefunction", "invocation_id": call, "function_id": function_id,
              "namespace": ns, "data": {"from": "guest"}})
    frames, closed = drain(ws, 10, lambda f: f.get("invocation_id") == call)
    answer = [f for f in frames if f.get("invocation_id") == call]
    if not closed:
        try:
            announce(ws, {"name": "guest-ns", "runtime": "python", "version": "0",
                          "os": "linux", "pid": os.getpid(), "namespace": ns})
            send(ws, {"type": "registerfunction", "id": "guest::ns", "description": "ns"})
            more, closed = drain(ws, 2)
            frames += more
        except Exception:
            closed = True
    print(json.dumps({"answer": answer, "frames": frames, "closed": closed}), flush=True)
    try:
        ws.close()
    except Exception:
        pass


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "names":
        names(args[0])
    elif mode == "claim":
        claim(args[0], args[1:])
    elif mode == "http":
        http(args[0], args[1], float(args[2]))
    elif mode == "schemas":
        schemas(int(args[0]), int(args[1]), float(args[2]))
    elif mode == "channels":
        channels(int(args[0]))
    elif mode == "churn":
        churn(float(args[0]))
    elif mode == "namespace":
        namespace(args[0], args[1])
