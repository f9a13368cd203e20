"""Platform configuration: the guest and its CXL devices, read from YAML.

Example (``platform/configs/default.yaml``)::

    name: default
    guest:
      dram: 2GiB
      vcpus: 1
      boot_timeout_s: 600
      clock: instructions # the guest's clocks follow its instructions (-icount), or: host
      kernel_helper: true # transparent context switching (host_os/kmod/, docs/host-os.md)
    cxl_devices:
      - size: 1GiB
        # optional: a dynamic capacity device (``configs/dcd.yaml``)
        # dynamic_capacity: {regions: 1, size: 256MiB}
    cpu:                  # the modelled CPU (docs/plugin.md, "Modelled clock")
      frequency_ghz: 3.0
      cpi: 1.0
      llc: 2MiB
      llc_ways: 16
      string_bytes_per_insn: 32 # a REP MOVS/STOS: one instruction per this many bytes

``extends: NAME`` starts from another platform file (:func:`read_platform_file`), so
a variant such as ``configs/skybyte-64.yaml`` states only what differs.

Each section is a configuration model (:mod:`cxlssd.models`): its fields, their types,
ranges and descriptions are the one definition of the keys. Sizes are byte counts or
numbers with a binary unit (``512MiB``, ``1.5GiB``), read by
:func:`cxlssd.validation.size_bytes` as everywhere else. Every key is checked: unknown
keys, wrong types and impossible sizes are a :class:`~cxlssd.errors.ConfigError`
naming the file, the key path, the value and the fix.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cxlssd.errors import ConfigError
from cxlssd.models import ConfigModel, SizeBytes, SizeOrZeroBytes
from cxlssd.validation import check_keys, did_you_mean, format_size
from cxlssd.yamlfile import read_yaml, short_repr

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

MiB = 1 << 20
GiB = 1 << 30
# The kernel onlines CXL memory in memory blocks and QEMU maps windows at 256 MiB
# granularity: a device size must be a multiple of it.
CXL_SIZE_ALIGN_BYTES = 256 * MiB
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


# Upper bounds of the numeric keys: far above any sensible value, low enough that
# nothing derived from them overflows or waits forever.
MAX_VCPUS = 64
MAX_BOOT_TIMEOUT_S = 24 * 3600.0
MAX_LLC_WAYS = 64
MAX_STRING_BYTES_PER_INSN = 4096  # the plugin's bound: a page per instruction
MAX_FREQUENCY_GHZ = 100.0
MAX_CPI = 1000.0
MAX_MOVABLE_DRAM_BYTES = 8 * GiB  # QEMU's memory hotplug area (qemu.py MAXMEM_EXTRA_BYTES) holds it

# A device has at most 8 DC regions (CXL r3.x; QEMU's region table has 8 entries).
DC_MAX_REGIONS = 8


def _positive(maximum: float) -> AfterValidator:
    """A number in (0, maximum]; NaN and infinities are refused (a NaN timeout never expires)."""
    def check(value: float) -> float:
        if not math.isfinite(value) or not 0 < value <= maximum:
            raise ValueError(f"must be positive and at most {maximum:g}, got {short_repr(value)}")
        return value

    return AfterValidator(check)


def _multiple_of_256mib(size: int) -> int:
    if size % CXL_SIZE_ALIGN_BYTES:
        raise ValueError(f"{format_size(size)} is not a multiple of 256MiB; "
                         "CXL memory is mapped and onlined in 256MiB units")
    return size


class DynamicCapacityConfig(ConfigModel):
    """A device's dynamic capacity (a dynamic capacity device, DCD): ``regions`` DC regions
    of ``size_bytes / regions`` each, placed in the device's DPA space after its
    static capacity. None of it is host memory until the host accepts an extent
    (docs/inject.md, "Dynamic capacity")."""

    label: ClassVar[str] = "dynamic_capacity"
    regions: Annotated[StrictInt, _positive(math.inf)] = Field(default=1, description="DC regions, 1..8")
    size_bytes: SizeBytes = Field(validation_alias="size",
                                  description="the dynamic capacity of all regions, e.g. size: 256MiB")

    @field_validator("regions")
    @classmethod
    def _regions(cls, regions: int) -> int:
        if regions > DC_MAX_REGIONS:
            raise ValueError(f"{regions} DC regions; a device has at most {DC_MAX_REGIONS}")
        return regions

    @field_validator("size_bytes")
    @classmethod
    def _split(cls, size: int, info: ValidationInfo) -> int:
        regions = info.data.get("regions")
        if regions is not None and size % (regions * CXL_SIZE_ALIGN_BYTES):
            raise ValueError(
                f"{format_size(size)} does not split into {regions} region(s) of a multiple of "
                f"256MiB (QEMU's DC region unit); use e.g. {format_size(regions * CXL_SIZE_ALIGN_BYTES)} "
                f"or {format_size(2 * regions * CXL_SIZE_ALIGN_BYTES)}"
            )
        return size

    @property
    def region_bytes(self) -> int:
        return self.size_bytes // self.regions


class CxlDeviceConfig(ConfigModel):
    """One volatile CXL Type-3 memory device (its own host bridge and window);
    ``size_bytes`` is its static capacity, ``dynamic_capacity`` makes it a DCD."""

    label: ClassVar[str] = "CXL device"
    size_bytes: Annotated[SizeBytes, AfterValidator(_multiple_of_256mib)] = Field(
        validation_alias="size", description="static capacity, a multiple of 256MiB, e.g. size: 1GiB"
    )
    dynamic_capacity: DynamicCapacityConfig | None = Field(
        default=None,
        description="optional: makes it a dynamic capacity device, e.g. {regions: 1, size: 256MiB}",
    )

    @property
    def backing_bytes(self) -> int:
        """Host memory the device's backing files can take (static + dynamic)."""
        dynamic = self.dynamic_capacity.size_bytes if self.dynamic_capacity is not None else 0
        return self.size_bytes + dynamic


# What the guest's own clocks (timer interrupts, its wall-clock, TSC) follow: the
# instructions it executes (QEMU's -icount), so its timer-driven kernel work comes at
# a fixed rate per instruction whatever the host's speed (docs/live.md, "Modelled time
# and the host"); or the host's time, as plain TCG does.
GuestClock = Literal["instructions", "host"]
GUEST_CLOCKS: tuple[str, ...] = typing.get_args(GuestClock)


def _memory_blocks(size: int) -> int:
    if size % (128 * MiB):
        raise ValueError(f"{format_size(size)} is not a multiple of 128MiB (the guest's memory block size)")
    return size


def _movable_dram(size: int) -> int:
    if size > MAX_MOVABLE_DRAM_BYTES:
        raise ValueError(f"{format_size(size)} is more than the {format_size(MAX_MOVABLE_DRAM_BYTES)} "
                         "QEMU's memory hotplug area holds")
    return _memory_blocks(size)


class GuestConfig(ConfigModel):
    label: ClassVar[str] = "guest"
    dram_bytes: Annotated[SizeBytes, AfterValidator(_memory_blocks)] = Field(
        default=2 * GiB, validation_alias="dram", description="node 0's memory, a multiple of 128MiB"
    )
    # A second DRAM node without CPUs (a pc-dimm), onlined ZONE_MOVABLE like the CXL node, so
    # its free pages can be put in a fixed order before every live run: promoted pages and
    # dram-only runs go there and get the same physical pages (which the modelled LLC
    # indexes) every run. Node 0 holds the guest kernel's and every other process's memory,
    # so its placement cannot be reset (docs/live.md, "Placement").
    movable_dram_bytes: Annotated[SizeOrZeroBytes, AfterValidator(_movable_dram)] = Field(
        default=2 * GiB, validation_alias="movable_dram",
        description="a DRAM node without CPUs for promoted pages and dram-only runs, a multiple of "
        "128MiB (0: node 0 takes them)",
    )
    vcpus: Annotated[StrictInt, _positive(MAX_VCPUS)] = Field(
        default=1, description="virtual CPUs; more than 1 only with `clock: host` (below)"
    )
    boot_timeout_s: Annotated[StrictFloat, _positive(MAX_BOOT_TIMEOUT_S)] = Field(
        default=600.0, description="seconds to boot; the error then shows the serial log's last lines"
    )
    clock: GuestClock = Field(default="instructions", description="what the guest's clocks follow")
    # The guest kernel helper (host_os/kmod/) and its doorbell device: a design that
    # switches on long delays then does so for unmodified multi-threaded programs.
    kernel_helper: StrictBool = Field(
        default=True, description="load the guest kernel helper (host_os/kmod/)"
    )

    @model_validator(mode="after")
    def _one_vcpu_under_icount(self) -> Self:
        # Measured 2026-12-07 with QEMU 10.0.2: -smp 2 -icount with the plugin loaded (dormant,
        # only its per-block instruction count) panics the guest at boot (a stack-protector
        # or page-fault oops); without -icount, or without the plugin, it boots.
        if self.vcpus > 1 and self.clock == "instructions":
            raise ValueError(
                f"vcpus: {self.vcpus} with clock: instructions is not supported: QEMU's -icount with "
                "several vCPUs and the cxlssd plugin corrupts the guest (a kernel panic at boot; "
                "docs/platform.md); use vcpus: 1, or clock: host (the guest's clocks then follow "
                "the host's time)"
            )
        return self


class CpuConfig(ConfigModel):
    """The modelled CPU: its clock (instructions x CPI / frequency) and its
    last-level cache, which the TCG plugin simulates."""

    label: ClassVar[str] = "cpu"
    frequency_ghz: Annotated[StrictFloat, _positive(MAX_FREQUENCY_GHZ)] = Field(
        default=3.0, description="clock frequency, GHz"
    )
    cpi: Annotated[StrictFloat, _positive(MAX_CPI)] = Field(default=1.0, description="cycles per instruction")
    llc_bytes: SizeBytes = Field(default=2 * MiB, validation_alias="llc", description="last-level cache size")
    llc_ways: Annotated[StrictInt, _positive(MAX_LLC_WAYS)] = Field(
        default=16, description="LLC associativity"
    )
    # A REP MOVS/STOS (the guest kernel's page copies and clears, copies to and from
    # user space) is charged one instruction per this many bytes it stores, plus one:
    # ours, a fast-string copy at one 32-byte store a cycle (docs/plugin.md).
    string_bytes_per_insn: Annotated[StrictInt, _positive(MAX_STRING_BYTES_PER_INSN)] = Field(
        default=32, description="a REP MOVS/STOS: one instruction per this many bytes"
    )

    @model_validator(mode="after")
    def _power_of_2_sets(self) -> Self:
        sets, rest = divmod(self.llc_bytes, 64 * self.llc_ways)
        if rest or sets & (sets - 1) or not sets:
            raise ValueError(
                f"an LLC of {format_size(self.llc_bytes)} with {self.llc_ways} ways does not have a "
                "power-of-2 number of 64-byte-line sets (ways 1..64); e.g. llc: 2MiB, llc_ways: 16"
            )
        return self

    @property
    def insn_ps(self) -> int:
        """Picoseconds per instruction."""
        return max(1, round(self.cpi * 1000 / self.frequency_ghz))


def _instance_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{short_repr(name)} must be 1-32 letters, digits, '-' or '_' "
                         "(it names the instance)")
    return name


class PlatformConfig(ConfigModel):
    label: ClassVar[str] = "platform config"
    reader_fields: ClassVar[frozenset[str]] = frozenset({"source"})
    name: Annotated[StrictStr, AfterValidator(_instance_name)] = Field(
        default="default", description="instance name prefix (letters, digits, - and _)"
    )
    guest: GuestConfig = Field(default_factory=GuestConfig, description="the guest machine")
    cpu: CpuConfig = Field(default_factory=CpuConfig, description="the modelled CPU")
    cxl_devices: tuple[CxlDeviceConfig, ...] = Field(
        default=(CxlDeviceConfig(size_bytes=1 * GiB),), description="1-4 CXL Type-3 devices"
    )
    # Where it was read from, for messages; set by the reader, not a key of the file.
    source: str = "<built-in>"

    @field_validator("cxl_devices")
    @classmethod
    def _one_to_four(cls, devices: tuple[CxlDeviceConfig, ...]) -> tuple[CxlDeviceConfig, ...]:
        if not devices:
            raise ValueError("cxl_devices must be a non-empty list, e.g. [{size: 1GiB}]")
        if len(devices) > 4:
            raise ValueError(f"at most 4 CXL devices are supported, got {len(devices)}")
        return devices

    @property
    def cxl_total_bytes(self) -> int:
        """Host memory (and tmpfs) all CXL backing files can take, dynamic capacity included."""
        return sum(d.backing_bytes for d in self.cxl_devices)

    @property
    def host_memory_bytes(self) -> int:
        """Host memory the guest can take: its DRAM (both nodes) and all CXL backing files."""
        return self.guest.dram_bytes + self.guest.movable_dram_bytes + self.cxl_total_bytes


# The keys of a platform file's guest
PLATFORM_KEYS = frozenset(PlatformConfig.model_fields) - PlatformConfig.reader_fields


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: expected a mapping of keys to values, got {type(value).__name__}"
        )
    return value


def config_from_dict(raw: object, source: str = "<dict>") -> PlatformConfig:
    """Validate a parsed YAML document and build the configuration."""
    top = _single_guest_part(_mapping(raw, source), source)
    check_keys(top, PLATFORM_KEYS, source)
    return PlatformConfig.parse({**top, "source": source}, source)


def platform_file(value: str | Path, *bases: Path) -> Path | None:
    """The platform file ``value`` names: a built-in config's name (``skybyte-64``),
    else a path tried relative to each of ``bases`` in turn; None if there is none."""
    for candidate in (CONFIG_DIR / f"{value}.yaml", *(base / value for base in bases)):
        if candidate.is_file():
            return candidate
    return None


# An `extends:` chain longer than this is refused (a cycle is caught before it).
MAX_EXTENDS_DEPTH = 8


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: mappings merge key by key, anything else (a list
    of devices, a number) replaces the base's value whole."""
    merged = dict(base)
    for key, value in over.items():
        inherited = merged.get(key)
        if isinstance(value, dict) and isinstance(inherited, dict):
            value = _merged(inherited, value)
        merged[key] = value
    return merged


def read_platform_file(path: Path) -> tuple[object, str]:
    """A platform file's document with its ``extends:`` applied, and the source to name
    in messages (``skybyte-64.yaml (extends default.yaml)``: a key may come from
    either). ``extends: default`` starts from the named file (a built-in config's name
    or a path relative to this file) and lays this file's keys over it, so a variant
    states only what differs."""
    document, bases = _extended(path, ())
    return document, f"{path} (extends {' -> '.join(bases)})" if bases else str(path)


def _extended(path: Path, chain: tuple[Path, ...]) -> tuple[object, list[str]]:
    """``path``'s document laid over its bases', and the bases' file names in order."""
    raw = read_yaml(path, "platform config")
    if not isinstance(raw, dict) or "extends" not in raw:
        return raw, []
    chain = (*chain, path.resolve())
    parent_name = raw["extends"]
    if not isinstance(parent_name, str) or not parent_name:
        raise ConfigError(f"{path}: extends: expected the name of a platform file, e.g. "
                          f"extends: default, got {short_repr(parent_name)}")
    if "name" not in raw:
        raise ConfigError(f"{path}: a platform file that extends another needs a name of its "
                          "own (guests and results are labelled with it), e.g. name: my-platform")
    parent = platform_file(parent_name, path.parent)
    if parent is None:
        raise ConfigError(f"{path}: extends: no platform config {short_repr(parent_name)} "
                          f"(a name in {CONFIG_DIR} or a path relative to {path.parent})")
    if parent.resolve() in chain:
        raise ConfigError(f"{path}: extends: {parent} is already in the chain "
                          f"({' -> '.join(p.name for p in chain)}); remove the cycle")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"{path}: extends: more than {MAX_EXTENDS_DEPTH} files deep; "
                          "extend a file nearer the base")
    base, bases = _extended(parent, chain)
    merged = _merged(_mapping(base, str(parent)), {k: v for k, v in raw.items() if k != "extends"})
    return merged, [parent.name, *bases]


def load_config(path: Path | None = None) -> PlatformConfig:
    """Read and validate a platform configuration file (the default one if ``path`` is None)."""
    path = path or DEFAULT_CONFIG
    return config_from_dict(*read_platform_file(path))


# -- networking and multi-guest platforms (docs/network.md) ---------------------------

# Every guest has QEMU's user-mode NIC (SSH forwarded on 127.0.0.1); the guest image
# configures it statically as 10.0.2.15 in this subnet.
USER_NET_SUBNET = ipaddress.IPv4Network("10.0.2.0/24")
DEFAULT_BRIDGE_SUBNET = ipaddress.IPv4Network("10.77.0.0/24")
# A bridge subnet must be private (RFC 1918): the guests' default route is the
# user-mode NIC, which a public subnet on the bridge would shadow.
PRIVATE_RANGES = tuple(
    ipaddress.IPv4Network(r) for r in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
# At most /8 (a guest's bridge MAC is derived from the last 3 bytes of its address),
# at least /30 (the bridge's address and one guest).
BRIDGE_PREFIX_RANGE = (8, 30)
_GUEST_ONLY_KEYS = {"design", "address"}


NetworkMode = Literal["user", "bridge"]
NETWORK_MODES: tuple[str, ...] = typing.get_args(NetworkMode)


def _subnet(value: object) -> object:
    """A bridge subnet: a private IPv4 network of /8../30 that does not overlap the
    user-mode network."""
    if isinstance(value, ipaddress.IPv4Network):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected an IPv4 subnet like 10.77.0.0/24, got {short_repr(value)}")
    try:
        subnet = ipaddress.IPv4Network(value, strict=True)
    except ValueError as error:
        fix = ""
        with contextlib.suppress(ValueError):
            fix = f"; did you mean {ipaddress.IPv4Network(value, strict=False)}?"
        raise ValueError(f"{short_repr(value)} is not an IPv4 subnet ({error}){fix}") from None
    low, high = BRIDGE_PREFIX_RANGE
    if not low <= subnet.prefixlen <= high:
        raise ValueError(f"{subnet} must have a prefix length from /{low} to /{high}")
    if not any(subnet.subnet_of(r) for r in PRIVATE_RANGES):
        raise ValueError(
            f"{subnet} is not a private range ({', '.join(map(str, PRIVATE_RANGES))}); "
            "a public one would shadow real addresses in the guests"
        )
    if subnet.overlaps(USER_NET_SUBNET):
        raise ValueError(
            f"{subnet} overlaps {USER_NET_SUBNET}, the user-mode network every guest also "
            "has (its SSH forward); choose another subnet, e.g. 10.77.0.0/24"
        )
    return subnet


class NetworkConfig(ConfigModel):
    """How the guests of a platform are networked. ``user``: each guest has only
    QEMU's user-mode NIC. ``bridge``: each guest also has a NIC on a bridge in a
    network namespace the platform creates (guests reach each other; nothing leaves)."""

    label: ClassVar[str] = "network"
    mode: NetworkMode = Field(default="user", description="user, or bridge: the guests also share a bridge")
    subnet: Annotated[ipaddress.IPv4Network, BeforeValidator(_subnet)] = Field(
        default=DEFAULT_BRIDGE_SUBNET, description="the bridge's private IPv4 subnet"
    )

    @model_validator(mode="after")
    def _bridge_only(self) -> Self:
        if "subnet" in self.model_fields_set and self.mode != "bridge":
            raise ValueError("subnet: only a bridge network has a subnet (set mode: bridge)")
        return self

    @property
    def bridge_address(self) -> ipaddress.IPv4Interface:
        """The bridge's own address: the subnet's first host."""
        return ipaddress.IPv4Interface((next(self.subnet.hosts()), self.subnet.prefixlen))


@dataclass(frozen=True)
class GuestSpec:
    """One guest of a (multi-guest) platform: its machine, its firmware design (None:
    not chosen) and its address on the bridge (None unless the network is a bridge)."""

    platform: PlatformConfig
    design: str | None = None
    address: ipaddress.IPv4Interface | None = None

    @property
    def name(self) -> str:
        return self.platform.name


@dataclass(frozen=True)
class MultiPlatformConfig:
    """Guests started together on one network (``cxlssd.platform.multi.MultiPlatform``)."""

    name: str
    network: NetworkConfig
    guests: tuple[GuestSpec, ...]
    source: str

    @property
    def platforms(self) -> tuple[PlatformConfig, ...]:
        return tuple(g.platform for g in self.guests)


def _single_guest_part(top: dict[str, Any], source: str) -> dict[str, Any]:
    """The keys :func:`config_from_dict` reads: a file with ``guests:`` or a bridge
    network needs the multi-guest loader; a ``network: {mode: user}`` is the default."""
    if "guests" in top or NetworkConfig.parse(top.get("network"), f"{source}: network").mode != "user":
        what = "several guests" if "guests" in top else "a bridge network"
        raise ConfigError(
            f"{source}: declares {what}; start it with MultiPlatform(load_multi_config(path)) "
            "from cxlssd.platform.multi (docs/network.md)"
        )
    return {key: value for key, value in top.items() if key != "network"}


def _design_from(value: object, key: str) -> str | None:
    if value is None:
        return None
    # Imported here: the firmware package is not needed to boot a guest.
    from cxlssd.firmware.profile import available_profiles

    designs = available_profiles()
    if value not in designs:
        raise ConfigError(
            f"{key}: unknown design {short_repr(value)}{did_you_mean(str(value), designs)}; "
            f"choose one of: {', '.join(designs)}"
        )
    return str(value)


def _address_from(value: object, network: NetworkConfig, key: str) -> ipaddress.IPv4Address:
    """A guest's explicit bridge address: a host of the subnet other than the bridge's."""
    if network.mode != "bridge":
        raise ConfigError(f"{key}: only guests on a bridge network have an address (network.mode)")
    try:
        address = ipaddress.IPv4Interface(str(value))
    except ValueError:
        raise ConfigError(f"{key}: {short_repr(value)} is not an IPv4 address") from None
    subnet = network.subnet
    if "/" in str(value) and address.network != subnet:
        raise ConfigError(f"{key}: {value} is not on the bridge subnet {subnet} (or drop the prefix)")
    if address.ip not in subnet or address.ip in (subnet.network_address, subnet.broadcast_address):
        raise ConfigError(f"{key}: {address.ip} is not a host address of the bridge subnet {subnet}")
    if address.ip == network.bridge_address.ip:
        raise ConfigError(f"{key}: {address.ip} is the bridge's own address; choose another")
    return address.ip


def _assign_addresses(
    network: NetworkConfig, explicit: list[ipaddress.IPv4Address | None], where: str
) -> list[ipaddress.IPv4Interface | None]:
    """Bridge addresses: explicit ones as given (unique), the others the subnet's
    free hosts in order after the bridge's."""
    if network.mode != "bridge":
        return [None] * len(explicit)
    taken = {network.bridge_address.ip}
    for index, address in enumerate(explicit):
        if address is not None and address in taken:
            raise ConfigError(f"{where}: guests[{index}].address {address} is already taken")
        if address is not None:
            taken.add(address)
    free = (host for host in network.subnet.hosts() if host not in taken)
    assigned: list[ipaddress.IPv4Interface | None] = []
    for address in explicit:
        chosen = address if address is not None else next(free, None)
        if chosen is None:
            raise ConfigError(
                f"{where}: network.subnet {network.subnet} has no room for {len(explicit)} guests "
                "and the bridge; use a larger subnet"
            )
        assigned.append(ipaddress.IPv4Interface((chosen, network.subnet.prefixlen)))
    return assigned


def multi_config_from_dict(raw: object, source: str = "<dict>") -> MultiPlatformConfig:
    """Validate a platform document in either form: one guest (the keys of
    :func:`config_from_dict`) or several (``guests:``), each with an optional
    ``network:`` section. Everything is checked before anything starts."""
    top = _mapping(raw, source)
    network = NetworkConfig.parse(top.get("network"), f"{source}: network")
    if "guests" not in top:
        single = config_from_dict({k: v for k, v in top.items() if k != "network"}, source)
        return MultiPlatformConfig(
            name=single.name,
            network=network,
            guests=(GuestSpec(single, None, _assign_addresses(network, [None], source)[0]),),
            source=source,
        )
    check_keys(top, {"name", "network", "guests"}, source)
    try:
        name = _instance_name(top.get("name", "default"))
    except ValueError as error:
        raise ConfigError(f"{source}: name: {error}") from None
    entries = top["guests"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{source}: guests must be a non-empty list, e.g. [{{name: a}}, {{name: b}}]"
        )
    platforms, designs, explicit = [], [], []
    first_index: dict[str, int] = {}
    for index, raw_entry in enumerate(entries):
        where = f"{source}: guests[{index}]"
        entry = _mapping(raw_entry, where)
        check_keys(entry, PLATFORM_KEYS | _GUEST_ONLY_KEYS, where)
        if "name" not in entry:
            raise ConfigError(f"{where}: missing 'name' (each guest needs its own, e.g. name: dram-only)")
        platform = config_from_dict(
            {k: v for k, v in entry.items() if k not in _GUEST_ONLY_KEYS}, where
        )
        if platform.name in first_index:
            raise ConfigError(
                f"{where}: guest name '{platform.name}' is also used by "
                f"guests[{first_index[platform.name]}]; guest names must be unique"
            )
        first_index[platform.name] = index
        platforms.append(platform)
        designs.append(_design_from(entry.get("design"), f"{where}.design"))
        explicit.append(
            _address_from(entry["address"], network, f"{where}.address") if "address" in entry else None
        )
    addresses = _assign_addresses(network, explicit, source)
    return MultiPlatformConfig(
        name=name,
        network=network,
        guests=tuple(map(GuestSpec, platforms, designs, addresses)),
        source=source,
    )


def load_multi_config(path: Path | None = None) -> MultiPlatformConfig:
    """Read and validate a platform file of either form (the default one if ``path`` is None)."""
    path = path or DEFAULT_CONFIG
    return multi_config_from_dict(*read_platform_file(path))


# The sections of a platform file, for its reference (docs/platform.md, generated)
SECTIONS: dict[str, type[ConfigModel]] = {
    "(top)": PlatformConfig, "guest": GuestConfig, "cpu": CpuConfig, "cxl_devices[]": CxlDeviceConfig,
    "cxl_devices[].dynamic_capacity": DynamicCapacityConfig, "network": NetworkConfig,
}
