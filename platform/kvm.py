"""Is KVM usable here? The platform runs its guests under TCG either way (the cxlssd
plugin that keeps the modelled clock is a TCG plugin), and says why in one line.

Usable means: ``/dev/kvm`` opens read-write, reports API version 12, creates a VM, and
the CPU has hardware virtualization (``vmx``/``svm``). The last check matters: a
paravirtual KVM such as PVM (``kvm_pvm``) creates VMs without it, but cannot boot a
stock kernel (measured on these machines, DESIGN.md section 2).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_API_VERSION = 12


@dataclass(frozen=True)
class KvmProbe:
    usable: bool
    reason: str

    def notice(self) -> str:
        """The one line the platform logs at launch."""
        if self.usable:
            return "KVM is usable but not used: the cxlssd TCG plugin (the modelled clock) needs TCG"
        return f"KVM is not usable ({self.reason}): guests run under TCG"


def probe_kvm(
    device: Path = Path("/dev/kvm"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    modules: Path = Path("/sys/module"),
) -> KvmProbe:
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        return KvmProbe(False, f"{device}: {error.strerror}")
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        if version != KVM_API_VERSION:
            return KvmProbe(False, f"{device} has API version {version}, not {KVM_API_VERSION}")
        os.close(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
    except OSError as error:
        return KvmProbe(False, f"{device} does not create a VM: {error.strerror}")
    finally:
        os.close(fd)
    flags = set()
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    if not flags & {"vmx", "svm"}:
        pvm = "; /dev/kvm is the paravirtual kvm_pvm" if (modules / "kvm_pvm").exists() else ""
        return KvmProbe(False, f"the CPU has no hardware virtualization, vmx/svm{pvm}")
    return KvmProbe(True, "")
