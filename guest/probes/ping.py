"""Runs IN THE GUEST as root (python3, stdlib only): ICMP echo to an address, like
``ping -c COUNT`` (the guest image has no ping binary).

Usage: ``python3 - ADDRESS [COUNT] < ping.py``. Prints one JSON line: sent, received,
and each reply's round trip in ms (emulator wall-clock under TCG, never a result).
Exits 1 when no reply came.
"""

import json
import os
import socket
import struct
import sys
import time

ECHO_REQUEST, ECHO_REPLY = 8, 0
TIMEOUT_S = 2.0


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo(sock: socket.socket, address: str, ident: int, seq: int) -> float | None:
    payload = struct.pack("!d", time.monotonic()) + b"cxlssd-ping" * 4
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident, seq)
    packet = struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + payload), ident, seq) + payload
    sent = time.monotonic()
    sock.sendto(packet, (address, 0))
    deadline = sent + TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data, (source, _) = sock.recvfrom(2048)
        except TimeoutError:
            return None
        ihl = (data[0] & 0x0F) * 4  # raw ICMP sockets deliver the IP header too
        kind, _, _, reply_ident, reply_seq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
        if source == address and kind == ECHO_REPLY and (reply_ident, reply_seq) == (ident, seq):
            return (time.monotonic() - sent) * 1000
    return None


def main() -> None:
    address = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ident = os.getpid() & 0xFFFF
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        rtts = [echo(sock, address, ident, seq) for seq in range(1, count + 1)]
    got = [round(rtt, 3) for rtt in rtts if rtt is not None]
    print(json.dumps({"address": address, "sent": count, "received": len(got), "rtt_ms": got}))
    sys.exit(0 if got else 1)


main()
