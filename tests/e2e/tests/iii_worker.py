# A minimal iii worker in plain python3 (stdlib only: the guest images have nothing else),
# for the network tests: a WebSocket client of PROTOCOL.md that registers one function and
# answers its calls. Run inside a sandbox or a worker VM by tests/e2e/tests/network.rs.
#
#   iii_worker.py serve FUNCTION_ID ANSWER   register FUNCTION_ID on $III_URL and answer every
#                                            call with {"answer": ANSWER}; prints "registered"
#   iii_worker.py probe HOST PORT ...        one line per HOST PORT pair: "ok", "refused MS",
#                                            "unreachable MS", "timeout MS" or "error ..."; a
#                                            HOST name is resolved (IPv4) before the clock starts
#   iii_worker.py resolve NAME ...           one line per NAME through the system resolver
#                                            (getaddrinfo, IPv4): "NAME ok IP,IP" or
#                                            "NAME error ..."; a failure is retried for 10 s
#   iii_worker.py ask SERVER NAME udp|tcp    one DNS question for NAME's A records sent to
#                                            SERVER port 53 itself: "ask ok IP,IP" or
#                                            "ask error ..."
#   iii_worker.py flood SERVER COUNT         COUNT malformed or hostile messages to SERVER
#                                            port 53 over udp, and a few over tcp
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
        # A name is resolved first, apart: MS is the connection's time alone.
        resolved = ""
        address = host
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        except OSError:
            start = time.monotonic()
            try:
                address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
            except OSError as e:
                print(f"{host}:{port} error resolving {e}", flush=True)
                continue
            resolved = f" (resolved in {int((time.monotonic() - start) * 1000)} ms)"
        start = time.monotonic()
        try:
            sock = connect(address, port)
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
            print(f"{host}:{port} {kind or 'error'} {ms} {e}{resolved}", flush=True)


def resolve(names):
    for name in names:
        deadline = time.monotonic() + 10
        while True:
            try:
                infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
                ips = sorted({info[4][0] for info in infos})
                print(f"{name} ok {','.join(ips)}", flush=True)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"{name} error {e}", flush=True)
                    break
                time.sleep(0.2)


def dns_question(name, ident):
    labels = b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split("."))
    return struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", 1, 1)


def dns_addresses(reply):
    ancount = struct.unpack(">H", reply[6:8])[0]
    offset = 12
    while reply[offset] != 0:
        offset += reply[offset] + 1
    offset += 5
    ips = []
    for _ in range(ancount):
        if reply[offset] & 0xC0 == 0xC0:
            offset += 2
        else:
            while reply[offset] != 0:
                offset += reply[offset] + 1
            offset += 1
        rtype, _, _, length = struct.unpack(">HHIH", reply[offset:offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            ips.append(socket.inet_ntoa(reply[offset:offset + 4]))
        offset += length
    return ips


def ask(server, name, proto):
    query = dns_question(name, 0x1234)
    try:
        if proto == "tcp":
            sock = socket.create_connection((server, 53), timeout=5)
            sock.sendall(struct.pack(">H", len(query)) + query)
            length = struct.unpack(">H", read_exact(sock, 2))[0]
            reply = read_exact(sock, length)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.settimeout(5)
            sock.sendto(query, (server, 53))
            reply, _ = sock.recvfrom(65535)
        print(f"ask ok {','.join(dns_addresses(reply))}", flush=True)
    except (OSError, ConnectionError, IndexError, struct.error) as e:
        print(f"ask error {e!r}", flush=True)


def flood(server, count):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    valid = dns_question("public.test", 7)
    crafted = [
        b"",
        b"\0" * 5,
        valid[:12],
        struct.pack(">HHHHHH", 1, 0x0100, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF),
        valid[:12] + b"\xc0\x0c\0\1\0\1",
        valid[:12] + b"\x3fab",
        struct.pack(">H", 9) + b"\x81\x80" + valid[4:],
        valid[:2] + b"\x28\0" + valid[4:],
        valid + b"\0" * 5000,
        os.urandom(4096),
    ]
    sent = 0
    for i in range(count):
        message = crafted[i % len(crafted)] if i % 2 else os.urandom(i % 700)
        try:
            udp.sendto(message, (server, 53))
            sent += 1
        except OSError:
            pass
    for garbage in [b"\0\0", b"\xff\xff" + os.urandom(100), b"\0\x20" + os.urandom(32), b"\0"]:
        try:
            sock = socket.create_connection((server, 53), timeout=2)
            sock.sendall(garbage)
            sock.close()
        except OSError:
            pass
    print(f"flooded {sent}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        try:
            serve(sys.argv[2], sys.argv[3])
        except OSError as e:
            print(f"cannot reach the engine: {e}", flush=True)
            sys.exit(3)
    elif sys.argv[1] == "resolve":
        resolve(sys.argv[2:])
    elif sys.argv[1] == "ask":
        ask(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "flood":
        flood(sys.argv[2], int(sys.argv[3]))
    else:
        probe(sys.argv[2:])
