"""The shared-memory protocol between the TCG plugin, the firmware and the guest.

``cxlssd_abi.h`` (C: the plugin, the guest runtime, the promotion daemon) and
:mod:`.protocol` (Python: numpy dtypes, offsets, numbers) describe the same
layouts; ``tests/test_abi.py`` checks that they agree. The readers of the
plugin's shared files live here too, so the firmware needs nothing of the
platform: :mod:`.ring` (the request ring), :mod:`.counters` (the counters file)
and :mod:`.pv` (the paravirtual page).
"""
