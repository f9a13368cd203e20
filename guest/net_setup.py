"""Runs IN THE GUEST (python3, stdlib only): bring up the NIC on the platform's bridge.

Usage: ``python3 - < net_setup.py``. The platform passes the NIC's MAC and address
through QEMU's fw_cfg (``opt/cxlssd/bridge``: ``mac=M address=A/P``), like the
instance's SSH keys, so the guest image needs no change. The NIC is found by its
MAC (never by probe order), brought up and given the address (no default route:
that stays on the user-mode NIC). Prints one JSON line: interface, MAC, address.
"""

import json
import os
import subprocess
import sys
import time

FW_CFG = "/sys/firmware/qemu_fw_cfg/by_name/opt/cxlssd/bridge/raw"
NET = "/sys/class/net"
TIMEOUT_S = 60.0


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def interface_with(mac: str) -> str | None:
    for name in sorted(os.listdir(NET)):
        try:
            if read(f"{NET}/{name}/address").lower() == mac:
                return name
        except OSError:
            continue
    return None


def main() -> None:
    subprocess.run(["modprobe", "qemu_fw_cfg"], check=False)
    if not os.path.exists(FW_CFG):
        sys.exit("net_setup: no bridge NIC was passed to this guest (fw_cfg opt/cxlssd/bridge)")
    fields = {key: value for key, _, value in (item.partition("=") for item in read(FW_CFG).split())}
    mac, address = fields["mac"].lower(), fields["address"]
    deadline = time.monotonic() + TIMEOUT_S
    while (name := interface_with(mac)) is None:
        if time.monotonic() > deadline:
            sys.exit(f"net_setup: no network interface has MAC {mac}")
        time.sleep(0.2)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    subprocess.run(["ip", "addr", "replace", address, "dev", name], check=True)
    print(json.dumps({"interface": name, "mac": mac, "address": address}))


main()
