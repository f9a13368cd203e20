"""Experiments: definitions are checked before anything runs; the runner resumes;
the report derives speedups and writes CSV, JSON, Markdown and plots; and (on the
session's guest) a small experiment runs end to end with the firmware live."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cxlssd.errors import ConfigError
from cxlssd.experiments.report import derive, summary, write_results
from cxlssd.experiments.runner import POINTS_FILE, ExperimentRunner, load_points
from cxlssd.experiments.spec import DEMO_FILE, experiment_from_dict, load_experiment
from cxlssd.platform.machine import Platform

BASE = {
    "name": "t",
    "designs": ["base-cssd", "skybyte-full", "dram-only"],
    "workloads": [
        {"name": "chase", "command": ["chase", "--bytes", "{size}"], "sweep": {"size": ["1M", "2M"]}},
    ],
}


def test_points_cover_every_case_and_design_with_substituted_commands() -> None:
    experiment = experiment_from_dict(BASE, "t.yaml")
    points = experiment.points()
    assert len(points) == 6 and experiment.baseline == "base-cssd" and experiment.ideal == "dram-only"
    assert points[0].command == ("chase", "--bytes", "1M") and points[0].key == "chase[size=1M]@base-cssd"
    assert points[3].case == "chase[size=2M]"
    assert load_experiment(DEMO_FILE).points()  # the shipped experiments are valid
    skybyte = load_experiment(DEMO_FILE.with_name("skybyte.yaml"))
    assert len(skybyte.designs) == 8 and skybyte.ideal == "dram-only"
    spikes = load_experiment(DEMO_FILE.with_name("scenario-spikes.yaml")).points()[0]
    assert [(at, knob.kind) for at, knob in spikes.inject][:2] == [
        (5.0, "latency-spike"), (60.0, "latency-spike"),
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"designs": ["base-cssd", "no-such"]}, "no-such"),
        ({"designs": ["base-cssd", "base-cssd"]}, "twice"),
        ({"baseline": "skybyte-w"}, "baseline 'skybyte-w' is not one of the designs"),
        ({"workloads": []}, "non-empty list"),
        ({"workloads": [{"name": "x", "command": ["chase", "{n}"]}]}, "uses {n} but sweep gives it no"),
        ({"workloads": [{"name": "x", "command": ["chase"], "sweep": {"n": ["1"]}}]}, "n is not used"),
        ({"workloads": [{"name": "x", "comand": ["chase"]}]}, "did you mean 'command'"),
        ({"platform": "nowhere"}, "no platform config 'nowhere'"),
        ({"overrides": {"cache.wayz": 4}}, "cache.wayz"),
        ({"colour": 1}, "unknown key 'colour'"),
        ({"workloads": [{"name": "x", "command": ["chase"], "inject": [{"kind": "link-latency"}]}]},
         "needs at_ms"),
        ({"workloads": [{"name": "x", "command": ["chase"], "inject": [{"at_ms": 1, "kind": "gc-party"}]}]},
         "not a firmware knob"),
    ],
)
def test_bad_definitions_are_clear_errors(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        experiment_from_dict({**BASE, **change}, "t.yaml")


def _row(key: str, design: str, ns: int, flash: int, ok: bool = True) -> dict[str, Any]:
    case = key.rsplit("@", 1)[0]
    return {
        "key": key, "case": case, "workload": "chase", "design": design, "modelled_ns": ns,
        "local_ns": ns // 2, "device_stall_ns": ns // 2, "instructions": 10,
        "device": {"requests": 5, "long_delays": 0},
        "flash": {"reads": flash, "programs": 0}, "check_ok": ok, "exit_status": 0,
    }


def test_report_derives_speedup_ideal_fraction_and_flash_reduction(tmp_path: Path) -> None:
    experiment = experiment_from_dict(BASE, "t.yaml")
    rows = {}
    for size, scale in (("1M", 1), ("2M", 2)):
        case = f"chase[size={size}]"
        rows[f"{case}@base-cssd"] = _row(f"{case}@base-cssd", "base-cssd", 8000 * scale, 100)
        rows[f"{case}@skybyte-full"] = _row(f"{case}@skybyte-full", "skybyte-full", 2000 * scale, 25)
        rows[f"{case}@dram-only"] = _row(f"{case}@dram-only", "dram-only", 1000 * scale, 0)
    table = derive(experiment, rows)
    full = [r for r in table if r["design"] == "skybyte-full"]
    assert [r["speedup"] for r in full] == [4.0, 4.0] and [r["fraction_of_ideal"] for r in full] == [0.5, 0.5]
    assert full[0]["flash_traffic_reduction"] == 4.0
    means = summary(experiment, table)
    assert means["skybyte-full"]["speedup"] == pytest.approx(4.0)
    assert means["dram-only"]["fraction_of_ideal"] == pytest.approx(1.0)
    del rows["chase[size=2M]@dram-only"]
    rows["chase[size=2M]@skybyte-full"]["check_ok"] = False
    written = write_results(experiment, rows, tmp_path)
    assert written["missing"] == ["chase[size=2M]@dram-only"]
    assert written["failed"] == ["chase[size=2M]@skybyte-full"]
    assert {p.name for p in written["plots"]} >= {"speedup.png", "speedup.svg", "flash_ops.png"}
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 5
    full_json = json.loads((tmp_path / "results.json").read_text())
    assert set(full_json["profiles"]) == set(experiment.designs) and full_json["versions"]["qemu"]
    report = (tmp_path / "report.md").read_text()
    assert "| chase[size=1M] | skybyte-full | 0.002 | 4.00 | 50.0% |" in report
    assert "Not run yet (1)" in report


def test_a_corrupt_points_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / POINTS_FILE).write_text("not json\n")
    with pytest.raises(Exception, match="not a results row"):
        load_points(tmp_path)


@pytest.mark.guest
def test_a_small_experiment_runs_live_and_resumes(default_platform: Platform, tmp_path: Path) -> None:
    definition = tmp_path / "mini.yaml"
    definition.write_text(yaml.safe_dump({
        "name": "mini", "designs": ["base-cssd", "dram-only"],
        "overrides": {"ssd_dram.size_bytes": "16MiB"},
        # 4096 pages: their lines overflow the LLC sets they map to, so every step misses it
        "workloads": [{"name": "chase", "command": ["chase", "--bytes", "16M", "--stride", "4096"],
                       "inject": [{"at_ms": 0.5, "kind": "latency-spike", "extra_ns": 500,
                                   "duration_ms": 1}]}],
    }))
    experiment = load_experiment(definition)
    out = tmp_path / "out"
    rows = ExperimentRunner(experiment, out, default_platform).run()
    assert set(rows) == {"chase@base-cssd", "chase@dram-only"}
    assert all(r["check_ok"] and r["modelled_ns"] > 0 for r in rows.values())
    base, dram = rows["chase@base-cssd"], rows["chase@dram-only"]
    assert base["modelled_ns"] > dram["modelled_ns"] and dram["device"]["requests"] == 0
    assert base["workload_report"]["cycle_ok"] is True
    assert [k["kind"] for k in base["knobs"]] == ["latency-spike", "latency-spike-start", "latency-spike-end"]
    # Resuming runs nothing more (no platform needed) and the report is written.
    assert ExperimentRunner(experiment, out, platform=None).pending() == []
    written = write_results(experiment, ExperimentRunner(experiment, out).run(), out)
    assert written["table"][1]["fraction_of_ideal"] == 1.0 and (out / "speedup.png").stat().st_size > 0
