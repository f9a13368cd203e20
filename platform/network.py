"""Bridge networking for several guests, inside a network namespace the platform owns.

:class:`GuestNetwork` creates, with pyroute2, a network namespace named after the
platform run (``cxlssd-<uid>-<owner pid>-<run name>``), a bridge in it with the
subnet's first address, and one tap per guest attached to the bridge. Nothing
connects the namespace to the host (no veth, no NAT), so guest traffic on the
bridge never leaves it. Each tap is also opened (from a thread that entered the
namespace) and its descriptor handed to QEMU (``-netdev tap,fd=N``): QEMU itself
stays in the host namespace, where its user-mode NIC forwards SSH on 127.0.0.1.

Lifecycle: ``create()`` / ``destroy()`` or the context manager. ``destroy()`` is
idempotent and also undoes a ``create()`` that failed half-way. A namespace whose
owner process died (killed -9) is removed by the next ``create()``, as
``machine.reap_stale_instances`` does with runtime dirs: the owner's pid is part of
the namespace's name.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import logging
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from cxlssd.errors import ConfigError, PrerequisiteError
from cxlssd.lifecycle import Lifecycle, pid_alive
from cxlssd.platform.config import NetworkConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

BRIDGE_IFNAME = "cxbr0"
TAP_IFNAME = "cxtap{index}"  # interface names: at most 15 characters
# Locally administered unicast prefix, distinct from QEMU's default 52:54:00 NICs.
MAC_PREFIX = "52:54:77"
_TUNSETIFF = 0x400454CA
_CLONE_NEWNET = 0x40000000
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000


def namespace_prefix() -> str:
    """Every namespace of this user's platform runs starts with this."""
    return f"cxlssd-{os.getuid()}-"


def namespace_name(run_name: str, owner_pid: int | None = None) -> str:
    return f"{namespace_prefix()}{owner_pid or os.getpid()}-{run_name}"


def platform_namespaces() -> list[str]:
    """This user's platform namespaces that exist now (live or stale)."""
    return sorted(name for name in netns.listnetns() if name.startswith(namespace_prefix()))


def reap_stale_networks() -> list[str]:
    """Remove the namespaces whose owner process is gone (with their bridge and taps,
    which the kernel deletes with the namespace). Returns the names removed."""
    reaped = []
    pattern = re.compile(re.escape(namespace_prefix()) + r"(\d+)-")
    for name in platform_namespaces():
        match = pattern.match(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            netns.remove(name)
        reaped.append(name)
    return reaped


def guest_mac(address: ipaddress.IPv4Interface) -> str:
    """The bridge NIC's MAC: the prefix and the address's last 3 bytes (unique on a
    subnet of at most /8, which config.py enforces)."""
    return ":".join([MAC_PREFIX, *(f"{b:02x}" for b in address.ip.packed[1:])])


def check_subnet_free(network: NetworkConfig, source: str) -> None:
    """Refuse a bridge subnet that overlaps an address or route of the host: the
    guests' addresses must be unambiguous wherever they are reported or reached."""
    subnet = network.subnet
    with IPRoute() as ipr:
        names = {link["index"]: link.get("ifname") for link in ipr.get_links()}
        for addr in ipr.get_addr(family=socket.AF_INET):
            used = ipaddress.IPv4Interface((addr.get("IFA_ADDRESS"), addr["prefixlen"]))
            if used.network.overlaps(subnet):
                raise ConfigError(
                    f"{source}: network.subnet {subnet} overlaps the host's address {used} on "
                    f"{names.get(addr['index'], '?')}; choose another subnet"
                )
        for route in ipr.route("dump", family=socket.AF_INET):
            if route["dst_len"] == 0:  # default routes cover everything
                continue
            dst = ipaddress.IPv4Network((route.get("RTA_DST"), route["dst_len"]), strict=False)
            if dst.overlaps(subnet):
                raise ConfigError(
                    f"{source}: network.subnet {subnet} overlaps the host's route to {dst} via "
                    f"{names.get(route.get('RTA_OIF'), '?')}; choose another subnet"
                )


@dataclass(frozen=True)
class GuestPort:
    """One guest's attachment to the bridge: its tap and the open descriptor QEMU gets."""

    guest: str
    tap: str
    tap_fd: int
    mac: str
    address: ipaddress.IPv4Interface


class GuestNetwork(Lifecycle):
    """A bridge with one tap per guest in a network namespace owned by this process."""

    def __init__(
        self, run_name: str, config: NetworkConfig,
        guests: Sequence[tuple[str, ipaddress.IPv4Interface]],
    ) -> None:
        if config.mode != "bridge":
            raise ValueError(f"GuestNetwork needs a bridge network, got mode {config.mode!r}")
        self.config = config
        self.namespace = namespace_name(run_name)
        self._guests = list(guests)
        self.ports: dict[str, GuestPort] = {}
        self._created = False

    def _begin(self) -> None:
        self.create()

    def _end(self, error: BaseException | None) -> None:
        self.destroy()

    def create(self) -> GuestNetwork:
        """Make the namespace, the bridge and the taps, and open the taps for QEMU.
        On any failure everything made so far is removed."""
        if os.geteuid() != 0:
            raise PrerequisiteError(
                "bridge networking needs root (network namespace, bridge and taps); "
                "run as root or use network mode: user"
            )
        for name in reap_stale_networks():
            log.info("removed network namespace %s (its owner had died)", name)
        try:
            self._created = True  # from here on destroy() has something to undo
            create_namespace(self.namespace)
            in_namespace(self.namespace, self._build)
        except BaseException as error:
            self.destroy()
            if isinstance(error, (OSError, NetlinkError)):
                raise PrerequisiteError(
                    f"cannot create the bridge network in namespace {self.namespace}: {error}"
                ) from error
            raise
        log.info(
            "network namespace %s: bridge %s %s, taps for %s",
            self.namespace, BRIDGE_IFNAME, self.config.bridge_address,
            ", ".join(f"{p.guest} ({p.address.ip})" for p in self.ports.values()),
        )
        return self

    def _build(self) -> None:
        """In the namespace: the bridge with its address, then per guest a tap on the
        bridge and a descriptor attached to it (``self.ports``, closed by destroy())."""
        bridge_address = self.config.bridge_address
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            ipr.link("add", ifname=BRIDGE_IFNAME, kind="bridge")
            bridge = ipr.link_lookup(ifname=BRIDGE_IFNAME)[0]
            ipr.addr("add", index=bridge, address=str(bridge_address.ip),
                     prefixlen=bridge_address.network.prefixlen)
            ipr.link("set", index=bridge, state="up")
            for index, (guest, address) in enumerate(self._guests):
                tap = TAP_IFNAME.format(index=index)
                ipr.link("add", ifname=tap, kind="tuntap", mode="tap", iff_no_pi=True)
                ipr.link("set", index=ipr.link_lookup(ifname=tap)[0], master=bridge, state="up")
                self.ports[guest] = GuestPort(
                    guest=guest, tap=tap, tap_fd=self._open_tap(tap),
                    mac=guest_mac(address), address=address,
                )

    def _open_tap(self, tap: str) -> int:
        """A descriptor attached to ``tap`` (run in the namespace: /dev/net/tun binds
        to the namespace of the thread that opens it). It is process-wide."""
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", tap.encode(), _IFF_TAP | _IFF_NO_PI))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def links(self) -> list[str]:
        """Names of the interfaces in the namespace ([] once it is gone)."""
        if self.namespace not in netns.listnetns():
            return []
        return in_namespace(self.namespace, _link_names)

    def destroy(self) -> None:
        """Close the tap descriptors, delete taps and bridge, remove the namespace.
        Safe to call more than once and after a failed ``create()``."""
        ports, self.ports = self.ports, {}
        for port in ports.values():
            with contextlib.suppress(OSError):
                os.close(port.tap_fd)
        if not self._created:
            return
        if self.namespace in netns.listnetns():
            # The kernel deletes the links with the namespace, but only once nothing
            # holds it: delete them now, so they are gone even if a tap is still open.
            with contextlib.suppress(OSError, NetlinkError):
                in_namespace(self.namespace, _delete_links)
            with contextlib.suppress(FileNotFoundError):
                netns.remove(self.namespace)
        self._created = False
        log.info("removed network namespace %s", self.namespace)


def _link_names() -> list[str]:
    with IPRoute() as ipr:
        return sorted(link.get("ifname") for link in ipr.get_links())


def _delete_links() -> None:
    with IPRoute() as ipr:
        for link in ipr.get_links():
            if link.get("ifname") != "lo":
                with contextlib.suppress(NetlinkError):
                    ipr.link("del", index=link["index"])


# -- namespaces from threads ----------------------------------------------------------
# pyroute2's own netns helpers (netns.create, IPRoute(netns=...)) fork the Python
# process and stop the copy with SIGTERM; under the CLI, whose SIGTERM handler raises
# KeyboardInterrupt (Ctrl-C semantics), that copy would go on running the parent's
# cleanup code (it tore a network down in a test). A network namespace is a property
# of a thread, so the platform enters namespaces from short-lived threads instead.


def _in_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` in a new thread; its result, or its exception raised here."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as error:  # handed to the calling thread
            errors.append(error)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    try:
        thread.join()
    except BaseException:  # Ctrl-C: the work takes milliseconds; let it end before undoing it
        thread.join()
        raise
    if errors:
        raise errors[0]
    return results[0]


def in_namespace(namespace: str, work: Callable[[], T]) -> T:
    """``work()`` run in the network namespace ``namespace``: netlink sockets
    (``IPRoute()``) and taps it opens belong to that namespace."""

    def entered() -> T:
        netns.setns(namespace, flags=0)  # this thread only; flags=0: never creates one
        return work()

    return _in_thread(entered, f"netns-{namespace}")


def unshare_network() -> None:
    """Move the calling thread (and the threads and processes it starts from now on)
    into a new network namespace of its own, which holds only a loopback interface, down."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare(CLONE_NEWNET): {os.strerror(error)}")


def create_namespace(namespace: str) -> None:
    """A new network namespace, pinned as /run/netns/NAME (like ``ip netns add``)."""

    def create() -> None:
        unshare_network()
        netns.attach(namespace, "thread-self")  # bind-mounts /proc/thread-self/ns/net

    _in_thread(create, f"create-{namespace}")
