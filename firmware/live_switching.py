"""Opportunistic context switching in a live run: the firmware's side of the protocol.

In a replay the controller's :class:`~.context_switch.ContextSwitchPolicy` hides a
long delay at once (it assumes the OS always has another thread). In a live run the
guest really switches, so a long delay is hidden only by work the guest actually
ran meanwhile. The guest runtime (``guest/runtime``, docs/guest-runtime.md) asks:
a *query* (a device read flagged by the plugin) gets the answer "long delay, data
ready at t, ticket k" or "not long"; then

* the runtime switches to another task (a SWITCH marker): the vCPU is charged the
  switch cost, and the read's latency is parked under its ticket;
* when the task runs again (a RESUME marker naming the ticket) the vCPU is charged
  whatever of the latency is still left: ``max(0, ready - now)``;
* if the vCPU's next marker after a long-delay answer is anything but a SWITCH
  (the program ignored the flag, or had no other task), the full latency is charged.

Every SWITCH of the runtime costs ``switch_cost_ns``, also the ones that do not
follow a long delay (a task that finished). A SWITCH of the guest kernel helper
(transparent switching, docs/host-os.md: every device read of a page not in SSD DRAM
inside an ROI is a query, the helper parks the thread and the scheduler runs another)
costs nothing here: the switch's cost is the kernel's own instructions (interrupt, parking, scheduler; ~5 100
measured), already on the vCPU's clock. One model, two triggers. The queried read
is charged in full by the controller and stays charged until a SWITCH takes it back.
Until then the vCPU's clock is that of a thread that waits for its data, so the
requests it issues meanwhile (a thread that does not switch re-issues the access and
reads the rest of its page) are timed after the data is there. Taking the latency
back at the answer timed them before it: each waited for the fill in flight, and the
settlement charged the flash read again. (A load the vCPU runs between the answer
and the helper's switch is timed after the wait as well; the switch takes back only
the queried read's latency.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cxlssd.abi.protocol import SWITCH_KERNEL
from cxlssd.firmware.context_switch import ContextSwitchPolicy, NeverSwitch
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.request import MarkerCmd


@dataclass
class SwitchCounters:
    queries: int = 0
    long_delays: int = 0  # answered "long delay"
    switches: int = 0  # SWITCH markers of the runtime (each charged the switch cost)
    kernel_switches: int = 0  # SWITCH markers of the kernel helper (cost: its instructions)
    resumes: int = 0  # parked long delays whose task ran again
    ignored: int = 0  # long delays the vCPU did not switch away from: charged in full
    hidden_ns: int = 0  # latency that other tasks' work covered
    residual_wait_ns: int = 0  # latency still left when the task resumed
    switch_cost_ns: int = 0


@dataclass
class _LongDelay:
    ticket: int
    ready_ns: int
    latency_ns: int


class LiveContextSwitch:
    """Answers queries and settles long delays per vCPU (see the module doc)."""

    def __init__(self, controller: Controller, policy: ContextSwitchPolicy) -> None:
        self.controller = controller
        self.policy = policy
        self.counters = SwitchCounters()
        self._tickets: dict[int, int] = {}  # vCPU -> queries so far
        self._pending: dict[int, _LongDelay] = {}  # vCPU -> unsettled long-delay answer
        self._parked: dict[tuple[int, int], _LongDelay] = {}  # (vCPU, ticket) -> parked

    def query(self, vcpu: int, start_ns: int, latency_ns: int) -> tuple[int, bool, int]:
        """A queried read (served and charged in full): (ticket, long, ready_ns)."""
        self.settle(vcpu, switched=False)
        ticket = self._tickets.get(vcpu, 0) + 1
        self._tickets[vcpu] = ticket
        self.counters.queries += 1
        if not self.policy.long_delay(latency_ns):
            return ticket, False, 0
        self.counters.long_delays += 1
        ready_ns = start_ns + latency_ns
        self._pending[vcpu] = _LongDelay(ticket, ready_ns, latency_ns)
        return ticket, True, ready_ns

    def settle(self, vcpu: int, switched: bool) -> None:
        """The vCPU's next event after a long-delay answer: if it switched away the
        read is parked and its latency taken back, else it stays charged in full."""
        pending = self._pending.pop(vcpu, None)
        if pending is None:
            return
        if switched:
            self.controller.charge_stall(vcpu, -pending.latency_ns)
            self._parked[(vcpu, pending.ticket)] = pending
        else:
            self.counters.ignored += 1

    def marker(self, vcpu: int, cmd: int, arg: int, local_ns: int) -> None:
        """A marker of ``vcpu`` at its local clock ``local_ns`` (any command)."""
        if cmd == MarkerCmd.DAEMON:  # the scheduler's, not the thread's: says nothing of its read
            return
        if cmd == MarkerCmd.SWITCH:
            self.settle(vcpu, switched=True)
            if arg == SWITCH_KERNEL:
                self.counters.kernel_switches += 1
                return
            self.counters.switches += 1
            self.counters.switch_cost_ns += self.policy.switch_cost_ns
            self.controller.charge_stall(vcpu, self.policy.switch_cost_ns)
            return
        self.settle(vcpu, switched=False)
        if cmd != MarkerCmd.RESUME:
            return
        parked = self._parked.pop((vcpu, arg), None)
        if parked is None:
            return  # settled already (the task never left the vCPU), or not a long delay
        now_ns = local_ns + self.controller.vcpu_stall_ns(vcpu)
        wait_ns = max(0, parked.ready_ns - now_ns)
        self.controller.charge_stall(vcpu, wait_ns)
        self.counters.resumes += 1
        self.counters.residual_wait_ns += wait_ns
        self.counters.hidden_ns += parked.latency_ns - wait_ns

    def counter_dict(self) -> dict[str, int]:
        return {**asdict(self.counters), "parked": len(self._parked)}


def guest_driven(controller: Controller) -> LiveContextSwitch:
    """Make ``controller`` the firmware of a stream in which the guest carries out
    context switches and promotions (a live run, or its trace): the controller
    hides no long delay by itself and applies no promotion it decides. Returns
    the switching that settles the design's long delays."""
    policy = controller.context_switch
    controller.context_switch = NeverSwitch()
    # (also without a migration policy: a program may move its own pages, cxlssd_promote)
    controller.auto_apply = False
    controller.host_managed = True
    return LiveContextSwitch(controller, policy)
