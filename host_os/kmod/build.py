"""Build the guest kernel helper against the guest kernel's own headers, with trixie's gcc.

The guest runs Debian trixie's kernel (``linux-image-amd64`` of the guest image,
``guest/image.py``); a module must be built with that kernel's headers and, to be safe,
its compiler (gcc 14; the host has bookworm's gcc 12). So the module is built in a
**trixie build root** made with ``mmdebstrap`` from Debian packages (gcc, make,
``linux-headers-RELEASE``), from the apt mirror the machine is configured with (the
bootstrap exports it as ``CXLSSD_DEBIAN_MIRROR``; no host name is written here)::

    cache_dir()/kmod-root/trixie-RELEASE-<hash>/     the build root (~2 min once per kernel)
    cache_dir()/kmod/<hash>/                          the built tree, copied into the guest
        cxlssd_helper.ko   release   (the skid probe is built with the guest runtime)

The build root's key covers the suite, its packages and the kernel release; the
tree's key covers the sources (``host_os/kmod/``, ``abi/cxlssd_abi.h``), the kernel
release, the build root and this builder. A changed source, or an image with another
kernel, builds a new tree; an unchanged one is reused without running anything.

The kernel release is read from the image's bzImage header (the version string the
kernel reports as ``uname -r``), so it always matches the image actually booted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from cxlssd.cbuild import cached_build
from cxlssd.errors import PrerequisiteError
from cxlssd.guest.image import _debian_mirror as debian_mirror  # one reader of the mirror
from cxlssd.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
ABI_HEADER = SOURCE_DIR.parent.parent / "abi" / "cxlssd_abi.h"
SUITE = "trixie"
# The headers package pulls linux-kbuild and the compiler the kernel was built with.
BUILD_PACKAGES = ("gcc", "make", "libc6-dev", "libelf-dev", "binutils")
MODULE_SOURCES = ("cxlssd_helper.c", "cxlssd_promote.h", "Kbuild", "shim/stdint.h", "shim/stddef.h")
MODULE = "cxlssd_helper.ko"
ROOT_KIND = "kmod-root"
CACHE_KIND = "kmod"
BUILD_TIMEOUT_S = 600
# The bzImage setup header (Documentation/arch/x86/boot.rst): "HdrS" at 0x202, and at
# 0x20e the offset (from 0x200) of the kernel's version string.
_BZIMAGE_MAGIC_OFFSET = 0x202
_BZIMAGE_VERSION_POINTER = 0x20E
_BZIMAGE_SETUP_BASE = 0x200


def kernel_release(vmlinuz: Path) -> str:
    """The release (``uname -r``) of a bzImage, e.g. ``6.12.117+deb13-amd64``."""
    with open(vmlinuz, "rb") as image:
        header = image.read(0x400)
        if header[_BZIMAGE_MAGIC_OFFSET:_BZIMAGE_MAGIC_OFFSET + 4] != b"HdrS":
            raise PrerequisiteError(f"{vmlinuz} is not a bzImage (no HdrS header)")
        pointer = int.from_bytes(header[_BZIMAGE_VERSION_POINTER:_BZIMAGE_VERSION_POINTER + 2], "little")
        image.seek(pointer + _BZIMAGE_SETUP_BASE)
        version = image.read(256).split(b"\0", 1)[0].decode("ascii", errors="replace")
    release = version.split(" ", 1)[0]
    if not release or not release[0].isdigit():
        raise PrerequisiteError(f"{vmlinuz}: cannot read its kernel release from {version!r}")
    return release


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def build_root_dir(release: str) -> Path:
    packages = (*BUILD_PACKAGES, f"linux-headers-{release}")
    key = _digest(json.dumps([SUITE, packages]).encode())
    return cache_dir() / ROOT_KIND / f"{SUITE}-{release}-{key}"


def _run(argv: list[str], what: str, timeout_s: float = BUILD_TIMEOUT_S) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PrerequisiteError(f"{what}: cannot run {argv[0]}: {error}") from None
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
        raise PrerequisiteError(f"{what} failed ({argv[0]} exited with {result.returncode}):\n{tail}")
    return result.stdout


def ensure_build_root(release: str) -> Path:
    """The trixie build root with gcc, make and ``linux-headers-RELEASE``, made once."""
    root = build_root_dir(release)
    if (root / "usr/src" / f"linux-headers-{release}" / "Makefile").is_file():
        return root
    if os.geteuid() != 0:
        raise PrerequisiteError(
            "building the guest kernel helper needs root (mmdebstrap --mode=root, chroot)")
    if shutil.which("mmdebstrap") is None:
        raise PrerequisiteError("mmdebstrap not found; run ./cxlssd setup to install it")
    mirror = debian_mirror()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".building", dir=root.parent))
    started = time.monotonic()
    log.info("creating the trixie build root for kernel modules (%s, first time only, ~2 min) ...", release)
    try:
        tree = staging / "tree"
        try:
            _run([
                "mmdebstrap", "--variant=apt", "--mode=root", "--quiet",
                "--include=" + ",".join((*BUILD_PACKAGES, f"linux-headers-{release}")),
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                SUITE, str(tree), mirror,
            ], "creating the trixie build root")
        except PrerequisiteError as error:
            if f"linux-headers-{release}" in str(error):
                raise PrerequisiteError(
                    f"the mirror {mirror} has no linux-headers-{release} (the guest image's kernel); "
                    "the image is older than the mirror's trixie kernel: rebuild the guest image "
                    f"(delete {cache_dir() / 'images'}) and run again\n{error}"
                ) from None
            raise
        try:
            tree.rename(root)
        except OSError:
            if not root.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("trixie build root ready in %.0f s: %s", time.monotonic() - started, root)
    return root


def module_key(release: str) -> str:
    files = [SOURCE_DIR / name for name in MODULE_SOURCES]
    files += [ABI_HEADER, Path(__file__)]
    return _digest(release.encode(), build_root_dir(release).name.encode(),
                   *(path.name.encode() + b"\0" + path.read_bytes() for path in files))


def ensure_module(vmlinuz: Path) -> Path:
    """The built tree (``cxlssd_helper.ko``, ``release``) for the kernel of
    ``vmlinuz``, building the root and the module first if needed."""
    release = kernel_release(vmlinuz)
    key = module_key(release)
    if (cache_dir() / CACHE_KIND / key / MODULE).is_file():
        return cache_dir() / CACHE_KIND / key
    root = ensure_build_root(release)
    return cached_build(CACHE_KIND, key, lambda tree: _populate(tree, root, release))


def _populate(tree: Path, root: Path, release: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="cxlssd-kmod-", dir=root / "tmp"))
    inside = "/" + str(work.relative_to(root))
    try:
        for name in MODULE_SOURCES:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SOURCE_DIR / name, work / name)
        shutil.copyfile(ABI_HEADER, work / ABI_HEADER.name)
        log.info("building the guest kernel helper for %s in %s", release, root)
        _run(["chroot", str(root), "make", "-s", "-C", f"/usr/src/linux-headers-{release}",
              f"M={inside}", "modules"], "building the guest kernel helper")
        _run(["chroot", str(root), "strip", "--strip-debug", f"{inside}/{MODULE}"],
             "stripping the guest kernel helper")
        info = _run(["chroot", str(root), "modinfo", "-F", "vermagic", f"{inside}/{MODULE}"],
                    "reading the helper's vermagic") if (root / "usr/sbin/modinfo").exists() else ""
        if info and not info.startswith(release + " "):
            raise PrerequisiteError(f"the helper was built for {info.strip()!r}, not {release}")
        shutil.copyfile(work / MODULE, tree / MODULE)
        (tree / MODULE).chmod(0o644)
        (tree / "release").write_text(release + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
