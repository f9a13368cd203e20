"""The CXL-SSD controller firmware model (SkyByte-style), in Python + numpy.

Components (each its own module, composed by :class:`Controller` from a YAML
profile, see ``docs/firmware.md``): :mod:`.request` (host interface: request and
response dtypes), :mod:`.writelog`, :mod:`.cache`, :mod:`.ftl`, :mod:`.scheduler`,
:mod:`.flash`, :mod:`.migration`, :mod:`.context_switch`; drivers and tools:
:mod:`.replay`, :mod:`.trace`, :mod:`.synth`, :mod:`.bench`, :mod:`.commands`.

Typical use::

    from cxlssd.firmware import Controller, load_profile, make_requests
    model = Controller.from_profile(load_profile("skybyte-full", ["cache.ways=8"]))
    responses = model.process(requests)  # REQUEST_DTYPE array -> RESPONSE_DTYPE array
"""

from cxlssd.firmware.controller import Controller, Latencies
from cxlssd.firmware.profile import Profile, available_profiles, load_profile
from cxlssd.firmware.request import (
    REQUEST_DTYPE,
    RESPONSE_DTYPE,
    Op,
    Source,
    make_requests,
)

__all__ = [
    "REQUEST_DTYPE",
    "RESPONSE_DTYPE",
    "Controller",
    "Latencies",
    "Op",
    "Profile",
    "Source",
    "available_profiles",
    "load_profile",
    "make_requests",
]
