"""Experiment definitions: designs x workloads (x parameter sweeps, x repetitions), from YAML.

Example (``experiments/demo.yaml``)::

    name: demo
    platform: default              # a config of platform/configs, or a YAML path
    designs: [base-cssd, skybyte-full, dram-only]
    baseline: base-cssd            # speedups are over this design
    ideal: dram-only               # "fraction of ideal" is against this one
    repeat: 1                      # live points run this many times (mean and spread reported)
    point_timeout_s: 3600          # a live point still running after this is recorded as failed
    workloads:                     # live: a guest command under each design
      - name: chase
        command: [chase, --bytes, "{footprint}", --warm, "1"]
        sweep: {footprint: [16M, 32M]}   # one case per value (a product over keys)
        repeat: 3                  # this workload's repetitions (overrides the experiment's)
        designs: [base-cssd, dram-only]  # only these of the experiment's designs (default: all)
      - name: kvstore-a
        command: [kvstore, --footprint, 16M, --mix, a]
        inject:                    # a scenario: firmware knobs at modelled times,
          - {at_ms: 5, kind: latency-spike, extra_ns: 2000, duration_ms: 10}
          - {after_s: 1, kind: poison, dpa: 0x200000}   # QMP injections by wall-clock (scenario.py)
    traces:                        # replay: a recorded or synthesized trace, no guest
      - name: zipf
        synth: {pattern: zipf, requests: 200000, footprint_bytes: 64MiB}
        sweep: {context_switch.threshold_ns: [2000, 20000]}   # dotted keys: profile keys
      - name: recorded
        path: runs/chase.trace     # relative to this file
    overrides: {}                  # profile overrides for every design (--set)
    notes: |                       # copied into report.md: what a reader must know

A live point runs ``command`` in the guest under one design with the firmware
attached (bound to the CXL node, or node 0 for a ``dram-only`` design); its
modelled time is the sum of its ROIs. A replay point replays a trace under one
design with the replay driver (its ROIs if the trace has markers, else the
modelled end of its last request). A sweep key with a dot is a profile key
(every case sets it, like an override), one without is a ``{placeholder}`` of
the command. Everything is checked before anything runs: unknown keys, unknown
designs, bad overrides, a baseline or ideal that is not among the designs, a
placeholder without a sweep value, a missing or corrupt trace, an injection
that does not fit the platform's device are :class:`ConfigError` (or
:class:`InputError` for files).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError, InputError
from cxlssd.experiments.scenario import QMP_KINDS, QmpEvent, check_events, qmp_event_from_dict
from cxlssd.firmware.knobs import KNOBS, FirmwareKnob, knob_from_dict
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.synth import SynthSpec
from cxlssd.firmware.trace import TraceReader
from cxlssd.platform.config import CONFIG_DIR, load_config
from cxlssd.platform.inject import DcLayout, DeviceView
from cxlssd.validation import check_keys, parse_size
from cxlssd.yamlfile import read_yaml, short_repr

EXPERIMENT_DIR = Path(__file__).resolve().parent
DEMO_FILE = EXPERIMENT_DIR / "demo.yaml"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_REPEAT = 100
MAX_POINTS = 10_000  # counted before any point is made: a sweep cannot exhaust memory
DEFAULT_POINT_TIMEOUT_S = 3600.0
MAX_POINT_TIMEOUT_S = 7 * 24 * 3600.0
TRACE_DIR = "traces"  # synthesized traces go here, in the results directory


@dataclass(frozen=True)
class TraceSource:
    """A replay workload's request stream: a trace file, or a synthetic one the
    runner writes into the results directory (``traces/NAME.trace``)."""

    name: str
    path: Path | None = None
    synth: SynthSpec | None = None

    def file(self, out_dir: Path) -> Path:
        return self.path if self.path is not None else out_dir / TRACE_DIR / f"{self.name}.trace"


@dataclass(frozen=True)
class Point:
    """One run: a workload case (its sweep values) under one design, one repetition."""

    workload: str
    design: str
    params: dict[str, str]
    command: tuple[str, ...]
    inject: tuple[tuple[float, FirmwareKnob], ...] = ()
    qmp: tuple[QmpEvent, ...] = ()
    overrides: tuple[str, ...] = ()  # KEY=VALUE profile keys of the case's sweep
    trace: TraceSource | None = None  # a replay point
    rep: int = 1

    @property
    def case(self) -> str:
        """The workload case without the design: what designs are compared on."""
        values = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.workload}[{values}]" if values else self.workload

    @property
    def key(self) -> str:
        """Unique within an experiment; names the point in results (and for resuming).
        Repetitions after the first carry ``#N``."""
        return f"{self.case}@{self.design}" + (f"#{self.rep}" if self.rep > 1 else "")

    @property
    def takes_down_cxl(self) -> bool:
        return any(event.takes_down_cxl for event in self.qmp)


def _substitute(arg: str, params: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: params[m.group(1)], arg)


@dataclass(frozen=True)
class Workload:
    """A live workload (``command``) or a replay one (``trace``)."""

    name: str
    command: tuple[str, ...] = ()
    # placeholder or dotted profile key -> values (one case per combination)
    sweep: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (at_ms, knob): applied that long in modelled time after the point's first request
    inject: tuple[tuple[float, FirmwareKnob], ...] = ()
    qmp: tuple[QmpEvent, ...] = ()
    repeat: int | None = None  # None: the experiment's
    trace: TraceSource | None = None
    designs: tuple[str, ...] = ()  # a subset of the experiment's designs; () = all of them

    def cases(self) -> list[tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]]:
        """(params, command, profile overrides) for each combination of the sweep values."""
        keys = sorted(self.sweep)
        out = []
        for values in itertools.product(*(self.sweep[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            command = tuple(_substitute(arg, params) for arg in self.command)
            overrides = tuple(f"{k}={v}" for k, v in params.items() if "." in k)
            out.append((params, command, overrides))
        return out


@dataclass(frozen=True)
class Experiment:
    name: str
    platform: Path
    designs: tuple[str, ...]
    workloads: tuple[Workload, ...]  # live ones, then replay ones (``traces:``)
    baseline: str
    ideal: str | None
    overrides: dict[str, Any]
    source: str
    notes: str = ""  # copied into the report: what the reader must know to read the results
    repeat: int = 1  # repetitions of every live point (a workload may say otherwise)
    # wall-clock limit of one live point's guest command (a hung guest): then recorded as failed
    point_timeout_s: float = DEFAULT_POINT_TIMEOUT_S

    def points(self) -> list[Point]:
        """Every point, workload-major: all designs of a case back to back, repetition
        after repetition (so slow drift of the host affects every design alike)."""
        return [
            Point(w.name, design, params, command, w.inject, w.qmp, overrides, w.trace, rep)
            for w in self.workloads
            for params, command, overrides in w.cases()
            for rep in range(1, self.repetitions(w) + 1)
            for design in self.designs
            if not w.designs or design in w.designs
        ]

    def repetitions(self, workload: Workload) -> int:
        if workload.trace is not None:
            return 1  # a replay is exactly repeatable
        return workload.repeat if workload.repeat is not None else self.repeat

    def profile_overrides(self, point: Point) -> list[str]:
        """KEY=VALUE overrides of ``point``'s design: the experiment's, then its case's."""
        return [*(f"{k}={v}" for k, v in self.overrides.items()), *point.overrides]


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str | int | float) for v in value):
        raise ConfigError(f"{where}: expected a non-empty list of strings, got {short_repr(value)}")
    return tuple(str(v) for v in value)


def _name(name: object, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}: name {short_repr(name)} must be 1-64 letters, digits, '.', '-' or '_'")
    return name


def _repeat(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEAT:
        raise ConfigError(
            f"{where}: repeat must be a whole number of runs, 1..{MAX_REPEAT}, got {short_repr(value)}"
        )
    return value


def _point_timeout(value: object, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 1 <= value <= MAX_POINT_TIMEOUT_S):  # also rejects NaN
        raise ConfigError(f"{where}: point_timeout_s must be 1..{MAX_POINT_TIMEOUT_S:.0f} seconds, "
                          f"got {short_repr(value)}")
    return float(value)


def _sweep(raw: object, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of placeholder or profile key to a list of values")
    return {str(k): _strings(v, f"{where}.{k}") for k, v in raw.items()}


def _workload(raw: object, where: str) -> Workload:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with name and command")
    check_keys(raw, {"name", "command", "sweep", "inject", "repeat", "designs"}, where)
    name = _name(raw.get("name"), where)
    command = _strings(raw.get("command"), f"{where}.command")
    sweep = _sweep(raw.get("sweep") or {}, f"{where}.sweep")
    placeholders = {k for k in sweep if "." not in k}
    used = {m for arg in command for m in _PLACEHOLDER.findall(arg)}
    if used - placeholders:
        missing = sorted(used - placeholders)[0]
        raise ConfigError(f"{where}.command uses {{{missing}}} but sweep gives it no values")
    if placeholders - used:
        raise ConfigError(f"{where}.sweep: {sorted(placeholders - used)[0]} is not used in the command "
                          "(a profile key has a dot, e.g. cache.ways)")
    knobs, qmp = _scenario(raw.get("inject") or [], f"{where}.inject")
    repeat = _repeat(raw["repeat"], f"{where}") if "repeat" in raw else None
    designs = _strings(raw["designs"], f"{where}.designs") if "designs" in raw else ()
    return Workload(name, command, sweep, knobs, qmp, repeat, designs=designs)


_SYNTH_SIZES = ("footprint_bytes", "hot_bytes")


def _synth(raw: object, where: str) -> SynthSpec:
    """A SynthSpec from its YAML mapping (the ``./cxlssd trace synth`` parameters)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping such as {{pattern: zipf, requests: 200000, "
                          "footprint_bytes: 64MiB}")
    known = set(SynthSpec.__dataclass_fields__)
    check_keys(raw, known, where)
    values: dict[str, Any] = {k: parse_size(v, f"{where}.{k}") if k in _SYNTH_SIZES else v
                              for k, v in raw.items()}
    defaults = SynthSpec()
    for key, value in values.items():
        default = getattr(defaults, key)
        wanted = str if isinstance(default, str) else int | float if isinstance(default, float) else int
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise ConfigError(f"{where}.{key}: expected a value like {default!r}, got {short_repr(value)}")
    spec = SynthSpec(**values)
    try:
        spec.check()
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    return spec


def _trace(raw: object, where: str, base: Path) -> Workload:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with name and path or synth")
    if "repeat" in raw:
        raise ConfigError(f"{where}: repeat is for live workloads: a replay gives the same answer "
                          "every time (sweep profile keys or designs instead)")
    check_keys(raw, {"name", "path", "synth", "sweep"}, where)
    name = _name(raw.get("name"), where)
    if ("path" in raw) == ("synth" in raw):
        raise ConfigError(f"{where}: give either path (a trace file, from --record or ./cxlssd trace synth) "
                          "or synth (a synthetic trace the runner writes)")
    sweep = _sweep(raw.get("sweep") or {}, f"{where}.sweep")
    if any("." not in k for k in sweep):
        bad = next(k for k in sweep if "." not in k)
        raise ConfigError(f"{where}.sweep: {short_repr(bad)} is not a profile key (a replay has no command, "
                          "so it sweeps profile keys such as context_switch.threshold_ns)")
    if "synth" in raw:
        synth = _synth(raw["synth"], f"{where}.synth")
        return Workload(name, sweep=sweep, trace=TraceSource(name, synth=synth))
    path = raw["path"]
    if not isinstance(path, str):
        raise ConfigError(f"{where}.path: expected a file name, got {short_repr(path)}")
    resolved = Path(path) if Path(path).is_absolute() else base / path
    if not resolved.is_file():
        raise InputError(f"{where}: trace {resolved} does not exist; record one (./cxlssd guest exec "
                         "--design D --record FILE -- CMD), write one (./cxlssd trace synth) or use synth:")
    TraceReader(resolved)  # a corrupt or foreign file fails now, not after the other points
    return Workload(name, sweep=sweep, trace=TraceSource(name, path=resolved))


def _scenario(raw: object, where: str) -> tuple[tuple[tuple[float, FirmwareKnob], ...], tuple[QmpEvent, ...]]:
    """Firmware knobs at modelled times ([{at_ms, kind, ...}], docs/inject.md) and QMP
    injections timed by the workload ([{after_s | at, kind, ...}], scenario.py)."""
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list of {{at_ms: T, kind: KNOB, ...}} or "
                          "{after_s: S, kind: QMP-KIND, ...}")
    knobs, qmp = [], []
    for i, entry in enumerate(raw):
        here = f"{where}[{i}]"
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if isinstance(entry, dict) and kind in QMP_KINDS:
            qmp.append(qmp_event_from_dict(entry, here))
            continue
        if not isinstance(entry, dict) or kind not in KNOBS:
            raise ConfigError(f"{here}: kind {short_repr(kind)} is not a firmware knob "
                              f"({', '.join(KNOBS)}; timed by "
                              f"at_ms) or a QMP injection ({', '.join(QMP_KINDS)}; timed by after_s or at)")
        if "at_ms" not in entry:
            raise ConfigError(f"{here}: {kind} is a firmware knob: it needs at_ms (modelled ms after "
                              "the first request)")
        at_ms = entry["at_ms"]
        if isinstance(at_ms, bool) or not isinstance(at_ms, int | float) or not 0 <= at_ms <= 3_600_000:
            raise ConfigError(f"{here}.at_ms: expected 0..3600000 ms, got {short_repr(at_ms)}")
        try:
            knob = knob_from_dict({k: v for k, v in entry.items() if k != "at_ms"}, here)
        except InputError as error:  # an experiment's problem is its configuration's
            raise ConfigError(str(error)) from None
        knobs.append((float(at_ms), knob))
    return tuple(knobs), tuple(qmp)


def _platform_path(value: object, base: Path, where: str) -> Path:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: platform must be a config name or a YAML path")
    for candidate in (CONFIG_DIR / f"{value}.yaml", base / value, Path(value)):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{where}: no platform config {short_repr(value)} (in {CONFIG_DIR} or as a path)")


def _entries(raw: dict[str, Any], key: str, source: str) -> list[Any]:
    entries = raw.get(key) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: {key} must be a list")
    return entries


def experiment_from_dict(raw: object, source: str, base: Path = EXPERIMENT_DIR) -> Experiment:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: an experiment is a mapping (name, designs, workloads, ...)")
    keys = {"name", "platform", "designs", "workloads", "traces", "baseline", "ideal", "overrides", "notes",
            "repeat", "point_timeout_s"}
    check_keys(raw, keys, source)
    notes = raw.get("notes", "")
    if not isinstance(notes, str):
        raise ConfigError(f"{source}: notes must be text (it goes into the report)")
    name = _name(raw.get("name", Path(source).stem), source)
    designs = _strings(raw.get("designs"), f"{source}: designs")
    if len(set(designs)) != len(designs):
        raise ConfigError(f"{source}: designs lists a design twice")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: overrides must be a mapping of profile keys to values")
    for design in designs:
        load_profile(design, overrides)  # unknown designs and bad overrides fail now
    live = [_workload(w, f"{source}: workloads[{i}]")
            for i, w in enumerate(_entries(raw, "workloads", source))]
    replay = [_trace(t, f"{source}: traces[{i}]", base)
              for i, t in enumerate(_entries(raw, "traces", source))]
    workloads = (*live, *replay)
    if not workloads:
        raise ConfigError(f"{source}: workloads (live) or traces (replay) must be a non-empty list")
    if len({w.name for w in workloads}) != len(workloads):
        raise ConfigError(f"{source}: two workloads or traces have the same name")
    baseline = raw.get("baseline", designs[0])
    ideal = raw.get("ideal", "dram-only" if "dram-only" in designs else None)
    role: str
    design_name: Any
    for role, design_name in (("baseline", baseline), ("ideal", ideal)):
        if design_name is not None and design_name not in designs:
            raise ConfigError(
                f"{source}: {role} {short_repr(design_name)} is not one of the designs {list(designs)}"
            )
    platform = _platform_path(raw.get("platform", "default"), base, source)
    devices = [DeviceView(index=i, size_bytes=d.size_bytes, dynamic_capacity=DcLayout.of_config(d))
               for i, d in enumerate(load_config(platform).cxl_devices)]
    for i, workload in enumerate(live):
        check_events(workload.qmp, devices, f"{source}: workloads[{i}].inject")
        unknown = [d for d in workload.designs if d not in designs]
        if unknown:
            raise ConfigError(f"{source}: workloads[{i}].designs: {short_repr(unknown[0])} is not one of "
                              f"the designs {list(designs)}")
    experiment = Experiment(
        name=name,
        platform=platform,
        designs=designs,
        workloads=workloads,
        baseline=str(baseline),
        ideal=None if ideal is None else str(ideal),
        overrides=dict(overrides),
        source=source,
        notes=notes,
        repeat=_repeat(raw["repeat"], source) if "repeat" in raw else 1,
        point_timeout_s=_point_timeout(raw.get("point_timeout_s", DEFAULT_POINT_TIMEOUT_S), source),
    )
    points = len(designs) * sum(
        math.prod(len(values) for values in w.sweep.values()) * experiment.repetitions(w) for w in workloads
    )
    if points > MAX_POINTS:
        raise ConfigError(f"{source}: {points} points (designs x sweep cases x repetitions); at most "
                          f"{MAX_POINTS} per experiment: split it or sweep fewer values")
    # A swept profile key must suit every design: checked for each case now.
    for point in {(p.design, p.overrides): p for p in experiment.points() if p.overrides}.values():
        try:
            load_profile(point.design, experiment.profile_overrides(point))
        except ConfigError as error:
            raise ConfigError(f"{source}: sweep {', '.join(point.overrides)} under {point.design}: "
                              f"{error}") from None
    return experiment


def load_experiment(path: Path) -> Experiment:
    return experiment_from_dict(read_yaml(path, "experiment"), str(path), path.resolve().parent)
