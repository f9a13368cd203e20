"""Runs IN THE GUEST under ``numactl --membind=N python3 - SIZE_MIB``: a small
bandwidth/latency probe of the node the process is bound to.

It measures the *emulator's* wall-clock (TCG), which shows that the guest really
uses the device (CXL accesses take QEMU's slow MMIO path) but is never a result:
modelled time comes from the platform's firmware model. Prints one JSON line.
"""

import json
import sys
import time

import numpy as np

size_mib = int(sys.argv[1])
data = np.ones(size_mib << 17, dtype=np.float64)  # touches every page on the bound node
started = time.perf_counter()
total = float(data.sum())
seq_s = time.perf_counter() - started
rng = np.random.default_rng(0)
index = rng.integers(0, data.size, 20000)
started = time.perf_counter()
picked = float(data[index].sum())
rand_s = time.perf_counter() - started
assert total == data.size and picked == index.size
print(
    json.dumps(
        {
            "size_mib": size_mib,
            "seq_read_mib_per_s": size_mib / seq_s,
            "random_read_ns": rand_s / index.size * 1e9,
        }
    )
)
