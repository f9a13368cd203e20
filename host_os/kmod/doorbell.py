"""A minimal ivshmem server for one QEMU peer: the guest's ``ivshmem-doorbell`` device.

Debian's QEMU packages ship no ``ivshmem-server``, so the platform plays the server
(QEMU's ``docs/specs/ivshmem-spec.rst`` protocol): when QEMU's chardev connects it
sends, as little-endian int64 messages, the protocol version (0), the peer's id, -1
with the shared memory's descriptor, and the peer's own id once per vector, each with
the eventfd that rings that vector. QEMU watches those eventfds in its main loop and
raises the vector's MSI-X interrupt in the guest when one is written; the server keeps
them, so :meth:`DoorbellServer.ring` (or any process given the descriptor) rings it.

The platform runs one per guest (``Platform.doorbell``, the socket in the instance's
private runtime directory) with two vectors and gives both eventfds to the TCG plugin,
which rings vector 0 on a long-delay answer and vector 1 when the promotion mailbox got
decisions (docs/host-os.md).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
from pathlib import Path

from cxlssd.lifecycle import Lifecycle

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 0
PEER_ID = 1
SHM_BYTES = 4096
CHARDEV_ID = "cxlssd-doorbell"
ACCEPT_TIMEOUT_S = 0.2


def _message(value: int) -> bytes:
    return struct.pack("<q", value)


class DoorbellServer(Lifecycle):
    """The ivshmem server of one ``ivshmem-doorbell`` device with ``vectors`` vectors."""

    def __init__(self, socket_path: Path, vectors: int = 1) -> None:
        if not 1 <= vectors <= 64:
            raise ValueError(f"vectors must be 1..64, not {vectors}")
        self.vectors = vectors
        # In a private directory (the instance's, 0700): the path goes into QEMU's
        # comma-separated options, so it has no commas.
        self.socket_path = socket_path
        self._listener: socket.socket | None = None
        self._peer: socket.socket | None = None
        self._shm_fd = -1
        self._eventfds: list[int] = []
        self._bound = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.connected = threading.Event()

    def start(self) -> None:
        self._shm_fd = os.memfd_create("cxlssd-doorbell", os.MFD_CLOEXEC)
        os.ftruncate(self._shm_fd, SHM_BYTES)
        self._eventfds = [os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK) for _ in range(self.vectors)]
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket_path))  # fails if the path exists: never reused
        self._bound = True
        self._listener.listen(1)
        self._listener.settimeout(ACCEPT_TIMEOUT_S)
        self._thread = threading.Thread(target=self._serve, name="ivshmem-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                peer, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._peer is not None:  # one device per server
                peer.close()
                continue
            try:
                peer.sendall(_message(PROTOCOL_VERSION))
                peer.sendall(_message(PEER_ID))
                socket.send_fds(peer, [_message(-1)], [self._shm_fd])
                for eventfd in self._eventfds:
                    socket.send_fds(peer, [_message(PEER_ID)], [eventfd])
            except OSError as error:
                log.warning("ivshmem server: the peer left during the handshake: %s", error)
                peer.close()
                continue
            self._peer = peer
            self.connected.set()
            log.debug("ivshmem server: QEMU connected as peer %d with %d vectors", PEER_ID, self.vectors)

    def qemu_args(self) -> list[str]:
        """QEMU options for the device (on pcie.0, as the platform's other PCI devices)."""
        return ["-chardev", f"socket,path={self.socket_path},id={CHARDEV_ID}",
                "-device", f"ivshmem-doorbell,chardev={CHARDEV_ID},vectors={self.vectors},bus=pcie.0"]

    def eventfd(self, vector: int = 0) -> int:
        """The descriptor that rings ``vector`` (write a nonzero u64 to it)."""
        return self._eventfds[vector]

    def ring(self, vector: int = 0) -> None:
        """Ring ``vector``: QEMU's main loop raises its MSI-X interrupt in the guest."""
        os.eventfd_write(self._eventfds[vector], 1)

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._peer is not None:
            self._peer.close()
            self._peer = None
        for fd in [*self._eventfds, self._shm_fd]:
            if fd >= 0:
                os.close(fd)
        self._eventfds, self._shm_fd = [], -1
        if self._bound:  # the socket this server created (bind refuses an existing path)
            self.socket_path.unlink(missing_ok=True)
            self._bound = False

    def _begin(self) -> None:
        self.start()

    def _end(self, error: BaseException | None) -> None:
        self.stop()
