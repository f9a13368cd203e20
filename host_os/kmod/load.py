"""Put the guest kernel helper into a running guest, load it, unload it.

The guest's root is a tmpfs made from the image, so, like the guest runtime, the helper
is copied in after each boot (``/opt/cxlssd-kmod``, a few tens of KiB over SFTP) rather
than baked into the image (whose hash keys the shared image)::

    tree = ensure_module(image.kernel)          # host_os/kmod/build.py
    install_helper(platform.guest(), tree)
    load_helper(platform.guest(), tree, poll_ns=20_000)
    ...
    unload_helper(platform.guest())

A helper that cannot load is a :class:`GuestError` naming the problem (a kernel
mismatch, insmod's own message, the kernel log's last lines) and the fix.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from cxlssd.errors import GuestError
from cxlssd.host_os.kmod.build import MODULE
from cxlssd.platform.ssh import GuestSSH

log = logging.getLogger(__name__)

GUEST_DIR = "/opt/cxlssd-kmod"
MODULE_NAME = "cxlssd_helper"
DEVICE = "/dev/cxlssd_helper"
PROMOTE_DEVICE = "/dev/cxlssd_promote"  # the promotion daemon waits here
COMMAND_TIMEOUT_S = 60.0
DMESG_LINES = 8


def install_helper(guest: GuestSSH, tree: Path, timeout_s: float | None = COMMAND_TIMEOUT_S) -> None:
    """Copy the built tree (module, probe, release) to ``/opt/cxlssd-kmod`` in the guest."""
    missing = [name for name in (MODULE, "release") if not (tree / name).is_file()]
    if missing:
        raise GuestError(f"{tree} is not a built kernel helper (missing {', '.join(missing)}); "
                         "build it with cxlssd.host_os.kmod.build.ensure_module()")
    log.info("installing the kernel helper %s into the guest's %s", tree, GUEST_DIR)
    guest.put_tree(tree, GUEST_DIR, timeout_s)


def is_loaded(guest: GuestSSH) -> bool:
    status, _, _ = guest.run(["grep", "-q", f"^{MODULE_NAME} ", "/proc/modules"], timeout_s=COMMAND_TIMEOUT_S)
    return status == 0


def _dmesg_tail(guest: GuestSSH) -> str:
    _, out, _ = guest.run(["sh", "-c", f"dmesg | tail -n {DMESG_LINES}"], timeout_s=COMMAND_TIMEOUT_S)
    return out.decode(errors="replace").rstrip()


def load_helper(guest: GuestSSH, tree: Path, poll_ns: int = 0, switching: bool = True) -> None:
    """Load the helper (unloading a loaded one first). ``poll_ns``: the per-CPU poll of the
    pv slots (0: off; the module refuses < 1000; the skid experiment's alternative to the
    doorbell). ``switching``: park a thread that got a long delay (the platform's default)."""
    expected = (tree / "release").read_text().strip()
    _, out, _ = guest.run(["uname", "-r"], check=True, timeout_s=COMMAND_TIMEOUT_S)
    running = out.decode().strip()
    if running != expected:
        raise GuestError(
            f"the kernel helper was built for kernel {expected} but the guest runs {running}: "
            "build it for the image that boots (ensure_module(image.kernel))"
        )
    if is_loaded(guest):
        unload_helper(guest)
    argv = ["insmod", f"{GUEST_DIR}/{MODULE}", f"poll_ns={int(poll_ns)}",
            f"switching={int(switching)}"]
    status, _, err = guest.run(argv, timeout_s=COMMAND_TIMEOUT_S)
    if status != 0:
        raise GuestError(
            f"the guest kernel helper did not load ({shlex.join(argv)} exited with {status}: "
            f"{err.decode(errors='replace').strip()}); the kernel says:\n{_dmesg_tail(guest)}\n"
            "fix: rebuild it for the running kernel (delete the kmod cache dir), or check its parameters"
        )
    log.info("kernel helper loaded (poll_ns=%d, switching=%s)", poll_ns, switching)


def unload_helper(guest: GuestSSH) -> None:
    """Unload the helper; a :class:`GuestError` if it stays (e.g. a process keeps its device open)."""
    status, _, err = guest.run(["rmmod", MODULE_NAME], timeout_s=COMMAND_TIMEOUT_S)
    if status != 0 or is_loaded(guest):
        raise GuestError(
            f"the guest kernel helper did not unload ({err.decode(errors='replace').strip()}); "
            f"a process may still hold {DEVICE} or {PROMOTE_DEVICE} open (a promotion daemon, "
            f"cxlssd-promote): stop it (fuser {DEVICE} {PROMOTE_DEVICE}) and rmmod {MODULE_NAME}"
        )


def helper_stats(guest: GuestSSH) -> dict[str, int]:
    """The module's counters (``/sys/class/misc/cxlssd_helper/stats``)."""
    _, out, _ = guest.run(["cat", f"/sys/class/misc/{MODULE_NAME}/stats"], check=True,
                          timeout_s=COMMAND_TIMEOUT_S)
    words = out.decode().split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}
