"""The unit tier (``./cxlssd test -m "not guest"``) needs neither QEMU nor a guest image:
only a selection that holds a test marked ``guest`` sets them up (issue 17)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cxlssd.paths import cache_dir
from cxlssd.setup_commands import selects_guest_tests

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("pytest_args", "selects"),
    [
        ([], True),
        (["-m", "not guest"], False),
        (["-mnot guest"], False),
        (["-m", "slow"], True),  # every slow test runs QEMU
        (["tests/firmware"], False),
        (["tests/platform/test_config.py", "-k", "bad"], False),
        (["tests/platform/test_plugin.py", "-k", "bad_arguments"], True),  # QEMU -M none
    ],
)
def test_the_selection_decides_whether_qemu_and_the_image_are_set_up(
    pytest_args: list[str], selects: bool
) -> None:
    assert selects_guest_tests(pytest_args) is selects


def test_the_unit_tier_runs_without_qemu_and_builds_no_image(tmp_path: Path) -> None:
    """A cache without an image and a CXLSSD_QEMU that names nothing: the README's test
    command passes on a selection of unit tests. (The venv is the shared one: installing
    it from PyPI is not what this tests.)"""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "venv").symlink_to(cache_dir() / "venv")
    env = {**os.environ, "CXLSSD_CACHE": str(cache), "CXLSSD_QEMU": str(tmp_path / "no-qemu")}
    result = subprocess.run(
        [str(REPO / "cxlssd"), "test", "-m", "not guest", "tests/platform/test_config.py",
         "tests/firmware/test_profile.py"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "QEMU and the guest image are not needed" in result.stderr
    assert " passed" in result.stdout
    assert not (cache / "images").exists()
