"""GuestSSH.run returns a command's whole output. sshd may send the exit status
before the last of the output; the fakes replay that order, and a real guest
checks outputs far larger than one SSH packet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cxlssd.errors import GuestTimeout
from cxlssd.platform import ssh
from cxlssd.platform.machine import Platform
from cxlssd.platform.ssh import GuestSSH, InstanceKeys


class LateOutputChannel:
    """A session channel whose exit status is ready from the start, whose stdout
    chunks arrive one every 20 ms after that, and which then sends EOF (or never
    does)."""

    def __init__(self, chunks: list[bytes], sends_eof: bool) -> None:
        self._chunks = list(chunks)
        self._sends_eof = sends_eof
        self._started = time.monotonic()
        self._received = 0
        self.eof_received = False

    def exec_command(self, command: str) -> None:
        self.command = command

    def shutdown_write(self) -> None:
        pass

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 0

    def recv_ready(self) -> bool:
        arrived = min(len(self._chunks), int((time.monotonic() - self._started) / 0.02))
        self.eof_received = self._sends_eof and arrived == len(self._chunks) == self._received
        return self._received < arrived

    def recv(self, size: int) -> bytes:
        self._received += 1
        return self._chunks[self._received - 1]

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, size: int) -> bytes:
        raise AssertionError("no stderr was ready")

    def close(self) -> None:
        pass


def _guest_with(channel: LateOutputChannel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GuestSSH:
    guest = GuestSSH(port=22, keys=InstanceKeys.generate(tmp_path))

    class Transport:
        def is_active(self) -> bool:
            return True

        def open_session(self, timeout: float | None = None) -> LateOutputChannel:
            return channel

    monkeypatch.setattr(guest._client, "get_transport", Transport)
    return guest


class HungChannel(LateOutputChannel):
    """A command that never ends and never prints."""

    def __init__(self) -> None:
        super().__init__([], sends_eof=False)
        self.closed = False

    def exit_status_ready(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def test_a_command_past_its_timeout_is_closed_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = HungChannel()
    guest = _guest_with(channel, tmp_path, monkeypatch)
    began = time.monotonic()
    with pytest.raises(GuestTimeout, match=r"did not finish within 0 s: sleep infinity"):
        guest.run(["sleep", "infinity"], timeout_s=0.3)
    assert 0.3 <= time.monotonic() - began < 2 and channel.closed


def test_output_sent_after_the_exit_status_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"a" * 100, b"b" * 100, b"c" * 100]
    guest = _guest_with(LateOutputChannel(chunks, sends_eof=True), tmp_path, monkeypatch)
    status, out, err = guest.run(["cat", "/proc/zoneinfo"])
    assert (status, out, err) == (0, b"".join(chunks), b"")


def test_a_channel_without_eof_ends_after_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A command that leaves a background child holding its stdout: no EOF ever.
    monkeypatch.setattr(ssh, "EOF_GRACE_S", 0.05)
    guest = _guest_with(LateOutputChannel([b"started"], sends_eof=False), tmp_path, monkeypatch)
    assert guest.run(["daemon"]) == (0, b"started", b"")


@pytest.mark.slow
@pytest.mark.guest
def test_large_outputs_arrive_whole(default_platform: Platform) -> None:
    # Before the EOF wait, about one run in 75 lost the tail of /proc/zoneinfo.
    guest = default_platform.guest()
    size_bytes = 3 << 20
    device = default_platform.devices[0]
    for _ in range(40):
        _, out, _ = guest.run(["head", "-c", str(size_bytes), "/dev/zero"], check=True)
        assert len(out) == size_bytes
        _, zoneinfo, _ = guest.run(["cat", "/proc/zoneinfo"], check=True)
        assert f"Node {device.node}, zone  Movable".encode() in zoneinfo
