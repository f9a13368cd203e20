"""The firmware process: the live driver serving a running guest until told to stop.

``./cxlssd serve-firmware`` runs :func:`serve`; the platform starts it as a
process of its own (``platform/live.py``, ``FirmwareProcess``) so the model neither
competes for the GIL with the platform's SSH traffic nor dies silently with it:
a dead firmware process is something the platform detects and reports. It stops
on SIGTERM or SIGINT (or when QEMU exits), serves what is left in the ring and
writes its results (counters, ROI results, driver statistics) as JSON.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from cxlssd.abi.counters import PluginCounters
from cxlssd.abi.protocol import FEATURE_CONTEXT_SWITCH, FEATURE_PROMOTION, FEATURE_SWITCH_OUTSIDE_ROI
from cxlssd.abi.pv import PvPage
from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.knobs import FirmwareKnob, KnobController, knob_from_dict, knob_to_dict
from cxlssd.firmware.live import LiveDriver
from cxlssd.firmware.live_switching import guest_driven
from cxlssd.firmware.profile import Profile

log = logging.getLogger(__name__)

POLL_S = 0.1


def _cpu_counters(counters: PluginCounters) -> Any:
    def lookup(event: int) -> dict[str, int] | None:
        found = counters.roi_events(event)[:1]
        return dataclasses.asdict(found[0].counters) if found else None

    return lookup


class ControlFile:
    """The knobs appended to the control file since the last look (one JSON object a
    line; a line still being written is left for the next look; a bad line is logged
    and skipped, never fatal: the guest's run goes on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_knobs(self) -> list[tuple[FirmwareKnob, float | None]]:
        """(knob, at_ms): at_ms schedules it in modelled time after the first request."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        knobs = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                raw = json.loads(line)
                at_ms = raw.pop("at_ms", None) if isinstance(raw, dict) else None
                knobs.append((knob_from_dict(raw), at_ms))
            except (ValueError, InputError) as error:
                log.error("firmware: ignoring control line %r: %s", line, error)
        return knobs


class Mailbox:
    """Promotion decisions on their way to the guest's daemon, through the pv page's
    mailbox, as SkyByte's promotion queue carries them to its promotion thread
    (artifact ``HieronZhang/SkyByte-Artifact`` 4a78756f, ``ftl.cc``: a decision is
    pushed to a queue, one thread takes the entries in order and skips a page no
    longer in the SSD cache). A decision that finds the mailbox full waits here, in
    decision order, and goes to the mailbox as the guest takes entries; when its turn
    comes, a page that has left the data cache since is given up (the host did not
    promote it: the controller may decide it again on later hits) instead of posted:
    its data is no longer hot in the device. A demotion goes before any waiting
    promotion: the budget depends on it.

    The room is what the guest had taken out when its daemon last reported a page
    (:meth:`reported`, at a PROMOTED/DEMOTED/PROMOTE_FAILED marker): the daemon writes
    ``taken`` right after its barrier and reports after it, so the value is one of the
    request stream's order. Read from the page at any other moment, it would depend on
    how far this firmware lagged the guest in host time."""

    def __init__(self, page: PvPage, controller: Controller) -> None:
        self.page = page
        self.controller = controller
        self.demotions: collections.deque[int] = collections.deque()
        # at most one entry per page: a page waiting here is pending, not decided again
        self.promotions: collections.deque[int] = collections.deque()
        # Attached before the run's daemon starts: an earlier run's leftovers go.
        self.discarded = page.discard_pending()
        self.consumed = page.consumed()
        self.posted = 0
        self.waited = 0  # promotions that found the mailbox full (or others waiting)
        self.stale = 0  # promotions given up: the page had left the data cache

    def post(self, device_page: int, demote: bool) -> None:
        if demote:
            self.demotions.append(device_page)
            self.flush()
            return
        behind_others = bool(self.demotions or self.promotions)
        self.promotions.append(device_page)
        self.flush()
        if behind_others or self.promotions:
            self.waited += 1

    def reported(self) -> None:
        """The guest's daemon reported a page: it has taken what it took, room may be free."""
        self.consumed = self.page.consumed()
        self.flush()

    def flush(self) -> None:
        while self.demotions and self.page.post(self.demotions[0], True, self.consumed):
            self.demotions.popleft()
            self.posted += 1
        if self.demotions:
            return
        while self.promotions:
            device_page = self.promotions[0]
            if not self.controller.cached(device_page):
                self.promotions.popleft()
                self.stale += 1
                self.controller.host_gave_up(device_page)
            elif self.page.post(device_page, False, self.consumed):
                self.promotions.popleft()
                self.posted += 1
            else:
                return

    def stats(self) -> dict[str, int]:
        return {"posted": self.posted, "promotions_waited": self.waited,
                "promotions_stale": self.stale, "promotions_waiting": len(self.promotions),
                "demotions_waiting": len(self.demotions), "discarded_at_start": self.discarded}


def _hand_over(control: ControlFile, knobs: KnobController, driver: LiveDriver) -> None:
    """New knobs go to the serving thread: applied (or scheduled) before its next chunk."""
    for knob, at_ms in control.new_knobs():
        log.info("firmware knob: %s (at %s)", knob_to_dict(knob), "once" if at_ms is None else f"{at_ms} ms")
        if at_ms is None:
            driver.call_soon(functools.partial(knobs.apply, knob))
        else:
            driver.call_soon(functools.partial(knobs.schedule, knob, at_ms))


def serve(
    ring_path: Path,
    profile: Profile,
    results_path: Path,
    counters_path: Path | None = None,
    record: Path | None = None,
    stop: threading.Event | None = None,
    pv_path: Path | None = None,
    control_path: Path | None = None,
    cache_map_path: Path | None = None,
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
    # A long delay is hidden only when the guest really switched (the guest runtime
    # asks, the firmware answers); a promotion happens when the guest OS has moved
    # the page (host_os/promoter): docs/live.md.
    switching = guest_driven(controller)
    with contextlib.ExitStack() as stack:
        counters = stack.enter_context(PluginCounters(counters_path)) if counters_path is not None else None
        page = stack.enter_context(PvPage(pv_path)) if pv_path is not None else None
        if cache_map_path is not None and controller.cache is not None:
            stack.enter_context(controller.cache.published(cache_map_path))
        mailbox = Mailbox(page, controller) if page is not None else None
        driver = LiveDriver(
            ring_path,
            controller,
            record=record,
            metadata={"design": profile.name, "profile": profile.tree, "guest_driven": True},
            cpu_counters=_cpu_counters(counters) if counters is not None else None,
            on_clock=page.publish if page is not None else None,
        )
        driver.server.switching = switching
        if page is not None and mailbox is not None:
            driver.server.on_query = page.answer_query
            driver.server.on_decision = mailbox.post
            driver.server.on_report = mailbox.reported
            page.set_features(
                (FEATURE_CONTEXT_SWITCH if profile["context_switch.enabled"] else 0)
                | (FEATURE_SWITCH_OUTSIDE_ROI if profile["context_switch.outside_roi"] else 0)
                | (FEATURE_PROMOTION if profile["migration.enabled"] else 0),
                profile["context_switch.scheduler"],
            )
        knobs = KnobController(controller)

        driver.before_chunk = knobs.tick
        control = ControlFile(control_path) if control_path is not None else None
        with driver:
            log.info("firmware %s serving %s (pid %d)", profile.name, ring_path, os.getpid())
            while not stop.wait(POLL_S):
                if control is not None:
                    _hand_over(control, knobs, driver)
                driver.check()
                if driver.producer_exited:
                    log.info("QEMU exited: the firmware stops")
                    break
        result = {
            "design": profile.name,
            "profile": profile.tree,
            **driver.server.summary(),
            "driver": driver.stats(),
            "mailbox": mailbox.stats() if mailbox is not None else None,
            "knobs": knobs.log,
            "served_at": time.time(),
        }
    staging = results_path.with_name(results_path.name + ".tmp")
    staging.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    staging.replace(results_path)
    return result
