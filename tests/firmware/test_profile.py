"""Profiles: every shipped profile loads; overrides are checked key by key."""

from __future__ import annotations

import re

import pytest

from cxlssd.errors import ConfigError
from cxlssd.firmware.profile import available_profiles, load_profile
from cxlssd.validation import parse_size

SHIPPED = ["base-cssd", "dram-only", "skybyte-c", "skybyte-cp", "skybyte-full",
           "skybyte-p", "skybyte-w", "skybyte-wp"]


def test_all_designs_are_shipped_and_load() -> None:
    assert available_profiles() == SHIPPED
    for name in SHIPPED:
        assert load_profile(name).name == name


def test_designs_enable_the_right_components() -> None:
    full = load_profile("skybyte-full")
    assert full.chain == ["base-cssd", "skybyte-w", "skybyte-wp", "skybyte-full"]
    assert full["write_log.enabled"] and full["migration.enabled"]
    assert full["context_switch.enabled"]
    base = load_profile("base-cssd")
    assert not (base["write_log.enabled"] or base["migration.enabled"])
    assert load_profile("dram-only")["kind"] == "dram-only"


def test_skybyte_defaults() -> None:
    p = load_profile("skybyte-w")
    assert p["ssd_dram.size_bytes"] == 448 << 20
    assert p["write_log.size_bytes"] * 8 == p["ssd_dram.size_bytes"]
    assert (p["flash.read_ns"], p["flash.program_ns"], p["flash.erase_ns"]) == (
        3_000, 80_000, 1_000_000)
    assert p["flash.channels"] == 16 and p["cache.ways"] == 16


def test_overrides_and_presets() -> None:
    p = load_profile("base-cssd", ["cache.ways=8", "flash.preset=tlc", "ssd_dram.size_bytes=1GiB"])
    assert p["cache.ways"] == 8 and p["flash.read_ns"] == 75_000
    assert p["ssd_dram.size_bytes"] == 1 << 30
    explicit = load_profile("base-cssd", {"flash.preset": "slc", "flash.read_ns": 10})
    assert explicit["flash.read_ns"] == 10 and explicit["flash.program_ns"] == 200_000
    assert p.tree["cache"]["ways"] == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cache.wayz=4"], "did you mean 'cache.ways'"),
        (["cache.ways=many"], "the overrides: cache.ways: expected an integer, got 'many'"),
        (["cache=3"], "the overrides: cache: expected a mapping of keys to values, got 3"),
        (["flash.transfer_ns=-1"], "flash.transfer_ns: must not be negative, got -1"),
        (["cache.ways=null"], "cache.ways: expected an integer, got None"),
        (["write_log.size_bytes=1GiB"], "larger than ssd_dram.size_bytes"),
        (["write_log.size_bytes=4KiB"], "fewer than 64 entries"),
        (["flash.channels=0"], "flash.channels must be at least 1"),
        (["flash.preset=qlc"], "unknown flash.preset"),
        (["migration.min_threshold=8"], "min_threshold"),
        (["noequals"], "key=value"),
        (["ssd_dram.size_bytes=12 parsecs"], "is not a size"),
        (["gc.unit=lines"], "unknown gc.unit 'lines' (did you mean 'line'?): one of die, line"),
        (["gc.unit=line", "flash.placement=striped"], "gc.unit line needs flash.placement write-pointer"),
        (["gc.unit=line", "gc.stop_threshold=0.1"], "gc.stop_threshold (0.1) must be above"),
        (["gc.read_priority=maybe"], "gc.read_priority: expected true or false, got 'maybe'"),
    ],
)
def test_bad_overrides_are_clear_errors(overrides: list[str], message: str) -> None:
    message = re.escape(message)
    with pytest.raises(ConfigError, match=message):
        load_profile("skybyte-w", overrides)


def test_unknown_profile_suggests() -> None:
    with pytest.raises(ConfigError, match="did you mean 'skybyte-full'"):
        load_profile("skybyte-ful")


def test_profile_file_with_unknown_key(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("extends: base-cssd\ncache:\n  way: 4\n")
    with pytest.raises(ConfigError, match=r"mine\.yaml: cache: unknown key 'way'; did you mean 'ways'\?"):
        load_profile(str(path))


def test_parse_size() -> None:
    assert parse_size("448MiB", "k") == 448 << 20
    assert parse_size(4096, "k") == 4096
    assert parse_size("1.5KiB", "k") == 1536
