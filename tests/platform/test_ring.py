"""The device-request ring: its reader against a synthetic producer (the C
layout written from Python), the live driver (served == recorded == replayed),
and the real plugin in a bare SeaBIOS machine (LLC + ring end to end, a dead
or stalled firmware does not hang the guest). The real-guest test (a stride
over N lines gives exactly N device reads) is in test_plugin.py, which shares
one booted guest."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cxlssd.abi import protocol
from cxlssd.abi.counters import PluginCounters
from cxlssd.abi.ring import RequestRing, RingError
from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live import LiveDriver
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.request import REQUEST_DTYPE, Op, make_requests
from cxlssd.firmware.trace import TraceReader
from cxlssd.platform.plugin.build import ensure_plugin

QEMU = "qemu-system-x86_64"
DESIGN = "skybyte-full"


# -- a synthetic producer: the plugin's side of the ring, in Python ------------------------


class FakeProducer:
    """Creates a ring file with the plugin's layout and publishes records into it."""

    def __init__(self, path: Path, capacity: int, insn_ps: int = 333) -> None:
        self.path = path
        self.capacity = capacity
        size = protocol.RING_HEADER_BYTES + capacity * REQUEST_DTYPE.itemsize
        with open(path, "wb") as f:
            f.write(bytes(size))
        self._mem = np.memmap(path, np.uint8, "r+")
        self.u32 = self._mem[: protocol.RING_HEADER_BYTES].view(np.uint32)
        self.u64 = self._mem[: protocol.RING_HEADER_BYTES].view(np.uint64)
        self.records = self._mem[protocol.RING_HEADER_BYTES :].view(REQUEST_DTYPE)
        header = struct.pack("<QIIIIQQQQI", 0, 1, 256, 24, capacity, size, os.getpid(), insn_ps, 10**9, 1)
        self._mem[: len(header)] = np.frombuffer(header, np.uint8)
        self.u64[0] = protocol.RING_MAGIC
        self.head = 0

    def push(self, requests: np.ndarray) -> int:
        """Publish as many of ``requests`` as fit; returns how many."""
        room = self.capacity - (self.head - int(self.u64[16]))
        n = min(room, requests.shape[0])
        for i in range(n):
            self.records[(self.head + i) % self.capacity] = requests[i]
        self.head += n
        self.u64[8] = self.head
        return n

    def set_state(self, state: int) -> None:
        self.u32[14] = state

    @property
    def consumer_state(self) -> int:
        return int(self.u32[34])


def _stream(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lines = rng.zipf(1.3, n) % (1 << 16)
    ops = (rng.random(n) < 0.3).astype(np.uint8)
    return make_requests(lines * 64, ops, time_ns=np.arange(n) * 50)


def test_reader_peeks_views_releases_and_wraps(tmp_path: Path) -> None:
    producer = FakeProducer(tmp_path / "ring", capacity=8)
    stream = _stream(20)
    with RequestRing(tmp_path / "ring") as ring:
        assert producer.consumer_state == protocol.RING_ATTACHED and ring.capacity == 8
        assert ring.peek().shape == (0,)
        assert producer.push(stream[:6]) == 6
        chunk = ring.peek()
        assert chunk.base is not None and np.array_equal(chunk, stream[:6])  # a view, not a copy
        ring.release(6)
        assert producer.push(stream[6:20]) == 8  # full: 8 more fit
        first = ring.peek()  # up to the end of the storage (slots 6, 7)
        assert np.array_equal(first, stream[6:8])
        ring.release(2)
        second = ring.peek(max_records=4)
        assert np.array_equal(second, stream[8:12])
        ring.release(4)
        assert ring.pending() == 2
        with pytest.raises(ValueError, match="only 2 pending"):
            ring.release(3)
        status = ring.status()
        assert (status.head, status.tail, status.state) == (14, 12, "running")
        ring.check()
        producer.set_state(protocol.RING_CONSUMER_GONE)
        with pytest.raises(RingError, match="consumer gone"):
            ring.check()
    assert producer.consumer_state == protocol.RING_DETACHED


def test_a_new_consumer_skips_what_a_dead_one_left(tmp_path: Path) -> None:
    """Records queued for a consumer that died belong to its run: the next
    consumer starts at the head."""
    producer = FakeProducer(tmp_path / "ring", capacity=8)
    stream = _stream(5)
    assert producer.push(stream[:3]) == 3
    with RequestRing(tmp_path / "ring") as ring:
        assert ring.peek().shape == (0,) and ring.status().tail == 3
        assert producer.push(stream[3:]) == 2
        assert np.array_equal(ring.peek(), stream[3:])
    # A consumer that died attached (its pid is gone) does not block the next one.
    dead = subprocess.Popen(["true"])
    dead.wait()
    producer.u64[18] = dead.pid
    producer.u32[34] = protocol.RING_ATTACHED
    with RequestRing(tmp_path / "ring") as ring:
        assert producer.u64[18] == os.getpid()


def test_reader_refuses_a_second_consumer_and_bad_files(tmp_path: Path) -> None:
    FakeProducer(tmp_path / "ring", capacity=4)
    with RequestRing(tmp_path / "ring"):
        with pytest.raises(InputError, match=r"another consumer .*is attached"):
            RequestRing(tmp_path / "ring").open(timeout_s=0)
        with RequestRing(tmp_path / "ring", consume=False) as observer:
            assert observer.status().head == 0
            with pytest.raises(InputError, match="observer"):
                observer.peek()
    (tmp_path / "junk").write_bytes(bytes(4096))
    with pytest.raises(InputError, match="not a ready cxlssd request ring"):
        RequestRing(tmp_path / "junk").open(timeout_s=0)
    producer = FakeProducer(tmp_path / "v9", capacity=4)
    producer.u32[2] = 9
    with pytest.raises(InputError, match="ring version 9"):
        RequestRing(tmp_path / "v9").open(timeout_s=0)


def test_live_driver_serves_records_and_replays_identically(tmp_path: Path) -> None:
    """A producer thread pushes 100k requests through a 4096-record ring; the
    driver serves them all, the trace holds them all, and replaying the trace
    gives the live controller's counters exactly."""
    producer = FakeProducer(tmp_path / "ring", capacity=4096)
    stream = _stream(100_000)
    profile = load_profile(DESIGN)
    live = Controller.from_profile(profile, timebase="compute")
    trace = tmp_path / "live.trace"

    def produce() -> None:
        sent = 0
        while sent < stream.shape[0]:
            pushed = producer.push(stream[sent : sent + 1024])
            sent += pushed
            if not pushed:
                time.sleep(0.0002)

    with LiveDriver(tmp_path / "ring", live, record=trace, metadata={"test": "synthetic"}) as driver:
        thread = threading.Thread(target=produce)
        thread.start()
        thread.join(timeout=120)
        assert driver.wait_drained() == stream.shape[0]
    stats = driver.stats()
    print(f"live driver: {stats['requests']} requests, {stats['requests_per_busy_s']:.0f} requests/s busy")
    reader = TraceReader(trace)
    assert reader.records == stream.shape[0] and reader.timebase == "compute"
    assert reader.metadata["test"] == "synthetic" and reader.metadata["source"] == "live"
    assert np.array_equal(reader.read_all(), stream)
    replayed = replay_file(trace, profile)
    assert replayed["counters"] == driver.server.device_counters()


def test_live_driver_reports_a_bad_record_on_stop(tmp_path: Path) -> None:
    producer = FakeProducer(tmp_path / "ring", capacity=16)
    bad = make_requests([1 << 50], Op.READ)  # beyond the device
    driver = LiveDriver(tmp_path / "ring", Controller.from_profile(load_profile(DESIGN)))
    driver.start()
    producer.push(bad)
    time.sleep(0.3)
    with pytest.raises(InputError, match="invalid"):
        driver.stop()
    driver.stop()  # idempotent
    assert producer.consumer_state == protocol.RING_DETACHED


# -- the real plugin, in a bare machine (SeaBIOS only, seconds) -------------------------------


@pytest.fixture(scope="module")
def plugin() -> Path:
    return ensure_plugin()


def _bare_qemu(plugin_arg: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [QEMU, "-M", "q35", "-accel", "tcg", "-display", "none", "-monitor", "none", "-serial", "none",
         "-plugin", plugin_arg],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def stop_qemu() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for qemu in started:
        if qemu.poll() is None:
            qemu.terminate()
        output, _ = qemu.communicate(timeout=60)
        print(f"QEMU output: {output.decode(errors='replace')}")


LOW_MEMORY = 0xA0000  # SeaBIOS lives here: published as a "CXL window"
DPA_BASE = 0x1000000


def test_seabios_requests_flow_through_llc_ring_and_firmware(
    plugin: Path, tmp_path: Path, stop_qemu: list[subprocess.Popen[bytes]]
) -> None:
    out, shm, ring_path, trace = (tmp_path / n for n in ("c.json", "c", "ring", "t.trace"))
    qemu = _bare_qemu(f"{plugin},out={out},shm={shm},ring={ring_path},llc=65536,llc_ways=4,ring_records=1024")
    stop_qemu.append(qemu)
    profile = load_profile(DESIGN)
    live = Controller.from_profile(profile, timebase="compute")
    with PluginCounters(shm) as counters, LiveDriver(ring_path, live, record=trace) as driver:
        assert (counters.llc_bytes, counters.llc_ways, counters.insn_ps) == (65536, 4, 333)
        counters.publish_window(0, LOW_MEMORY, DPA_BASE)
        time.sleep(1.5)
        qemu.terminate()
        qemu.wait(timeout=60)
        served = driver.wait_drained()
    report = json.loads(out.read_text())
    totals, ring = report["totals"], report["ring"]
    print(f"totals {totals}\nring {ring}\ndriver {driver.stats()}")
    # Every CXL miss is one device read, every CXL dirty write-back one device write.
    assert totals["llc_misses_cxl"] == totals["device_reads"] > 0
    assert totals["writebacks_cxl"] == totals["device_writes"]
    assert totals["llc_hits_cxl"] > totals["llc_misses_cxl"]  # SeaBIOS reuses its lines
    assert totals["llc_hits_dram"] + totals["llc_misses_dram"] > 0
    # All of them went through the ring to the firmware (consumer attached first).
    assert ring["dropped"] == 0 and ring["producer_state"] == protocol.RING_EXITED
    assert served == ring["published"] == totals["device_reads"] + totals["device_writes"]
    assert live.counter_dict()["model"]["requests"] == served
    records = TraceReader(trace).read_all()
    assert records.shape[0] == served
    assert ((records["addr"] >= DPA_BASE) & (records["addr"] < DPA_BASE + LOW_MEMORY)).all()
    assert (records["addr"] % 64 == 0).all() and (records["size"] == 64).all()
    assert (np.diff(records["time_ns"].astype(np.int64)) >= 0).all()  # one vCPU: in order
    assert replay_file(trace, profile)["counters"] == driver.server.device_counters()


def test_without_llc_every_window_access_is_a_request(
    plugin: Path, tmp_path: Path, stop_qemu: list[subprocess.Popen[bytes]]
) -> None:
    out = tmp_path / "c.json"
    qemu = _bare_qemu(f"{plugin},out={out},llc=0,window=0:{LOW_MEMORY}")
    stop_qemu.append(qemu)
    time.sleep(1.0)
    qemu.terminate()
    qemu.wait(timeout=60)
    totals = json.loads(out.read_text())["totals"]
    assert totals["llc_hits_cxl"] == totals["llc_hits_dram"] == totals["writebacks_cxl"] == 0
    # One request per line touched by each access (an access may span two lines).
    accesses = totals["cxl_loads"] + totals["cxl_stores"]
    assert accesses <= totals["device_reads"] + totals["device_writes"] == totals["llc_misses_cxl"]
    assert totals["device_reads"] >= totals["cxl_loads"] and totals["device_writes"] >= totals["cxl_stores"]


def _wait_state(observer: RequestRing, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while observer.status().producer_state == protocol.RING_RUNNING:
        assert time.monotonic() < deadline, f"the plugin kept waiting: {observer.status()}"
        time.sleep(0.05)
    return observer.status().producer_state


CONSUMER_SCRIPT = """
import sys, time
from cxlssd.abi.ring import RequestRing
ring = RequestRing(sys.argv[1]); ring.open()
print("attached", flush=True)
time.sleep(600)
"""


def test_dead_firmware_does_not_hang_the_guest(
    plugin: Path, tmp_path: Path, stop_qemu: list[subprocess.Popen[bytes]]
) -> None:
    """The consumer process is killed: the plugin notices (its pid is gone),
    stops waiting, counts drops and says so in the ring header."""
    ring_path = tmp_path / "ring"
    qemu = _bare_qemu(
        f"{plugin},shm={tmp_path / 'c'},ring={ring_path},llc=0,ring_records=16,ring_timeout_ms=600000"
    )
    stop_qemu.append(qemu)
    consumer = subprocess.Popen(
        [sys.executable, "-c", CONSUMER_SCRIPT, str(ring_path)], stdout=subprocess.PIPE
    )
    try:
        assert consumer.stdout is not None and consumer.stdout.readline() == b"attached\n"
        with PluginCounters(tmp_path / "c") as counters, RequestRing(ring_path, consume=False) as observer:
            counters.publish_window(0, LOW_MEMORY)
            time.sleep(0.5)
            assert observer.status().head == 16  # full, the guest waits on the live consumer
            os.kill(consumer.pid, signal.SIGKILL)
            consumer.wait(timeout=30)
            began = time.monotonic()
            assert _wait_state(observer) == protocol.RING_CONSUMER_GONE
            print(f"gave up {time.monotonic() - began:.3f} s after the consumer died")
            before = counters.snapshot()
            time.sleep(0.5)
            after = counters.snapshot()
            assert after.insns > before.insns  # the guest runs on
            assert observer.status().dropped > 0 and after.total("device_dropped") > 0
            with pytest.raises(RingError, match="consumer gone"):
                observer.check()
    finally:
        consumer.kill()
        consumer.wait(timeout=30)


def test_stalled_firmware_times_out(
    plugin: Path, tmp_path: Path, stop_qemu: list[subprocess.Popen[bytes]]
) -> None:
    ring_path, out = tmp_path / "ring", tmp_path / "c.json"
    qemu = _bare_qemu(
        f"{plugin},out={out},shm={tmp_path / 'c'},ring={ring_path},llc=0,ring_records=16,ring_timeout_ms=300"
    )
    stop_qemu.append(qemu)
    with PluginCounters(tmp_path / "c") as counters, RequestRing(ring_path) as ring:  # never drained
        counters.publish_window(0, LOW_MEMORY)
        assert _wait_state(ring) == protocol.RING_CONSUMER_STALLED
        status = ring.status()
        assert status.full_waits >= 1 and status.wait_ns >= 300_000_000 and status.dropped > 0
        with pytest.raises(RingError, match="consumer stalled"):
            ring.check()
        qemu.terminate()
        qemu.wait(timeout=60)
    # the wait for room is one of the vCPU's waits for the firmware, all in sleeps after the spin
    waits = json.loads(out.read_text())["firmware_waits"]
    assert waits["waits"] == status.full_waits and waits["host_wait_ns"] >= 300_000_000
    assert waits["sleeps"] >= 300_000_000 // 20_000 // 10  # 20 us sleeps (each longer on a busy host)
