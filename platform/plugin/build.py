"""Build the TCG plugin with gcc into the cache, once per version of its sources.

The plugin is compiled against the project's own declarations of the QEMU
plugin API (``qemu_plugin_api.h``), not QEMU's header (no Debian package ships
it), and the protocol's header (``abi/cxlssd_abi.h``). The output goes to
``cache_dir()/plugin/<hash>/libcxlssd.so`` where the hash covers the sources
and the compiler flags (:mod:`cxlssd.cbuild`), so a changed source or flag
builds a new plugin and an unchanged one is reused without running gcc (a cached plugin needs no compiler).
"""

from __future__ import annotations

from pathlib import Path

from cxlssd.abi.protocol import C_HEADER
from cxlssd.cbuild import cached_build, compile_c, compiler_name, content_hash, find_compiler
from cxlssd.paths import cache_dir

PLUGIN_DIR = Path(__file__).resolve().parent
SOURCES = (PLUGIN_DIR / "cxlssd_plugin.c", PLUGIN_DIR / "qemu_plugin_api.h", C_HEADER)
MAIN_SOURCE = SOURCES[0]
LIBRARY_NAME = "libcxlssd.so"
CACHE_KIND = "plugin"
PURPOSE = "the TCG plugin"
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


def source_hash() -> str:
    """A digest of everything that determines the built plugin: sources and flags."""
    return content_hash(SOURCES, (compiler_name(), *CFLAGS))


def plugin_path() -> Path:
    """Where the plugin for the current sources lives (built or not)."""
    return cache_dir() / CACHE_KIND / source_hash() / LIBRARY_NAME


def ensure_plugin() -> Path:
    """The path of the built plugin, compiling it first if the sources changed.

    Raises :class:`PrerequisiteError` if the compiler is missing or fails
    (with the compiler's message)."""

    def compile_into(tree: Path) -> None:
        output = tree / LIBRARY_NAME
        compile_c(
            [
                find_compiler(PURPOSE),
                *CFLAGS,
                "-I",
                str(C_HEADER.parent),
                "-o",
                str(output),
                str(MAIN_SOURCE),
            ],
            PURPOSE,
        )

    return cached_build(CACHE_KIND, source_hash(), compile_into) / LIBRARY_NAME
