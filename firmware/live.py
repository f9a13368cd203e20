"""Live driver: the firmware fed by the TCG plugin's device-request ring.

The plugin (``platform/plugin/cxlssd_plugin.c``) writes one
:data:`~cxlssd.firmware.request.REQUEST_DTYPE` record per LLC miss or dirty
write-back in a CXL window, and one marker record per ROI marker, into a
shared-memory ring; this driver drains it in chunks (numpy views of the ring, no
copy), serves them through a :class:`~cxlssd.firmware.stream.StreamServer`
(the controller, plus the ROI results) and, on request, records the stream to a
trace file (:class:`~cxlssd.firmware.trace.TraceWriter`) so ``./cxlssd replay``
re-runs it under other designs and gives the same answers (DESIGN.md decision 5)::

    controller = Controller.from_profile(load_profile("skybyte-full"), timebase="compute")
    with LiveDriver(rundir / "plugin.ring", controller, record=Path("run.trace")) as driver:
        ...  # the guest runs; the driver's thread serves its requests
    # leaving the block drains what is left, closes the trace, detaches
    driver.server.results  # one dict per ROI, modelled time first

Request times are the vCPU's local clock (instructions x ``insn_ps`` plus DRAM
stalls, kept by the plugin), hence the ``compute`` timebase: the controller adds
the device stall it charged each vCPU, which closes the loop (a slow device
delays every later request of that vCPU). ``firmware serve`` runs this driver as
the platform's firmware process.

The driver runs in a thread of the platform's process. numpy and the
controller's inner loops release the GIL only in places, so it competes with
the caller's Python code for one core; the plugin waits (bounded) when the
ring is full.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cxlssd.abi.ring import RequestRing, RingError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.stream import StreamServer
from cxlssd.firmware.trace import TraceWriter
from cxlssd.lifecycle import Lifecycle

DEFAULT_CHUNK_RECORDS = 1 << 16
IDLE_SLEEP_S = 0.0005
# After serving something, poll without sleeping this long first: a guest waiting
# for an answer (a clock read, a long-delay query) usually asks again soon, and
# every 0.5 ms it waits is wall-clock time its timer interrupts run in.
BUSY_POLL_S = 0.002


class LiveDriver(Lifecycle):
    """Drain the plugin's ring into ``controller`` in a background thread.

    ``start()``/``stop()`` (or use it as a context manager). ``stop()`` drains
    every record the plugin has published, then detaches from the ring; an
    error in the thread (a bad record, the plugin giving up on the ring) is
    raised again by ``stop()`` and by :meth:`check`."""

    def __init__(
        self,
        ring_path: Path,
        controller: Controller,
        record: Path | None = None,
        metadata: dict[str, Any] | None = None,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
        cpu_counters: Callable[[int], dict[str, int] | None] | None = None,
        on_clock: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.ring_path = Path(ring_path)
        self.controller = controller
        self.server = StreamServer(controller, cpu_counters, on_clock)
        # Work for the serving thread, run before its next chunk (firmware knobs):
        # the controller is only ever touched by that thread.
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.before_chunk: Callable[[], None] | None = None
        self.record = record
        self.metadata = metadata or {}
        self.chunk_records = chunk_records
        self.requests = 0  # records served so far
        self.chunks = 0
        self.busy_s = 0.0  # time spent in Controller.process (and the trace writer)
        self.started_at = 0.0
        self.stopped_at = 0.0
        self._ring: RequestRing | None = None
        self._writer: TraceWriter | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._served = threading.Condition()

    # -- lifecycle -------------------------------------------------------------------

    def _begin(self) -> None:
        self.start()

    def _end(self, error: BaseException | None) -> None:
        # On an exception in the block, still stop cleanly, but let that one propagate.
        self.stop(raise_errors=error is None)

    def start(self) -> None:
        """Attach to the ring and start serving in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the live driver is already started")
        ring = RequestRing(self.ring_path)
        ring.open()
        self._ring = ring
        if self.record is not None:
            meta = {
                "source": "live",
                "ring": str(self.ring_path),
                "insn_ps": ring.insn_ps,
                **self.metadata,
            }
            self._writer = TraceWriter(self.record, meta, timebase=self._timebase())
        self._stop.clear()
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="cxlssd-live-firmware", daemon=True)
        self._thread.start()

    def stop(self, raise_errors: bool = True) -> None:
        """Serve what is left in the ring, close the trace, detach. Idempotent."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join()
            self._thread = None
            self.stopped_at = time.monotonic()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if raise_errors and self._error is not None:
            error, self._error = self._error, None
            raise error

    def _timebase(self) -> str:
        return "compute" if self.controller.compute_timebase else "issue"

    # -- serving -----------------------------------------------------------------------

    def call_soon(self, call: Callable[[], None]) -> None:
        """Run ``call`` in the serving thread before it serves the next chunk."""
        self._calls.put(call)

    def _serve_once(self, ring: RequestRing) -> int:
        while not self._calls.empty():
            self._calls.get()()
        if self.before_chunk is not None:
            self.before_chunk()
        chunk = ring.peek(self.chunk_records)
        n = int(chunk.shape[0])
        if n:
            began = time.perf_counter()
            self.server.serve(chunk)
            if self._writer is not None:
                self._writer.write(chunk)
            ring.release(n)
            self.busy_s += time.perf_counter() - began
            with self._served:
                self.requests += n
                self.chunks += 1
                self._served.notify_all()
        return n

    def _run(self) -> None:
        ring = self._ring
        assert ring is not None
        try:
            last_served = 0.0
            while not self._stop.is_set():
                if self._serve_once(ring):
                    last_served = time.perf_counter()
                else:
                    ring.check()
                    time.sleep(0 if time.perf_counter() - last_served < BUSY_POLL_S else IDLE_SLEEP_S)
            while self._serve_once(ring):  # drain after stop()
                pass
        except BaseException as error:  # re-raised by stop()/check()
            self._error = error
        finally:
            with self._served:
                self._served.notify_all()

    # -- for callers -----------------------------------------------------------------

    def check(self) -> None:
        """Raise the serving thread's error, or the plugin's verdict on the ring."""
        if self._error is not None:
            raise self._error
        if self._ring is not None:
            self._ring.check()

    @property
    def producer_exited(self) -> bool:
        """Whether QEMU's plugin has exited (nothing more will come)."""
        return self._ring is not None and self._ring.producer_exited

    def wait_drained(self, timeout_s: float = 60.0) -> int:
        """Wait until every record the plugin has published so far is served;
        returns the number served in total."""
        ring = self._ring
        if ring is None or self._thread is None:
            raise RuntimeError("the live driver is not running")
        target = ring.status().head
        deadline = time.monotonic() + timeout_s
        with self._served:
            while ring.status().tail < target:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the live driver did not drain the ring within {timeout_s:.0f} s")
                self._served.wait(min(left, 0.05))
            return self.requests

    def stats(self) -> dict[str, Any]:
        """Requests served, and the rate while running (wall clock of the host)."""
        end = self.stopped_at or time.monotonic()
        elapsed = max(end - self.started_at, 1e-9) if self.started_at else 0.0
        return {
            "requests": self.requests,
            "chunks": self.chunks,
            "busy_s": self.busy_s,
            "elapsed_s": elapsed,
            "requests_per_busy_s": self.requests / self.busy_s if self.busy_s else 0.0,
        }


__all__ = ["LiveDriver", "RingError"]
