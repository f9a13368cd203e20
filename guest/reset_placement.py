"""Runs IN THE GUEST (python3, stdlib only): put a CXL node's free memory back in address order.

Usage: ``python3 - NODE < reset_placement.py``. Offlines every memory block of NODE, then
onlines them ZONE_MOVABLE again, both in ascending block order. The buddy allocator then
holds the node's pages as after a fresh online, whatever earlier runs allocated and freed,
so a program that faults its pages in the same order (the guest runs with ASLR off,
cxl_setup.py) gets the same physical pages, and the same conflict misses in the modelled
LLC and SSD data cache, in every run (docs/live.md, "Placement"). Offlining migrates what
is still on the node (page cache of files read under a CXL binding) to other nodes.

Exits 0 with one JSON line ``{"blocks": N}``; 1 with a message if a block cannot be
offlined (pages in use that cannot move): every block is online again then.
"""

import glob
import json
import sys

MEMORY = "/sys/devices/system/memory"


def blocks_of(node: int) -> list[str]:
    paths = glob.glob(f"/sys/devices/system/node/node{node}/memory[0-9]*")
    return sorted((p.rsplit("/", 1)[1] for p in paths), key=lambda name: int(name[len("memory"):]))


def state(block: str) -> str:
    with open(f"{MEMORY}/{block}/state") as f:
        return f.read().strip()


def set_state(block: str, value: str) -> None:
    with open(f"{MEMORY}/{block}/state", "w") as f:
        f.write(value)


def main() -> None:
    node = int(sys.argv[1])
    blocks = blocks_of(node)
    if not blocks:
        sys.exit(f"reset_placement: node {node} has no memory blocks")
    failure = None
    for block in blocks:
        if state(block) == "online":
            try:
                set_state(block, "offline")
            except OSError as error:
                failure = f"cannot offline {block} of node {node}: {error.strerror} (pages in use there)"
                break
    for block in blocks:  # also after a failure: no block may stay offline
        if state(block) == "offline":
            set_state(block, "online_movable")
    if failure:
        sys.exit(f"reset_placement: {failure}")
    print(json.dumps({"blocks": len(blocks)}))


main()
