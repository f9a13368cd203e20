"""Synthetic request traces: uniform, zipfian, sequential and hot-set patterns.

Every generator is deterministic for a seed and produces chunks, so traces of any
length stream. Addresses are 64 B-aligned lines inside ``footprint_bytes``; a
request's page is drawn by the pattern and its line uniformly within the page.
Timestamps are on the *compute* timebase: ``gap_ns`` of computation between
successive requests of a vCPU (the controller adds the stalls it models).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal, Self

import numpy as np
from pydantic import AfterValidator, Field, StrictFloat, StrictInt, model_validator

from cxlssd.firmware.request import LINES_PER_PAGE, PAGE_BYTES, REQUEST_DTYPE, Op
from cxlssd.models import ConfigModel, SizeBytes
from cxlssd.validation import format_size

Pattern = Literal["uniform", "zipf", "sequential", "hotset"]
PATTERNS: tuple[str, ...] = typing.get_args(Pattern)
MAX_THREADS = 1024


def _in(low: float, high: float, unit: str = "") -> AfterValidator:
    """A number in ``low..high``; the message says the range."""

    def check(value: float) -> float:
        if not low <= value <= high:  # also rejects NaN
            raise ValueError(f"expected {low:g}..{high:g}{unit}, got {value!r}")
        return value

    return AfterValidator(check)


def _at_least_a_page(size: int) -> int:
    if size < PAGE_BYTES:
        raise ValueError(f"{format_size(size)} is less than one 4KiB page")
    return size


class SynthSpec(ConfigModel):
    """What to generate (sizes in bytes, times in ns)."""

    label: ClassVar[str] = "synthetic trace"
    pattern: Pattern = Field(default="zipf", description="which pages requests go to")
    requests: Annotated[StrictInt, _in(0, math.inf)] = Field(default=1_000_000, description="requests in all")
    footprint_bytes: Annotated[SizeBytes, AfterValidator(_at_least_a_page)] = Field(
        default=1 << 30, description="bytes the requests touch"
    )
    write_fraction: Annotated[StrictFloat, _in(0, 1)] = Field(default=0.3, description="share of writes")
    zipf_theta: StrictFloat = Field(default=0.99, description="zipf: skew (0 = uniform)")
    hot_bytes: Annotated[SizeBytes, AfterValidator(_at_least_a_page)] = Field(
        default=64 << 20, description="hotset: size of the hot set"
    )
    hot_fraction: Annotated[StrictFloat, _in(0, 1)] = Field(
        default=0.9, description="hotset: share of requests to the hot set"
    )
    gap_ns: Annotated[StrictInt, _in(0, math.inf, " ns")] = Field(
        default=50, description="computation between two requests of one thread, ns"
    )
    vcpus: Annotated[StrictInt, _in(1, math.inf)] = Field(default=1, description="vCPUs issuing requests")
    threads: Annotated[StrictInt, _in(1, MAX_THREADS)] = Field(
        default=1, description="threads per vCPU (SkyByte runs 3 per core)"
    )
    seed: StrictInt = Field(default=1, description="random seed: a spec always gives the same trace")

    @model_validator(mode="after")
    def _hot_set_fits(self) -> Self:
        if self.pattern == "hotset" and self.hot_bytes > self.footprint_bytes:
            raise ValueError(f"hot_bytes {format_size(self.hot_bytes)} is larger than footprint_bytes "
                             f"{format_size(self.footprint_bytes)}")
        return self

    def metadata(self) -> dict[str, object]:
        return {"generator": "cxlssd.firmware.synth", **self.model_dump()}


def _zipf_cdf(pages: int, theta: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, pages + 1, dtype=np.float64) ** theta
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def generate(spec: SynthSpec, chunk_records: int = 1 << 18) -> Iterator[np.ndarray]:
    """Yield REQUEST_DTYPE chunks making up the trace described by ``spec``."""
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
