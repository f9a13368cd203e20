"""KVM detection: the one-line notice says whether KVM is usable and why not."""

from __future__ import annotations

from pathlib import Path

from cxlssd.platform.kvm import probe_kvm


def test_this_machine() -> None:
    """Measured here: /dev/kvm is the paravirtual PVM, the CPU has no vmx/svm."""
    probe = probe_kvm()
    print(probe.notice())
    cpuinfo = Path("/proc/cpuinfo").read_text()
    if " vmx" not in cpuinfo and " svm" not in cpuinfo:
        assert not probe.usable and "hardware virtualization" in probe.reason
    assert "TCG" in probe.notice()


def test_missing_device(tmp_path: Path) -> None:
    probe = probe_kvm(device=tmp_path / "kvm")
    assert not probe.usable and "No such file" in probe.reason
    assert probe.notice().startswith("KVM is not usable") and probe.notice().endswith("guests run under TCG")


def test_not_a_kvm_device(tmp_path: Path) -> None:
    fake = tmp_path / "kvm"
    fake.write_bytes(b"")  # a plain file: the ioctl fails
    probe = probe_kvm(device=fake)
    assert not probe.usable
    assert "API version" in probe.reason or "does not create a VM" in probe.reason
