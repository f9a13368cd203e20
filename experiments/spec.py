"""Experiment definitions: designs x workloads (x parameter sweeps), from YAML.

Example (``experiments/demo.yaml``)::

    name: demo
    platform: default              # a config of platform/configs, or a YAML path
    designs: [base-cssd, skybyte-full, dram-only]
    baseline: base-cssd            # speedups are over this design
    ideal: dram-only               # "fraction of ideal" is against this one
    workloads:
      - name: chase
        command: [chase, --bytes, "{footprint}", --warm, "1"]
        sweep: {footprint: [16M, 32M]}   # one point per value (a product over keys)
      - name: kvstore-a
        command: [kvstore, --footprint, 16M, --mix, a]
        inject:                    # a scenario: firmware knobs at modelled times
          - {at_ms: 5, kind: latency-spike, extra_ns: 2000, duration_ms: 10}
    overrides: {}                  # profile overrides for every design (--set)
    notes: |                       # copied into report.md: what a reader must know

Each point runs ``command`` in the guest under one design with the firmware
attached (bound to the CXL node, or node 0 for a ``dram-only`` design); its
modelled time is the sum of its ROIs. Every key is checked: unknown keys,
unknown designs, a baseline or ideal that is not among the designs, a
placeholder without a sweep value are :class:`ConfigError` before anything runs.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError, InputError
from cxlssd.firmware.knobs import FirmwareKnob, knob_from_dict
from cxlssd.firmware.profile import load_profile
from cxlssd.platform.config import CONFIG_DIR
from cxlssd.yamlfile import read_yaml

EXPERIMENT_DIR = Path(__file__).resolve().parent
DEMO_FILE = EXPERIMENT_DIR / "demo.yaml"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Point:
    """One run: a workload (with its sweep values) under one design."""

    workload: str
    design: str
    params: dict[str, str]
    command: tuple[str, ...]
    inject: tuple[tuple[float, FirmwareKnob], ...] = ()

    @property
    def key(self) -> str:
        """Unique within an experiment; names the point in results (and for resuming)."""
        values = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.workload}[{values}]@{self.design}" if values else f"{self.workload}@{self.design}"

    @property
    def case(self) -> str:
        """The workload point without the design: what designs are compared on."""
        return self.key.rsplit("@", 1)[0]


def _substitute(arg: str, params: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: params[m.group(1)], arg)


@dataclass(frozen=True)
class Workload:
    name: str
    command: tuple[str, ...]
    sweep: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (at_ms, knob): applied that long in modelled time after the point's first request
    inject: tuple[tuple[float, FirmwareKnob], ...] = ()

    def cases(self) -> list[tuple[dict[str, str], tuple[str, ...]]]:
        """(params, command) for each combination of the sweep values."""
        keys = sorted(self.sweep)
        out = []
        for values in itertools.product(*(self.sweep[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            out.append((params, tuple(_substitute(arg, params) for arg in self.command)))
        return out


@dataclass(frozen=True)
class Experiment:
    name: str
    platform: Path
    designs: tuple[str, ...]
    workloads: tuple[Workload, ...]
    baseline: str
    ideal: str | None
    overrides: dict[str, Any]
    source: str
    notes: str = ""  # copied into the report: what the reader must know to read the results

    def points(self) -> list[Point]:
        """Every point, workload-major (all designs of a case run back to back)."""
        return [
            Point(w.name, design, params, command, w.inject)
            for w in self.workloads
            for params, command in w.cases()
            for design in self.designs
        ]


def _check_keys(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in raw:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"allowed: {', '.join(sorted(allowed))}"
            raise ConfigError(f"{where}: unknown key '{key}'; {fix}")


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str | int | float) for v in value):
        raise ConfigError(f"{where}: expected a non-empty list of strings, got {value!r}")
    return tuple(str(v) for v in value)


def _workload(raw: object, where: str) -> Workload:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with name and command")
    _check_keys(raw, {"name", "command", "sweep", "inject"}, where)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}: name {name!r} must be 1-64 letters, digits, '.', '-' or '_'")
    command = _strings(raw.get("command"), f"{where}.command")
    sweep_raw = raw.get("sweep") or {}
    if not isinstance(sweep_raw, dict):
        raise ConfigError(f"{where}.sweep: expected a mapping of placeholder to a list of values")
    sweep = {str(k): _strings(v, f"{where}.sweep.{k}") for k, v in sweep_raw.items()}
    used = {m for arg in command for m in _PLACEHOLDER.findall(arg)}
    if used - set(sweep):
        missing = sorted(used - set(sweep))[0]
        raise ConfigError(f"{where}.command uses {{{missing}}} but sweep gives it no values")
    if set(sweep) - used:
        raise ConfigError(f"{where}.sweep: {sorted(set(sweep) - used)[0]} is not used in the command")
    return Workload(name, command, sweep, _scenario(raw.get("inject") or [], f"{where}.inject"))


def _scenario(raw: object, where: str) -> tuple[tuple[float, FirmwareKnob], ...]:
    """Firmware knobs at modelled times (docs/inject.md): [{at_ms, kind, ...}, ...]."""
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list of {{at_ms: T, kind: KNOB, ...}}")
    events = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or "at_ms" not in entry:
            raise ConfigError(f"{where}[{i}]: needs at_ms (modelled ms after the first request) and a kind")
        at_ms = entry["at_ms"]
        if isinstance(at_ms, bool) or not isinstance(at_ms, int | float) or not 0 <= at_ms <= 3_600_000:
            raise ConfigError(f"{where}[{i}].at_ms: expected 0..3600000 ms, got {at_ms!r}")
        try:
            knob = knob_from_dict({k: v for k, v in entry.items() if k != "at_ms"})
        except InputError as error:
            raise ConfigError(f"{where}[{i}]: {error}") from None
        events.append((float(at_ms), knob))
    return tuple(events)


def _platform_path(value: object, base: Path, where: str) -> Path:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: platform must be a config name or a YAML path")
    for candidate in (CONFIG_DIR / f"{value}.yaml", base / value, Path(value)):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{where}: no platform config {value!r} (in {CONFIG_DIR} or as a path)")


def experiment_from_dict(raw: object, source: str, base: Path = EXPERIMENT_DIR) -> Experiment:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: an experiment is a mapping (name, designs, workloads, ...)")
    keys = {"name", "platform", "designs", "workloads", "baseline", "ideal", "overrides", "notes"}
    _check_keys(raw, keys, source)
    notes = raw.get("notes", "")
    if not isinstance(notes, str):
        raise ConfigError(f"{source}: notes must be text (it goes into the report)")
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{source}: name {name!r} must be 1-64 letters, digits, '.', '-' or '_'")
    designs = _strings(raw.get("designs"), f"{source}: designs")
    if len(set(designs)) != len(designs):
        raise ConfigError(f"{source}: designs lists a design twice")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: overrides must be a mapping of profile keys to values")
    for design in designs:
        load_profile(design, overrides)  # unknown designs and bad overrides fail now
    workloads_raw = raw.get("workloads")
    if not isinstance(workloads_raw, list) or not workloads_raw:
        raise ConfigError(f"{source}: workloads must be a non-empty list")
    workloads = tuple(_workload(w, f"{source}: workloads[{i}]") for i, w in enumerate(workloads_raw))
    if len({w.name for w in workloads}) != len(workloads):
        raise ConfigError(f"{source}: two workloads have the same name")
    baseline = raw.get("baseline", designs[0])
    ideal = raw.get("ideal", "dram-only" if "dram-only" in designs else None)
    role: str
    design_name: Any
    for role, design_name in (("baseline", baseline), ("ideal", ideal)):
        if design_name is not None and design_name not in designs:
            raise ConfigError(f"{source}: {role} {design_name!r} is not one of the designs {list(designs)}")
    return Experiment(
        name=name,
        platform=_platform_path(raw.get("platform", "default"), base, source),
        designs=designs,
        workloads=workloads,
        baseline=str(baseline),
        ideal=None if ideal is None else str(ideal),
        overrides=dict(overrides),
        source=source,
        notes=notes,
    )


def load_experiment(path: Path) -> Experiment:
    return experiment_from_dict(read_yaml(path, "experiment"), str(path), path.resolve().parent)
