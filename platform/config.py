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

Sizes are byte counts or numbers with a binary unit (``512MiB``, ``1.5GiB``), read by
:func:`cxlssd.validation.parse_size` as everywhere else.
Every key is checked: unknown keys, wrong types and impossible sizes are a
:class:`~cxlssd.errors.ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError
from cxlssd.validation import check_keys, did_you_mean, format_size, parse_size
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

# A device has at most 8 DC regions (CXL r3.x; QEMU's region table has 8 entries).
DC_MAX_REGIONS = 8


@dataclass(frozen=True)
class DynamicCapacityConfig:
    """A device's dynamic capacity (a dynamic capacity device, DCD): ``regions`` DC regions
    of ``size_bytes / regions`` each, placed in the device's DPA space after its
    static capacity. None of it is host memory until the host accepts an extent
    (docs/inject.md, "Dynamic capacity")."""

    regions: int
    size_bytes: int

    @property
    def region_bytes(self) -> int:
        return self.size_bytes // self.regions


@dataclass(frozen=True)
class CxlDeviceConfig:
    """One volatile CXL Type-3 memory device (its own host bridge and window);
    ``size_bytes`` is its static capacity, ``dynamic_capacity`` makes it a DCD."""

    size_bytes: int
    dynamic_capacity: DynamicCapacityConfig | None = None

    @property
    def backing_bytes(self) -> int:
        """Host memory the device's backing files can take (static + dynamic)."""
        dynamic = self.dynamic_capacity.size_bytes if self.dynamic_capacity is not None else 0
        return self.size_bytes + dynamic


# What the guest's own clocks (timer interrupts, its wall-clock, TSC) follow: the
# instructions it executes (QEMU's -icount), so its timer-driven kernel work comes at
# a fixed rate per instruction whatever the host's speed (docs/live.md, "Modelled time
# and the host"); or the host's time, as plain TCG does.
GUEST_CLOCKS = ("instructions", "host")


@dataclass(frozen=True)
class GuestConfig:
    dram_bytes: int = 2 * GiB
    vcpus: int = 1
    boot_timeout_s: float = 600.0
    clock: str = "instructions"
    # The guest kernel helper (host_os/kmod/) and its doorbell device: a design that
    # switches on long delays then does so for unmodified multi-threaded programs.
    kernel_helper: bool = True


@dataclass(frozen=True)
class CpuConfig:
    """The modelled CPU: its clock (instructions x CPI / frequency) and its
    last-level cache, which the TCG plugin simulates."""

    frequency_ghz: float = 3.0
    cpi: float = 1.0
    llc_bytes: int = 2 * MiB
    llc_ways: int = 16
    # A REP MOVS/STOS (the guest kernel's page copies and clears, copies to and from
    # user space) is charged one instruction per this many bytes it stores, plus one:
    # ours, a fast-string copy at one 32-byte store a cycle (docs/plugin.md).
    string_bytes_per_insn: int = 32

    @property
    def insn_ps(self) -> int:
        """Picoseconds per instruction."""
        return max(1, round(self.cpi * 1000 / self.frequency_ghz))


@dataclass(frozen=True)
class PlatformConfig:
    name: str = "default"
    guest: GuestConfig = field(default_factory=GuestConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    cxl_devices: tuple[CxlDeviceConfig, ...] = (CxlDeviceConfig(size_bytes=1 * GiB),)
    source: str = "<built-in>"

    @property
    def cxl_total_bytes(self) -> int:
        """Host memory (and tmpfs) all CXL backing files can take, dynamic capacity included."""
        return sum(d.backing_bytes for d in self.cxl_devices)

    @property
    def host_memory_bytes(self) -> int:
        """Host memory the guest can take: its DRAM and all CXL backing files."""
        return self.guest.dram_bytes + self.cxl_total_bytes


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: expected a mapping of keys to values, got {type(value).__name__}"
        )
    return value


def _positive_number(value: object, key: str, kind: type, maximum: float) -> Any:
    """``value`` as a ``kind`` in (0, maximum]; NaN and infinities are refused (a NaN
    timeout never expires)."""
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ConfigError(f"{key}: expected a positive {kind.__name__}, got {short_repr(value)}")
    if not math.isfinite(value) or not 0 < value <= maximum:
        raise ConfigError(f"{key}: must be positive and at most {maximum:g}, got {short_repr(value)}")
    return kind(value)


def _guest_from(raw: dict[str, Any], where: str) -> GuestConfig:
    defaults = GuestConfig()
    check_keys(raw, {"dram", "vcpus", "boot_timeout_s", "clock", "kernel_helper"}, where)
    dram_bytes = parse_size(raw["dram"], f"{where}.dram") if "dram" in raw else defaults.dram_bytes
    if dram_bytes % (128 * MiB):
        raise ConfigError(
            f"{where}.dram: {format_size(dram_bytes)} is not a multiple of 128MiB "
            "(the guest's memory block size)"
        )
    clock = raw.get("clock", defaults.clock)
    if clock not in GUEST_CLOCKS:
        raise ConfigError(f"{where}.clock: expected one of {', '.join(GUEST_CLOCKS)}, got {clock!r}")
    kernel_helper = raw.get("kernel_helper", defaults.kernel_helper)
    if not isinstance(kernel_helper, bool):
        raise ConfigError(f"{where}.kernel_helper: expected true or false, got {short_repr(kernel_helper)}")
    return GuestConfig(
        dram_bytes=dram_bytes,
        vcpus=_positive_number(raw.get("vcpus", defaults.vcpus), f"{where}.vcpus", int, MAX_VCPUS),
        boot_timeout_s=_positive_number(
            raw.get("boot_timeout_s", defaults.boot_timeout_s), f"{where}.boot_timeout_s", float,
            MAX_BOOT_TIMEOUT_S,
        ),
        clock=clock,
        kernel_helper=kernel_helper,
    )


def _cpu_from(raw: dict[str, Any], where: str) -> CpuConfig:
    defaults = CpuConfig()
    check_keys(raw, {"frequency_ghz", "cpi", "llc", "llc_ways", "string_bytes_per_insn"}, where)
    llc_bytes = parse_size(raw["llc"], f"{where}.llc") if "llc" in raw else defaults.llc_bytes
    ways = _positive_number(raw.get("llc_ways", defaults.llc_ways), f"{where}.llc_ways", int, MAX_LLC_WAYS)
    sets, rest = divmod(llc_bytes, 64 * ways)
    if rest or sets & (sets - 1) or not sets:
        raise ConfigError(
            f"{where}: an LLC of {format_size(llc_bytes)} with {ways} ways does not have a power-of-2 "
            "number of 64-byte-line sets (ways 1..64); e.g. llc: 2MiB, llc_ways: 16"
        )
    return CpuConfig(
        frequency_ghz=_positive_number(raw.get("frequency_ghz", defaults.frequency_ghz),
                                       f"{where}.frequency_ghz", float, MAX_FREQUENCY_GHZ),
        cpi=_positive_number(raw.get("cpi", defaults.cpi), f"{where}.cpi", float, MAX_CPI),
        llc_bytes=llc_bytes,
        llc_ways=ways,
        string_bytes_per_insn=_positive_number(
            raw.get("string_bytes_per_insn", defaults.string_bytes_per_insn),
            f"{where}.string_bytes_per_insn", int, MAX_STRING_BYTES_PER_INSN),
    )


def _dynamic_capacity_from(raw: object, where: str) -> DynamicCapacityConfig:
    section = _mapping(raw, where)
    check_keys(section, {"regions", "size"}, where)
    if "size" not in section:
        raise ConfigError(f"{where}: missing 'size', the dynamic capacity of all regions (e.g. size: 256MiB)")
    regions = _positive_number(section.get("regions", 1), f"{where}.regions", int, math.inf)
    if regions > DC_MAX_REGIONS:
        raise ConfigError(f"{where}.regions: {regions} DC regions; a device has at most {DC_MAX_REGIONS}")
    size = parse_size(section["size"], f"{where}.size")
    if size % (regions * CXL_SIZE_ALIGN_BYTES):
        raise ConfigError(
            f"{where}.size: {format_size(size)} does not split into {regions} region(s) of a "
            f"multiple of 256MiB (QEMU's DC region unit); use e.g. "
            f"{format_size(regions * CXL_SIZE_ALIGN_BYTES)} or "
            f"{format_size(2 * regions * CXL_SIZE_ALIGN_BYTES)}"
        )
    return DynamicCapacityConfig(regions=regions, size_bytes=size)


def _device_from(raw: object, where: str) -> CxlDeviceConfig:
    device = _mapping(raw, where)
    check_keys(device, {"size", "dynamic_capacity"}, where)
    if "size" not in device:
        raise ConfigError(f"{where}: missing 'size' (e.g. size: 1GiB)")
    size = parse_size(device["size"], f"{where}.size")
    if size % CXL_SIZE_ALIGN_BYTES:
        raise ConfigError(
            f"{where}.size: {format_size(size)} is not a multiple of 256MiB; "
            "CXL memory is mapped and onlined in 256MiB units"
        )
    dynamic = (
        _dynamic_capacity_from(device["dynamic_capacity"], f"{where}.dynamic_capacity")
        if device.get("dynamic_capacity") is not None
        else None
    )
    return CxlDeviceConfig(size_bytes=size, dynamic_capacity=dynamic)


def config_from_dict(raw: object, source: str = "<dict>") -> PlatformConfig:
    """Validate a parsed YAML document and build the configuration."""
    top = _single_guest_part(_mapping(raw, source), source)
    check_keys(top, {f.name for f in fields(PlatformConfig)} - {"source"}, source)
    name = _checked_name(top.get("name", PlatformConfig.name), source)
    devices_raw = top.get("cxl_devices", [{"size": "1GiB"}])
    if not isinstance(devices_raw, list) or not devices_raw:
        raise ConfigError(f"{source}: cxl_devices must be a non-empty list, e.g. [{{size: 1GiB}}]")
    if len(devices_raw) > 4:
        raise ConfigError(f"{source}: at most 4 CXL devices are supported, got {len(devices_raw)}")
    return PlatformConfig(
        name=name,
        guest=_guest_from(_mapping(top.get("guest"), f"{source}: guest"), f"{source}: guest"),
        cpu=_cpu_from(_mapping(top.get("cpu"), f"{source}: cpu"), f"{source}: cpu"),
        cxl_devices=tuple(
            _device_from(d, f"{source}: cxl_devices[{i}]") for i, d in enumerate(devices_raw)
        ),
        source=source,
    )


def load_config(path: Path | None = None) -> PlatformConfig:
    """Read and validate a platform configuration file (the default one if ``path`` is None)."""
    path = path or DEFAULT_CONFIG
    return config_from_dict(read_yaml(path, "platform config"), str(path))


# -- networking and multi-guest platforms (docs/network.md) ---------------------------

# Every guest has QEMU's user-mode NIC (SSH forwarded on 127.0.0.1); the guest image
# configures it statically as 10.0.2.15 in this subnet.
USER_NET_SUBNET = ipaddress.IPv4Network("10.0.2.0/24")
DEFAULT_BRIDGE_SUBNET = ipaddress.IPv4Network("10.77.0.0/24")
NETWORK_MODES = ("user", "bridge")
# A bridge subnet must be private (RFC 1918): the guests' default route is the
# user-mode NIC, which a public subnet on the bridge would shadow.
PRIVATE_RANGES = tuple(
    ipaddress.IPv4Network(r) for r in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
# At most /8 (a guest's bridge MAC is derived from the last 3 bytes of its address),
# at least /30 (the bridge's address and one guest).
BRIDGE_PREFIX_RANGE = (8, 30)
_GUEST_ONLY_KEYS = {"design", "address"}


@dataclass(frozen=True)
class NetworkConfig:
    """How the guests of a platform are networked. ``user``: each guest has only
    QEMU's user-mode NIC. ``bridge``: each guest also has a NIC on a bridge in a
    network namespace the platform creates (guests reach each other; nothing leaves)."""

    mode: str = "user"
    subnet: ipaddress.IPv4Network = DEFAULT_BRIDGE_SUBNET

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


def _checked_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"{where}: name {short_repr(name)} must be 1-32 letters, digits, '-' or '_' "
            "(it names the instance)"
        )
    return name


def _single_guest_part(top: dict[str, Any], source: str) -> dict[str, Any]:
    """The keys :func:`config_from_dict` reads: a file with ``guests:`` or a bridge
    network needs the multi-guest loader; a ``network: {mode: user}`` is the default."""
    if "guests" in top or _network_from(top.get("network"), f"{source}: network").mode != "user":
        what = "several guests" if "guests" in top else "a bridge network"
        raise ConfigError(
            f"{source}: declares {what}; start it with MultiPlatform(load_multi_config(path)) "
            "from cxlssd.platform.multi (docs/network.md)"
        )
    return {key: value for key, value in top.items() if key != "network"}


def _subnet_from(value: object, key: str) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected an IPv4 subnet like 10.77.0.0/24, got {short_repr(value)}")
    try:
        subnet = ipaddress.IPv4Network(value, strict=True)
    except ValueError as error:
        fix = ""
        with contextlib.suppress(ValueError):
            fix = f"; did you mean {ipaddress.IPv4Network(value, strict=False)}?"
        raise ConfigError(f"{key}: {short_repr(value)} is not an IPv4 subnet ({error}){fix}") from None
    low, high = BRIDGE_PREFIX_RANGE
    if not low <= subnet.prefixlen <= high:
        raise ConfigError(f"{key}: {subnet} must have a prefix length from /{low} to /{high}")
    if not any(subnet.subnet_of(r) for r in PRIVATE_RANGES):
        raise ConfigError(
            f"{key}: {subnet} is not a private range ({', '.join(map(str, PRIVATE_RANGES))}); "
            "a public one would shadow real addresses in the guests"
        )
    if subnet.overlaps(USER_NET_SUBNET):
        raise ConfigError(
            f"{key}: {subnet} overlaps {USER_NET_SUBNET}, the user-mode network every guest also "
            "has (its SSH forward); choose another subnet, e.g. 10.77.0.0/24"
        )
    return subnet


def _network_from(raw: object, where: str) -> NetworkConfig:
    section = _mapping(raw, where)
    check_keys(section, {"mode", "subnet"}, where)
    mode = section.get("mode", NetworkConfig.mode)
    if mode not in NETWORK_MODES:
        raise ConfigError(f"{where}.mode: {short_repr(mode)} is not one of {', '.join(NETWORK_MODES)}")
    if "subnet" in section and mode != "bridge":
        raise ConfigError(f"{where}.subnet: only a bridge network has a subnet (set mode: bridge)")
    subnet = (
        _subnet_from(section["subnet"], f"{where}.subnet")
        if "subnet" in section
        else DEFAULT_BRIDGE_SUBNET
    )
    return NetworkConfig(mode=mode, subnet=subnet)


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
    network = _network_from(top.get("network"), f"{source}: network")
    if "guests" not in top:
        single = config_from_dict({k: v for k, v in top.items() if k != "network"}, source)
        return MultiPlatformConfig(
            name=single.name,
            network=network,
            guests=(GuestSpec(single, None, _assign_addresses(network, [None], source)[0]),),
            source=source,
        )
    check_keys(top, {"name", "network", "guests"}, source)
    name = _checked_name(top.get("name", PlatformConfig.name), source)
    entries = top["guests"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{source}: guests must be a non-empty list, e.g. [{{name: a}}, {{name: b}}]"
        )
    platform_keys = {f.name for f in fields(PlatformConfig)} - {"source"}
    platforms, designs, explicit = [], [], []
    first_index: dict[str, int] = {}
    for index, raw_entry in enumerate(entries):
        where = f"{source}: guests[{index}]"
        entry = _mapping(raw_entry, where)
        check_keys(entry, platform_keys | _GUEST_ONLY_KEYS, where)
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
    return multi_config_from_dict(read_yaml(path, "platform config"), str(path))
