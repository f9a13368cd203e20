"""``./cxlssd run --cluster``: points on a real Ray cluster (a head and a worker node on
127.0.0.1, in a network namespace of the test's own, so Ray listens on loopback only).

Marked ``cluster`` (and the live one ``guest`` too). The four without a guest take 1 to 3
minutes here (with the other sessions' load), the live one 1.5 to 4.5 more, so a run selects
them only when asked: ``./cxlssd test -m cluster`` (or ``-k cluster``; tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import cxlssd
from cxlssd.experiments.report import table_lines, write_results
from cxlssd.experiments.runner import POINTS_FILE, ExperimentRunner
from cxlssd.experiments.spec import load_experiment

REPO = Path(__file__).resolve().parents[2]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # Ray's CLI, from the Python running the tests
SHIPPED_SWEEP = REPO / "experiments" / "replay-sweep.yaml"
# The shipped sweep's traces shortened from 200 000 requests (the same designs and cases); longer
# where a replay must still be running when the test kills its worker.
REQUESTS = 20_000
REQUESTS_TO_KILL = 40_000
RUN_TIMEOUT_S = 300.0
START_TIMEOUT_S = 120.0

pytestmark = pytest.mark.cluster


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LoopbackCluster:
    """A Ray head and ``workers`` worker nodes (1 CPU each) on 127.0.0.1 inside the network
    namespace ``namespace``; the processes of the namespace are this cluster's own. ``env``:
    what the nodes' environment changes (their workers inherit it)."""

    def __init__(self, namespace: str, temp_dir: Path, workers: int = 1,
                 env: dict[str, str] | None = None) -> None:
        self.namespace = namespace
        self.temp_dir = temp_dir
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.client_port = _free_port()
        self.client_address = f"ray://127.0.0.1:{self.client_port}"  # Ray Client
        # This checkout's code (PYTHONPATH, from ./cxlssd) in the workers; a token of the test's own.
        self.token = temp_dir / "auth_token"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN_PATH": str(self.token)}
        self.node_env = {**self.env, **(env or {})}
        self.workers = workers

    def command(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]

    def start(self) -> None:
        self.temp_dir.mkdir(mode=0o700)
        self.token.write_text(secrets.token_hex(32))
        subprocess.run(["ip", "netns", "add", self.namespace], check=True)
        subprocess.run(self.command("ip", "link", "set", "lo", "up"), check=True)
        common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
        head = [*RAY, "start", "--head", "--port", str(self.port), "--include-dashboard=false",
                "--ray-client-server-port", str(self.client_port),
                "--temp-dir", str(self.temp_dir), *common]
        worker = [*RAY, "start", "--address", self.address, *common]
        for argv in (head, *[worker] * self.workers):
            started = subprocess.run(self.command(*argv), env=self.node_env, capture_output=True, text=True,
                                     timeout=START_TIMEOUT_S, cwd=self.temp_dir)
            assert started.returncode == 0, started.stdout + started.stderr

    def pids(self) -> list[int]:
        found = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def task_processes(self, name: str) -> list[int]:
        """The Ray worker processes running a task of function ``name`` now."""
        running = []
        for pid in self.pids():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(f"ray::{name}".encode()):
                running.append(pid)
        return running

    def stop(self) -> None:
        """End every process of the namespace (ours only), then remove it."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + 5
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
        subprocess.run(["ip", "netns", "del", self.namespace], check=False)
        # Why a Ray Client server did not start, in the test's output (shown if it fails).
        for log_file in sorted(self.temp_dir.glob("session_*/logs/ray_client_server*.err")):
            if text := log_file.read_text(errors="replace").strip():
                print(f"{log_file.name}:\n{text[-3000:]}")
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextlib.contextmanager
def _started(name: str, workers: int = 1, env: dict[str, str] | None = None) -> Iterator[LoopbackCluster]:
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root (as every ./cxlssd command here)")
    cluster = LoopbackCluster(f"cxlssd-{name}-{os.getpid()}", Path(f"/tmp/cxlssd-{name}-{os.getpid()}"),
                              workers, env)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LoopbackCluster]:
    with _started("raytest") as cluster:
        yield cluster


def _sweep(tmp_path: Path, requests: int = REQUESTS) -> Path:
    """The shipped replay sweep with shorter traces."""
    raw = yaml.safe_load(SHIPPED_SWEEP.read_text())
    for trace in raw["traces"]:
        trace["synth"]["requests"] = requests
    path = tmp_path / "replay-sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cxlssd", *args]


def _finish(process: subprocess.Popen[str]) -> str:
    output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    assert process.returncode == 0, output
    return output


def _table(output: str) -> list[str]:
    """The table the CLI printed (its indented lines)."""
    return [line for line in output.splitlines() if line.startswith("   ")]


def _rows(out: Path) -> list[dict[str, object]]:
    path = out / POINTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_replay_sweep_through_ray_client_gives_the_local_table(ray_cluster: LoopbackCluster,
                                                             tmp_path: Path) -> None:
    sweep = _sweep(tmp_path)
    remote = _run(ray_cluster.command(*_cli("run", str(sweep), "--out", str(tmp_path / "cluster"),
                                            "--cluster", ray_cluster.client_address)), env=ray_cluster.env)
    cluster_output = _finish(remote)
    experiment = load_experiment(sweep)
    local_out = tmp_path / "local"
    local = write_results(experiment, ExperimentRunner(experiment, local_out).run(), local_out)
    assert _table(cluster_output) == [f"   {line}" for line in table_lines(experiment, local["table"])]
    assert re.search(r"Ray cluster: 2 nodes", cluster_output), cluster_output
    assert len(_table(cluster_output)) > 30
    # Replays are exact: every row is the local one but for where it ran and its trace's folder.
    def comparable(row: dict[str, object]) -> dict[str, object]:
        trace = dict(row["trace"])  # type: ignore[call-overload]
        trace["path"] = Path(trace["path"]).name
        return {**row, "wall_s": None, "trace": trace}

    cluster_rows = {r["key"]: comparable(r) for r in _rows(tmp_path / "cluster")}
    local_rows = {r["key"]: comparable(r) for r in _rows(tmp_path / "local")}
    assert len(cluster_rows) == 30 and cluster_rows == local_rows
    csv = [(tmp_path / run / "results.csv").read_text() for run in ("cluster", "local")]
    assert csv[0] == csv[1]
    # A finished run resumes to nothing, without connecting to the cluster again.
    again = _finish(_run(_cli("run", str(sweep), "--out", str(tmp_path / "cluster"), "--cluster",
                              "127.0.0.1:1")))
    assert "all 30 points already done" in again


def test_a_killed_worker_reruns_its_point_once_and_ctrl_c_stops_a_resumable_run(
    ray_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    sweep = _sweep(tmp_path, REQUESTS_TO_KILL)
    argv = ray_cluster.command(*_cli("run", str(sweep), "--out", str(out), "--cluster", ray_cluster.address))
    run = _run(argv, env=ray_cluster.env)
    killed = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while run.poll() is None and time.monotonic() < deadline:
        running = ray_cluster.task_processes("replay_point")
        done = len(_rows(out))
        if killed is None and running and done >= 3:  # mid-run: some points recorded, others to come
            killed = running[0]
            os.kill(killed, signal.SIGKILL)
        if killed is not None and done >= 8:
            run.send_signal(signal.SIGINT)  # Ctrl-C (``ip netns exec`` execs the CLI itself)
            break
        time.sleep(0.02)
    output, _ = run.communicate(timeout=RUN_TIMEOUT_S)
    assert killed is not None, "no replay was running to kill"
    assert run.returncode == 130 and "interrupted" in output, output
    assert 8 <= len(_rows(out)) < 30
    # Not left running: Ray kills a job's tasks once its driver has left.
    deadline = time.monotonic() + 10
    while ray_cluster.task_processes("replay_point"):
        assert time.monotonic() < deadline, "replays still running 10 s after the driver left"
        time.sleep(0.1)
    # Run again: the rest of the points, and every point recorded exactly once.
    _finish(_run(argv, env=ray_cluster.env))
    keys = [row["key"] for row in _rows(out)]
    assert len(keys) == 30 and len(set(keys)) == 30


def test_an_unreachable_cluster_is_a_clear_error_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    failed = _run(_cli("run", str(_sweep(tmp_path)), "--out", str(tmp_path / "out"), "--cluster",
                       "127.0.0.1:1"))
    output, _ = failed.communicate(timeout=RUN_TIMEOUT_S)
    assert failed.returncode == 2, output
    assert "error: no Ray head answers at 127.0.0.1:1" in output
    assert time.monotonic() - began < 60 and not _rows(tmp_path / "out")


def test_nodes_that_cannot_run_the_points_are_named_before_anything_runs(tmp_path: Path) -> None:
    # A node whose cxlssd differs from the driver's by one comment, and without QEMU.
    # A checkout of its own: the package's core, its top-level folders and pyproject.toml
    # (which maps them into the package).
    other = tmp_path / "other"
    for _, root in cxlssd.package_roots():
        part = root.relative_to(REPO)
        shutil.copytree(REPO / part, other / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", other / "pyproject.toml")
    code = other / "src"
    with open(code / "cxlssd" / "errors.py", "a") as changed:
        changed.write("# another revision\n")
    others = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
              if path and Path(path).resolve() != (REPO / "src").resolve()]
    env = {"PYTHONPATH": os.pathsep.join([str(code), *others]), "CXLSSD_QEMU": str(tmp_path / "no-qemu")}
    experiment = tmp_path / "live.yaml"
    experiment.write_text(yaml.safe_dump({"name": "lv", "designs": ["base-cssd"],
                                          "workloads": [{"name": "chase", "command": ["chase"]}]}))
    with _started("raycheck", workers=0, env=env) as cluster:
        failed = _run(cluster.command(*_cli("run", str(experiment), "--out", str(tmp_path / "out"),
                                            "--cluster", cluster.address)), env=cluster.env)
        output, _ = failed.communicate(timeout=RUN_TIMEOUT_S)
    assert failed.returncode == 2, output
    assert "nodes of the Ray cluster cannot run this experiment" in output
    node = re.escape(f"{socket.gethostname()} (127.0.0.1)")
    assert re.search(node + r": its cxlssd code \(digest \w+\) is not the driver's", output), output
    assert re.search(node + r": .*no-qemu.*; run ./cxlssd setup there", output), output
    assert not _rows(tmp_path / "out")


def _our_processes(title: bytes) -> list[int]:
    """Processes whose title (first argument) holds ``title`` and that run in this session's
    runtime dir (``CXLSSD_RUNTIME`` in their environment: started under this test run)."""
    ours = f"CXLSSD_RUNTIME={os.environ['CXLSSD_RUNTIME']}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and title in (entry / "cmdline").read_bytes().split(b"\0")[0]
                    and ours in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.guest
def test_live_points_share_an_actors_guest_and_survive_a_killed_actor(tmp_path: Path) -> None:
    experiment = {
        "name": "live-ray", "designs": ["base-cssd", "dram-only"],
        "overrides": {"ssd_dram.size_bytes": "16MiB"},
        "workloads": [{"name": "chase", "command": ["chase", "--bytes", "4M", "--stride", "4096"]}],
    }
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(experiment))
    run = _run(_cli("run", str(path), "--out", str(tmp_path / "out"), "--cluster", "local"))
    # Kill the first actor (SIGKILL) while its guest boots: its QEMU dies with it, and the point
    # runs on a new actor, whose boot removes what the dead one left (the leak check after).
    killed = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while killed is None and run.poll() is None and time.monotonic() < deadline:
        actors = _our_processes(b"ray::GuestWorker")
        if actors and _our_processes(b"qemu-system"):
            killed = actors[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.1)
    output = _finish(run)
    assert killed is not None, output
    assert "chase@base-cssd: its worker died" in output and "it runs again on a new one" in output, output
    rows = {row["key"]: row for row in _rows(tmp_path / "out")}
    assert len(_rows(tmp_path / "out")) == 2 and sorted(rows) == ["chase@base-cssd", "chase@dram-only"]
    assert all(row["check_ok"] and row["kind"] == "live" for row in rows.values()), output
    # One guest ran both points (the new actor kept it), and it is gone now.
    assert len({row["instance"] for row in rows.values()}) == 1
    assert rows["chase@base-cssd"]["modelled_ns"] > rows["chase@dram-only"]["modelled_ns"]  # type: ignore[operator]
