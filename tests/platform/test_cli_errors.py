"""Bad input through ./cxlssd: one clear line, exit code 2, nothing left running."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cxlssd.errors import PrerequisiteError
from cxlssd.paths import cache_dir

Cli = Callable[..., subprocess.CompletedProcess[str]]


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors, f"no error line in stderr: {result.stderr!r}"
    assert "Traceback" not in result.stderr
    return errors[0]


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "platform.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("guest: {dram: [2GiB}\n", "malformed YAML at line 1"),
        (
            "guest: {dram: 2GiB}\ncxl_device: [{size: 1GiB}]\n",
            "unknown key 'cxl_device'; did you mean 'cxl_devices'",
        ),
        ("cxl_devices: [{size: 300MiB}]\n", "is not a multiple of 256MiB"),
        ("cxl_devices: [{size: 64GiB}]\n", "backing files but"),
        ("guest: {dram: 256GiB}\n", "the host has only"),
    ],
)
def test_bad_config(cli: Cli, tmp_path: Path, text: str, message: str) -> None:
    result = cli("guest", "exec", "--config", _config(tmp_path, text), "--", "true")
    assert result.returncode == 2
    assert message in _error_line(result)


def test_missing_command(cli: Cli) -> None:
    result = cli("guest", "exec")
    assert result.returncode == 2
    assert "needs a command" in _error_line(result)


def test_qemu_missing(cli: Cli, tmp_path: Path) -> None:
    result = cli("guest", "exec", "--", "true", env={"CXLSSD_QEMU": str(tmp_path / "no-qemu")})
    assert result.returncode == 2
    assert "QEMU not found" in _error_line(result)


def test_qemu_too_old(cli: Cli, tmp_path: Path) -> None:
    fake = tmp_path / "qemu-system-x86_64"
    fake.write_text("#!/bin/sh\necho 'QEMU emulator version 9.2.0 (Debian 1:9.2.0)'\n")
    fake.chmod(0o755)
    result = cli("guest", "exec", "--", "true", env={"CXLSSD_QEMU": str(fake)})
    assert result.returncode == 2
    line = _error_line(result)
    assert "QEMU 9.2.0" in line and "too old" in line and ">= 10.0" in line


def test_cache_dir_not_writable_in_bootstrap(cli: Cli, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = cli("guest", "exec", "--", "true", env={"CXLSSD_CACHE": str(blocker / "cache")})
    assert result.returncode == 2
    assert "is not writable; set CXLSSD_CACHE" in _error_line(result)


def test_cache_dir_not_writable_in_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CXLSSD_CACHE", str(blocker / "cache"))
    with pytest.raises(PrerequisiteError, match="is not writable"):
        cache_dir()


@pytest.mark.guest
def test_boot_timeout_shows_serial_log(cli: Cli, tmp_path: Path) -> None:
    config = _config(tmp_path, "guest: {boot_timeout_s: 4}\n")
    result = cli("guest", "exec", "--config", config, "--", "true")
    assert result.returncode == 2
    assert "was not ready within 4 s (guest.boot_timeout_s in" in _error_line(result)
    assert "last lines of the serial log" in result.stderr
