"""Results that are right or visibly refused: rows carry the digests of their inputs
and run again when one changed; a torn last row is set aside; one run at a time per
results dir; a live point past its timeout is recorded as failed (no VM); fault
campaigns, replay (no VM) and live (guests of the runner's own, opt-in: ``-m campaign``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from cxlssd.errors import ConfigError, GuestTimeout
from cxlssd.experiments.report import write_results
from cxlssd.experiments.runner import (
    POINTS_FILE,
    TIMED_OUT_STATUS,
    ExperimentRunner,
    load_points,
    locked_out_dir,
    point_inputs,
)
from cxlssd.experiments.spec import experiment_from_dict, load_experiment
from cxlssd.lifecycle import ProcessId
from cxlssd.paths import runtime_root
from cxlssd.platform.machine import Platform

SYNTH = {"pattern": "zipf", "requests": 2000, "footprint_bytes": "4MiB", "seed": 3}
REPLAY = {
    "name": "ri", "designs": ["base-cssd", "dram-only"],
    "overrides": {"ssd_dram.size_bytes": "1MiB", "write_log.size_bytes": "128KiB"},
    "traces": [{"name": "z", "synth": SYNTH}],
}
LIVE = {"name": "lv", "designs": ["base-cssd", "dram-only"],
        "workloads": [{"name": "chase", "command": ["chase", "--bytes", "4M"]}]}
CAMPAIGN = {**LIVE, "name": "fc", "workloads": [
    *LIVE["workloads"], {"name": "chase-warm", "command": ["chase", "--bytes", "4M", "--warm", "2"]}]}
# How far a live point's modelled time may differ between two boots: chase's was 0.0015 %
# apart (base-cssd) and equal (dram-only) in two runs of fresh guests on 2026-12-02.
LIVE_SPREAD = 0.01


def _reruns(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "runs again" in r.getMessage()]


def test_a_changed_input_reruns_its_points_and_says_which(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    first = ExperimentRunner(experiment_from_dict(REPLAY, "ri.yaml"), out).run()
    assert len(first) == 2 and all(r["inputs"]["code"] for r in first.values())
    assert ExperimentRunner(experiment_from_dict(REPLAY, "ri.yaml"), out).pending() == []
    # The profile after overrides changed (base-cssd's cache shrinks; dram-only has none to shrink).
    smaller = {**REPLAY, "overrides": {**REPLAY["overrides"], "ssd_dram.size_bytes": "512KiB"}}
    caplog.set_level(logging.INFO)
    again = ExperimentRunner(experiment_from_dict(smaller, "ri.yaml"), out).pending()
    assert [p.key for p in again] == ["z@base-cssd", "z@dram-only"]
    assert "z@base-cssd runs again: its profile changed since it ran" in _reruns(caplog)
    rows = ExperimentRunner(experiment_from_dict(smaller, "ri.yaml"), out).run()
    assert rows["z@base-cssd"]["modelled_ns"] != first["z@base-cssd"]["modelled_ns"]
    # The synthetic trace's spec changed: the trace is written anew and the points rerun.
    caplog.clear()
    other = {**smaller, "traces": [{"name": "z", "synth": {**SYNTH, "seed": 4}}]}
    assert len(ExperimentRunner(experiment_from_dict(other, "ri.yaml"), out).pending()) == 2
    assert any("its trace changed" in m for m in _reruns(caplog))


def test_a_changed_command_or_platform_reruns_live_points(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    experiment = experiment_from_dict(LIVE, "lv.yaml")
    tmp_path.joinpath(POINTS_FILE).write_text("".join(
        json.dumps({"key": p.key, "inputs": point_inputs(experiment, p)}) + "\n" for p in experiment.points()
    ))
    assert ExperimentRunner(experiment, tmp_path).pending() == []
    edited = {**LIVE, "workloads": [{"name": "chase", "command": ["chase", "--bytes", "8M"]}]}
    assert len(ExperimentRunner(experiment_from_dict(edited, "lv.yaml"), tmp_path).pending()) == 2
    assert "chase@base-cssd runs again: its command changed since it ran" in _reruns(caplog)
    caplog.clear()
    moved = experiment_from_dict({**LIVE, "platform": "two-devices"}, "lv.yaml")
    assert len(ExperimentRunner(moved, tmp_path).pending()) == 2
    assert "chase@dram-only runs again: its platform changed since it ran" in _reruns(caplog)
    # A row from before the digests: it runs again too, never silently kept.
    tmp_path.joinpath(POINTS_FILE).write_text(json.dumps({"key": "chase@base-cssd"}) + "\n")
    assert [p.key for p in ExperimentRunner(experiment, tmp_path).pending()] == [
        "chase@base-cssd", "chase@dram-only"]


def test_a_torn_last_row_is_set_aside_and_its_point_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    experiment = experiment_from_dict(REPLAY, "ri.yaml")
    rows = ExperimentRunner(experiment, out).run()
    points = out / POINTS_FILE
    whole = points.read_text().splitlines(keepends=True)
    torn = whole[1][: len(whole[1]) // 2]
    points.write_text(whole[0] + torn)  # killed while writing the second row
    assert set(load_points(out)) == {"z@base-cssd"}  # readable meanwhile: the torn row is skipped
    assert "torn row" in caplog.text
    again = ExperimentRunner(experiment, out).run()
    assert again == rows | {"z@dram-only": again["z@dram-only"]}
    assert again["z@dram-only"]["modelled_ns"] == rows["z@dram-only"]["modelled_ns"]
    assert (out / f"{POINTS_FILE}.torn").read_text() == torn + "\n"
    assert points.read_text().endswith("\n") and len(points.read_text().splitlines()) == 2


def test_a_bad_row_before_the_last_is_an_error_that_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / POINTS_FILE).write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(Exception, match=r"points.jsonl:2 is not a results row.*the other rows are kept"):
        load_points(tmp_path)


def test_two_runs_cannot_write_to_one_results_dir(tmp_path: Path) -> None:
    experiment = experiment_from_dict(REPLAY, "ri.yaml")
    with locked_out_dir(tmp_path), pytest.raises(ConfigError, match=r"another run \(pid \d+\) is writing to"):
        ExperimentRunner(experiment, tmp_path).run()
    assert not (tmp_path / POINTS_FILE).exists()
    assert len(ExperimentRunner(experiment, tmp_path).run()) == 2  # free again afterwards


class _HungSession:
    """A live session whose guest command never ends (what GuestSSH.run then raises)."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def __enter__(self) -> _HungSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, argv: list[str], timeout_s: float) -> tuple[int, bytes, bytes]:
        raise GuestTimeout(f"the guest command did not finish within {timeout_s:.0f} s: {' '.join(argv)}")


class _HungPlatform:
    name = "hung-000000"

    def lost_connection_explained(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # its QEMU never dies

    def attach(self, design: str, overrides: list[str]) -> _HungSession:
        return _HungSession()


def test_a_timed_out_point_is_recorded_failed_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    experiment = experiment_from_dict({**LIVE, "point_timeout_s": 5}, "lv.yaml")
    rows = ExperimentRunner(experiment, tmp_path, cast(Platform, _HungPlatform())).run()
    assert set(rows) == {"chase@base-cssd", "chase@dram-only"}
    for row in rows.values():
        assert row["timed_out"] and row["exit_status"] == TIMED_OUT_STATUS and not row["check_ok"]
        assert "did not finish within 5 s" in row["stderr_tail"]
    assert re.search(r"chase@base-cssd did not finish within point_timeout_s = 5 s", caplog.text)
    written = write_results(experiment, rows, tmp_path)
    assert sorted(written["failed"]) == ["chase@base-cssd", "chase@dram-only"]


@pytest.mark.parametrize("value", [0, -1, ".nan", ".inf", "soon", True])
def test_point_timeout_must_be_a_sane_number_of_seconds(value: object) -> None:
    parsed = {".nan": float("nan"), ".inf": float("inf")}.get(str(value), value)
    with pytest.raises(ConfigError, match=r"lv\.yaml: point_timeout_s: expected 1\.\.604800 seconds, got "):
        experiment_from_dict({**LIVE, "point_timeout_s": parsed}, "lv.yaml")


def _run_command(definition: Path, out: Path) -> tuple[list[str], dict[str, str]]:
    """``./cxlssd run DEFINITION --out OUT`` as a child process of the tests (argv, env)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return [sys.executable, "-m", "cxlssd", "run", str(definition), "--out", str(out)], env


def _row_count(points: Path) -> int:
    """Rows in ``points`` so far (0 before the file exists)."""
    return points.read_bytes().count(b"\n") if points.exists() else 0


def _kill_when(process: subprocess.Popen[bytes], ready: Callable[[], bool]) -> bool:
    """SIGKILL ``process`` as soon as ``ready()`` holds; False if it exited first."""
    while process.poll() is None:
        if ready():
            process.kill()
            process.wait()
            return True
        time.sleep(0.005)
    return False


def test_a_runner_killed_at_random_points_resumes_to_the_uninterrupted_results(tmp_path: Path) -> None:
    """Fault campaign (replay points, no VM): SIGKILL ./cxlssd run during the trace's
    synthesis and then once a random number of rows is written (mid-replay of the
    next), resuming each time; every point ends up in points.jsonl exactly once and
    equal to an uninterrupted run's row, and no partial trace is left."""
    definition = tmp_path / "fc.yaml"
    definition.write_text(json.dumps({
        **REPLAY, "designs": ["base-cssd", "skybyte-c", "dram-only"],
        "traces": [{"name": "z", "synth": {**SYNTH, "requests": 100_000},
                    "sweep": {"context_switch.threshold_ns": [2000, 20000]}}],
    }))
    experiment = load_experiment(definition)
    reference = ExperimentRunner(experiment, tmp_path / "reference").run()
    out = tmp_path / "out"
    points = out / POINTS_FILE

    def rows() -> int:
        return _row_count(points)

    moments: list[Callable[[], bool]] = [(out / "traces" / "z.trace.partial").exists]
    for count in sorted(random.Random(16).sample(range(1, len(reference)), 3)):
        moments.append(lambda count=count: rows() >= count)
    argv, env = _run_command(definition, out)
    rows_at_kills = []
    for ready in moments:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if _kill_when(process, ready):
            rows_at_kills.append(rows())
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
    keys = [json.loads(line)["key"] for line in points.read_text().splitlines()]
    assert sorted(keys) == sorted(reference), rows_at_kills
    resumed = load_points(out)
    for key, expected in reference.items():
        for field_name in ("modelled_ns", "device", "flash", "latency_percentiles_ns", "inputs", "check_ok"):
            assert resumed[key][field_name] == expected[field_name], (key, field_name)
    assert not list(out.rglob("*.partial"))
    assert len(rows_at_kills) == 4 and rows_at_kills[0] == 0, rows_at_kills


def _new_instance(runtime: Path, before: set[str], has: str) -> Path | None:
    """The instance directory a run started after ``before`` was listed, once it holds ``has``."""
    found = [p for p in runtime.iterdir() if p.name not in before and (p / has).exists()]
    return found[0] if found else None


@pytest.mark.guest
@pytest.mark.campaign
def test_a_live_run_killed_in_its_firmware_qemu_and_runner_resumes_to_every_point_once(
    default_platform: Platform, tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Fault campaign on guests of the runner's own (``./cxlssd run`` as a user starts
    it): the firmware killed mid-point, QEMU SIGKILLed mid-point, the runner SIGKILLed
    mid-point, each after a random delay; every run resumes the previous one. The two
    runs that lost a part stop with one line naming it and leave no process or file;
    the SIGKILLed runner's guest dies with it. The last run completes: every point once,
    each passing its self-check, the modelled times those of an uninterrupted run on the
    session's guest within the spread between boots."""
    definition = tmp_path / "fc.yaml"
    definition.write_text(json.dumps(CAMPAIGN))
    experiment = load_experiment(definition)
    reference = ExperimentRunner(experiment, tmp_path / "reference", default_platform).run()
    runtime = runtime_root()
    out = tmp_path / "out"
    points = out / POINTS_FILE
    rng = random.Random(16)

    def rows() -> int:
        return _row_count(points)

    argv, env = _run_command(definition, out)

    def attached(before: set[str], rows_before: int) -> Callable[[], Path | None]:
        """The run's instance once a point past ``rows_before`` rows has its firmware."""
        return lambda: _new_instance(runtime, before, "firmware.json") if rows() >= rows_before else None

    def kill_firmware(instance: Path) -> None:
        # The moment may fall between two points, when no firmware is attached (seen on
        # a host where the first point ended within the delay): kill the next one.
        deadline = time.monotonic() + 120
        while (kill := cli("inject", "--instance", instance.name, "firmware-kill")).returncode != 0:
            assert "attach one first" in kill.stderr and time.monotonic() < deadline, kill.stderr
            time.sleep(0.05)

    def kill_qemu(instance: Path) -> None:
        qemu = ProcessId.read(instance / "qemu.pid")
        assert qemu is not None and qemu.kill()

    ended: list[tuple[str, int | None, str]] = []
    for part, kill, after_rows in (("firmware", kill_firmware, 0), ("QEMU", kill_qemu, 0),
                                   ("runner", None, 1)):
        before = {p.name for p in runtime.iterdir()}
        done_before = rows()
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            ready = attached(before, done_before + after_rows)
            deadline = time.monotonic() + 900
            while (instance := ready()) is None:
                assert process.poll() is None and time.monotonic() < deadline, part
                time.sleep(0.05)
            time.sleep(rng.uniform(0.5, 4.0))
            if kill is None:
                process.kill()
            else:
                kill(instance)
            _, stderr = process.communicate(timeout=300)
            # The error's first line; what follows it is the dead part's log tail.
            text = stderr.decode(errors="replace")
            errors = [line for line in text.splitlines() if line.startswith("error: ")]
            ended.append((part, process.returncode, errors[0] if errors else ""))
            assert "Traceback" not in text, text
            assert not instance.exists() or kill is None, (part, errors)
        finally:
            if process.poll() is None:  # the test failed mid-part: no run may outlive it
                process.kill()
                process.communicate()
    (_, firmware_status, firmware_error), (_, qemu_status, qemu_error), runner = ended
    assert firmware_status == qemu_status == 2, ended
    assert re.search(r"firmware process \(design [\w-]+, pid \d+\) killed by SIGKILL", firmware_error), ended
    assert "QEMU" in qemu_error, ended
    assert runner[1:] == (-9, ""), ended
    finished = subprocess.run(argv, env=env, capture_output=True, timeout=900)
    assert finished.returncode == 0, finished.stderr.decode(errors="replace")[-2000:]
    keys = [json.loads(line)["key"] for line in points.read_text().splitlines()]
    assert sorted(keys) == sorted(reference), (keys, ended)
    resumed = load_points(out)
    for key, expected in reference.items():
        row = resumed[key]
        assert row["check_ok"] and expected["check_ok"], key
        assert row["modelled_ns"] == pytest.approx(expected["modelled_ns"], rel=LIVE_SPREAD), key
    print(f"campaign: {ended}; rows {[(k, resumed[k]['modelled_ns']) for k in sorted(resumed)]}")
