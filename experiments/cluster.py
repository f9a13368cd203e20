"""Run an experiment's points on a Ray cluster: ``./cxlssd run EXPERIMENT.yaml --cluster ADDRESS``.

The driver (this process) does what a local run does around the points: it holds
``DIR/.lock``, sets a torn row aside, works out which points are pending from the rows'
input digests, synthesizes the traces, and appends each row to ``DIR/points.jsonl``
(synced) as its point finishes, with the progress and ETA; then the report is written
as after a local run (:class:`ExperimentRunner` does all of it; this class only
replaces where the points run). The points run on the cluster's nodes:

- a replay point is a Ray task declaring 1 CPU and :data:`REPLAY_MEMORY_BYTES`; the
  driver puts each trace into Ray's object store once, so a node needs no shared disk;
- live points run on :class:`GuestWorker` actors, each declaring what one guest takes
  (:func:`guest_resources`: its vCPUs and one more for the firmware process, its DRAM
  and CXL backing files and :data:`GUEST_OVERHEAD_BYTES`), as many actors as the
  cluster fits at once. An actor boots its guest on its node at its first point and
  keeps it for the next ones, as the local runner does, and boots a fresh one after a
  point that spoiled it (:func:`spoils_guest`).

Before anything is scheduled, every node runs a check (:func:`node_report`): this
package importable, with the driver's code digest (rows made by other code would be
recorded under the driver's digest), and for live points QEMU, the guest image and
the plugin there. A node that fails is a :class:`ClusterError` naming it.

A point whose worker dies (its process killed, its node lost) runs again elsewhere, up
to :data:`MAX_POINT_ATTEMPTS` times, and is recorded once: only the driver writes
rows, one per finished point. Ctrl-C (or SIGTERM) shuts every actor's guest down,
kills the actors and disconnects; Ray then kills the replay tasks still running, as
it does every task of a job whose driver left (not ``ray.cancel``: in Ray 2.60 a
cancel that races with the task's reply aborts the driver, "Tried to complete task
that was not pending", ray-project/ray#54846). QEMU and the firmware also die with
an actor killed any other way (``PR_SET_PDEATHSIG``), and the next boot on that node
removes what they left (``reap_stale_instances``).

``--cluster local`` starts a one-node Ray cluster for the run and stops it after. Ray
listens on every interface of the node's address, so the driver first moves into a
private network namespace holding only the loopback interface (root, as every
``./cxlssd`` command here): the head, its workers and their guests are reachable from
this process and its children only. Ray's dashboard is never started.
"""

from __future__ import annotations

import logging
import signal
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import ray
from pyroute2 import IPRoute
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cxlssd.errors import ClusterError, CxlssdError, PrerequisiteError
from cxlssd.experiments.runner import (
    ExperimentRunner,
    code_digest,
    live_row,
    materialize_trace,
    replay_row,
    spoils_guest,
    timed,
)
from cxlssd.experiments.spec import Experiment, Point
from cxlssd.guest.image import current_image, ensure_image
from cxlssd.platform.config import PlatformConfig, load_config
from cxlssd.platform.machine import Platform
from cxlssd.platform.network import unshare_network
from cxlssd.platform.plugin.build import ensure_plugin, plugin_path
from cxlssd.platform.qemu import check_qemu

log = logging.getLogger(__name__)

LOCAL = "local"  # --cluster local: a Ray head for this run only, on loopback
MiB = 1 << 20
# A replay's firmware model peaks at ~113 MiB RSS (docs/firmware.md, 10 M requests over
# 2 GiB); the Ray worker process and the trace in memory come on top.
REPLAY_MEMORY_BYTES = 512 * MiB
# Beside a guest's DRAM and CXL backing files: QEMU itself, the firmware process, the actor.
GUEST_OVERHEAD_BYTES = 1024 * MiB
MAX_POINT_ATTEMPTS = 3  # a point whose worker died this often stops the run
CONNECT_TIMEOUT_S = 10.0  # for the head to accept a TCP connection
CHECK_TIMEOUT_S = 300.0  # for every node's check (a busy node starts a worker slowly)
STOP_TIMEOUT_S = 120.0  # for the actors to shut their guests down at the end or on Ctrl-C
WAIT_S = 1.0  # between looks at the finished points (Ctrl-C is seen at once regardless)


@dataclass(frozen=True)
class Resources:
    """What one point's task or actor declares to Ray."""

    cpus: int
    memory_bytes: int

    def fits(self, node: dict[str, Any]) -> int:
        """How many fit at once on ``node`` (an entry of ``ray.nodes()``)."""
        have = node["Resources"]
        return int(min(have.get("CPU", 0) // self.cpus, have.get("memory", 0) // self.memory_bytes))

    def describe(self) -> str:
        return f"{self.cpus} CPU and {self.memory_bytes / MiB:.0f} MiB of memory"


REPLAY_RESOURCES = Resources(cpus=1, memory_bytes=REPLAY_MEMORY_BYTES)


def guest_resources(config: PlatformConfig) -> Resources:
    """What one guest of ``config`` takes on a node: its vCPUs and one CPU for the firmware
    model beside it; its DRAM, its CXL backing files and :data:`GUEST_OVERHEAD_BYTES`."""
    return Resources(cpus=config.guest.vcpus + 1,
                     memory_bytes=config.host_memory_bytes + GUEST_OVERHEAD_BYTES)


def node_report(guests: bool) -> dict[str, Any]:
    """Runs on a node: its code digest and what it lacks to run the points (``guests``:
    live points too, so QEMU, the guest image and the TCG plugin)."""
    problems = []
    if guests:
        try:
            check_qemu()
        except PrerequisiteError as error:
            problems.append(str(error))
        if not current_image().exists():
            problems.append("the guest image is not built")
        if not plugin_path().is_file():
            problems.append("the TCG plugin is not built")
    return {"code": code_digest(), "problems": problems}


def replay_point(point: Point, overrides: list[str], trace_bytes: bytes, trace_name: str) -> dict[str, Any]:
    """Runs on a node: ``point``'s replay row, from the trace's contents (written to a
    private temporary file there); the row names the trace as the driver has it."""
    with tempfile.TemporaryDirectory(prefix="cxlssd-replay-") as directory:
        trace = Path(directory) / Path(trace_name).name
        trace.write_bytes(trace_bytes)
        row = timed(partial(replay_row, point, trace, overrides))
    row["trace"]["path"] = trace_name
    return row


class GuestWorker:
    """A Ray actor holding one guest on its node: runs live points one after another
    on it, booting it at the first and again after a point that spoiled it.
    :meth:`stop` (callable while a point runs) shuts the guest down for good."""

    def __init__(self, experiment: Experiment, config: PlatformConfig) -> None:
        logging.basicConfig(level=logging.INFO, format="%(message)s")  # forwarded to the driver
        for chatty in ("paramiko", "qemu.qmp"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
        self.experiment = experiment
        self.config = config
        self._platform: Platform | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def run(self, point: Point) -> dict[str, Any]:
        platform = self._guest()
        row = timed(partial(live_row, self.experiment, platform, point))
        if spoils_guest(point, row):
            self._drop_guest()
        return row

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._drop_guest()

    def _guest(self) -> Platform:
        with self._lock:
            if self._stopped:
                raise ClusterError("this worker was stopped")
            if self._platform is not None:
                return self._platform
            platform = self._platform = Platform(self.config)
        try:
            platform.launch()  # a stop() meanwhile shuts it down: the launch then fails
        except BaseException:
            self._drop_guest()  # the next point boots anew
            raise
        return platform

    def _drop_guest(self) -> None:
        with self._lock:
            platform, self._platform = self._platform, None
        if platform is not None:
            platform.shutdown()


def enter_loopback_network() -> None:
    """Move this thread, and the Ray head it starts, into a private network namespace
    whose only interface is loopback (up)."""
    try:
        unshare_network()
    except PermissionError:
        raise PrerequisiteError("--cluster local runs Ray in a private network namespace, which needs "
                                "root: run ./cxlssd as root, as the README says") from None
    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def check_reachable(address: str) -> None:
    """A :class:`ClusterError` unless something accepts TCP connections at ``address``
    (``HOST:PORT`` or ``ray://HOST:PORT``) within :data:`CONNECT_TIMEOUT_S`: Ray itself
    retries an unreachable head for minutes."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if host is None or port is None:
        raise ClusterError(f"--cluster {address}: expected local, auto, HOST:PORT (the head's GCS "
                           "address, from a node of the cluster) or ray://HOST:PORT (Ray Client)")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise ClusterError(f"no Ray head answers at {address} ({error.strerror or error}); start one "
                           "(docs/experiments.md) or check the address") from None


@contextmanager
def connected(address: str) -> Iterator[None]:
    """Connected to the Ray cluster at ``address`` (``local``: a head started for this
    run, stopped after it) until the block ends."""
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address == LOCAL:
            enter_loopback_network()
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        else:
            if address != "auto":
                check_reachable(address)
            _init_remote(address)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {error}") from None
    finally:
        # ray.init makes SIGTERM exit at once; the CLI's handler stops the run like Ctrl-C.
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        ray.shutdown()


# What Ray Client's head says when the server process it starts for this client exited
# first: seen once under load (2 guests on 2 cores), the next connection worked.
CLIENT_SERVER_FAILED = "Starting Ray client server failed"


def _init_remote(address: str) -> None:
    """``ray.init`` at ``address``, once more if Ray Client's per-client server did not start."""
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError) as error:
        if CLIENT_SERVER_FAILED not in str(error):
            raise
        log.warning("the Ray head at %s could not start a client server for this run; trying once more",
                    address)
        ray.shutdown()
        ray.init(address=address, logging_level=logging.WARNING)


def _node_name(node: dict[str, Any]) -> str:
    return f"{node['NodeManagerHostname']} ({node['NodeManagerAddress']})"


def check_nodes(nodes: list[dict[str, Any]], guests: bool) -> None:
    """Run :func:`node_report` on every node; a :class:`ClusterError` naming each node
    that cannot run the points (or runs other code than the driver)."""
    check = ray.remote(num_cpus=0, max_retries=0)(node_report)
    refs = {
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        .remote(guests): node
        for node in nodes
    }
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
    problems = [f"{_node_name(refs[ref])}: no answer to the check within {CHECK_TIMEOUT_S:.0f} s"
                for ref in late]
    mine = code_digest()
    for ref in ready:
        name = _node_name(refs[ref])
        try:
            report = ray.get(ref)
        except ray.exceptions.RayError as error:
            cause = getattr(error, "cause", None) or error
            problems.append(f"{name}: cannot run cxlssd there ({str(cause).strip().splitlines()[-1]})")
            continue
        if report["code"] != mine:
            problems.append(f"{name}: its cxlssd code (digest {report['code']}) is not the driver's "
                            f"({mine}); update its checkout")
        problems += [f"{name}: {problem}; run ./cxlssd setup there" for problem in report["problems"]]
    if problems:
        raise ClusterError("nodes of the Ray cluster cannot run this experiment:\n  " + "\n  ".join(problems))


def capacity(nodes: list[dict[str, Any]], need: Resources, what: str) -> int:
    """How many of ``need`` the cluster fits at once; a :class:`ClusterError` if none."""
    fits = sum(need.fits(node) for node in nodes)
    if not fits:
        have = "; ".join(f"{_node_name(n)}: {n['Resources'].get('CPU', 0):.0f} CPU, "
                         f"{n['Resources'].get('memory', 0) / MiB:.0f} MiB" for n in nodes)
        raise ClusterError(f"no node of the Ray cluster has the {need.describe()} {what} needs ({have})")
    return fits


@dataclass
class _Job:
    """A point in flight: on an actor (live) or as a task (replay)."""

    point: Point
    worker: Any = None  # the GuestWorker actor running a live point
    attempts: int = 1


@dataclass
class _Dispatch:
    """The points in flight and the live points still waiting for a guest."""

    in_flight: dict[Any, _Job] = field(default_factory=dict)
    waiting: deque[_Job] = field(default_factory=deque)
    workers: list[Any] = field(default_factory=list)
    retiring: dict[Any, Any] = field(default_factory=dict)  # a worker's stop() -> the worker

    def retire(self, worker: Any) -> None:
        """Have ``worker`` shut its guest down (waited for at the end, by :func:`_stop`)."""
        self.workers.remove(worker)
        self.retiring[worker.stop.remote()] = worker


class ClusterRunner(ExperimentRunner):
    """:class:`ExperimentRunner` with the points run on the Ray cluster at ``address``."""

    def __init__(self, experiment: Experiment, out_dir: Path, address: str) -> None:
        super().__init__(experiment, out_dir)
        self.address = address

    def _execute(self, points_file: TextIO, pending: list[Point]) -> None:
        live = [p for p in pending if p.trace is None]
        replays = [p for p in pending if p.trace is not None]
        config = load_config(self.experiment.platform)
        if self.address == LOCAL and live:  # before Ray's private network: the image build downloads
            ensure_image()
            ensure_plugin()
        with connected(self.address):
            nodes = [node for node in ray.nodes() if node["Alive"]]
            log.info("Ray cluster: %d nodes, %s", len(nodes), ", ".join(_node_name(n) for n in nodes))
            check_nodes(nodes, guests=bool(live))
            dispatch = _Dispatch(waiting=deque(_Job(point) for point in live))
            guests = capacity(nodes, guest_resources(config), f"a guest of {config.source}") if live else 0
            if replays:
                capacity(nodes, REPLAY_RESOURCES, "a replay")
            try:
                self._submit_replays(dispatch, replays)
                actor = ray.remote(GuestWorker).options(
                    num_cpus=guest_resources(config).cpus, memory=guest_resources(config).memory_bytes,
                    max_concurrency=2,  # stop() runs while a point does
                    max_restarts=0, scheduling_strategy="SPREAD",
                )
                for _ in range(min(guests, len(live))):
                    dispatch.workers.append(actor.remote(self.experiment, config))
                    self._next_live(dispatch, dispatch.workers[-1])
                while dispatch.in_flight:
                    ready, _ = ray.wait(list(dispatch.in_flight), num_returns=1, timeout=WAIT_S)
                    for ref in ready:
                        self._finished(points_file, dispatch, ref, actor, config)
            finally:
                _stop(dispatch)

    def _submit_replays(self, dispatch: _Dispatch, replays: list[Point]) -> None:
        task = ray.remote(replay_point).options(
            num_cpus=REPLAY_RESOURCES.cpus, memory=REPLAY_RESOURCES.memory_bytes,
            max_retries=MAX_POINT_ATTEMPTS - 1,  # Ray runs it again elsewhere if its worker dies
        )
        traces: dict[Path, Any] = {}
        for point in replays:
            assert point.trace is not None
            trace = materialize_trace(point.trace, self.out_dir)
            if trace not in traces:
                traces[trace] = ray.put(trace.read_bytes())
            ref = task.remote(point, self.experiment.profile_overrides(point), traces[trace], str(trace))
            dispatch.in_flight[ref] = _Job(point)

    def _next_live(self, dispatch: _Dispatch, worker: Any) -> None:
        """Give ``worker`` the next waiting live point, or stop it if none is left."""
        if not dispatch.waiting:
            dispatch.retire(worker)
            return
        job = dispatch.waiting.popleft()
        job.worker = worker
        dispatch.in_flight[worker.run.remote(job.point)] = job

    def _finished(self, points_file: TextIO, dispatch: _Dispatch, ref: Any, actor: Any,
                  config: PlatformConfig) -> None:
        """Record the point behind ``ref``; a live one's actor takes the next point. A point
        whose actor died goes back to the front of the queue, on a new actor."""
        job = dispatch.in_flight.pop(ref)
        try:
            row = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            if job.attempts >= MAX_POINT_ATTEMPTS:
                raise ClusterError(f"{job.point.key}: its worker died {job.attempts} times, the last "
                                   f"time: {error}") from None
            log.warning("%s: its worker died (%s); it runs again on a new one",
                        job.point.key, str(error).strip().splitlines()[0])
            dispatch.workers.remove(job.worker)
            ray.kill(job.worker, no_restart=True)
            job.attempts += 1
            dispatch.waiting.appendleft(job)
            dispatch.workers.append(actor.remote(self.experiment, config))
            self._next_live(dispatch, dispatch.workers[-1])
            return
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, CxlssdError):
                raise ClusterError(f"{job.point.key}: {error.cause}") from None
            raise
        except ray.exceptions.RayError as error:  # a replay whose every attempt lost its worker
            raise ClusterError(f"{job.point.key}: its worker died {MAX_POINT_ATTEMPTS} times, the last "
                               f"time: {error}") from None
        self._keep(points_file, job.point, row)
        if job.worker is not None:
            self._next_live(dispatch, job.worker)


def _stop(dispatch: _Dispatch) -> None:
    """Have every worker shut its guest down (at most :data:`STOP_TIMEOUT_S`), then end
    the workers. Also after an error or Ctrl-C. The replays still in flight end when the
    driver disconnects (:func:`connected`)."""
    began = time.monotonic()
    for worker in list(dispatch.workers):
        dispatch.retire(worker)
    if dispatch.retiring:
        stopping = list(dispatch.retiring)
        _, late = ray.wait(stopping, num_returns=len(stopping), timeout=STOP_TIMEOUT_S)
        if late:
            log.warning("%d workers did not shut their guests down within %.0f s: killed (their QEMU "
                        "dies with them)", len(late), STOP_TIMEOUT_S)
    for worker in dispatch.retiring.values():
        ray.kill(worker, no_restart=True)
    if dispatch.in_flight:
        log.info("stopped the workers in %.1f s; %d points in flight end with this run and run again "
                 "next time", time.monotonic() - began, len(dispatch.in_flight))
