"""Platform configuration: the guest and its CXL devices, read from YAML.

Example (``platform/configs/default.yaml``)::

    name: default
    guest:
      dram: 2GiB
      vcpus: 1
      boot_timeout_s: 600
    cxl_devices:
      - size: 1GiB

Sizes are strings with a binary unit (``512MiB``, ``1GiB``) or plain byte counts.
Every key is checked: unknown keys, wrong types and impossible sizes are a
:class:`~cxlssd.errors.ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from cxlssd.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

MiB = 1 << 20
GiB = 1 << 30
# The kernel onlines CXL memory in memory blocks and QEMU maps windows at 256 MiB
# granularity: a device size must be a multiple of it.
CXL_SIZE_ALIGN_BYTES = 256 * MiB
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": GiB, "TiB": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]iB|B)?\s*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


def parse_size(value: object, key: str) -> int:
    """Bytes from ``value`` (an int, or a string like ``"512MiB"``)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like 1GiB, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        size = int(match.group(1)) * _UNITS[match.group(2) or ""]
    else:
        raise ConfigError(
            f"{key}: {value!r} is not a size; write bytes or a number with KiB/MiB/GiB/TiB, e.g. 1GiB"
        )
    if size <= 0:
        raise ConfigError(f"{key}: size must be positive, got {value!r}")
    return size


def format_size(size_bytes: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size_bytes % _UNITS[unit] == 0:
            return f"{size_bytes // _UNITS[unit]}{unit}"
    return f"{size_bytes}B"


@dataclass(frozen=True)
class CxlDeviceConfig:
    """One volatile CXL Type-3 memory device (its own host bridge and window)."""

    size_bytes: int


@dataclass(frozen=True)
class GuestConfig:
    dram_bytes: int = 2 * GiB
    vcpus: int = 1
    boot_timeout_s: float = 600.0


@dataclass(frozen=True)
class PlatformConfig:
    name: str = "default"
    guest: GuestConfig = field(default_factory=GuestConfig)
    cxl_devices: tuple[CxlDeviceConfig, ...] = (CxlDeviceConfig(size_bytes=1 * GiB),)
    source: str = "<built-in>"

    @property
    def cxl_total_bytes(self) -> int:
        return sum(d.size_bytes for d in self.cxl_devices)


def _check_keys(section: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in section:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            fix = (
                f"did you mean '{hint[0]}'?"
                if hint
                else f"allowed keys: {', '.join(sorted(allowed))}"
            )
            raise ConfigError(f"{where}: unknown key '{key}'; {fix}")


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: expected a mapping of keys to values, got {type(value).__name__}"
        )
    return value


def _positive_number(value: object, key: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ConfigError(f"{key}: expected a positive {kind.__name__}, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{key}: must be positive, got {value!r}")
    return kind(value)


def _guest_from(raw: dict[str, Any], where: str) -> GuestConfig:
    defaults = GuestConfig()
    _check_keys(raw, {"dram", "vcpus", "boot_timeout_s"}, where)
    dram_bytes = parse_size(raw["dram"], f"{where}.dram") if "dram" in raw else defaults.dram_bytes
    if dram_bytes % (128 * MiB):
        raise ConfigError(
            f"{where}.dram: {format_size(dram_bytes)} is not a multiple of 128MiB "
            "(the guest's memory block size)"
        )
    return GuestConfig(
        dram_bytes=dram_bytes,
        vcpus=_positive_number(raw.get("vcpus", defaults.vcpus), f"{where}.vcpus", int),
        boot_timeout_s=_positive_number(
            raw.get("boot_timeout_s", defaults.boot_timeout_s), f"{where}.boot_timeout_s", float
        ),
    )


def _device_from(raw: object, where: str) -> CxlDeviceConfig:
    device = _mapping(raw, where)
    _check_keys(device, {"size"}, where)
    if "size" not in device:
        raise ConfigError(f"{where}: missing 'size' (e.g. size: 1GiB)")
    size = parse_size(device["size"], f"{where}.size")
    if size % CXL_SIZE_ALIGN_BYTES:
        raise ConfigError(
            f"{where}.size: {format_size(size)} is not a multiple of 256MiB; "
            "CXL memory is mapped and onlined in 256MiB units"
        )
    return CxlDeviceConfig(size_bytes=size)


def config_from_dict(raw: object, source: str = "<dict>") -> PlatformConfig:
    """Validate a parsed YAML document and build the configuration."""
    top = _mapping(raw, source)
    _check_keys(top, {f.name for f in fields(PlatformConfig)} - {"source"}, source)
    name = top.get("name", PlatformConfig.name)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"{source}: name {name!r} must be 1-32 letters, digits, '-' or '_' (it names the instance)"
        )
    devices_raw = top.get("cxl_devices", [{"size": "1GiB"}])
    if not isinstance(devices_raw, list) or not devices_raw:
        raise ConfigError(f"{source}: cxl_devices must be a non-empty list, e.g. [{{size: 1GiB}}]")
    if len(devices_raw) > 4:
        raise ConfigError(f"{source}: at most 4 CXL devices are supported, got {len(devices_raw)}")
    return PlatformConfig(
        name=name,
        guest=_guest_from(_mapping(top.get("guest"), f"{source}: guest"), f"{source}: guest"),
        cxl_devices=tuple(
            _device_from(d, f"{source}: cxl_devices[{i}]") for i, d in enumerate(devices_raw)
        ),
        source=source,
    )


def load_config(path: Path | None = None) -> PlatformConfig:
    """Read and validate a platform configuration file (the default one if ``path`` is None)."""
    path = path or DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read platform config {path}: {error.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"{path}: malformed YAML{where}: {getattr(error, 'problem', error)}"
        ) from None
    return config_from_dict(raw, str(path))
