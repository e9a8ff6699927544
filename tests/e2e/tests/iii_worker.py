# A minimal iii worker in plain python3 (stdlib only: the guest images have nothing else),
# for the network tests: a WebSocket client of PROTOCOL.md that registers one function and
# answers its calls. Run inside a sandbox or a worker VM by tests/e2e/tests/network.rs.
#
#   iii_worker.py serve FUNCTION_ID ANSWER   register FUNCTION_ID on $III_URL and answer every
#                                            call with {"answer": ANSWER}; prints "registered"
#   iii_worker.py probe HOST PORT ...        one line per HOST PORT pair: "ok", "refused MS",
#                                            "unreachable MS", "timeout MS" or "error ..."
import base64
import errno
import json
import os
import socket
import struct
import sys
import time


def connect(host, port, timeout=5.0):
    return socket.create_connection((host, int(port)), timeout=timeout)


def ws_open(url):
    rest = url.split("://", 1)[-1]
    authority, _, path = rest.partition("/")
    host, _, port = authority.rpartition(":")
    sock = connect(host.strip("[]"), port or 49134)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /{path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("closed during the upgrade")
        head += chunk
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise ConnectionError(head.decode(errors="replace"))
    sock.settimeout(None)
    return sock


def ws_send(sock, message):
    data = json.dumps(message).encode()
    mask = os.urandom(4)
    header = bytes([0x81])
    if len(data) < 126:
        header += bytes([0x80 | len(data)])
    elif len(data) < 65536:
        header += bytes([0x80 | 126]) + struct.pack(">H", len(data))
    else:
        header += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def read_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def ws_recv(sock):
    while True:
        first, second = read_exact(sock, 2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack(">H", read_exact(sock, 2))[0]
        elif length == 127:
            length = struct.unpack(">Q", read_exact(sock, 8))[0]
        payload = read_exact(sock, length)
        opcode = first & 0x0F
        if opcode in (0x1, 0x2):
            return json.loads(payload)
        if opcode == 0x8:
            raise ConnectionError("closed by the engine")
        if opcode == 0x9:
            mask = os.urandom(4)
            sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask
                         + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def serve(function_id, answer):
    sock = ws_open(os.environ["III_URL"])
    ws_send(sock, {"type": "registerfunction", "id": function_id, "description": "test",
                   "request_format": {"type": "object"}, "response_format": {"type": "object"},
                   "metadata": {}})
    ws_send(sock, {"type": "invokefunction", "invocation_id": None,
                   "function_id": "engine::workers::register",
                   "data": {"name": os.environ.get("III_WORKER_NAME", function_id), "runtime": "python",
                            "version": "0", "os": "linux", "pid": os.getpid()}})
    print("registered", flush=True)
    while True:
        message = ws_recv(sock)
        if message.get("type") == "ping":
            ws_send(sock, {"type": "pong"})
        elif message.get("type") == "invokefunction" and message.get("invocation_id"):
            ws_send(sock, {"type": "invocationresult", "invocation_id": message["invocation_id"],
                           "function_id": message.get("function_id"), "result": {"answer": answer}})


def probe(pairs):
    for host, port in zip(pairs[::2], pairs[1::2]):
        start = time.monotonic()
        try:
            sock = connect(host, port)
            sock.settimeout(5)
            data = sock.recv(64).decode(errors="replace").strip()
            print(f"{host}:{port} ok {data}", flush=True)
            sock.close()
        except OSError as e:
            ms = int((time.monotonic() - start) * 1000)
            kind = {errno.ECONNREFUSED: "refused", errno.ENETUNREACH: "unreachable",
                    errno.EHOSTUNREACH: "unreachable"}.get(e.errno)
            if isinstance(e, socket.timeout) or e.errno == errno.ETIMEDOUT:
                kind = "timeout"
            print(f"{host}:{port} {kind or 'error'} {ms} {e}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        try:
            serve(sys.argv[2], sys.argv[3])
        except OSError as e:
            print(f"cannot reach the engine: {e}", flush=True)
            sys.exit(3)
    else:
        probe(sys.argv[2:])
