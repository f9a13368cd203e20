"""Cached C builds: compile into the cache once per version of the sources.

The TCG plugin (``platform/plugin/build.py``) and the guest runtime
(``guest/runtime/build.py``) are built with the host's gcc into
``cache_dir()/KIND/KEY/``, where KEY hashes everything that determines the
output (sources, flags, compiler name): a changed source builds a new tree, an
unchanged one is reused without running the compiler (a cached build needs no
compiler at all).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from cxlssd.errors import PrerequisiteError
from cxlssd.paths import cache_dir

log = logging.getLogger(__name__)

COMPILER_ENV = "CXLSSD_CC"
COMPILE_TIMEOUT_S = 120

def compiler_name() -> str:
    """The C compiler to use: ``$CXLSSD_CC`` or ``gcc``."""
    return os.environ.get(COMPILER_ENV, "gcc")


def content_hash(files: Iterable[Path], extra: Sequence[str]) -> str:
    """A short digest of the files' names and contents and of ``extra`` (flags, compiler, ...)."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\0".join(extra).encode())
    return digest.hexdigest()[:16]


def cached_build(kind: str, key: str, populate: Callable[[Path], None]) -> Path:
    """The directory ``cache_dir()/kind/key``, made by ``populate(directory)`` if missing.

    ``populate`` fills a fresh temporary directory next to the target, which is then
    renamed into place: a reader, or a concurrent builder, never sees a partial tree
    (if another builder won the race, its tree is used and ours dropped). On any error
    the temporary directory is removed and the error propagates."""
    target = cache_dir() / kind / key
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", suffix=".building", dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it 0700
        populate(staging)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            log.debug("%s was built concurrently; using that build", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def find_compiler(purpose: str) -> str:
    """The full path of the C compiler; :class:`PrerequisiteError` if it is missing."""
    compiler = shutil.which(compiler_name())
    if compiler is None:
        raise PrerequisiteError(
            f"C compiler {compiler_name()!r} not found, needed to build {purpose}; "
            f"install gcc (./cxlssd setup does) or set {COMPILER_ENV}"
        )
    return compiler


def compile_c(argv: Sequence[str], purpose: str) -> None:
    """Run one compiler command; :class:`PrerequisiteError` with the compiler's message if it fails."""
    log.info("building %s: %s", purpose, " ".join(argv))
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PrerequisiteError(f"cannot run {argv[0]} to build {purpose}: {error}") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        raise PrerequisiteError(
            f"building {purpose} failed ({argv[0]} exited with {result.returncode}):\n{message}"
        )
