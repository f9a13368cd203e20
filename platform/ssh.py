"""SSH into a guest: per-instance keys, strict host-key check, streamed commands."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shlex
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import paramiko

from cxlssd.errors import GuestError, GuestTimeout

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.1
EOF_GRACE_S = 2.0  # how long output may trail the exit status
CHANNEL_OPEN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class InstanceKeys:
    """The key pair the host logs in with and the guest's host key (both ed25519)."""

    client_key: Path
    host_key: Path

    @property
    def authorized_keys(self) -> Path:
        return self.client_key.with_suffix(".pub")

    @property
    def host_public_key(self) -> Path:
        return self.host_key.with_suffix(".pub")

    @classmethod
    def generate(cls, directory: Path) -> InstanceKeys:
        keys = cls(client_key=directory / "client_key", host_key=directory / "host_key")
        for path, comment in ((keys.client_key, "cxlssd-client"), (keys.host_key, "cxlssd-host")):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                check=True,
                capture_output=True,
            )
        return keys


def wait_for_banner(port: int, deadline: float, alive: Callable[[], None]) -> None:
    """Wait until sshd answers with its banner: QEMU's user-mode forwarder
    accepts TCP before sshd listens, so an accepted connection proves nothing.
    ``alive`` raises if the guest died meanwhile."""
    while True:
        alive()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                conn.settimeout(5)
                if conn.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(1)


class GuestSSH:
    """An SSH connection to one guest as root."""

    def __init__(self, port: int, keys: InstanceKeys) -> None:
        self.port = port
        self.keys = keys
        self._client = paramiko.SSHClient()
        host_key = paramiko.Ed25519Key.from_private_key_file(str(keys.host_key))
        self._client.get_host_keys().add(f"[127.0.0.1]:{port}", host_key.get_name(), host_key)
        self._client.set_missing_host_key_policy(paramiko.RejectPolicy())

    def connect(self) -> None:
        self._client.connect(
            "127.0.0.1",
            port=self.port,
            username="root",
            key_filename=str(self.keys.client_key),
            allow_agent=False,
            look_for_keys=False,
            timeout=30,
            banner_timeout=60,
            auth_timeout=60,
            channel_timeout=CHANNEL_OPEN_TIMEOUT_S,
        )
        # No keepalive: a packet sent by the host's clock wakes the guest's sshd inside
        # whatever ROI runs then (measured with ftrace: in 4 of 6 traced ROIs, ~20 000
        # instructions and their LLC misses each). The connection is loopback to QEMU's
        # forward, with no NAT or firewall to keep open; a hung guest ends in GuestTimeout.

    def close(self) -> None:
        self._client.close()

    def run(
        self,
        argv: Sequence[str],
        stdin: bytes | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        check: bool = False,
        watch: Callable[[], None] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` in the guest. Output is streamed to ``stdout``/``stderr`` when
        given, else captured and returned. Returns (exit status, stdout, stderr).

        ``watch`` is called about every 0.1 s while the command runs; if it raises
        (the firmware died, say), the command's channel is closed and the error
        propagates. After ``timeout_s`` (wall-clock) the channel is closed and a
        :class:`GuestTimeout` raised."""
        command = shlex.join(argv)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        channel = self._open_session()
        channel.exec_command(command)
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        out, err = bytearray(), bytearray()
        exited_at: float | None = None
        next_watch = time.monotonic() + WATCH_INTERVAL_S
        while True:
            if deadline is not None and time.monotonic() > deadline:
                channel.close()
                raise GuestTimeout(f"the guest command did not finish within {timeout_s:.0f} s: {command}")
            if watch is not None and time.monotonic() >= next_watch:
                next_watch = time.monotonic() + WATCH_INTERVAL_S
                try:
                    watch()
                except BaseException:
                    channel.close()
                    raise
            got_out = _drain(channel.recv_ready, channel.recv, stdout, out)
            got_err = _drain(channel.recv_stderr_ready, channel.recv_stderr, stderr, err)
            if not (got_out or got_err):
                if channel.exit_status_ready() and not (
                    channel.recv_ready() or channel.recv_stderr_ready()
                ):
                    # sshd may send the exit status before the last of the output: the
                    # output ends at EOF. A background child that keeps the output open
                    # never sends EOF, so that wait is bounded.
                    if exited_at is None:
                        exited_at = time.monotonic()
                    if channel.eof_received or time.monotonic() - exited_at >= EOF_GRACE_S:
                        if watch is not None:
                            watch()  # a channel ended by a dead guest or firmware: say why
                        break
                time.sleep(0.01)
        status = channel.recv_exit_status()
        channel.close()
        if check and status != 0:
            raise GuestError(
                f"guest command failed with status {status}: {command}\n"
                + bytes(err).decode(errors="replace").strip()[-2000:]
            )
        return status, bytes(out), bytes(err)

    def _open_session(self) -> paramiko.Channel:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestError("the SSH connection to the guest is closed")
        try:
            return transport.open_session(timeout=CHANNEL_OPEN_TIMEOUT_S)
        except paramiko.SSHException as error:
            raise GuestError(f"cannot open an SSH channel to the guest: {error}") from None

    def open_process(self, argv: Sequence[str]) -> paramiko.Channel:
        """Start ``argv`` and return its channel, for interactive use (tests, agents)."""
        channel = self._open_session()
        channel.exec_command(shlex.join(argv))
        return channel

    def put_tree(self, local: Path, remote: str, timeout_s: float | None = None) -> None:
        """Copy the directory ``local`` into the guest as ``remote`` (an absolute path) over
        SFTP, merging with what is there: directories are created, files keep their
        permission bits. Each file is written under a temporary name and renamed over
        the old one, so a reader never sees a partial file and a running binary is
        never overwritten in place. ``timeout_s`` bounds the whole copy (a
        :class:`GuestTimeout`)."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise GuestError("the SSH connection to the guest is closed")
        try:
            sftp = self._client.open_sftp()
        except paramiko.SSHException as error:
            raise GuestError(f"cannot open an SFTP session to the guest: {error}") from None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            _put_tree(sftp, local, remote, deadline)
        except TimeoutError:
            raise GuestTimeout(f"copying {local} to the guest's {remote} did not finish within "
                               f"{timeout_s:.0f} s") from None
        except OSError as error:
            raise GuestError(f"copying {local} to the guest's {remote} failed: {error}") from None
        finally:
            sftp.close()

    def interactive_argv(self, known_hosts: Path) -> list[str]:
        """An ``ssh`` command line for a shell in the guest (append a command to run
        one); writes ``known_hosts`` with the instance's host key so it is checked."""
        key_type, key_data = self.keys.host_public_key.read_text().split()[:2]
        known_hosts.write_text(f"[127.0.0.1]:{self.port} {key_type} {key_data}\n")
        return [
            "ssh",
            "-p",
            str(self.port),
            "-i",
            str(self.keys.client_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
        ]


def _drain(
    ready: Callable[[], bool],
    receive: Callable[[int], bytes],
    stream: BinaryIO | None,
    buffer: bytearray,
) -> bool:
    """Move what a channel has ready to ``stream`` (streamed) or ``buffer`` (captured)."""
    if not ready():
        return False
    chunk = receive(65536)
    if stream is None:
        buffer.extend(chunk)
    else:
        stream.write(chunk)
        stream.flush()
    return True


def _put_tree(sftp: paramiko.SFTPClient, local: Path, remote: str, deadline: float | None) -> None:
    """Copy ``local`` to ``remote``; past ``deadline`` (monotonic) a TimeoutError, also
    from inside a stalled SFTP operation (the channel's timeout is what remains)."""
    _make_remote_dirs(sftp, remote, stat.S_IMODE(local.stat().st_mode))
    for entry in sorted(local.iterdir()):
        if deadline is not None:
            remaining_s = deadline - time.monotonic()
            channel = sftp.get_channel()
            if remaining_s <= 0 or channel is None:
                raise TimeoutError
            channel.settimeout(remaining_s)
        target = posixpath.join(remote, entry.name)
        mode = stat.S_IMODE(entry.stat().st_mode)
        if entry.is_dir():
            _put_tree(sftp, entry, target, deadline)
        elif entry.is_file():
            partial = posixpath.join(remote, f".{entry.name}.{os.getpid()}.tmp")
            try:
                sftp.put(str(entry), partial)
                sftp.chmod(partial, mode)
                sftp.posix_rename(partial, target)
            except OSError:
                with contextlib.suppress(OSError):
                    sftp.remove(partial)
                raise
        else:
            raise OSError(f"{entry} is neither a regular file nor a directory")


def _make_remote_dirs(sftp: paramiko.SFTPClient, remote: str, mode: int) -> None:
    """``mkdir -p remote`` (the directories it creates get ``mode``)."""
    try:
        if not stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
            raise OSError(f"{remote} exists in the guest and is not a directory")
        return
    except FileNotFoundError:
        pass
    parent = posixpath.dirname(remote)
    if parent != remote:
        _make_remote_dirs(sftp, parent, mode)
    sftp.mkdir(remote, mode)
    sftp.chmod(remote, mode)  # mkdir's mode is masked by the server's umask
