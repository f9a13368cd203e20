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
    params: {threads: "3"}         # a command {placeholder} not swept: its value for every design
    design_params:                 # and per design (the case stays one: designs are compared on it)
      base-cssd: {threads: "1"}
    notes: |                       # copied into report.md: what a reader must know

A live point runs ``command`` in the guest under one design with the firmware
attached (bound to the CXL node, or the movable DRAM node for a ``dram-only`` design); its
modelled time is the sum of its ROIs. A replay point replays a trace under one
design with the replay driver (its ROIs if the trace has markers, else the
modelled end of its last request). A sweep key with a dot is a profile key
(every case sets it, like an override), one without is a ``{placeholder}`` of
the command. A placeholder may instead take its value from ``params``, and per
design from ``design_params``: the same case then runs a different command under
some designs (``skybyte.yaml``: SkyByte's artifact runs the designs without
context switching on one thread per core, those with it on three). Everything
is checked before anything runs: unknown keys, unknown designs, bad overrides, a
baseline or ideal that is not among the designs, a placeholder without a value,
a missing or corrupt trace, an injection that does not fit the platform's device
are :class:`ConfigError` (or
:class:`InputError` for files). The file is read into the models below
(:class:`~cxlssd.models.ConfigModel`, like platform files and profiles: one message
format, naming file, key path, value and fix); the reader then checks what needs
files or the designs' profiles.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import BeforeValidator, Field, field_validator, model_validator

from cxlssd.errors import ConfigError, InputError
from cxlssd.experiments.scenario import QmpEvent, ScenarioEntry, TimedKnob, check_events
from cxlssd.firmware.knobs import FirmwareKnob
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.synth import SynthSpec
from cxlssd.firmware.trace import TraceReader
from cxlssd.models import ConfigModel, number_in
from cxlssd.platform.config import CONFIG_DIR, load_config, platform_file
from cxlssd.platform.inject import DcLayout, DeviceView
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


def _name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{short_repr(name)} must be 1-64 letters, digits, '.', '-' or '_'")
    return name


def _strings(value: object) -> tuple[str, ...]:
    """A non-empty list of words (numbers too: YAML reads ``- 4096`` as one)."""
    if not isinstance(value, list | tuple) or not value or not all(
            isinstance(v, str | int | float) for v in value):
        raise ValueError(f"expected a non-empty list of strings, got {short_repr(value)}")
    return tuple(str(v) for v in value)


def _mapping_of(what: str) -> BeforeValidator:
    """A mapping (nothing under the key: an empty one) with text keys (YAML reads
    ``4096:`` as a number); the message says what it maps."""

    def check(value: object) -> dict[str, object]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping of {what}, got {short_repr(value)}")
        return {str(k): v for k, v in value.items()}

    return BeforeValidator(check)


def _word(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a word (a string or a number), got {short_repr(value)}")
    return str(value)


def _repeat(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEAT:
        raise ValueError(f"expected a whole number of runs, 1..{MAX_REPEAT}, got {short_repr(value)}")
    return value


def _platform(value: object) -> object:
    if not isinstance(value, str | Path):
        raise ValueError(f"expected a config name (of platform/configs) or a YAML path, "
                         f"got {short_repr(value)}")
    return value


def _none_is_empty(value: object) -> object:
    """A list key with nothing under it (``traces:``) is an empty list."""
    return () if value is None else value


Name = Annotated[str, BeforeValidator(_name)]
Words = Annotated[tuple[str, ...], BeforeValidator(_strings)]
# command placeholder -> its value
Params = Annotated[dict[str, Annotated[str, BeforeValidator(_word)]], _mapping_of("placeholders to values")]
# placeholder or dotted profile key -> values (one case per combination)
Sweep = Annotated[dict[str, Words], _mapping_of("placeholder or profile key to a list of values")]
Repeat = Annotated[int, BeforeValidator(_repeat)]


class Workload(ConfigModel):
    """What live and replay workloads share: a name and a sweep."""

    name: Name = Field(description="names the workload's points (letters, digits, '.', '-', '_')")
    sweep: Sweep = Field(default_factory=dict, description="placeholder or dotted profile key -> values; "
                         "one case per combination")

    # What a live workload has and a replay one does not.
    @property
    def command(self) -> tuple[str, ...]:
        return ()

    @property
    def knobs(self) -> tuple[tuple[float, FirmwareKnob], ...]:
        return ()

    @property
    def qmp(self) -> tuple[QmpEvent, ...]:
        return ()

    @property
    def placeholders(self) -> set[str]:
        return {m for arg in self.command for m in _PLACEHOLDER.findall(arg)}

    def cases(self) -> list[tuple[dict[str, str], tuple[str, ...]]]:
        """(params, profile overrides) for each combination of the sweep values."""
        keys = sorted(self.sweep)
        out = []
        for values in itertools.product(*(self.sweep[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            out.append((params, tuple(f"{k}={v}" for k, v in params.items() if "." in k)))
        return out


class LiveWorkload(Workload):
    """A guest command run under each design (``workloads:``)."""

    label: ClassVar[str] = "workload"
    command_words: Words = Field(validation_alias="command", description="the guest command and its "
                                 "arguments, with {placeholder}s of the sweep")
    inject: Annotated[tuple[ScenarioEntry, ...], BeforeValidator(_none_is_empty)] = Field(
        default=(), description="a scenario: firmware knobs with at_ms, QMP injections with at or "
        "after_s (docs/experiments.md)"
    )
    repeat: Repeat | None = Field(default=None, description="runs of every point (default: the experiment's)")
    designs: Words = Field(default=(), description="only these of the experiment's designs (default: all)")

    @model_validator(mode="after")
    def _sweep_used(self) -> Self:
        unused = {k for k in self.sweep if "." not in k} - self.placeholders
        if unused:
            raise ValueError(f"sweep: {sorted(unused)[0]} is not used in the command "
                             "(a profile key has a dot, e.g. cache.ways)")
        return self

    @property
    def command(self) -> tuple[str, ...]:
        return self.command_words

    @property
    def knobs(self) -> tuple[tuple[float, FirmwareKnob], ...]:
        """(at_ms, knob): applied that long in modelled time after the point's first request."""
        return tuple((e.at_ms, e.knob) for e in self.inject if isinstance(e, TimedKnob))

    @property
    def qmp(self) -> tuple[QmpEvent, ...]:
        return tuple(e for e in self.inject if isinstance(e, QmpEvent))


class TraceWorkload(Workload):
    """A replay workload's request stream (``traces:``): a trace file, or a synthetic one
    the runner writes into the results directory (``traces/NAME.trace``)."""

    label: ClassVar[str] = "trace"
    sweep: Sweep = Field(default_factory=dict, description="dotted profile key -> values (a replay has no "
                         "command); one case per combination")
    path: Path | None = Field(default=None, description="a trace file (--record, ./cxlssd trace synth), "
                              "relative to the experiment's file")
    synth: SynthSpec | None = Field(default=None, description="instead of path: a synthetic trace")

    @model_validator(mode="before")
    @classmethod
    def _no_repeat(cls, raw: object) -> object:
        if isinstance(raw, dict) and "repeat" in raw:
            raise ValueError("repeat is for live workloads: a replay gives the same answer every time "
                             "(sweep profile keys or designs instead)")
        return raw

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.path is None) == (self.synth is None):
            raise ValueError("give either path (a trace file, from --record or ./cxlssd trace synth) "
                             "or synth (a synthetic trace the runner writes)")
        return self

    @field_validator("sweep")
    @classmethod
    def _profile_keys(cls, sweep: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        bad = next((k for k in sweep if "." not in k), None)
        if bad is not None:
            raise ValueError(f"{short_repr(bad)} is not a profile key (a replay has no command, so it "
                             "sweeps profile keys such as context_switch.threshold_ns)")
        return sweep

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
    trace: TraceWorkload | None = None  # a replay point
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


class Experiment(ConfigModel):
    """An experiment file: designs x workloads (x sweeps, x repetitions)."""

    label: ClassVar[str] = "experiment"
    reader_fields: ClassVar[frozenset[str]] = frozenset({"source"})
    name: Name = Field(description="names the results (default: the file's name)")
    platform: Annotated[Path, BeforeValidator(_platform)] = Field(
        default=Path("default"), description="a config of platform/configs, or a YAML path"
    )
    designs: Words = Field(description="the designs to compare, e.g. [base-cssd, skybyte-full, dram-only]")
    # The defaults said come from the designs (_default_roles).
    baseline: str = Field(default="", description="speedups are over this design (default: the first)")
    ideal: str | None = Field(
        default=None, description="fraction of ideal is against this one (default: dram-only if a design)"
    )
    overrides: Annotated[dict[str, Any], _mapping_of("profile keys to values")] = Field(
        default_factory=dict, description="profile overrides for every design (like --set)"
    )
    params: Params = Field(default_factory=dict, description="values of command {placeholder}s "
                           "that no sweep gives, for every design (e.g. threads: 3)")
    design_params: Annotated[dict[str, Params], _mapping_of("designs to placeholder values")] = Field(
        default_factory=dict, description="per design, values that replace params' (e.g. base-cssd: "
        "{threads: 1}); the case stays the same, so the designs are still compared on it"
    )
    workloads: Annotated[tuple[LiveWorkload, ...], BeforeValidator(_none_is_empty)] = Field(
        default=(), description="live: guest commands under each design"
    )
    traces: Annotated[tuple[TraceWorkload, ...], BeforeValidator(_none_is_empty)] = Field(
        default=(), description="replay: recorded or synthetic traces, no guest"
    )
    notes: str = Field(default="", description="copied into the report: what a reader must know")
    repeat: Repeat = Field(default=1, description="runs of every live point (mean and spread reported)")
    point_timeout_s: Annotated[float, number_in(1, MAX_POINT_TIMEOUT_S, "seconds")] = Field(
        default=DEFAULT_POINT_TIMEOUT_S, description="wall-clock limit of a live point's command (a hung "
        "guest); then recorded as failed"
    )
    # Where it was read from, for messages; set by the reader, not a key of the file.
    source: str = "<dict>"

    @model_validator(mode="before")
    @classmethod
    def _default_roles(cls, raw: object) -> object:
        """The baseline is the first design and the ideal dram-only (if a design) unless given."""
        designs = raw.get("designs") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or not isinstance(designs, list | tuple) or not designs:
            return raw
        return {"baseline": designs[0], "ideal": "dram-only" if "dram-only" in designs else None, **raw}

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(set(self.designs)) != len(self.designs):
            raise ValueError("designs lists a design twice")
        for role, design in (("baseline", self.baseline), ("ideal", self.ideal)):
            if design is not None and design not in self.designs:
                raise ValueError(f"{role} {short_repr(design)} is not one of the designs "
                                 f"{list(self.designs)}")
        if not self.all_workloads:
            raise ValueError("workloads (live) or traces (replay) must be a non-empty list")
        if len({w.name for w in self.all_workloads}) != len(self.all_workloads):
            raise ValueError("two workloads or traces have the same name")
        for i, workload in enumerate(self.workloads):
            unknown = [d for d in workload.designs if d not in self.designs]
            if unknown:
                raise ValueError(f"workloads[{i}].designs: {short_repr(unknown[0])} is not one of the "
                                 f"designs {list(self.designs)}")
            self._check_placeholders(i, workload)
        unused = set(self.params) - {p for w in self.workloads for p in w.placeholders}
        if unused:
            raise ValueError(f"params: {sorted(unused)[0]} is not a {{placeholder}} of any workload's "
                             "command")
        for design, values in self.design_params.items():
            if design not in self.designs:
                raise ValueError(f"design_params: {short_repr(design)} is not one of the designs "
                                 f"{list(self.designs)}")
            if set(values) - set(self.params):
                raise ValueError(f"design_params.{design}: {sorted(set(values) - set(self.params))[0]} has "
                                 "no value in params: give there the value of the other designs")
        points = len(self.designs) * sum(
            math.prod(len(values) for values in w.sweep.values()) * self.repetitions(w)
            for w in self.all_workloads
        )
        if points > MAX_POINTS:
            raise ValueError(f"{points} points (designs x sweep cases x repetitions); at most "
                             f"{MAX_POINTS} per experiment: split it or sweep fewer values")
        return self

    def _check_placeholders(self, index: int, workload: LiveWorkload) -> None:
        swept = {k for k in workload.sweep if "." not in k}
        if swept & set(self.params):
            raise ValueError(f"workloads[{index}]: {{{sorted(swept & set(self.params))[0]}}} is both swept "
                             "and in params: give its values in one of them")
        missing = workload.placeholders - swept - set(self.params)
        if missing:
            raise ValueError(f"workloads[{index}]: command uses {{{sorted(missing)[0]}}} but neither its "
                             "sweep nor params gives it a value")

    @property
    def all_workloads(self) -> tuple[LiveWorkload | TraceWorkload, ...]:
        """The live workloads, then the replay ones."""
        return (*self.workloads, *self.traces)

    def points(self) -> list[Point]:
        """Every point, workload-major: all designs of a case back to back, repetition
        after repetition (so slow drift of the host affects every design alike)."""
        return [
            Point(w.name, design, params, self._command(w, design, params), w.knobs, w.qmp, overrides,
                  w if isinstance(w, TraceWorkload) else None, rep)
            for w in self.all_workloads
            for params, overrides in w.cases()
            for rep in range(1, self.repetitions(w) + 1)
            for design in self.designs
            if not isinstance(w, LiveWorkload) or not w.designs or design in w.designs
        ]

    def _command(self, workload: Workload, design: str, params: dict[str, str]) -> tuple[str, ...]:
        """``workload``'s command under ``design`` in the case ``params``."""
        values = {**self.params, **self.design_params.get(design, {}), **params}
        return tuple(_substitute(arg, values) for arg in workload.command)

    def repetitions(self, workload: Workload) -> int:
        if not isinstance(workload, LiveWorkload):
            return 1  # a replay is exactly repeatable
        return workload.repeat if workload.repeat is not None else self.repeat

    def profile_overrides(self, point: Point) -> list[str]:
        """KEY=VALUE overrides of ``point``'s design: the experiment's, then its case's."""
        return [*(f"{k}={v}" for k, v in self.overrides.items()), *point.overrides]


# The sections of an experiment file, for its reference (docs/experiments.md, generated)
SECTIONS: dict[str, type[ConfigModel]] = {
    "(top)": Experiment, "workloads[]": LiveWorkload, "workloads[].inject[] (knob)": TimedKnob,
    "workloads[].inject[] (QMP)": QmpEvent, "traces[]": TraceWorkload, "traces[].synth": SynthSpec,
}


def _platform_path(value: Path, base: Path, where: str) -> Path:
    found = platform_file(value, base, Path.cwd())
    if found is None:
        raise ConfigError(
            f"{where}: no platform config {short_repr(str(value))} (in {CONFIG_DIR} or as a path)"
        )
    return found


def _trace_file(trace: TraceWorkload, base: Path, where: str) -> TraceWorkload:
    """``trace`` with its file resolved against ``base`` and readable: a missing or
    corrupt file fails now, not after the other points."""
    if trace.path is None:
        return trace
    resolved = trace.path if trace.path.is_absolute() else base / trace.path
    if not resolved.is_file():
        raise InputError(f"{where}: trace {resolved} does not exist; record one (./cxlssd guest exec "
                         "--design D --record FILE -- CMD), write one (./cxlssd trace synth) or use synth:")
    TraceReader(resolved)
    return trace.model_copy(update={"path": resolved})


def experiment_from_dict(raw: object, source: str, base: Path = EXPERIMENT_DIR) -> Experiment:
    """The experiment of a YAML document; then what needs files and the designs'
    profiles: the platform config and trace files (relative to ``base``), the
    overrides and swept profile keys under every design, the injections against the
    platform's devices."""
    named = raw
    if raw is None or isinstance(raw, dict):  # an empty file: its problem is what is missing
        named = {"name": Path(source).stem, **(raw or {}), "source": source}
    parsed = Experiment.parse(named, source)
    for design in parsed.designs:
        load_profile(design, parsed.overrides)  # unknown designs and bad overrides fail now
    experiment = parsed.model_copy(update={
        "platform": _platform_path(parsed.platform, base, source),
        "traces": tuple(_trace_file(t, base, f"{source}: traces[{i}]") for i, t in enumerate(parsed.traces)),
    })
    devices = [DeviceView(index=i, size_bytes=d.size_bytes, dynamic_capacity=DcLayout.of_config(d))
               for i, d in enumerate(load_config(experiment.platform).cxl_devices)]
    for i, workload in enumerate(experiment.workloads):
        check_events(workload.qmp, devices, f"{source}: workloads[{i}].inject")
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
