"""Where the platform keeps build products (cache) and live state (runtime dirs)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cxlssd.errors import InputError, PrerequisiteError


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


def check_writable_output(path: Path, what: str) -> None:
    """Refuse an output path that cannot be written, before any work that would be lost:
    its directory must exist and be writable, and the path, if it exists, must be a
    writable regular file (never a FIFO or a device). An :class:`InputError` otherwise."""
    directory = path.parent
    if not directory.is_dir():
        raise InputError(f"cannot write {what} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {what} {path}: directory {directory} is not writable")
    try:
        found = path.stat()
    except FileNotFoundError:
        return
    except OSError as error:
        raise InputError(f"cannot write {what} {path}: {error.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise InputError(f"cannot write {what} {path}: it exists and is not a regular file")
    if not os.access(path, os.W_OK):
        raise InputError(f"cannot write {what} {path}: it is not writable")


def runtime_root(path: Path | None = None) -> Path:
    """The private directory holding every live instance's sockets, keys and device
    backing files (``$CXLSSD_RUNTIME``, default ``/dev/shm/cxlssd-UID``: tmpfs, because
    the CXL backing files are guest memory), or ``path`` (another session's root).

    Created mode 0700 if missing; otherwise trusted only if it is a real directory
    (not a symlink), owned by this user, with no group or other access, in a parent
    others cannot rename it out of (``/dev/shm`` is sticky). Anything else is a
    :class:`PrerequisiteError`: the platform deletes and signals what it finds in
    here, so it must never act on a directory someone else planted."""
    root = path or Path(os.environ.get("CXLSSD_RUNTIME", f"/dev/shm/cxlssd-{os.getuid()}"))
    refuse = f"runtime directory {root}"
    advice = "remove it, or set CXLSSD_RUNTIME to a private directory of yours"
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise PrerequisiteError(f"cannot create {refuse}: {error.strerror}; {advice}") from None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if root.is_symlink():
            problem = "is a symlink"
        elif error.errno == errno.ENOTDIR:
            problem = "is not a directory"
        else:
            problem = f"cannot be opened ({error.strerror})"
        raise PrerequisiteError(f"{refuse} {problem}: refusing to use it; {advice}") from None
    try:
        found = os.fstat(fd)
    finally:
        os.close(fd)
    if found.st_uid != os.geteuid():
        raise PrerequisiteError(
            f"{refuse} is owned by uid {found.st_uid}, not by this user ({os.geteuid()}): "
            f"refusing to use it; {advice}"
        )
    if found.st_mode & 0o077:
        raise PrerequisiteError(
            f"{refuse} has mode {stat.S_IMODE(found.st_mode):04o} (group or other access): "
            f"refusing to use it; {advice}"
        )
    parent = os.stat(root.parent)
    if parent.st_uid not in (0, os.geteuid()) or (
        parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX
    ):
        raise PrerequisiteError(
            f"{refuse} is in {root.parent}, which another user owns or can write without the "
            f"sticky bit (they could swap the directory): {advice}"
        )
    return root
