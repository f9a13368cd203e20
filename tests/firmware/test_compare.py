"""compare_designs: one synthetic stream under several designs (the demo's table)."""

from __future__ import annotations

from cxlssd.firmware.replay import compare_designs
from cxlssd.firmware.synth import SynthSpec


def test_designs_rank_as_the_paper_says_and_dram_only_is_the_ideal() -> None:
    spec = SynthSpec(pattern="zipf", requests=200_000, footprint_bytes=2 << 30)
    rows = {r["design"]: r for r in compare_designs(spec, ["base-cssd", "skybyte-full", "dram-only"])}
    assert rows["base-cssd"]["speedup"] == 1.0
    assert rows["skybyte-full"]["speedup"] > 1.0
    assert rows["dram-only"]["fraction_of_dram_only"] == 1.0
    assert all(0 < r["fraction_of_dram_only"] <= 1.0 for r in rows.values())
    # the write log coalesces small writes: far fewer flash programs than base
    assert rows["skybyte-full"]["flash_programs"] * 10 <= max(rows["base-cssd"]["flash_programs"], 10)
    assert rows["dram-only"]["flash_reads"] == rows["dram-only"]["flash_programs"] == 0
