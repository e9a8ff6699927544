# A tiny authoritative DNS server for tests/e2e/tests/network.rs, in plain python3 sockets:
# the sandboxes' resolver proxy is pointed at it through `network_dns`.
#
#   dns_server.py NAME=IPV4 ...   serves udp and tcp on 127.0.0.1 (one port for both), prints
#                                 "port N" once it listens; A queries for a NAME get its
#                                 address (TTL 60), other types of a known name an empty
#                                 answer, unknown names NXDOMAIN; each question it answers is
#                                 printed as "asked NAME TYPE"
import socket
import struct
import sys
import threading

RECORDS = {}
for pair in sys.argv[1:]:
    name, _, ip = pair.partition("=")
    RECORDS[name.lower().rstrip(".")] = socket.inet_aton(ip)


def read_name(data, offset):
    labels = []
    while True:
        length = data[offset]
        offset += 1
        if length == 0:
            return ".".join(labels), offset
        labels.append(data[offset:offset + length].decode("ascii", "replace"))
        offset += length


def answer(query):
    ident, flags, qdcount = struct.unpack(">HHH", query[:6])
    if qdcount != 1:
        return None
    name, end = read_name(query, 12)
    qtype, qclass = struct.unpack(">HH", query[end:end + 4])
    question = query[12:end + 4]
    print(f"asked {name.lower()} {qtype}", flush=True)
    ip = RECORDS.get(name.lower())
    answers = b""
    rcode = 0
    if ip is None:
        rcode = 3
    elif qtype == 1:
        # A pointer to the question's name, type A, class IN, TTL 60, four bytes.
        answers = struct.pack(">HHHIH", 0xC00C, 1, 1, 60, 4) + ip
    reply_flags = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | rcode
    header = struct.pack(">HHHHHH", ident, reply_flags, 1, 1 if answers else 0, 0, 0)
    return header + question + answers


def serve_udp(sock):
    while True:
        query, peer = sock.recvfrom(4096)
        try:
            reply = answer(query)
        except (IndexError, struct.error):
            continue
        if reply:
            sock.sendto(reply, peer)


def serve_tcp(conn):
    with conn:
        while True:
            head = conn.recv(2)
            if len(head) < 2:
                return
            (length,) = struct.unpack(">H", head)
            query = b""
            while len(query) < length:
                chunk = conn.recv(length - len(query))
                if not chunk:
                    return
                query += chunk
            try:
                reply = answer(query)
            except (IndexError, struct.error):
                return
            if reply:
                conn.sendall(struct.pack(">H", len(reply)) + reply)


tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
port = tcp.getsockname()[1]
tcp.listen(16)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", port))
threading.Thread(target=serve_udp, args=(udp,), daemon=True).start()
print(f"port {port}", flush=True)
while True:
    conn, _ = tcp.accept()
    threading.Thread(target=serve_tcp, args=(conn,), daemon=True).start()
