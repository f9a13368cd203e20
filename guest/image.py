"""The guest image: Debian trixie root filesystem with Debian's 6.12 kernel.

Built with ``mmdebstrap`` from Debian packages only, into the cache directory,
keyed by a hash of its inputs (package list, suite, the files written into it,
this builder), so it is rebuilt exactly when an input changes. Outputs: the
kernel, and the whole root filesystem as an uncompressed initramfs (``newc``
cpio) that systemd runs from directly (``rdinit=/sbin/init``).

Why the root lives in RAM rather than on a virtio disk: the CXL window is MMIO in
QEMU 10.0, so a device cannot DMA into it (virtio fails with "bogus descriptor or
out of resources", even with larger bounce buffers, and the guest hangs). A
process bound to the CXL node gets its *page cache* on that node too, and a disk
read into it would be such a DMA. With a RAM root there is no block I/O at all;
network buffers are kernel (unmovable) allocations, which stay on node 0 because
the CXL node is ZONE_MOVABLE. The root uses ~340 MiB of node 0's DRAM.

The image carries no keys: each instance passes its own SSH host key and
authorized key through QEMU's ``fw_cfg``, which a unit installs before sshd.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cxlssd.errors import PrerequisiteError
from cxlssd.lifecycle import LockHeld, exclusive_lock
from cxlssd.paths import cache_dir

log = logging.getLogger(__name__)

SUITE = "trixie"
# trixie has ndctl 81 (RAM regions), Python 3.13 and numpy 2; its kernel is 6.12.
PACKAGES = (
    "systemd-sysv",
    "udev",
    "openssh-server",
    "linux-image-amd64",
    "initramfs-tools",
    "python3",
    "python3-numpy",
    "numactl",
    "ndctl",
    "daxctl",
    "kmod",
    "iproute2",
    "procps",
    "trace-cmd",
)
# Not needed in a running guest whose root is the initramfs itself.
EXCLUDED_FROM_ROOT = ("./boot", "./var/cache/apt", "./var/lib/apt/lists", "./usr/share/doc")
FILES_DIR = Path(__file__).parent / "rootfs"
BUILD_LOCK = ".build.lock"


@dataclass(frozen=True)
class GuestImage:
    """A built guest image: the files QEMU boots."""

    kernel: Path
    rootfs: Path

    def exists(self) -> bool:
        return self.kernel.is_file() and self.rootfs.is_file()


def _image_key() -> str:
    # The mirror is not part of the key: any mirror serves the same suite.
    digest = hashlib.sha256()
    digest.update(json.dumps([SUITE, PACKAGES, EXCLUDED_FROM_ROOT]).encode())
    digest.update(Path(__file__).read_bytes())
    for path in sorted(FILES_DIR.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(FILES_DIR)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _debian_mirror() -> str:
    mirror = os.environ.get("CXLSSD_DEBIAN_MIRROR")
    if not mirror:
        raise PrerequisiteError(
            "CXLSSD_DEBIAN_MIRROR is not set; run the platform through ./cxlssd, "
            "which reads the mirror from the machine's apt sources"
        )
    return mirror


def image_dir() -> Path:
    return cache_dir() / "images"


def current_image() -> GuestImage:
    """The image for the current inputs (it may not be built yet)."""
    root = image_dir() / f"{SUITE}-{_image_key()}"
    return GuestImage(kernel=root / "vmlinuz", rootfs=root / "rootfs.cpio")


def ensure_image() -> GuestImage:
    """Return the guest image for the current inputs, building it first if needed."""
    image = current_image()
    if image.exists():
        return image
    if os.geteuid() != 0:
        raise PrerequisiteError(
            "building the guest image needs root (mmdebstrap --mode=root keeps file owners); "
            "run ./cxlssd as root (e.g. after 'sudo -i'), as the README says"
        )
    for tool in ("mmdebstrap", "cpio"):
        if shutil.which(tool) is None:
            raise PrerequisiteError(f"{tool} not found; run ./cxlssd setup to install it")
    mirror = _debian_mirror()
    # One builder at a time: two first runs would share the staging directory.
    image_dir().mkdir(parents=True, exist_ok=True)
    lock = image_dir() / BUILD_LOCK
    try:
        with exclusive_lock(lock, wait=False):
            _build_unless_built(image, mirror)
    except LockHeld as held:
        log.info("another run (pid %s) is building the guest image; waiting for it ...", held.holder)
        with exclusive_lock(lock, wait=True):
            _build_unless_built(image, mirror)
    return image


def _build_unless_built(image: GuestImage, mirror: str) -> None:
    # Under the lock: the run that held it may have built the image, or failed or been killed.
    if not image.exists():
        _build(image, mirror)


def _build(image: GuestImage, mirror: str) -> None:
    out_dir = image.rootfs.parent
    staging = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    tree = staging / "tree"
    staging.mkdir(parents=True)
    started = time.monotonic()
    log.info("building the guest image (Debian %s, first run only, ~2-4 min) ...", SUITE)
    try:
        _run([
            "mmdebstrap", "--variant=apt", "--mode=root", "--quiet",
            "--include=" + ",".join(PACKAGES),
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            SUITE, str(tree), mirror,
        ], "mmdebstrap")
        _customize(tree)
        kernels = sorted((tree / "boot").glob("vmlinuz-*"))
        if not kernels:
            raise PrerequisiteError(f"the guest image has no kernel in {tree}/boot")
        shutil.copy(kernels[-1], staging / image.kernel.name)
        _write_cpio(tree, staging / image.rootfs.name)
        shutil.rmtree(tree)
        # Only the current image is kept: older ones are ~0.5 GB each.
        for old in image_dir().glob(f"{SUITE}-*"):
            if old != staging:
                shutil.rmtree(old, ignore_errors=True)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("guest image ready in %.0f s: %s", time.monotonic() - started, out_dir)


def _customize(tree: Path) -> None:
    """Install the platform's guest files and settings into the root tree."""
    for source in FILES_DIR.rglob("*"):
        if source.is_file():
            target = tree / source.relative_to(FILES_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    (tree / "etc/hostname").write_text("cxlssd-guest\n")
    # Host keys come per instance through fw_cfg; none is baked into the image.
    for key in (tree / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    _run(["systemctl", f"--root={tree}", "enable", "cxlssd-init.service"], "systemctl enable")
    # Timers and services a scratch test guest does not need slow its boot under TCG.
    _run(
        [
            "systemctl",
            f"--root={tree}",
            "mask",
            "apt-daily.timer",
            "apt-daily-upgrade.timer",
            "e2scrub_all.timer",
            "fstrim.timer",
            "systemd-timesyncd.service",
            "ssh.socket",
        ],
        "systemctl mask",
    )


def _write_cpio(tree: Path, out: Path) -> None:
    """Pack ``tree`` as an uncompressed newc cpio (decompression is slow under TCG)."""
    find = subprocess.run(["find", ".", "-mindepth", "1"], cwd=tree, check=True,
                          capture_output=True)
    paths = [p for p in find.stdout.split(b"\n") if p and not any(
        p == x.encode() or p.startswith(x.encode() + b"/") for x in EXCLUDED_FROM_ROOT)]
    with open(out, "wb") as archive:
        result = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=tree,
                                input=b"\n".join(paths) + b"\n", stdout=archive,
                                stderr=subprocess.PIPE)
    if result.returncode != 0:
        raise PrerequisiteError(f"cpio failed while building the guest image: {result.stderr.decode()}")


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise PrerequisiteError(f"{what} failed while building the guest image:\n{tail}")
