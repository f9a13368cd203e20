"""Build the guest runtime on the host into the cache, once per version of its sources.

``ensure_runtime()`` compiles ``libcxlssd.so``, ``chase`` and the workload suite
(``guest/workloads/``, docs/workloads.md) with the host's gcc and lays them out,
with the Python wrapper and the C header, as the tree that
``install.install_runtime`` copies into the guest::

    cache_dir()/guest-runtime/<hash>/
        bin/chase  bin/{graph,radix,srad,kvstore,dlrm}
        lib/libcxlssd.so  python/cxlssd_guest.py  include/cxlssd.h  include/cxlssd_abi.h

The hash covers the sources, the build steps (outputs, flags) and the compiler
name (:mod:`cxlssd.cbuild`). Binaries are built for the baseline x86-64 (no
``-march=native``: the guest's ``-cpu max`` is not the host's CPU) and link
glibc dynamically: built on Debian 12 (glibc 2.36), they run on the guest's
newer glibc.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cxlssd.cbuild import cached_build, compile_c, compiler_name, content_hash, find_compiler

SOURCE_DIR = Path(__file__).resolve().parent
# Build inputs are named relative to SOURCE_DIR; the workloads' are in guest/workloads/.
WORKLOAD_SOURCES = "../workloads"
CACHE_KIND = "guest-runtime"
PURPOSE = "the guest runtime"
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11")
HEADER = "cxlssd.h"
# The protocol's header (abi/cxlssd_abi.h), which cxlssd.h includes.
ABI_HEADER = "../../abi/cxlssd_abi.h"
LIBRARY_SOURCE = "libcxlssd.c"
CHASE_SOURCE = "chase.c"
SHAPES_SOURCE = "shapes.c"
PYTHON_WRAPPER = "cxlssd_guest.py"
# The workload suite: bin/NAME from ../workloads/NAME.c, which includes common.h.
WORKLOADS = ("graph", "radix", "srad", "kvstore", "dlrm", "randread", "tpcc", "offload")
WORKLOAD_HEADER = f"{WORKLOAD_SOURCES}/common.h"
LIBM = ("m",)
# What a workload links besides libm: tpcc SQLite (libsqlite3-dev on the host; -lsqlite3 records
# the soname libsqlite3.so.0, which the guest's newer libsqlite3-0 provides).
WORKLOAD_LIBRARIES = {"tpcc": ("sqlite3",)}
# The guest OS's promotion daemon (host_os/, docs/host-os.md), and the kernel helper's
# interface it uses (included relative to the source).
PROMOTER_SOURCE = "../../host_os/promoter.c"
PROMOTER_HEADER = "../../host_os/kmod/cxlssd_promote.h"
# The kernel helper's skid probe (host_os/kmod/, experiments/kmod_skid.py): a user program.
SKIDPROBE_SOURCE = "../../host_os/kmod/skidprobe.c"


@dataclass(frozen=True)
class CompileStep:
    """One compiler run: ``sources`` (paths relative to SOURCE_DIR) into ``output`` (path in
    the tree), linked with ``libraries`` (``-l`` names, after the sources)."""

    output: str
    sources: tuple[str, ...]
    flags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()


def workload_source(name: str) -> str:
    """The C source of workload ``name``, relative to SOURCE_DIR."""
    return f"{WORKLOAD_SOURCES}/{name}.c"


STEPS = (
    CompileStep("lib/libcxlssd.so", (LIBRARY_SOURCE,), ("-shared", "-fPIC")),
    # chase takes runtime ROI ids: the library is compiled in, no libcxlssd.so needed.
    CompileStep("bin/chase", (CHASE_SOURCE, LIBRARY_SOURCE)),
    # shapes uses constant ROI ids only (the header's macros).
    CompileStep("bin/shapes", (SHAPES_SOURCE,)),
    CompileStep("bin/cxlssd-promote", (PROMOTER_SOURCE, LIBRARY_SOURCE)),
    CompileStep("bin/skidprobe", (SKIDPROBE_SOURCE, LIBRARY_SOURCE), ("-pthread",)),
    # So do the workloads (--roi ID); they need libm.
    *(
        CompileStep(
            f"bin/{name}",
            (workload_source(name), LIBRARY_SOURCE),
            libraries=LIBM + WORKLOAD_LIBRARIES.get(name, ()),
        )
        for name in WORKLOADS
    ),
)
# Files installed as they are: tree path -> source name.
NETKV = f"{WORKLOAD_SOURCES}/netkv.py"  # the network workload (python3 -m netkv)
COPIES = {
    "include/cxlssd.h": HEADER,
    "include/cxlssd_abi.h": ABI_HEADER,
    "python/cxlssd_guest.py": PYTHON_WRAPPER,
    "python/netkv.py": NETKV,
}
# Everything the build reads; the headers are included by every C source, common.h by the workloads.
INPUTS = (
    HEADER,
    ABI_HEADER,
    LIBRARY_SOURCE,
    CHASE_SOURCE,
    SHAPES_SOURCE,
    PYTHON_WRAPPER,
    NETKV,
    WORKLOAD_HEADER,
    PROMOTER_SOURCE,
    PROMOTER_HEADER,
    SKIDPROBE_SOURCE,
    *(workload_source(name) for name in WORKLOADS),
)
EXECUTABLE_MODE = 0o755
DATA_MODE = 0o644


def runtime_key() -> str:
    """The cache key of the runtime for the current sources, steps, flags and compiler."""
    steps = [repr(step) for step in STEPS] + [f"{out}={src}" for out, src in sorted(COPIES.items())]
    return content_hash((SOURCE_DIR / name for name in INPUTS), (compiler_name(), *CFLAGS, *steps))


def ensure_runtime() -> Path:
    """The directory of the built guest runtime, compiling it first if the sources changed.

    Raises :class:`PrerequisiteError` if the compiler is missing or fails (with its message)."""
    return cached_build(CACHE_KIND, runtime_key(), _populate)


def _populate(tree: Path) -> None:
    compiler = find_compiler(PURPOSE)
    for directory in ("bin", "lib", "include", "python"):
        (tree / directory).mkdir()
        (tree / directory).chmod(EXECUTABLE_MODE)  # whatever the umask: the modes are installed as they are
    for step in STEPS:
        output = tree / step.output
        sources = [str(SOURCE_DIR / name) for name in step.sources]
        libraries = [f"-l{name}" for name in step.libraries]
        # -I: the workloads include cxlssd.h from here, which includes cxlssd_abi.h from abi/
        # (not part of the key: where the sources are).
        flags = [*CFLAGS, *step.flags, "-I", str(SOURCE_DIR), "-I", str((SOURCE_DIR / ABI_HEADER).parent)]
        compile_c([compiler, *flags, "-o", str(output), *sources, *libraries], PURPOSE)
        output.chmod(EXECUTABLE_MODE)
    for output_name, source_name in COPIES.items():
        shutil.copyfile(SOURCE_DIR / source_name, tree / output_name)
        (tree / output_name).chmod(DATA_MODE)
