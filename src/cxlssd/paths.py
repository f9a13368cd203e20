"""Where the platform keeps build products (cache) and live state (runtime dirs)."""

from __future__ import annotations

import os
from pathlib import Path

from cxlssd.errors import PrerequisiteError

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """The cache of build products (venv, guest image, plugin): ``$CXLSSD_CACHE``
    or ``$XDG_CACHE_HOME/cxlssd`` (default ``~/.cache/cxlssd``). Created if missing;
    a :class:`PrerequisiteError` if it cannot be written."""
    explicit = os.environ.get("CXLSSD_CACHE")
    if explicit:
        path = Path(explicit)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "cxlssd"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise PrerequisiteError(
            f"cache directory {path} is not writable ({error.strerror}); "
            "set CXLSSD_CACHE to a writable directory"
        ) from None
    return path


def runtime_root() -> Path:
    """The private (mode 0700) directory holding every live instance's sockets,
    keys and device backing files. It is on tmpfs (``/dev/shm``) because the CXL
    backing files are guest memory."""
    root = Path(os.environ.get("CXLSSD_RUNTIME", f"/dev/shm/cxlssd-{os.getuid()}"))
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root
