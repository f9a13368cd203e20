"""Shared helpers: small device profiles that keep tests fast."""

from __future__ import annotations

from typing import Any

import pytest

from cxlssd.firmware.controller import Controller
from cxlssd.firmware.profile import Profile, load_profile

#: a scaled-down device (64 MiB flash, 1 MiB SSD DRAM -> 1/8 log) with SkyByte's ratios
SMALL = {
    "device.capacity_bytes": "64MiB",
    "ssd_dram.size_bytes": "1MiB",
    "write_log.size_bytes": "128KiB",
    "migration.window_accesses": 2000,
    "migration.host_capacity_bytes": "256KiB",
    "flash.channels": 4,
    "flash.dies_per_channel": 2,
    "flash.pages_per_block": 32,
}


def small_profile(name: str, **overrides: Any) -> Profile:
    return load_profile(name, {**SMALL, **{k.replace("__", "."): v for k, v in overrides.items()}})


def _small_controller(
    name: str, vectorize: bool = True, timebase: str = "compute", **overrides: Any
) -> Controller:
    return Controller.from_profile(
        small_profile(name, **overrides), timebase=timebase, vectorize=vectorize
    )


@pytest.fixture
def small_controller():
    return _small_controller
