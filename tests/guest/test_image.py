"""The guest image's build lock: two first runs never build into the same directory.

``_build`` (mmdebstrap, ~3 min) is replaced by a fake that writes the two files;
the lock, the waiting and the re-check are the real code."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cxlssd.guest import image as image_module
from cxlssd.guest.image import BUILD_LOCK, GuestImage, ensure_image, image_dir
from cxlssd.lifecycle import exclusive_lock


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[GuestImage]:
    """Run ensure_image in a private cache as root with the tools present; returns
    the list of the images the fake builder built."""
    monkeypatch.setenv("CXLSSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXLSSD_DEBIAN_MIRROR", "http://mirror.invalid/debian")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    built: list[GuestImage] = []

    def fake_build(image: GuestImage, mirror: str) -> None:
        _write(image)
        built.append(image)

    monkeypatch.setattr(image_module, "_build", fake_build)
    return built


def _write(image: GuestImage) -> None:
    image.kernel.parent.mkdir(parents=True, exist_ok=True)
    image.kernel.write_bytes(b"kernel")
    image.rootfs.write_bytes(b"rootfs")


@contextlib.contextmanager
def _a_run_waiting_for_the_lock(caplog: pytest.LogCaptureFixture) -> Iterator[list[GuestImage]]:
    """Hold the build lock as another run would, with ensure_image waiting for it in a
    thread; yields what that call returns (after the block, which releases the lock)."""
    caplog.set_level(logging.INFO, logger=image_module.__name__)
    image_dir().mkdir(parents=True)
    result: list[GuestImage] = []
    thread = threading.Thread(target=lambda: result.append(ensure_image()))
    with exclusive_lock(image_dir() / BUILD_LOCK, wait=False):
        thread.start()
        deadline = time.monotonic() + 10
        while f"another run (pid {os.getpid()}) is building the guest image; waiting" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.01)
        assert thread.is_alive()
        yield result
    thread.join(10)


def test_a_run_waits_for_the_build_in_progress_and_uses_its_image(
        builds: list[GuestImage], caplog: pytest.LogCaptureFixture) -> None:
    with _a_run_waiting_for_the_lock(caplog) as result:
        assert not builds
        _write(image_module.current_image())  # the other run finishes its build
    assert not builds and result == [image_module.current_image()]


def test_a_run_builds_the_image_itself_when_the_build_it_waited_for_failed(
        builds: list[GuestImage], caplog: pytest.LogCaptureFixture) -> None:
    with _a_run_waiting_for_the_lock(caplog) as result:
        pass  # the other run ends without an image
    assert builds == result == [image_module.current_image()]


def test_a_built_image_is_returned_without_taking_the_lock(builds: list[GuestImage]) -> None:
    _write(image_module.current_image())
    image_dir().joinpath(BUILD_LOCK).mkdir()  # a lock that could not even be opened
    assert ensure_image() == image_module.current_image() and not builds
