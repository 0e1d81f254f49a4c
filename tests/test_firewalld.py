"""The firewall plugin's firewalld backend (`cni_skel_plugins.firewall.firewalld`)
against Debian's firewalld 1.3 (nftables backend) running on a private D-Bus
inside a namespace of the test (tests/firewalld_node.py): the fixture itself,
``running``, the zone calls and their errors, a custom zone and what a reload
does to sources, Debian's Go firewall plugin talking to the same firewalld,
and what sources in a zone do to real traffic forwarded by the node.

One firewalld serves the module (its start takes seconds); every test
leaves its zones without sources (`fwd`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cni_skel_plugins.firewall.firewalld import Firewalld, firewalld_running
from firewalld_node import (
    FirewalldNode,
    firewalld_in,
    firewalld_state,
    missing_tools,
    private_bus,
    processes_in_netns,
    zone_xml,
)
from jeepney.wrappers import DBusErrorResponse

from cni_skel import CNIError, netlink
from cni_skel.harness import (
    TestNetNS,
    create_netns,
    icmp_ping,
    nft_table,
    remove_netns,
    run_plugin,
)
from cni_skel.netns import NetNS
from cni_skel.sysctl import read_sysctl, write_sysctl

pytestmark = pytest.mark.root

#: A zone written into firewalld's system config before it starts.
ZONE_FILE = "cnskfile"
#: A zone made at runtime through the permanent config and a reload.
ZONE_RUNTIME = "cnskrt"
PORT = 7411
#: What a TCP connect meets when firewalld rejects it ("reject with icmpx
#: admin-prohibited"): ICMP code 13 is EHOSTUNREACH, ICMPv6 code 1 EACCES.
REJECTED = {4: "EHOSTUNREACH", 6: "EACCES"}


@pytest.fixture(scope="module")
def fwd_netns() -> Iterator[TestNetNS]:
    """The node namespace firewalld runs in, for the module."""
    if os.geteuid() != 0:
        pytest.skip("firewalld in a network namespace needs root")
    ns = create_netns("cnsk-fwd")
    yield ns
    remove_netns(ns)


@pytest.fixture(scope="module")
def fwd_node(fwd_netns: TestNetNS, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[FirewalldNode]:
    if missing := missing_tools():
        pytest.fail(f"{', '.join(missing)} missing: run `make deps`, which installs "
                    "Debian's firewalld")
    with firewalld_in(fwd_netns.name, tmp_path_factory.mktemp("firewalld"),
                      zones={ZONE_FILE: zone_xml("cni-skel test")}) as node:
        yield node
    assert processes_in_netns(fwd_netns.path) == []


@pytest.fixture
def fwd(fwd_node: FirewalldNode) -> Iterator[Firewalld]:
    """Our backend connected to the module's firewalld; afterwards every
    zone is left without sources (the next test starts from firewalld's
    defaults)."""
    assert fwd_node.alive(), fwd_node.log_tail()
    with Firewalld(fwd_node.bus_address) as conn:
        yield conn
    with Firewalld(fwd_node.bus_address) as conn:
        for zone, what in fwd_node.active_zones().items():
            for source in what.get("sources", []):
                conn.remove_source(zone, source)
    assert not any(w.get("sources") for w in fwd_node.active_zones().values())


def forward_zones(node: FirewalldNode) -> str:
    """firewalld's dispatch of forwarded traffic by zone, as nft lists it."""
    return subprocess.run(["ip", "netns", "exec", node.netns, "nft", "list", "chain", "inet",
                           "firewalld", "filter_FORWARD_ZONES"],
                          capture_output=True, text=True, check=True, timeout=10).stdout


# -- the fixture -------------------------------------------------------------


def test_fixture_runs_in_the_namespace_and_leaves_nothing(netns_factory: Any,
                                                          tmp_path: Any) -> None:
    if missing := missing_tools():
        pytest.fail(f"{', '.join(missing)} missing: run `make deps`")
    ns = netns_factory("cnsk-fwd")
    had_run_dir = os.path.exists("/run/firewalld")
    with firewalld_in(ns.name, tmp_path / "fwd", debug=0) as node:
        assert set(node.pids()) <= set(processes_in_netns(ns.path))
        table = nft_table(ns, "inet", "firewalld")
        assert table is not None
        # /run is a tmpfs of firewalld's own mount namespace, not the machine's
        with open(f"/proc/{node.firewalld.pid}/mountinfo") as f:
            assert any(" /run " in line and "cnsk-firewalld" in line for line in f)
        with open("/proc/self/mountinfo") as f:
            assert "cnsk-firewalld" not in f.read()
        assert Firewalld.running(node.bus_address)
        assert node.env() == {"DBUS_SYSTEM_BUS_ADDRESS": node.bus_address}
    assert node.firewalld.returncode is not None and node.dbus.returncode is not None
    assert processes_in_netns(ns.path) == []
    # SIGTERM was enough: firewalld cleaned up after itself (CleanupOnExit)
    assert nft_table(ns, "inet", "firewalld") is None, node.log_tail()
    assert os.path.exists("/run/firewalld") == had_run_dir
    assert not Firewalld.running(node.bus_address)


# -- running, connecting -----------------------------------------------------


def test_running(fwd_node: FirewalldNode, tmp_path: Any,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", fwd_node.bus_address)
    assert Firewalld.running()
    assert firewalld_running()
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus.sock")
    started = time.monotonic()
    assert not Firewalld.running()
    assert not firewalld_running()
    assert time.monotonic() - started < 1.0
    with pytest.raises(CNIError) as e:
        Firewalld()
    assert e.value.code == 999
    assert f"unix:path={tmp_path}/no-bus.sock" in e.value.msg
    for bad in ("tcp:host=localhost,port=1", "nonsense"):
        assert not Firewalld.running(bad)
        with pytest.raises(CNIError, match="cannot connect to the D-Bus system bus"):
            Firewalld(bad)


def test_bus_that_does_not_answer(tmp_path: Any) -> None:
    """A socket that accepts and then says nothing: connecting gives up
    after ``timeout``."""
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(path)
        srv.listen()
        started = time.monotonic()
        assert not Firewalld.running(f"unix:path={path}", timeout=0.5)
        with pytest.raises(CNIError) as e:
            Firewalld(f"unix:path={path}", timeout=0.5)
        assert e.value.code == 999 and path in e.value.msg
        assert time.monotonic() - started < 3.0


def test_firewalld_that_does_not_answer(fwd_node: FirewalldNode, fwd: Firewalld) -> None:
    """firewalld stopped (SIGSTOP) with its name on the bus: ``running`` is
    still True (the bus daemon answers it, as for Go), and a call fails
    with 999 after the call's timeout instead of hanging."""
    fwd.add_source("trusted", "10.0.99.1/32")
    os.kill(fwd_node.firewalld.pid, signal.SIGSTOP)
    try:
        assert Firewalld.running(fwd_node.bus_address)
        with Firewalld(fwd_node.bus_address, timeout=1.0) as slow:
            started = time.monotonic()
            with pytest.raises(CNIError) as e:
                slow.query_source("trusted", "10.0.99.1/32")
            assert 0.9 < time.monotonic() - started < 3.0
        assert e.value.code == 999
        assert "did not answer querySource within 1 s" in e.value.msg
    finally:
        os.kill(fwd_node.firewalld.pid, signal.SIGCONT)
    assert fwd.query_source("trusted", "10.0.99.1/32")


def test_bus_without_firewalld(netns_factory: Any, tmp_path: Any) -> None:
    """firewalld not running (the bus answers ServiceUnknown): ``running``
    is False, ADD's and CHECK's calls fail with 999, DEL's succeed (Go)."""
    ns = netns_factory("cnsk-bus")
    with private_bus(ns.name, tmp_path) as (address, _proc), Firewalld(address) as conn:
        assert not Firewalld.running(address)
        with pytest.raises(CNIError) as e:
            conn.add_source("trusted", "10.0.98.1/32")
        assert e.value.code == 999
        assert e.value.msg.startswith("failed to add the address 10.0.98.1/32 to trusted zone: ")
        assert "org.fedoraproject.FirewallD1" in e.value.msg
        conn.remove_source("trusted", "10.0.98.1/32")
        with pytest.raises(CNIError) as e:
            conn.query_source("trusted", "10.0.98.1/32")
        assert e.value.msg == "failed to find the address 10.0.98.1/32 in trusted zone"
        with pytest.raises(CNIError, match="failed to list the sources of trusted zone"):
            conn.sources("trusted")
    assert processes_in_netns(ns.path) == []


def test_closed_connection(fwd_node: FirewalldNode) -> None:
    conn = Firewalld(fwd_node.bus_address)
    assert "open" in repr(conn)
    conn.close()
    conn.close()
    with pytest.raises(CNIError) as e:
        conn.sources("trusted")
    assert e.value.code == 999 and "closed" in e.value.msg


# -- zone calls --------------------------------------------------------------


@pytest.mark.parametrize("zone", ["trusted", "internal", ZONE_FILE])
def test_round_trip(fwd_node: FirewalldNode, fwd: Firewalld, zone: str) -> None:
    v4, v6 = "10.0.97.5/32", "fd00::97:5/128"
    assert not fwd.query_source(zone, v4)
    fwd.add_source(zone, v4)
    fwd.add_source(zone, v6)
    fwd.add_source(zone, v4)  # ZONE_ALREADY_SET: success, as in Go
    assert fwd.query_source(zone, v4) and fwd.query_source(zone, v6)
    assert fwd.sources(zone) == [v4, v6]
    assert fwd.zone_of_source(v4) == zone
    rules = forward_zones(fwd_node)
    assert f"ip saddr 10.0.97.5 goto filter_FWD_{zone}" in rules
    assert f"ip6 saddr fd00::97:5 goto filter_FWD_{zone}" in rules
    fwd.remove_source(zone, v4)
    assert not fwd.query_source(zone, v4)
    assert fwd.sources(zone) == [v6]
    fwd.remove_source(zone, v4)  # UNKNOWN_SOURCE: ignored, as in Go
    fwd.remove_source(zone, v6)
    assert fwd.sources(zone) == []
    assert fwd.zone_of_source(v6) == ""
    assert "10.0.97.5" not in forward_zones(fwd_node)


def test_errors(fwd: Firewalld) -> None:
    src = "10.0.96.5/32"
    with pytest.raises(CNIError) as e:
        fwd.add_source("cnsknosuch", src)
    assert e.value.code == 999
    assert e.value.msg == (f"failed to add the address {src} to cnsknosuch zone: "
                           "INVALID_ZONE: cnsknosuch")
    with pytest.raises(CNIError) as e:
        fwd.query_source("cnsknosuch", src)
    assert (e.value.code, e.value.msg) == (999, f"failed to find the address {src} in "
                                                "cnsknosuch zone")
    assert "INVALID_ZONE" in e.value.details
    with pytest.raises(CNIError, match="cnsknosuch"):
        fwd.sources("cnsknosuch")
    fwd.remove_source("cnsknosuch", src)  # every D-Bus error ignored, as Go's DEL
    fwd.remove_source("trusted", src)  # not there
    with pytest.raises(CNIError, match="INVALID_ADDR"):
        fwd.add_source("trusted", "not-an-address")

    # a source is in one zone at most: another zone's add is refused, and
    # its remove leaves the source where it is
    fwd.add_source("trusted", src)
    with pytest.raises(CNIError, match="ZONE_CONFLICT"):
        fwd.add_source("internal", src)
    fwd.remove_source("internal", src)
    assert fwd.zone_of_source(src) == "trusted"
    assert fwd.query_source("trusted", src)
    assert not fwd.query_source("internal", src)


def test_runtime_zone_and_reload(fwd_node: FirewalldNode, fwd: Firewalld) -> None:
    """A zone firewalld did not start with exists only through its
    permanent config and a reload; and a reload drops every source added
    at runtime (what the plugin adds), while the zones stay."""
    fwd.add_source("trusted", "10.0.95.5/32")
    with pytest.raises(DBusErrorResponse):
        fwd_node.call("getZoneSettings2", "s", ZONE_RUNTIME,
                      interface="org.fedoraproject.FirewallD1.zone")
    fwd_node.add_permanent_zone(ZONE_RUNTIME, forward=("b", True))
    assert (fwd_node.system_config / "zones" / f"{ZONE_RUNTIME}.xml").is_file()
    with pytest.raises(CNIError, match="INVALID_ZONE"):
        fwd.add_source(ZONE_RUNTIME, "10.0.95.6/32")  # not at runtime yet
    fwd_node.reload()
    assert not fwd.query_source("trusted", "10.0.95.5/32")  # gone with the reload
    fwd.add_source(ZONE_RUNTIME, "10.0.95.6/32")
    assert fwd.sources(ZONE_RUNTIME) == ["10.0.95.6/32"]
    fwd.remove_source(ZONE_RUNTIME, "10.0.95.6/32")
    assert fwd.sources(ZONE_RUNTIME) == []


# -- Debian's Go plugin on the same firewalld --------------------------------


def test_go_plugin_uses_the_fixture(fwd_node: FirewalldNode, fwd: Firewalld,
                                    netns_factory: Any, go_cni_dir: str) -> None:
    go = os.path.join(go_cni_dir, "firewall")
    assert os.access(go, os.X_OK), f"{go} missing: `make deps` installs it"
    pod = netns_factory("cnsk-pod")
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0", "name": "fwtest", "type": "firewall", "backend": "firewalld",
        "prevResult": {"cniVersion": "1.0.0",
                       "interfaces": [{"name": "cni0"}, {"name": "eth0", "sandbox": pod.path}],
                       "ips": [{"address": "10.88.0.5/24", "interface": 1}]}}

    def go_call(verb: str, config: dict[str, Any]) -> Any:
        return run_plugin(go, verb, config, container_id="cnsk-fw-go", netns=pod.path,
                          ifname="eth0", cni_path=go_cni_dir, node=fwd_node.ns,
                          env=fwd_node.env())

    result = go_call("ADD", conf)
    assert result["ips"][0]["address"] == "10.88.0.5/24"
    assert fwd.query_source("trusted", "10.88.0.5/32")
    assert fwd.sources("trusted") == ["10.88.0.5/32"]
    go_call("CHECK", conf)
    go_call("DEL", conf)
    assert not fwd.query_source("trusted", "10.88.0.5/32")
    go_call("DEL", conf)  # again: nothing to remove, still success

    # no backend: Go asks the bus whether firewalld runs (godbus found it
    # through DBUS_SYSTEM_BUS_ADDRESS), and a zone of the config's choosing
    auto = {k: v for k, v in conf.items() if k != "backend"} | {"firewalldZone": "internal"}
    go_call("ADD", auto)
    assert fwd.zone_of_source("10.88.0.5/32") == "internal"
    go_call("DEL", auto)
    assert fwd.zone_of_source("10.88.0.5/32") == ""


# -- traffic -----------------------------------------------------------------


@dataclass
class Pod:
    ns: TestNetNS
    host_if: str
    ip4: str
    ip6: str
    gw4: str
    gw6: str

    def sources(self) -> list[str]:
        return [f"{self.ip4}/32", f"{self.ip6}/128"]


def routed_pod(node: TestNetNS, pod: TestNetNS, host_if: str, n: int) -> Pod:
    """``pod`` behind a veth of its own to the node (``host_if``), in
    10.0.<n>.0/24 and fd00:0:0:<n>::/64: the node routes between pods."""
    p = Pod(pod, host_if, f"10.0.{n}.2", f"fd00:0:0:{n}::2", f"10.0.{n}.1", f"fd00:0:0:{n}::1")
    with NetNS.open(node.path) as nn, nn.rtnl() as ipr, NetNS.open(pod.path) as pn, \
            pn.rtnl() as pipr:
        netlink.create_veth_pair(ipr, host_if, "eth0", peer_netns=pn, peer_ipr=pipr)
        netlink.add_address(ipr, host_if, f"{p.gw4}/24")
        netlink.add_address(ipr, host_if, f"{p.gw6}/64", nodad=True)
        netlink.link_up(ipr, host_if)
        netlink.add_address(pipr, "eth0", f"{p.ip4}/24")
        netlink.add_address(pipr, "eth0", f"{p.ip6}/64", nodad=True)
        netlink.link_up(pipr, "eth0")
        netlink.link_up(pipr, "lo")
        netlink.add_route(pipr, "0.0.0.0/0", gw=p.gw4)
        netlink.add_route(pipr, "::/0", gw=p.gw6)
    return p


def bridged_pod(node: TestNetNS, pod: TestNetNS, bridge: str, host_if: str, ip: str) -> Pod:
    """``pod`` on ``bridge`` in the node, 10.0.<x>.0/24 (IPv4 only)."""
    with NetNS.open(node.path) as nn, nn.rtnl() as ipr, NetNS.open(pod.path) as pn, \
            pn.rtnl() as pipr:
        br = netlink.find_link(ipr, bridge)
        assert br is not None
        netlink.create_veth_pair(ipr, host_if, "eth0", peer_netns=pn, peer_ipr=pipr,
                                 master=br.index)
        netlink.link_up(ipr, host_if)
        netlink.add_address(pipr, "eth0", f"{ip}/24")
        netlink.link_up(pipr, "eth0")
    return Pod(pod, host_if, ip, "", "", "")


def wait_link(src: TestNetNS, node_ip: str, timeout: float = 3.0) -> None:
    """Wait until ``src`` gets an ICMP echo answer from the node (firewalld's
    zones let ICMP in): the links are forwarding, so the first connect of a
    test is not lost to a port still coming up (and retried 1 s later)."""
    deadline = time.monotonic() + timeout
    while not icmp_ping(src, node_ip, count=1, timeout=0.2):
        assert time.monotonic() < deadline, f"{node_ip} does not answer from {src.name}"


def listen(ns: TestNetNS, ip: str, stack: contextlib.ExitStack) -> None:
    """A TCP listener on ``ip``:`PORT` inside ``ns``, closed with ``stack``."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with NetNS.open(ns.path) as target:
        srv = target.run(socket.create_server, (ip, PORT), family=family)
    stack.enter_context(srv)


def connect(src: TestNetNS, dst: str, timeout: float = 2.0) -> str:
    """A TCP connect from inside ``src`` to ``dst``:`PORT`, bounded:
    ``"ok"``, ``"timeout"`` or the errno's name of the ICMP error it met
    (`REJECTED`: firewalld's reject).

    Non-blocking, reading SO_ERROR as it goes: IPv6 TCP keeps an ICMPv6
    error met in SYN_SENT as a soft error (SO_ERROR gives it) and fails
    the connect only at the SYN's retransmission, a second later."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with NetNS.open(src.path) as ns:
        sock = ns.run(socket.socket, family, socket.SOCK_STREAM)
    with sock:
        sock.setblocking(False)
        sock.connect_ex((dst, PORT))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            _, writable, _ = select.select([], [sock], [], min(left, 0.05))
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                return errno.errorcode.get(err, str(err))
            if writable:
                return "ok"
    return "timeout"


def reach(a: Pod, b: Pod) -> dict[str, str]:
    """New TCP connections between two routed pods, each way and per IP
    version, and from ``a`` to the node (its gateway address)."""
    return {"a->b v4": connect(a.ns, b.ip4), "a->b v6": connect(a.ns, b.ip6),
            "b->a v4": connect(b.ns, a.ip4), "b->a v6": connect(b.ns, a.ip6),
            "a->node v4": connect(a.ns, a.gw4)}


def expect(**allowed: bool) -> dict[str, str]:
    """`reach`'s answer: ``"ok"`` where allowed, firewalld's reject elsewhere
    (keys as in `reach`, with ``_`` for ``->`` and `` ``)."""
    out = {}
    for key, ok in allowed.items():
        src, dst, ver = key.split("_")
        out[f"{src}->{dst} {ver}"] = "ok" if ok else REJECTED[int(ver[1])]
    return out


def node_sysctls(node: TestNetNS) -> None:
    """Forwarding on in the node, and no rate limit on the ICMP errors it
    sends: every reject must reach the sender at once, however many came
    before it (the same pod addresses serve every test of the module)."""
    with NetNS.open(node.path) as nn:
        for key, value in (("net.ipv4.ip_forward", "1"),
                           ("net.ipv6.conf.all.forwarding", "1"),
                           ("net.ipv4.icmp_ratelimit", "0"),
                           ("net.ipv6.icmp.ratelimit", "0")):
            nn.run(write_sysctl, key, value)


@pytest.fixture
def two_routed_pods(fwd_node: FirewalldNode, fwd_netns: TestNetNS, netns_factory: Any
                    ) -> Iterator[tuple[Pod, Pod]]:
    """Pods a (10.0.1.2, fd00:0:0:1::2) and b (10.0.2.2, fd00:0:0:2::2)
    routed through the node, a TCP listener on each of their addresses and
    on a's gateway in the node; forwarding on in the node."""
    node_sysctls(fwd_netns)
    a = routed_pod(fwd_netns, netns_factory("cnsk-poda"), "cnskfwa", 1)
    b = routed_pod(fwd_netns, netns_factory("cnsk-podb"), "cnskfwb", 2)
    with contextlib.ExitStack() as stack:
        for pod in (a, b):
            listen(pod.ns, pod.ip4, stack)
            listen(pod.ns, pod.ip6, stack)
        listen(fwd_netns, a.gw4, stack)
        wait_link(a.ns, a.gw4)
        wait_link(b.ns, b.gw4)
        yield a, b
    # now, not when the pods' namespaces go (the kernel deletes their
    # veths later): the next test makes the same links
    with NetNS.open(fwd_netns.path) as nn, nn.rtnl() as ipr:
        for pod in (a, b):
            netlink.delete_link(ipr, pod.host_if)


def test_forwarding_follows_the_source_zone_trusted(fwd: Firewalld,
                                                    two_routed_pods: tuple[Pod, Pod]) -> None:
    """firewalld 1.3 (nftables) picks the zone of a forwarded packet by its
    source address first (``filter_FORWARD_ZONES``), then by its incoming
    interface; the default zone (public) rejects forwarding. A source in
    ``trusted`` (target ACCEPT) is forwarded to anywhere and reaches the
    node itself; the answers come back as established traffic. A new
    connection *to* a trusted pod from an address outside trusted is still
    rejected: each side must be a source for both to open connections."""
    a, b = two_routed_pods
    everyone_rejected = expect(a_b_v4=False, a_b_v6=False, b_a_v4=False, b_a_v6=False,
                               a_node_v4=False)
    assert reach(a, b) == everyone_rejected
    assert icmp_ping(a.ns, b.ip4, count=1, timeout=0.5) == []

    for src in a.sources():
        fwd.add_source("trusted", src)
    assert reach(a, b) == expect(a_b_v4=True, a_b_v6=True, b_a_v4=False, b_a_v6=False,
                                 a_node_v4=True)
    assert len(icmp_ping(a.ns, b.ip4, count=1)) == 1

    for src in b.sources():
        fwd.add_source("trusted", src)
    assert set(reach(a, b).values()) == {"ok"}

    for src in a.sources() + b.sources():
        fwd.remove_source("trusted", src)
    assert reach(a, b) == everyone_rejected


def test_forwarding_within_a_zone_internal(fwd: Firewalld,
                                           two_routed_pods: tuple[Pod, Pod]) -> None:
    """``internal`` (target default, intra-zone forwarding ``<forward/>``):
    forwarded only to the zone's own sources and interfaces, so both pods
    must be in it; its INPUT stays closed to our port (ssh, mdns,
    samba-client, dhcpv6-client only)."""
    a, b = two_routed_pods
    for src in a.sources():
        fwd.add_source("internal", src)
    assert set(reach(a, b).values()) == set(REJECTED.values())
    for src in b.sources():
        fwd.add_source("internal", src)
    assert reach(a, b) == expect(a_b_v4=True, a_b_v6=True, b_a_v4=True, b_a_v6=True,
                                 a_node_v4=False)


def test_bridged_pods(fwd_node: FirewalldNode, fwd: Firewalld, fwd_netns: TestNetNS,
                      netns_factory: Any) -> None:
    """Pods on one bridge in the node: their traffic is bridged, and reaches
    firewalld's forward rules only through br_netfilter
    (``net.bridge.bridge-nf-call-iptables``, per namespace, 1 by default
    once the module is loaded; the test never loads it). With it, firewalld
    rejects pod to pod on the same bridge until the sender is trusted;
    without it (or set to 0), firewalld never sees that traffic."""
    with NetNS.open(fwd_netns.path) as nn, nn.rtnl() as ipr:
        # the pods' gateway on the bridge, as the bridge plugin makes it: the
        # node's reject needs a way back to the sender
        node_sysctls(fwd_netns)
        netlink.ensure_bridge(ipr, "cnskfwbr")
        netlink.add_address(ipr, "cnskfwbr", "10.0.3.1/24")
        netlink.link_up(ipr, "cnskfwbr")
        nf_call = nn.run(os.path.exists, "/proc/sys/net/bridge/bridge-nf-call-iptables")
        before = nn.run(read_sysctl, "net.bridge.bridge-nf-call-iptables") if nf_call else None
    try:
        c = bridged_pod(fwd_netns, netns_factory("cnsk-podc"), "cnskfwbr", "cnskfwc",
                        "10.0.3.2")
        d = bridged_pod(fwd_netns, netns_factory("cnsk-podd"), "cnskfwbr", "cnskfwd",
                        "10.0.3.3")
        with contextlib.ExitStack() as stack:
            listen(d.ns, d.ip4, stack)
            wait_link(c.ns, "10.0.3.1")
            wait_link(d.ns, "10.0.3.1")
            if nf_call:
                with NetNS.open(fwd_netns.path) as nn:
                    nn.run(write_sysctl, "net.bridge.bridge-nf-call-iptables", "1")
                assert connect(c.ns, d.ip4) == REJECTED[4]
                fwd.add_source("trusted", f"{c.ip4}/32")
                assert connect(c.ns, d.ip4) == "ok"
                fwd.remove_source("trusted", f"{c.ip4}/32")
                with NetNS.open(fwd_netns.path) as nn:
                    nn.run(write_sysctl, "net.bridge.bridge-nf-call-iptables", "0")
            assert connect(c.ns, d.ip4) == "ok"
    finally:
        with NetNS.open(fwd_netns.path) as nn, nn.rtnl() as ipr:
            if before is not None:
                nn.run(write_sysctl, "net.bridge.bridge-nf-call-iptables", before)
            for link in ("cnskfwc", "cnskfwd", "cnskfwbr"):
                netlink.delete_link(ipr, link)


def test_module_firewalld_still_healthy(fwd_node: FirewalldNode) -> None:
    """Nothing above killed or wedged the shared firewalld (SIGSTOP and
    SIGCONT, a reload)."""
    assert fwd_node.alive(), fwd_node.log_tail()
    assert firewalld_state(fwd_node.bus_address) == "RUNNING"
