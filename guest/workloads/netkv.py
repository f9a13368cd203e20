"""netkv - a key-value store served over TCP from one guest, driven from another.

Runs IN THE GUEST (Python 3.13, standard library + cxlssd_guest). The network
workload of the multi-guest platform (docs/network.md): the server holds the
records in memory (bind it to the CXL node with numactl); the driver runs a YCSB
mix against it over the bridge, inside ROI 1, and checks every read returns the
version it last wrote.

    python3 -m netkv serve --port 7070 --records 5000
    python3 -m netkv drive --server 10.77.0.2 --port 7070 --records 5000 --ops 5000 --mix a --stop

Protocol: one line per request, ``GET key`` -> ``value``, ``SET key value`` ->
``OK``, ``QUIT`` -> the server's JSON report, then it exits. A value is
``version:padding`` (100 bytes). Each side prints one JSON line; exit status 1
if its self-check failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys

import cxlssd_guest

VALUE_BYTES = 100
MIXES = {"a": 0.5, "b": 0.05}  # update fraction (YCSB A and B)


def value(version: int) -> str:
    head = f"{version}:"
    return head + "x" * (VALUE_BYTES - len(head))


def serve(port: int, records: int) -> int:
    store = {f"user{k}": value(0) for k in range(records)}
    listener = socket.create_server(("0.0.0.0", port))
    print(json.dumps({"listening": port}), flush=True)
    connection, _ = listener.accept()
    requests = 0
    report: dict[str, object] = {}
    with connection, connection.makefile("rw") as stream:
        cxlssd_guest.roi_begin(1)
        for line in stream:
            verb, *args = line.split()
            requests += 1
            if verb == "GET":
                stream.write(store.get(args[0], "MISSING") + "\n")
            elif verb == "SET":
                store[args[0]] = args[1]
                stream.write("OK\n")
            else:
                cxlssd_guest.roi_end(1)
                report = {"workload": "netkv-serve", "requests": requests, "records": len(store),
                          "check_ok": len(store) == records}
                stream.write(json.dumps(report) + "\n")
                stream.flush()
                break
            stream.flush()
    print(json.dumps(report), flush=True)
    return 0 if report.get("check_ok") else 1


def drive(server: str, port: int, records: int, ops: int, mix: str, seed: int, stop: bool) -> int:
    rng = random.Random(seed)
    versions = [0] * records
    failures = reads = updates = 0
    connection = socket.create_connection((server, port), timeout=600)
    with connection, connection.makefile("rw") as stream:
        cxlssd_guest.roi_begin(1)
        for _ in range(ops):
            key = min(int(rng.paretovariate(1.2)) - 1, records - 1)  # skewed: a few hot keys
            if rng.random() < MIXES[mix]:
                versions[key] += 1
                stream.write(f"SET user{key} {value(versions[key])}\n")
                stream.flush()
                failures += stream.readline().strip() != "OK"
                updates += 1
            else:
                stream.write(f"GET user{key}\n")
                stream.flush()
                failures += int(stream.readline().split(":", 1)[0]) != versions[key]
                reads += 1
        cxlssd_guest.roi_end(1)
        server_report = None
        if stop:
            stream.write("QUIT\n")
            stream.flush()
            server_report = json.loads(stream.readline())
    report = {"workload": "netkv-drive", "params": {"mix": mix, "ops": ops, "records": records, "seed": seed},
              "reads": reads, "updates": updates, "failures": failures, "check_ok": failures == 0,
              "server": server_report}
    print(json.dumps(report), flush=True)
    return 0 if failures == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netkv", description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    s = modes.add_parser("serve")
    d = modes.add_parser("drive")
    for p in (s, d):
        p.add_argument("--port", type=int, default=7070)
        p.add_argument("--records", type=int, default=5000)
    d.add_argument("--server", required=True)
    d.add_argument("--ops", type=int, default=5000)
    d.add_argument("--mix", choices=sorted(MIXES), default="a")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--stop", action="store_true", help="stop the server afterwards (it prints its report)")
    args = parser.parse_args(argv)
    if args.records < 1 or not 0 < args.port < 65536 or (args.mode == "drive" and args.ops < 1):
        parser.error("--records and --ops must be positive, --port 1..65535")
    cxlssd_guest.load()
    if args.mode == "serve":
        return serve(args.port, args.records)
    return drive(args.server, args.port, args.records, args.ops, args.mix, args.seed, args.stop)


if __name__ == "__main__":
    sys.exit(main())
