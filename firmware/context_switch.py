"""Context-switch policy: which accesses the device answers with "long delay".

SkyByte's device estimates each access's latency; above a threshold it answers at
once with a long-delay flag and the estimated ready time, the CPU raises an
exception and the OS runs another thread (cost ~1-1.3 us) until the data is there.
The model's estimate is its own modelled latency (it knows its queues exactly).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from cxlssd.firmware.registry import Registry


class ContextSwitchPolicy(Protocol):
    #: what a long-delay answer costs the issuing vCPU (the switch), ns
    switch_cost_ns: int

    def long_delay(self, latency_ns: int) -> bool:
        """Whether an access of this modelled latency gets the long-delay answer."""
        ...

    def long_delay_batch(self, latency_ns: np.ndarray) -> np.ndarray:
        """:meth:`long_delay` of each element (bool array)."""
        ...


CONTEXT_SWITCH_POLICIES: Registry[ContextSwitchPolicy] = Registry(
    "context-switch policy", "context_switch.policy"
)


@CONTEXT_SWITCH_POLICIES.register("threshold")
class ThresholdSwitch:
    """Long delay when the latency exceeds ``threshold_ns`` (SkyByte: 2 us)."""

    def __init__(self, threshold_ns: int, switch_cost_ns: int) -> None:
        self.threshold_ns = threshold_ns
        self.switch_cost_ns = switch_cost_ns

    def long_delay(self, latency_ns: int) -> bool:
        return latency_ns > self.threshold_ns

    def long_delay_batch(self, latency_ns: np.ndarray) -> np.ndarray:
        return latency_ns > self.threshold_ns


@CONTEXT_SWITCH_POLICIES.register("never")
class NeverSwitch:
    """No context switch: the vCPU stalls for every access (designs without C)."""

    switch_cost_ns = 0

    def __init__(self, threshold_ns: int = 0, switch_cost_ns: int = 0) -> None:
        pass

    def long_delay(self, latency_ns: int) -> bool:
        return False

    def long_delay_batch(self, latency_ns: np.ndarray) -> np.ndarray:
        return np.zeros(latency_ns.shape, dtype=bool)
