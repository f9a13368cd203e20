"""Install the built guest runtime into a running guest, and the environment to use it.

    from cxlssd.guest.runtime.build import ensure_runtime
    from cxlssd.guest.runtime.install import install_runtime, with_guest_env

    install_runtime(platform.guest(), ensure_runtime())
    platform.guest().run(with_guest_env(["numactl", "--membind=2", "chase", "--bytes", "64M"]))

The guest's root filesystem is a tmpfs built from the image, so the runtime is
installed after each boot (a few hundred KiB over SFTP), not baked into the image.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cxlssd.errors import PrerequisiteError
from cxlssd.guest.runtime.build import COPIES, STEPS
from cxlssd.platform.ssh import GuestSSH

log = logging.getLogger(__name__)

GUEST_RUNTIME_DIR = "/opt/cxlssd"
# The PATH sshd gives root in the guest (Debian's default), after the runtime's bin/.
GUEST_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def guest_env() -> dict[str, str]:
    """Environment for guest commands that use the runtime: ``chase`` on the PATH,
    ``import cxlssd_guest`` working, and the wrapper's library."""
    return {
        "PATH": f"{GUEST_RUNTIME_DIR}/bin:{GUEST_DEFAULT_PATH}",
        "PYTHONPATH": f"{GUEST_RUNTIME_DIR}/python",
        "CXLSSD_LIB": f"{GUEST_RUNTIME_DIR}/lib/libcxlssd.so",
    }


def with_guest_env(argv: Sequence[str]) -> list[str]:
    """``argv`` prefixed with ``env`` and :func:`guest_env`, for ``GuestSSH.run``."""
    return ["env", *(f"{name}={value}" for name, value in guest_env().items()), *argv]


def install_runtime(guest: GuestSSH, runtime: Path, timeout_s: float | None = None) -> None:
    """Copy the runtime tree built by ``ensure_runtime()`` to ``/opt/cxlssd`` in the guest
    (bin/, lib/, python/, include/, modes kept); installing again replaces the files.
    ``timeout_s`` bounds the copy (a :class:`GuestTimeout`)."""
    expected = [step.output for step in STEPS] + list(COPIES)
    missing = [name for name in expected if not (runtime / name).is_file()]
    if missing:
        raise PrerequisiteError(
            f"{runtime} is not a built guest runtime (missing {', '.join(missing)}); "
            "build it with cxlssd.guest.runtime.build.ensure_runtime()"
        )
    log.info("installing the guest runtime %s into the guest's %s", runtime, GUEST_RUNTIME_DIR)
    guest.put_tree(runtime, GUEST_RUNTIME_DIR, timeout_s)
