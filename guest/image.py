"""The guest image: Debian trixie root filesystem with Debian's 6.12 kernel.

Built with ``mmdebstrap`` from Debian packages only, into the cache directory,
keyed by a hash of its inputs (package list, suite, the files written into it,
this builder), so it is rebuilt exactly when an input changes. Outputs: an ext4
root image (booted read-only through QEMU ``snapshot=on``, so instances never
change it), and the kernel and initrd taken out of it for ``-kernel``/``-initrd``.

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
from cxlssd.paths import cache_dir

log = logging.getLogger(__name__)

SUITE = "trixie"
# trixie has ndctl 81 (RAM regions), Python 3.13 and numpy 2; its kernel is 6.12.
PACKAGES = (
    "systemd-sysv", "udev", "openssh-server", "linux-image-amd64", "initramfs-tools",
    "python3", "python3-numpy", "numactl", "ndctl", "daxctl", "kmod", "iproute2",
    "procps", "trace-cmd",
)
EXTRA_FREE_BYTES = 512 << 20
FILES_DIR = Path(__file__).parent / "rootfs"


@dataclass(frozen=True)
class GuestImage:
    """A built guest image: the files QEMU boots."""

    kernel: Path
    initrd: Path
    rootfs: Path

    def exists(self) -> bool:
        return all(p.is_file() for p in (self.kernel, self.initrd, self.rootfs))


def _image_key() -> str:
    # The mirror is not part of the key: any mirror serves the same suite.
    digest = hashlib.sha256()
    digest.update(json.dumps([SUITE, PACKAGES, EXTRA_FREE_BYTES]).encode())
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
    return GuestImage(kernel=root / "vmlinuz", initrd=root / "initrd.img", rootfs=root / "rootfs.ext4")


def ensure_image() -> GuestImage:
    """Return the guest image for the current inputs, building it first if needed."""
    image = current_image()
    if image.exists():
        return image
    for tool in ("mmdebstrap", "mke2fs"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise PrerequisiteError(f"{tool} not found; run ./cxlssd setup to install it")
    _build(image, _debian_mirror())
    return image


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
        initrds = sorted((tree / "boot").glob("initrd.img-*"))
        if not kernels or not initrds:
            raise PrerequisiteError(f"the guest image has no kernel/initrd in {tree}/boot")
        shutil.copy(kernels[-1], staging / image.kernel.name)
        shutil.copy(initrds[-1], staging / image.initrd.name)
        used_bytes = int(subprocess.run(
            ["du", "-sb", str(tree)], check=True, capture_output=True, text=True
        ).stdout.split()[0])
        size_mib = (used_bytes + EXTRA_FREE_BYTES) >> 20
        _run(["mke2fs", "-q", "-t", "ext4", "-L", "cxlssd-root", "-d", str(tree),
              str(staging / image.rootfs.name), f"{size_mib}M"], "mke2fs")
        shutil.rmtree(tree)
        shutil.rmtree(out_dir, ignore_errors=True)
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
    _run(["systemctl", f"--root={tree}", "mask", "apt-daily.timer", "apt-daily-upgrade.timer",
          "e2scrub_all.timer", "fstrim.timer", "systemd-timesyncd.service",
          "ssh.socket"], "systemctl mask")


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise PrerequisiteError(f"{what} failed while building the guest image:\n{tail}")
