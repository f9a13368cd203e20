"""Runs IN THE GUEST (python3, stdlib only): bring the CXL devices up as NUMA nodes.

Usage: ``python3 - EXPECTED_DEVICES < cxl_setup.py``. Loads the CXL/DAX
modules, waits for the memdevs, creates one RAM region per memdev on the root
decoder whose window targets the memdev's host bridge (``cxl create-region``,
ndctl 81), and onlines the new memory ZONE_MOVABLE (the kernel boots with
``memhp_default_state=offline``), so only workload pages land on the device.
Turns transparent huge pages off: the device model and its page promotion work
on 4 KiB pages, and move_pages(2) on a huge page would move 512 of them at once.
Turns address-space randomization off: a program then faults its pages in the same
order in every run, so with the node's free memory reset (reset_placement.py) it gets
the same physical pages (docs/live.md, "Placement").
Also onlines the platform's movable DRAM node (a pc-dimm, node 1 when configured:
hotplugged memory, offline until then) ZONE_MOVABLE.
Prints one JSON line: ``devices``, a list with memdev, host bridge bus number, region,
HPA base, DPA base, size and NUMA node of each; ``dram_node``, the movable DRAM node
(the node without CPUs that has memory and is no device's), or null.
"""

import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CXL = "/sys/bus/cxl/devices"
MODULES = ("cxl_acpi", "cxl_pci", "cxl_mem", "dax_cxl", "device_dax", "kmem")
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
ASLR = "/proc/sys/kernel/randomize_va_space"


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"cxl_setup: timed out waiting for {what}")
        time.sleep(0.2)


def endpoint_of(memdev: str) -> str | None:
    for endpoint in glob.glob(f"{CXL}/endpoint*"):
        if os.path.basename(os.path.realpath(f"{endpoint}/uport")) == memdev:
            return endpoint
    return None


def host_bridge_of(endpoint: str) -> str:
    """The host bridge device (e.g. /sys/devices/pci0000:0c) above an endpoint port."""
    port = os.path.dirname(os.path.realpath(endpoint))
    return os.path.realpath(f"{port}/uport")


def root_decoder_for(host_bridge: str) -> str:
    for dport in glob.glob(f"{CXL}/root0/dport*"):
        if os.path.realpath(dport) == host_bridge:
            dport_id = dport.rsplit("dport", 1)[1]
            for decoder in sorted(glob.glob(f"{CXL}/root0/decoder0.*")):
                if dport_id in read(f"{decoder}/target_list").split(","):
                    return os.path.basename(decoder)
    sys.exit(f"cxl_setup: no root decoder targets host bridge {host_bridge}")


def memdevs_ready(expected: int) -> bool:
    memdevs = glob.glob(f"{CXL}/mem*")
    return len(memdevs) >= expected and all(endpoint_of(os.path.basename(m)) for m in memdevs)


def node_blocks(node: int) -> int:
    return len(glob.glob(f"/sys/devices/system/node/node{node}/memory[0-9]*"))


def has_cpus(node: int) -> bool:
    return read(f"/sys/devices/system/node/node{node}/cpulist") != ""


def block_number(path: str) -> int:
    return int(path.split("/memory")[-1].split("/")[0])


def main() -> None:
    expected = int(sys.argv[1])
    if os.path.exists(THP):
        with open(THP, "w") as f:
            f.write("never")
    with open(ASLR, "w") as f:
        f.write("0")
    subprocess.run(["modprobe", "-a", *MODULES], check=True)
    wait_for(lambda: memdevs_ready(expected), f"{expected} CXL memdevs")
    devices: list[dict[str, Any]] = []
    for mem_path in sorted(glob.glob(f"{CXL}/mem*")):
        memdev = os.path.basename(mem_path)
        endpoint = endpoint_of(memdev)
        assert endpoint is not None  # memdevs_ready checked it
        host_bridge = host_bridge_of(endpoint)
        result = subprocess.run(
            [
                "cxl",
                "create-region",
                "-t",
                "ram",
                "-d",
                root_decoder_for(host_bridge),
                "-m",
                memdev,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            sys.exit(f"cxl_setup: cxl create-region for {memdev} failed: {result.stderr.strip()}")
        region = json.loads(result.stdout)
        decoder = region["mappings"][0]["decoder"]
        devices.append(
            {
                "memdev": memdev,
                "host_bridge_bus": int(os.path.basename(host_bridge).split(":")[1], 16),
                "region": region["region"],
                "hpa_base": int(region["resource"]),
                "size_bytes": int(region["size"]),
                "dpa_base": int(read(f"{CXL}/{decoder}/dpa_resource"), 16),
            }
        )
    block_bytes = int(read("/sys/devices/system/memory/block_size_bytes"), 16)
    for device in devices:
        dax_glob = f"{CXL}/{device['region']}/dax_region*/dax[0-9]*"
        wait_for(lambda: glob.glob(dax_glob), f"the DAX device of {device['region']}")  # noqa: B023
        dax = os.path.basename(glob.glob(dax_glob)[0])
        target = f"/sys/bus/dax/devices/{dax}/target_node"
        wait_for(lambda: os.path.exists(target), f"{dax}")  # noqa: B023 (called at once)
        node = int(read(target))
        # kmem adds the memory blocks asynchronously after the region binds.
        blocks = device["size_bytes"] // block_bytes
        wait_for(lambda: node_blocks(node) >= blocks, f"the memory blocks of node {node}")  # noqa: B023
        device["dax"] = dax
        device["node"] = node
    # Every offline block is hotplugged (CXL memory or the movable DRAM node's pc-dimm):
    # boot memory is online.
    for state in sorted(glob.glob("/sys/devices/system/memory/memory*/state"), key=block_number):
        if read(state) == "offline":
            with open(state, "w") as f:
                f.write("online_movable")
    device_nodes = {device["node"] for device in devices}
    nodes = (int(path.rsplit("node", 1)[1]) for path in glob.glob("/sys/devices/system/node/node[0-9]*"))
    dram_node = min(
        (n for n in nodes if n not in device_nodes and not has_cpus(n) and node_blocks(n)), default=None
    )
    print(json.dumps({"devices": devices, "dram_node": dram_node}))


main()
