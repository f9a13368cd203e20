"""Networking and multi-guest platforms: config validation (no guest), the bridge
network's lifecycle in its own namespace (root, no guest), and two real guests
on a bridge reaching each other (``guest``), with everything removed afterwards."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute, netns

from cxlssd.errors import ConfigError, GuestError, PrerequisiteError
from cxlssd.guest.runtime.install import with_guest_env
from cxlssd.paths import runtime_root
from cxlssd.platform.config import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    MiB,
    NetworkConfig,
    load_config,
    load_multi_config,
    multi_config_from_dict,
)
from cxlssd.platform.machine import check_host_capacity
from cxlssd.platform.multi import MultiPlatform
from cxlssd.platform.network import (
    BRIDGE_IFNAME,
    GuestNetwork,
    check_subnet_free,
    create_namespace,
    in_namespace,
    namespace_name,
    reap_stale_networks,
)

REPO = Path(__file__).resolve().parents[2]
PING = REPO / "guest" / "probes" / "ping.py"
BRIDGE = {"mode": "bridge", "subnet": "10.77.0.0/24"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _pair(**network: Any) -> dict[str, Any]:
    return {"name": "pair", "network": {**BRIDGE, **network}, "guests": [{"name": "a"}, {"name": "b"}]}


def _host_links() -> set[str]:
    with IPRoute() as ipr:
        return {link.get("ifname") for link in ipr.get_links()}


# -- configuration (no root, no guest) --------------------------------------------------


def test_single_guest_files_load_unchanged() -> None:
    single = load_config(DEFAULT_CONFIG)
    multi = load_multi_config(DEFAULT_CONFIG)
    assert multi.network == NetworkConfig(mode="user")
    assert [g.platform for g in multi.guests] == [single]
    assert multi.guests[0].address is None


def test_pair_config_gives_each_guest_its_design_and_address() -> None:
    pair = load_multi_config(CONFIG_DIR / "pair.yaml")
    assert pair.network.mode == "bridge" and str(pair.network.bridge_address) == "10.77.0.1/24"
    assert [(g.name, g.design, str(g.address)) for g in pair.guests] == [
        ("dram-only", "dram-only", "10.77.0.2/24"),
        ("skybyte-full", "skybyte-full", "10.77.0.3/24"),
    ]


def test_explicit_addresses_are_kept_and_the_others_fill_in() -> None:
    raw = _pair()
    raw["guests"][0]["address"] = "10.77.0.2"
    raw["guests"].append({"name": "c", "address": "10.77.0.50/24"})
    config = multi_config_from_dict(raw)
    assert [str(g.address.ip) for g in config.guests if g.address] == ["10.77.0.2", "10.77.0.3", "10.77.0.50"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"guests": [{"name": "a"}, {"name": "b"}, {"name": "a"}]},
            "guests[2]: guest name 'a' is also used by guests[0]; guest names must be unique",
        ),
        (_pair(subnet="10.0.0.0/16"), "overlaps 10.0.2.0/24, the user-mode network"),
        (_pair(subnet="10.0.2.128/25"), "overlaps 10.0.2.0/24"),
        (_pair(subnet="10.77.0.1/24"), "did you mean 10.77.0.0/24?"),
        (_pair(subnet="8.8.8.0/24"), "is not a private range"),
        (_pair(subnet="10.77.0.0/31"), "prefix length from /8 to /30"),
        (_pair(subnet="10.77.0.0/30"), "has no room for 2 guests"),
        (_pair(subnet=77), "expected an IPv4 subnet"),
        (_pair(mode="tap"), "network.mode: expected one of user, bridge, got 'tap'"),
        ({"network": {"mode": "user", "subnet": "10.77.0.0/24"}}, "only a bridge network has a subnet"),
        ({"network": {"mode": "bridge", "subnets": "x"}}, "unknown key 'subnets'; did you mean 'subnet'?"),
        ({"guests": [{"name": "a", "dram": "1GiB"}]}, "guests[0]: unknown key 'dram'"),
        ({"guests": [{"name": "a", "design": "skybyte-ful"}]}, "did you mean 'skybyte-full'?"),
        ({"guests": [{"guest": {"dram": "1GiB"}}]}, "guests[0]: missing 'name'"),
        ({"guests": [{"name": "a b"}]}, "guests[0].name: 'a b' must be 1-32 letters"),
        ({"guests": [{"name": "a", "cxl_devices": [{"size": "100MiB"}]}]}, "not a multiple of 256MiB"),
        ({"guests": []}, "guests must be a non-empty list"),
        ({"guests": [{"name": "a", "address": "10.77.0.9"}]}, "only guests on a bridge network"),
    ],
)
def test_bad_multi_config(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        multi_config_from_dict(raw, "p.yaml")
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("10.78.0.5", "is not a host address of the bridge subnet 10.77.0.0/24"),
        ("10.77.0.5/16", "is not on the bridge subnet"),
        ("10.77.0.1", "is the bridge's own address"),
        ("10.77.0.255", "is not a host address"),
        ("ten", "is not an IPv4 address"),
    ],
)
def test_bad_guest_address(address: str, message: str) -> None:
    raw = _pair()
    raw["guests"][1]["address"] = address
    with pytest.raises(ConfigError) as error:
        multi_config_from_dict(raw, "p.yaml")
    assert message in str(error.value)


def test_two_guests_with_one_address_are_refused() -> None:
    raw = _pair()
    raw["guests"][0]["address"] = raw["guests"][1]["address"] = "10.77.0.7"
    with pytest.raises(ConfigError, match=r"guests\[1\].address 10.77.0.7 is already taken"):
        multi_config_from_dict(raw, "p.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("guests: [{name: a}, {name: b}]\n", "declares several guests"),
        ("network: {mode: bridge}\n", "declares a bridge network"),
    ],
)
def test_single_guest_loader_points_to_the_multi_guest_one(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="MultiPlatform") as error:
        load_config(path)
    assert message in str(error.value)
    load_config(_written(tmp_path / "user.yaml", "network: {mode: user}\n"))  # the default: fine


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_subnet_overlapping_a_host_address_or_route_is_refused() -> None:
    with IPRoute() as ipr:
        host = [
            ipaddress.IPv4Interface((a.get("IFA_ADDRESS"), a["prefixlen"]))
            for a in ipr.get_addr(family=socket.AF_INET)
        ]
    private = [a for a in host if a.ip.is_private and not a.ip.is_loopback and a.network.prefixlen >= 8]
    if not private:
        pytest.skip("the host has no private IPv4 address to collide with")
    taken = private[0]
    subnet = ipaddress.IPv4Network((taken.ip, 30), strict=False)
    with pytest.raises(ConfigError, match=r"overlaps the host's (address|route)"):
        check_subnet_free(NetworkConfig(mode="bridge", subnet=subnet), "p.yaml")
    check_subnet_free(NetworkConfig(mode="bridge"), "p.yaml")  # the default 10.77.0.0/24 is free here


def _subnet_verdicts(subnets: list[str]) -> list[str]:
    """In a fresh namespace (which stands in for the host): an interface with an
    address and a route, then check_subnet_free on each subnet."""
    with IPRoute() as ipr:
        ipr.link("add", ifname="up0", kind="bridge")
        index = ipr.link_lookup(ifname="up0")[0]
        ipr.link("set", index=index, state="up")
        ipr.addr("add", index=index, address="172.20.0.1", prefixlen=24)
        ipr.route("add", dst="10.99.0.0", dst_len=16, oif=index)
    verdicts = []
    for subnet in subnets:
        try:
            check_subnet_free(NetworkConfig(mode="bridge", subnet=ipaddress.IPv4Network(subnet)), "p.yaml")
            verdicts.append("free")
        except ConfigError as error:
            verdicts.append(str(error))
    return verdicts


@needs_root
def test_subnet_overlapping_a_route_or_address_is_refused() -> None:
    namespace = namespace_name("routes-000000")
    create_namespace(namespace)
    try:
        verdicts = in_namespace(
            namespace, lambda: _subnet_verdicts(["10.99.5.0/24", "172.20.0.0/28", "10.77.0.0/24"])
        )
    finally:
        netns.remove(namespace)
    assert verdicts == [
        "p.yaml: network.subnet 10.99.5.0/24 overlaps the host's route to 10.99.0.0/16 via up0; "
        "choose another subnet",
        "p.yaml: network.subnet 172.20.0.0/28 overlaps the host's address 172.20.0.1/24 on up0; "
        "choose another subnet",
        "free",
    ]


def test_host_memory_must_hold_all_guests_at_once() -> None:
    meminfo = Path("/proc/meminfo").read_text()
    available = int(next(x for x in meminfo.splitlines() if x.startswith("MemAvailable")).split()[1]) << 10
    # each guest: this DRAM + its movable DRAM node (2 GiB) + a 1 GiB CXL device = 60 %
    dram_mib = int(available * 0.6 - 3 * 1024 * MiB) // (128 * MiB) * 128
    raw = {"name": "big", "guests": [{"name": n, "guest": {"dram": f"{dram_mib}MiB"}} for n in "ab"]}
    config = multi_config_from_dict(raw, "big.yaml")
    for platform in config.platforms:
        check_host_capacity(platform, runtime_root())  # each alone fits
    before = set(runtime_root().iterdir())
    with pytest.raises(PrerequisiteError, match=r"2 guests together \(a, b\).*the host has only"):
        MultiPlatform(config).launch()
    assert set(runtime_root().iterdir()) == before


# -- the bridge network in its namespace (root, no guest) -------------------------------


def _bridge_ports_and_routes() -> tuple[int, dict[str, int], list[tuple[str, int]]]:
    with IPRoute() as ipr:
        bridge = ipr.link_lookup(ifname=BRIDGE_IFNAME)[0]
        masters = {link.get("ifname"): link.get("master") for link in ipr.get_links()}
        main_table = ipr.route("dump", family=socket.AF_INET, table=254)
        return bridge, masters, [(r.get("RTA_DST"), r["dst_len"]) for r in main_table]


def _network(run_name: str = "unit-000000") -> GuestNetwork:
    return GuestNetwork(
        run_name, NetworkConfig(mode="bridge"),
        [("a", ipaddress.IPv4Interface("10.77.0.2/24")), ("b", ipaddress.IPv4Interface("10.77.0.3/24"))],
    )


@needs_root
def test_network_lifecycle_creates_and_removes_namespace_bridge_and_taps() -> None:
    network = _network()
    with network:
        assert network.namespace == f"cxlssd-{os.getuid()}-{os.getpid()}-unit-000000"
        assert network.namespace in netns.listnetns()
        assert network.links() == ["cxbr0", "cxtap0", "cxtap1", "lo"]
        bridge, masters, routes = in_namespace(network.namespace, _bridge_ports_and_routes)
        assert masters["cxtap0"] == masters["cxtap1"] == bridge
        assert routes == [("10.77.0.0", 24)]  # no default route, no veth: nothing leaves
        assert not {"cxbr0", "cxtap0", "cxtap1"} & _host_links()
        fds = [port.tap_fd for port in network.ports.values()]
        assert all(os.readlink(f"/proc/self/fd/{fd}") == "/dev/net/tun" for fd in fds)
    assert network.namespace not in netns.listnetns() and network.links() == []
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    network.destroy()  # idempotent


@needs_root
def test_network_failing_half_way_removes_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    network = _network()
    opened: list[int] = []
    real_open = GuestNetwork._open_tap

    def open_once(self: GuestNetwork, tap: str) -> int:
        if opened:
            raise OSError(16, "Device or resource busy", tap)
        opened.append(real_open(self, tap))
        return opened[-1]

    monkeypatch.setattr(GuestNetwork, "_open_tap", open_once)
    with pytest.raises(PrerequisiteError, match="cannot create the bridge network in namespace cxlssd-"):
        network.create()
    assert network.namespace not in netns.listnetns() and network.ports == {}
    with pytest.raises(OSError):
        os.fstat(opened[0])


@needs_root
def test_stale_namespaces_of_dead_owners_are_reaped() -> None:
    stale = [namespace_name(f"stale-00000{i}", owner_pid=_dead_pid()) for i in range(2)]
    create_namespace(stale[0])
    try:
        with _network("alive-000000") as alive:  # creating a network reaps first
            assert stale[0] not in netns.listnetns()
            create_namespace(stale[1])
            assert stale[1] in reap_stale_networks()
            assert stale[1] not in netns.listnetns() and alive.namespace in netns.listnetns()
    finally:
        for name in set(stale) & set(netns.listnetns()):
            netns.remove(name)


# -- two real guests on the bridge ------------------------------------------------------


@pytest.fixture(scope="module")
def pair(live_instances: set[str]) -> Iterator[MultiPlatform]:
    """The shipped two-guest config, booted once for the module (~60 s under TCG)."""
    started = time.monotonic()
    with MultiPlatform(load_multi_config(CONFIG_DIR / "pair.yaml")) as multi:
        print(f"\ntwo guests on the bridge ready in {time.monotonic() - started:.0f} s (emulator wall-clock)")
        assert multi.network is not None
        names = {p.name for p in multi} | {multi.network.namespace}
        live_instances.update(names)
        yield multi
    live_instances.difference_update(names)


@pytest.mark.slow
@pytest.mark.guest
def test_each_guest_has_its_bridge_address(pair: MultiPlatform) -> None:
    for guest, expected in (("dram-only", "10.77.0.2/24"), ("skybyte-full", "10.77.0.3/24")):
        _, out, _ = pair[guest].guest().run(["ip", "-j", "addr", "show"], check=True)
        addresses = {
            f"{a['local']}/{a['prefixlen']}" for link in json.loads(out) for a in link["addr_info"]
            if a["family"] == "inet"
        }
        assert addresses == {"127.0.0.1/8", "10.0.2.15/24", expected}
    assert pair.network is not None
    assert pair.network.links() == ["cxbr0", "cxtap0", "cxtap1", "lo"]


@pytest.mark.slow
@pytest.mark.guest
@pytest.mark.parametrize(("source", "target"), [("dram-only", "skybyte-full"), ("skybyte-full", "dram-only")])
def test_guests_ping_each_other_over_the_bridge(pair: MultiPlatform, source: str, target: str) -> None:
    status, out, err = pair[source].guest().run(
        ["python3", "-", pair.bridge_address(target), "3"], stdin=PING.read_bytes()
    )
    assert status == 0, err.decode()
    result = json.loads(out)
    assert result["received"] == result["sent"] == 3


@pytest.mark.slow
@pytest.mark.guest
def test_guest_ssh_to_the_other_guest_over_the_bridge(pair: MultiPlatform) -> None:
    client, server = pair["dram-only"], pair["skybyte-full"]
    assert server.ssh is not None
    keys, address = server.ssh.keys, pair.bridge_address("skybyte-full")
    key_type, key_data = keys.host_public_key.read_text().split()[:2]
    guest = client.guest()
    store = "umask 077 && mkdir -p /run/peer && cat > /run/peer/$0"
    guest.run(["sh", "-c", store, "key"], stdin=keys.client_key.read_bytes(), check=True)
    known_host = f"{address} {key_type} {key_data}\n".encode()
    guest.run(["sh", "-c", store, "known_hosts"], stdin=known_host, check=True)
    status, out, err = guest.run([
        "ssh", "-i", "/run/peer/key", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", "UserKnownHostsFile=/run/peer/known_hosts", "-o", "StrictHostKeyChecking=yes",
        "-o", "ConnectTimeout=60", f"root@{address}", "cat", "/sys/class/net/eth1/address",
    ])
    assert status == 0, err.decode()
    assert pair.network is not None
    assert out.decode().strip() == pair.network.ports["skybyte-full"].mac


@pytest.mark.slow
@pytest.mark.guest
def test_side_by_side_runs_each_guest_under_its_own_design(pair: MultiPlatform) -> None:
    """The same command in both guests at once, each with its own firmware process:
    one table of modelled times (DRAM-only faster than the CXL-SSD)."""
    # 4096 pages: their lines overflow the LLC sets they map to, so every step misses it
    runs = pair.run_live(["chase", "--bytes", "16M", "--stride", "4096"])
    assert set(runs) == {"dram-only", "skybyte-full"}
    for guest, run in runs.items():
        assert run.status == 0 and run.design == guest, run.stderr.decode()
        assert len(run.results["rois"]) == 1
    dram, cxl = (runs[g].results["rois"][0] for g in ("dram-only", "skybyte-full"))
    print(f"side by side: dram-only {dram['modelled_ns']} ns, skybyte-full {cxl['modelled_ns']} ns")
    assert dram["device"]["model"]["requests"] == 0 < cxl["device"]["model"]["requests"]
    assert dram["modelled_ns"] < cxl["modelled_ns"]


@pytest.mark.slow
@pytest.mark.guest
def test_key_value_store_served_from_one_guest_driven_from_the_other(pair: MultiPlatform) -> None:
    """netkv over the bridge: the server on dram-only, the driver on skybyte-full with
    its firmware attached: every read returns the version written, the driver's ROI
    is in modelled time."""
    server, client = pair["dram-only"], pair["skybyte-full"]
    channel = server.guest().open_process(
        with_guest_env(["python3", "-m", "netkv", "serve", "--port", "7070", "--records", "1000"])
    )
    try:
        assert json.loads(channel.makefile("r").readline()) == {"listening": 7070}
        with client.attach("skybyte-full") as session:
            status, out, err = session.run([
                "python3", "-m", "netkv", "drive",
                "--server", pair.bridge_address("dram-only"), "--records", "1000", "--ops", "1000", "--stop",
            ])
        assert status == 0, err.decode()
        report = json.loads(out)
        assert report["check_ok"] and report["server"]["requests"] == 1001
        roi = session.results["rois"][0]
        print(f"netkv over the bridge: {roi['modelled_ns'] / 1e6:.3f} ms modelled for 1000 operations")
        assert roi["modelled_ns"] > 0 and roi["device"]["model"]["requests"] > 0
    finally:
        channel.close()


@pytest.mark.slow
@pytest.mark.guest
def test_shutdown_removes_guests_namespace_taps_and_bridge(pair: MultiPlatform) -> None:
    assert pair.network is not None
    namespace = pair.network.namespace
    instances = [p.name for p in pair]
    pair.shutdown()
    assert namespace not in netns.listnetns()
    assert not {"cxbr0", "cxtap0", "cxtap1"} & _host_links()
    running = subprocess.run(["pgrep", "-a", "-f", "qemu-system"], capture_output=True, text=True).stdout
    assert not [line for line in running.splitlines() if any(name in line for name in instances)]
    assert not [p for p in runtime_root().iterdir() if p.name in instances]


# -- failures while starting: nothing is left behind ------------------------------------


@pytest.mark.guest
def test_a_guest_failing_to_boot_stops_the_others_and_removes_the_network() -> None:
    raw = _pair()
    raw["guests"] = [{"name": "a"}, {"name": "b", "guest": {"boot_timeout_s": 1}}]
    multi = MultiPlatform(multi_config_from_dict(raw, "p.yaml"))
    started = time.monotonic()
    with pytest.raises(GuestError, match="was not ready within 1 s"):
        multi.launch()
    assert time.monotonic() - started < 60  # guest a was stopped, not waited for
    assert multi.network is None and multi.platforms["a"].rundir is None


INTERRUPTED = """
import logging, signal, sys
# (as the CLI does: the suite may run with SIGINT ignored, as a background job)
signal.signal(signal.SIGINT, signal.default_int_handler)
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from cxlssd.platform.config import multi_config_from_dict
from cxlssd.platform.multi import MultiPlatform
raw = {"name": "sigint", "network": {"mode": "bridge"}, "guests": [{"name": "a"}, {"name": "b"}]}
try:
    MultiPlatform(multi_config_from_dict(raw)).launch()
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.guest
def test_ctrl_c_while_booting_leaves_nothing() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "booting guest b-" in line:  # both QEMUs started, the namespace exists
                break
        assert platform_namespaces_of(process.pid)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()  # only if the test failed: the leak check then shows what was left
    assert process.returncode == 130, err
    assert platform_namespaces_of(process.pid) == []


def platform_namespaces_of(pid: int) -> list[str]:
    return [n for n in netns.listnetns() if n.startswith(f"cxlssd-{os.getuid()}-{pid}-")]
