"""Replay-throughput benchmark: requests per second and peak memory per profile.

Each profile replays the same synthetic trace file in its own subprocess (so peak
RSS is per profile). Wall-clock time is measured here only; it never enters
modelled results.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cxlssd
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay
from cxlssd.firmware.synth import SynthSpec, generate
from cxlssd.firmware.trace import TraceReader, TraceWriter

DEFAULT_PROFILES = (
    "base-cssd", "skybyte-p", "skybyte-c", "skybyte-w", "skybyte-cp", "skybyte-wp",
    "skybyte-full", "dram-only",
)


#: the issue's targets (requests/s on one core) for the profiles that have one
TARGETS = {"base-cssd": 1_000_000, "skybyte-full": 300_000}


def measure(trace: Path, profile_name: str) -> dict[str, Any]:
    """Replay ``trace`` on ``profile_name`` in this process; throughput and peak RSS.

    Trace generation is not timed (``run`` writes the file first). A first pass only
    reads the trace (CRC checks included; it also warms the page cache) and is
    reported as ``read_seconds``; the timed replay streams the file again, so
    ``requests_per_s`` is end to end (read + model + latency histogram) and
    ``model_requests_per_s`` leaves the read out.
    """
    reader = TraceReader(trace)
    start = time.perf_counter()
    for _ in reader.chunks():
        pass
    read_seconds = time.perf_counter() - start
    controller = Controller.from_profile(load_profile(profile_name), timebase=reader.timebase)
    start = time.perf_counter()
    result = replay(controller, reader.chunks())
    seconds = time.perf_counter() - start
    model = result["counters"]["model"]
    target = TARGETS.get(profile_name)
    return {
        "profile": profile_name,
        "requests": reader.records,
        "seconds": seconds,
        "read_seconds": read_seconds,
        "requests_per_s": reader.records / seconds,
        "model_requests_per_s": reader.records / max(seconds - read_seconds, 1e-9),
        "target_requests_per_s": target,
        "of_target": reader.records / seconds / target if target else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_hit_rate": model["cache_hit_rate"],
        "served": model["served"],
    }


def run(spec: SynthSpec, profiles: list[str], workdir: Path | None = None) -> list[dict[str, Any]]:
    """Write the trace for ``spec`` once, then measure each profile in a subprocess."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trace = Path(tmp) / "bench.trace"
        with TraceWriter(trace, spec.metadata()) as writer:
            for chunk in generate(spec):
                writer.write(chunk)
        rows = []
        for name in profiles:
            done = subprocess.run(
                [sys.executable, "-m", "cxlssd.firmware.bench", str(trace), name],
                check=True, capture_output=True, text=True, env=cxlssd.child_env(),
            )
            rows.append(json.loads(done.stdout))
        return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'profile':<14}{'req/s':>12}{'seconds':>9}{'read s':>8}{'model req/s':>13}"
        f"{'target':>11}{'x target':>9}{'peak MiB':>9}{'hit rate':>9}"
    ]
    for row in rows:
        target = row.get("target_requests_per_s")
        lines.append(
            f"{row['profile']:<14}{row['requests_per_s']:>12,.0f}{row['seconds']:>9.1f}"
            f"{row['read_seconds']:>8.1f}{row['model_requests_per_s']:>13,.0f}"
            + (f"{target:>11,}{row['of_target']:>9.2f}" if target else f"{'-':>11}{'-':>9}")
            + f"{row['peak_rss_mib']:>9.0f}{row['cache_hit_rate']:>9.3f}"
        )
    return lines


if __name__ == "__main__":  # the per-profile subprocess of run()
    print(json.dumps(measure(Path(sys.argv[1]), sys.argv[2])))
