"""The firmware process: the live driver serving a running guest until told to stop.

``./cxlssd serve-firmware`` runs :func:`serve`; the platform starts it as a
process of its own (``platform/firmware_process.py``) so the model neither
competes for the GIL with the platform's SSH traffic nor dies silently with it:
a dead firmware process is something the platform detects and reports. It stops
on SIGTERM or SIGINT (or when QEMU exits), serves what is left in the ring and
writes its results (counters, ROI results, driver statistics) as JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from cxlssd.firmware.context_switch import NeverSwitch
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live import LiveDriver
from cxlssd.firmware.profile import Profile
from cxlssd.platform.plugin.counters import PluginCounters
from cxlssd.platform.plugin.pv import ClockPage
from cxlssd.platform.plugin.ring import RequestRing

log = logging.getLogger(__name__)

POLL_S = 0.1


def _cpu_counters(counters: PluginCounters) -> Any:
    def lookup(event: int) -> dict[str, int] | None:
        found = counters.roi_events(event)[:1]
        return dataclasses.asdict(found[0].counters) if found else None

    return lookup


def serve(
    ring_path: Path,
    profile: Profile,
    results_path: Path,
    counters_path: Path | None = None,
    record: Path | None = None,
    stop: threading.Event | None = None,
    pv_path: Path | None = None,
) -> dict[str, Any]:
    """Serve the ring until ``stop`` is set (SIGTERM/SIGINT set it when this
    runs in the main thread) or the plugin exits; write and return the results."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: object) -> None:
            log.info("firmware: %s received, stopping", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
    controller = Controller.from_profile(profile, timebase="compute")
    not_applied = []  # what the profile asks for that a live run cannot honour yet
    if profile["context_switch.enabled"]:
        # Hiding a long delay is honest only if the guest really switched to other
        # work meanwhile: that needs the guest-side runtime (issue 5). Until then a
        # live run gives no long-delay answers: every read is charged in full.
        log.warning("%s: context switching is not applied live yet (issue 5): every read is charged "
                    "its full latency", profile.name)
        controller.context_switch = NeverSwitch()
        not_applied.append("context_switch")
    if profile["migration.enabled"] and controller.auto_apply:
        # Likewise a promotion happens when the guest OS moves the page (issue 5), not
        # when the firmware decides it: decisions are counted, pages stay on the device.
        log.warning("%s: promotions are decided, not carried out, in a live run yet (issue 5)", profile.name)
        controller.auto_apply = False
        not_applied.append("migration.auto_apply")
    with contextlib.ExitStack() as stack:
        counters = stack.enter_context(PluginCounters(counters_path)) if counters_path is not None else None
        page = stack.enter_context(ClockPage(pv_path)) if pv_path is not None else None
        driver = LiveDriver(
            ring_path,
            controller,
            record=record,
            metadata={"design": profile.name, "profile": profile.tree},
            cpu_counters=_cpu_counters(counters) if counters is not None else None,
            on_clock=page.publish if page is not None else None,
        )
        with driver, RequestRing(ring_path, consume=False) as observer:
            log.info("firmware %s serving %s (pid %d)", profile.name, ring_path, os.getpid())
            while not stop.wait(POLL_S):
                driver.check()
                if observer.producer_exited:
                    log.info("QEMU exited: the firmware stops")
                    break
        result = {
            "design": profile.name,
            "profile": profile.tree,
            **driver.server.summary(),
            "driver": driver.stats(),
            "not_applied_live": not_applied,
            "served_at": time.time(),
        }
    staging = results_path.with_name(results_path.name + ".tmp")
    staging.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    staging.replace(results_path)
    return result
