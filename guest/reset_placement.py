"""Runs IN THE GUEST (python3, stdlib only): put a movable node's free memory in a fixed order.

Usage: ``python3 - NODE [NODE...] < reset_placement.py`` (the CXL node, the movable DRAM
node: both ZONE_MOVABLE). For each NODE in turn: offlines every memory block of NODE but
the first and onlines them ZONE_MOVABLE again, then does the same with the first, each in
ascending block order. The buddy allocator then holds the node's pages in an order that
depends on nothing earlier runs allocated and freed. The node never has no memory on the
way, so the kernel does not stop and restart its kswapd and kcompactd or rebuild its
zonelists and demotion targets (work that would land in the next run). A program that
faults its pages in the same order (the guest runs with ASLR off, cxl_setup.py) then gets
the same physical pages, and the same conflict misses in the modelled LLC and SSD data
cache, in every run (docs/live.md, "Placement"). Offlining migrates what is still on the
node (page cache of files read under a CXL binding) to other nodes.

Exits 0, or 1 with a message if a block cannot be offlined (pages in use that cannot
move): every block is online again then.
"""

import glob
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


def reset(node: int) -> None:
    blocks = blocks_of(node)
    if not blocks:
        sys.exit(f"reset_placement: node {node} has no memory blocks")
    for group in (blocks[1:], blocks[:1]):
        failure = None
        for block in group:
            if state(block) == "online":
                try:
                    set_state(block, "offline")
                except OSError as error:
                    failure = f"cannot offline {block} of node {node}: {error.strerror} (pages in use there)"
                    break
        for block in group:  # also after a failure: no block may stay offline
            if state(block) == "offline":
                set_state(block, "online_movable")
        if failure:
            sys.exit(f"reset_placement: {failure}")


for argument in sys.argv[1:]:
    reset(int(argument))
