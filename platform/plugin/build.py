"""Build the TCG plugin with gcc into the cache, once per version of its sources.

The plugin is compiled against the project's own declarations of the QEMU
plugin API (``qemu_plugin_api.h``), not QEMU's header (no Debian package ships
it). The output goes to ``cache_dir()/plugin/<hash>/libcxlssd.so`` where the
hash covers the sources and the compiler flags, so a changed source or flag
builds a new plugin and an unchanged one is reused without running gcc (a
cached plugin needs no compiler).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from cxlssd.errors import PrerequisiteError
from cxlssd.paths import cache_dir

log = logging.getLogger(__name__)

PLUGIN_DIR = Path(__file__).resolve().parent
SOURCES = (PLUGIN_DIR / "cxlssd_plugin.c", PLUGIN_DIR / "qemu_plugin_api.h")
MAIN_SOURCE = SOURCES[0]
LIBRARY_NAME = "libcxlssd.so"
CFLAGS = (
    "-O2",
    "-shared",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-std=gnu11",
    # Only qemu_plugin_install and qemu_plugin_version are exported.
    "-fvisibility=hidden",
    "-pthread",
)
COMPILE_TIMEOUT_S = 120


def _compiler() -> str:
    return os.environ.get("CXLSSD_CC", "gcc")


def source_hash() -> str:
    """A digest of everything that determines the built plugin: sources and flags."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0")
        digest.update(source.read_bytes())
        digest.update(b"\0")
    digest.update("\0".join((_compiler(), *CFLAGS)).encode())
    return digest.hexdigest()[:16]


def plugin_path() -> Path:
    """Where the plugin for the current sources lives (built or not)."""
    return cache_dir() / "plugin" / source_hash() / LIBRARY_NAME


def ensure_plugin() -> Path:
    """The path of the built plugin, compiling it first if the sources changed.

    Raises :class:`PrerequisiteError` if the compiler is missing or fails
    (with the compiler's message)."""
    target = plugin_path()
    if target.is_file():
        return target
    compiler = shutil.which(_compiler())
    if compiler is None:
        raise PrerequisiteError(
            f"C compiler {_compiler()!r} not found, needed to build the TCG plugin; "
            "install gcc (./cxlssd setup does) or set CXLSSD_CC"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and rename: concurrent builders never see a partial file.
    partial = target.with_name(f".{LIBRARY_NAME}.{os.getpid()}.tmp")
    argv = [compiler, *CFLAGS, "-o", str(partial), str(MAIN_SOURCE)]
    log.info("building the TCG plugin: %s", " ".join(argv))
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        partial.unlink(missing_ok=True)
        raise PrerequisiteError(f"cannot run {compiler} to build the TCG plugin: {error}") from None
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        message = (result.stderr or result.stdout).strip()
        raise PrerequisiteError(
            f"building the TCG plugin failed ({compiler} exited with {result.returncode}):\n{message}"
        )
    os.replace(partial, target)
    return target
