"""Synthetic request traces: uniform, zipfian, sequential and hot-set patterns.

Every generator is deterministic for a seed and produces chunks, so traces of any
length stream. Addresses are 64 B-aligned lines inside ``footprint_bytes``; a
request's page is drawn by the pattern and its line uniformly within the page.
Timestamps are on the *compute* timebase: ``gap_ns`` of computation between
successive requests of a vCPU (the controller adds the stalls it models).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from cxlssd.errors import ConfigError
from cxlssd.firmware.request import LINES_PER_PAGE, PAGE_BYTES, REQUEST_DTYPE, Op

PATTERNS = ("uniform", "zipf", "sequential", "hotset")


@dataclass(frozen=True)
class SynthSpec:
    """What to generate (sizes in bytes, times in ns)."""

    pattern: str = "zipf"
    requests: int = 1_000_000
    footprint_bytes: int = 1 << 30
    write_fraction: float = 0.3
    zipf_theta: float = 0.99  # zipf: skew (0 = uniform)
    hot_bytes: int = 64 << 20  # hotset: size of the hot set ...
    hot_fraction: float = 0.9  # ... and the share of requests that go to it
    gap_ns: int = 50  # computation between two requests of one thread
    vcpus: int = 1
    threads: int = 1  # per vCPU (SkyByte runs 3 per core)
    seed: int = 1

    def check(self) -> None:
        if self.pattern not in PATTERNS:
            raise ConfigError(f"unknown pattern {self.pattern!r}; choose one of {PATTERNS}")
        if self.footprint_bytes < PAGE_BYTES or self.requests < 0:
            raise ConfigError("footprint must be at least one 4 KiB page and requests >= 0")
        if not 0 <= self.write_fraction <= 1 or not 0 <= self.hot_fraction <= 1:
            raise ConfigError("write_fraction and hot_fraction must be in [0, 1]")
        if self.pattern == "hotset" and not PAGE_BYTES <= self.hot_bytes <= self.footprint_bytes:
            raise ConfigError("hot_bytes must be between 4 KiB and footprint_bytes")
        if self.vcpus < 1 or not 1 <= self.threads <= 1024:
            raise ConfigError("vcpus must be at least 1 and threads between 1 and 1024")

    def metadata(self) -> dict[str, object]:
        return {"generator": "cxlssd.firmware.synth", **asdict(self)}


def _zipf_cdf(pages: int, theta: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, pages + 1, dtype=np.float64) ** theta
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def generate(spec: SynthSpec, chunk_records: int = 1 << 18) -> Iterator[np.ndarray]:
    """Yield REQUEST_DTYPE chunks making up the trace described by ``spec``."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    pages = spec.footprint_bytes // PAGE_BYTES
    # hot pages are scattered over the footprint, as a real heap's would be
    shuffle = rng.permutation(pages)
    cdf = _zipf_cdf(pages, spec.zipf_theta) if spec.pattern == "zipf" else None
    hot_pages = max(1, spec.hot_bytes // PAGE_BYTES)
    done = 0
    while done < spec.requests:
        n = min(chunk_records, spec.requests - done)
        index = np.arange(done, done + n, dtype=np.int64)
        if spec.pattern == "uniform":
            page = rng.integers(0, pages, n)
        elif spec.pattern == "zipf":
            assert cdf is not None
            page = shuffle[np.minimum(np.searchsorted(cdf, rng.random(n)), pages - 1)]
        elif spec.pattern == "hotset":
            hot = rng.random(n) < spec.hot_fraction
            page = np.where(
                hot, shuffle[rng.integers(0, hot_pages, n)], shuffle[rng.integers(0, pages, n)]
            )
        else:  # sequential: line after line
            page = (index // LINES_PER_PAGE) % pages
        line = index % LINES_PER_PAGE if spec.pattern == "sequential" else rng.integers(0, LINES_PER_PAGE, n)
        chunk = np.zeros(n, dtype=REQUEST_DTYPE)
        chunk["addr"] = (page.astype(np.uint64) * PAGE_BYTES) + line.astype(np.uint64) * 64
        chunk["op"] = np.where(rng.random(n) < spec.write_fraction, Op.WRITE, Op.READ)
        # round robin over vCPUs, then over each vCPU's threads; a record's time is its
        # thread's own compute clock
        chunk["vcpu"] = index % spec.vcpus
        chunk["thread"] = (index // spec.vcpus) % spec.threads
        chunk["time_ns"] = (index // (spec.vcpus * spec.threads)) * spec.gap_ns
        chunk["size"] = 64
        done += n
        yield chunk


def synthesize(spec: SynthSpec) -> np.ndarray:
    """The whole trace as one array (tests, small benchmarks)."""
    parts = list(generate(spec))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=REQUEST_DTYPE)
