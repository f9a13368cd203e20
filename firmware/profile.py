"""Device profiles: YAML files naming every parameter of a modelled device.

``profiles/base-cssd.yaml`` is the complete schema with SkyByte's defaults; every
other profile ``extends`` one and changes some keys. The schema is a configuration
model (:func:`profile_model`, made from that file: a key's type is its default's,
``*_bytes`` keys are sizes, ``null`` defaults are optional integers), so every layer
(a profile file, the ``key=value`` overrides with dotted keys such as
``cache.ways=8``) is checked by it with the same messages as every other
configuration. :func:`load_profile` resolves the chain, applies the overrides, fills
flash timings from the NAND preset and checks that the geometry is possible. Any
mistake is a :class:`~cxlssd.errors.ConfigError` that names the key and the fix.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    create_model,
)

from cxlssd.abi.protocol import TASK_SCHEDULERS
from cxlssd.errors import ConfigError
from cxlssd.firmware.ftl import GC_UNITS
from cxlssd.firmware.request import LINES_PER_PAGE, PAGE_BYTES
from cxlssd.models import ConfigModel
from cxlssd.validation import did_you_mean, size_bytes
from cxlssd.yamlfile import read_yaml

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
BASE_PROFILE = "base-cssd"
#: capacities that ``scale.capacity_divisor`` divides together (a scaled-down run)
SCALED_CAPACITIES = ("ssd_dram.size_bytes", "write_log.size_bytes", "migration.host_capacity_bytes")

#: NAND timing presets (ns). ULL is SkyByte's; SLC/MLC/TLC are typical datasheet
#: values (see docs/firmware.md), not numbers from the paper.
NAND_PRESETS: dict[str, dict[str, int]] = {
    "ull": {"read_ns": 3_000, "program_ns": 80_000, "erase_ns": 1_000_000},
    "slc": {"read_ns": 25_000, "program_ns": 200_000, "erase_ns": 1_500_000},
    "mlc": {"read_ns": 50_000, "program_ns": 600_000, "erase_ns": 3_000_000},
    "tlc": {"read_ns": 75_000, "program_ns": 1_000_000, "erase_ns": 3_500_000},
}

def available_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path} must be a mapping of keys to values")
    return data


def _profile_path(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"profile file {name} does not exist")
        return path
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        names = available_profiles()
        raise ConfigError(
            f"unknown profile {name!r}{did_you_mean(name, names)}; "
            f"choose one of: {', '.join(names)} (or give a path to a .yaml file)"
        )
    return path


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


@functools.cache
def _base_tree() -> dict[str, Any]:
    """The base profile's keys and defaults: the schema of every profile (not to be changed)."""
    data = _read_yaml(PROFILE_DIR / f"{BASE_PROFILE}.yaml")
    data.pop("extends", None)
    return data


def _not_negative(value: int | float | None) -> int | float | None:
    if value is not None and value < 0:
        raise ValueError(f"must not be negative, got {value}")
    return value


# Keys whose value is a size, a time or a count: never negative.
_NON_NEGATIVE_SUFFIXES = ("_bytes", "_ns", "_threshold", "_accesses")


def _key_type(key: str, default: object) -> object:
    """A key's type, from its name and the base profile's default."""
    if key.endswith("_bytes"):  # a size, 0 allowed (an empty log)
        kind: object = Annotated[int, BeforeValidator(functools.partial(size_bytes, minimum_bytes=0))]
    elif default is None:  # a flash timing: null takes the preset's
        kind = StrictInt | None
    else:
        kind = {bool: StrictBool, int: StrictInt, float: StrictFloat, str: StrictStr}[type(default)]
    return Annotated[kind, AfterValidator(_not_negative)] if key.endswith(_NON_NEGATIVE_SUFFIXES) else kind


def _section_model(name: str, tree: Mapping[str, Any]) -> type[ConfigModel]:
    fields: dict[str, Any] = {}
    for key, default in tree.items():
        if isinstance(default, Mapping):
            fields[key] = (_section_model(f"{name}.{key}", default), None)
        else:
            fields[key] = (_key_type(key, default), default)
    return create_model(name, __base__=ConfigModel, **fields)


@functools.cache
def profile_model() -> type[ConfigModel]:
    """The model of a profile (or of some of its keys), made from the base profile."""
    return _section_model("profile", _base_tree())


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``; a key given as a section and a value stays
    the value (the model then says it is not a mapping)."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            node = child if isinstance(child, dict) else {}
        node[leaf] = value
    return tree


def _apply(flat: dict[str, Any], updates: Mapping[str, Any], where: str, dotted: bool = False) -> None:
    """Set the dotted keys of ``updates`` in ``flat``, each checked by the profile model
    (``dotted``: messages spell keys as the overrides do, ``cache.ways``)."""
    checked = profile_model().parse(_nested(updates), where, dotted=dotted)
    for key in updates:
        value: Any = checked
        for part in key.split("."):
            value = getattr(value, part)
        flat[key] = value


def _resolve_chain(name: str, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """Flat values of profile ``name`` after its ``extends`` chain, and the chain."""
    if name in seen:
        raise ConfigError(f"profile {name!r} extends itself through {' -> '.join(seen)}")
    path = _profile_path(name)
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        flat = dict.fromkeys(flatten(_base_tree()))
        chain = [path.stem]
    else:
        flat, chain = _resolve_chain(str(parent), (*seen, name))
        chain = [*chain, path.stem]
    _apply(flat, flatten(data), f"profile {path}")
    return flat, chain


def parse_override(text: str) -> tuple[str, Any]:
    """``"cache.ways=8"`` -> ``("cache.ways", 8)`` (the value is parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value, e.g. cache.ways=8")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


class Profile:
    """A resolved, validated device profile: ``profile["cache.ways"]`` or ``.tree``."""

    def __init__(self, name: str, values: dict[str, Any], chain: list[str]) -> None:
        self.name = name
        self.values = values
        self.chain = chain
        _validate(values)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def capacity_bytes(self, key: str) -> int:
        """The capacity ``key`` the model gets: the profile's value divided by
        ``scale.capacity_divisor``, rounded down to whole pages."""
        return _scaled(self.values, key)

    @property
    def tree(self) -> dict[str, Any]:
        """The nested form (as in the YAML), for writing into results."""
        tree: dict[str, Any] = {}
        for dotted, value in self.values.items():
            node = tree
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return tree

    def with_overrides(self, overrides: Mapping[str, Any]) -> Profile:
        values = copy.deepcopy(self.values)
        _apply(values, overrides, "the overrides", dotted=True)
        _fill_presets(values, explicit=set(overrides))
        return Profile(self.name, values, self.chain)


def _fill_presets(values: dict[str, Any], explicit: Iterable[str] = ()) -> None:
    preset = values["flash.preset"]
    if preset not in NAND_PRESETS:
        raise ConfigError(
            f"unknown flash.preset {preset!r}{did_you_mean(preset, list(NAND_PRESETS))}; "
            f"choose one of: {', '.join(NAND_PRESETS)}"
        )
    for key, ns in NAND_PRESETS[preset].items():
        dotted = f"flash.{key}"
        # a preset override re-fills timings unless they were set explicitly
        if values[dotted] is None or ("flash.preset" in explicit and dotted not in explicit):
            values[dotted] = ns


def load_profile(name: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> Profile:
    """Resolve profile ``name`` (shipped name or path) with ``overrides`` applied.

    ``overrides`` is either ``["cache.ways=8", ...]`` or ``{"cache.ways": 8}``.
    """
    values, chain = _resolve_chain(name)
    _fill_presets(values)
    base = Profile(Path(name).stem, values, chain)
    if isinstance(overrides, Mapping):
        updates = dict(overrides)
    else:
        updates = dict(parse_override(text) for text in overrides)
    return base.with_overrides(updates) if updates else base


def _scaled(v: Mapping[str, Any], key: str) -> int:
    """``v[key]`` (one of :data:`SCALED_CAPACITIES`) after the capacity divisor."""
    return int(v[key]) // v["scale.capacity_divisor"] // PAGE_BYTES * PAGE_BYTES


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _fraction(v: dict[str, Any], key: str, lo: float, hi: float) -> None:
    _require(lo <= v[key] <= hi, f"{key} must be between {lo} and {hi}, got {v[key]}")


def _validate(v: dict[str, Any]) -> None:
    """Reject impossible geometries and out-of-range parameters."""
    _require(v["kind"] in ("cxl-ssd", "dram-only"),
             f"kind must be cxl-ssd or dram-only, got {v['kind']!r}")
    cap = v["device.capacity_bytes"]
    _require(
        cap >= PAGE_BYTES and cap % PAGE_BYTES == 0,
        f"device.capacity_bytes must be a positive multiple of {PAGE_BYTES}, got {cap}",
    )
    _require(v["flash.channels"] > 0, "flash.channels must be at least 1 (got "
             f"{v['flash.channels']}); a device needs a channel to reach its flash")
    _require(v["flash.dies_per_channel"] > 0,
             f"flash.dies_per_channel must be at least 1, got {v['flash.dies_per_channel']}")
    _require(v["flash.pages_per_block"] > 0,
             f"flash.pages_per_block must be at least 1, got {v['flash.pages_per_block']}")
    _fraction(v, "flash.overprovisioning", 0, 4)
    _fraction(v, "gc.free_threshold", 0, 0.99)
    _require(v["gc.unit"] in GC_UNITS,
             f"unknown gc.unit {v['gc.unit']!r}{did_you_mean(str(v['gc.unit']), list(GC_UNITS))}: "
             f"one of {', '.join(GC_UNITS)}")
    if v["gc.unit"] == "line":
        _require(v["gc.free_threshold"] < v["gc.stop_threshold"] <= 0.99,
                 f"gc.stop_threshold ({v['gc.stop_threshold']}) must be above gc.free_threshold "
                 f"({v['gc.free_threshold']}) and at most 0.99: a line GC pass runs from one to the other")
        _require(v["flash.placement"] == "write-pointer",
                 f"gc.unit line needs flash.placement write-pointer (got {v['flash.placement']!r}): "
                 "a line is the same block on every die, aligned only while the dies fill in turn")
    _require(v["scale.capacity_divisor"] >= 1,
             f"scale.capacity_divisor must be at least 1, got {v['scale.capacity_divisor']}")
    dram = _scaled(v, "ssd_dram.size_bytes")
    log = _scaled(v, "write_log.size_bytes") if v["write_log.enabled"] else 0
    _require(
        log <= dram,
        f"write_log.size_bytes ({log}) is larger than ssd_dram.size_bytes ({dram}); "
        "the log is carved out of the SSD DRAM: lower the log or raise the DRAM size",
    )
    cache_pages = (dram - log) // PAGE_BYTES
    _require(v["cache.ways"] > 0, f"cache.ways must be at least 1, got {v['cache.ways']}")
    if v["kind"] == "cxl-ssd":
        _require(
            cache_pages >= v["cache.ways"],
            f"the data cache gets {dram - log} bytes of SSD DRAM, less than one set of "
            f"{v['cache.ways']} x {PAGE_BYTES} B pages: raise ssd_dram.size_bytes or "
            "lower write_log.size_bytes / cache.ways",
        )
    if v["write_log.enabled"]:
        _require(v["write_log.entry_bytes"] > 0, "write_log.entry_bytes must be positive")
        # A dirty demotion logs a whole page at once: the log must hold one.
        _require(log // v["write_log.entry_bytes"] >= LINES_PER_PAGE,
                 f"write_log.size_bytes holds fewer than {LINES_PER_PAGE} entries "
                 "(one page of lines, what a dirty demotion logs at once; after "
                 "scale.capacity_divisor): raise it")
        _fraction(v, "write_log.flush_threshold", 0.001, 1)
        _require(0 <= v["write_log.compact_to"] < v["write_log.flush_threshold"],
                 f"write_log.compact_to ({v['write_log.compact_to']}) must be at least 0 and "
                 f"below write_log.flush_threshold ({v['write_log.flush_threshold']}): "
                 "compaction runs from the flush threshold down to it")
    lo, hi = v["migration.min_threshold"], v["migration.max_threshold"]
    start = v["migration.initial_threshold"]
    _require(1 <= lo <= start <= hi,
             f"need 1 <= migration.min_threshold ({lo}) <= initial_threshold ({start}) "
             f"<= max_threshold ({hi})")
    _require(v["migration.window_accesses"] >= 1, "migration.window_accesses must be at least 1")
    _require(v["context_switch.threshold_ns"] > 0,
             f"context_switch.threshold_ns must be above 0 ns, got {v['context_switch.threshold_ns']}: "
             "a long delay is one longer than the threshold (SkyByte: 2000, swept 2000-80000)")
    _require(v["context_switch.scheduler"] in TASK_SCHEDULERS,
             f"unknown context_switch.scheduler {v['context_switch.scheduler']!r}"
             f"{did_you_mean(str(v['context_switch.scheduler']), list(TASK_SCHEDULERS))}; "
             f"choose one of: {', '.join(TASK_SCHEDULERS)}")
    _require(
        v["migration.raise_at_or_below_share"] < v["migration.lower_at_or_above_share"],
        "migration.raise_at_or_below_share must be below migration.lower_at_or_above_share",
    )
