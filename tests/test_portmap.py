"""portmap through the real executable, run inside a node namespace the way a
runtime runs it, with real traffic.

Topology made by each test: a node namespace; pods attached to a bridge in it
by our bridge + host-local (cniVersion 1.0.0, which the Go plugins speak
too; ``bridge_exe`` is a fixture); a client namespace linked to the
node by a veth (node 10.99.0.1 / fd00:99::1, client .2). Echo servers run
in-process with their sockets made inside the pod namespace; they answer
with the source address they saw, which shows whether traffic was
masqueraded. nftables state is read back with libnftables JSON
(`cni_skel.harness.nft_table`). Config errors, GC, versions and concurrency
are in test_portmap_verbs.py.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from cni_skel.errors import CNIError
from cni_skel.harness import nft_table, run_plugin
from cni_skel.netns import NetNS
from cni_skel.nft import Nft, attachment_tag
from cni_skel.sysctl import read_sysctl, write_sysctl

TABLE = ("inet", "cni_portmap")
NODE4, NODE6 = "10.99.0.1", "fd00:99::1"
CLIENT4, CLIENT6 = "10.99.0.2", "fd00:99::2"
BR4, BR6 = "10.88.0.1", "fd00:88::1"
BRIDGE = "pmbr0"
NET = "pmnet"


# --- fixtures and helpers ------------------------------------------------------------


@pytest.fixture(scope="session")
def portmap(cni_bin: str) -> str:
    return os.path.join(cni_bin, "portmap")


@pytest.fixture(scope="session")
def bridge_exe(cni_bin: str) -> str:
    """The bridge plugin that builds the pods' network (ours)."""
    return os.path.join(cni_bin, "bridge")


def ip(ns: Any, *args: str) -> None:
    subprocess.run(["ip", "-n", ns.name, *args], check=True, capture_output=True, timeout=10)


def sysctls(ns: Any, values: dict[str, str]) -> None:
    with NetNS.open(ns.path) as n, n.enter():
        for key, value in values.items():
            write_sysctl(key, value)


def sysctl(ns: Any, key: str) -> str:
    with NetNS.open(ns.path) as n, n.enter():
        return read_sysctl(key)


_QUIET_V6 = {"net/ipv6/conf/all/accept_dad": "0", "net/ipv6/conf/default/accept_dad": "0"}


@dataclass
class Pod:
    ns: Any
    cid: str
    result: dict
    ip4: str
    ip6: str


class Net:
    """A node with a client and a bridge network (Go bridge + host-local)."""

    def __init__(self, node: Any, client: Any, factory: Any, tmp_path: Any,
                 bridge_exe: str, cni_path: str) -> None:
        self.node, self.client, self.factory = node, client, factory
        self.tmp_path, self.bridge_exe, self.cni_path = tmp_path, bridge_exe, cni_path
        self.pods: list[Pod] = []

    def bridge_conf(self) -> dict:
        return {"cniVersion": "1.0.0", "name": NET, "type": "bridge", "bridge": BRIDGE,
                "isDefaultGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.tmp_path / "ipam"),
                         "ranges": [[{"subnet": "10.88.0.0/24"}], [{"subnet": "fd00:88::/64"}]]}}

    def pod(self, cid: str) -> Pod:
        ns = self.factory("cnsk-pmpod")
        sysctls(ns, _QUIET_V6)
        ip(ns, "link", "set", "lo", "up")
        result = run_plugin(self.bridge_exe, "ADD", self.bridge_conf(), container_id=cid,
                            netns=ns.path, ifname="eth0", node=self.node,
                            cni_path=self.cni_path)
        addrs = {ipaddress.ip_interface(i["address"]).version: i["address"].split("/")[0]
                 for i in result["ips"]}
        pod = Pod(ns, cid, result, addrs[4], addrs[6])
        self.pods.append(pod)
        return pod


@pytest.fixture
def net(node_netns, netns_factory, tmp_path, bridge_exe, cni_bin) -> Net:
    node, client = node_netns, netns_factory("cnsk-pmcl")
    for ns in (node, client):
        sysctls(ns, _QUIET_V6)
        ip(ns, "link", "set", "lo", "up")
    sysctls(node, {"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"})
    ip(node, "link", "add", "pmcl0", "type", "veth", "peer", "name", "eth0", "netns", client.name)
    for ns, end, addrs in ((node, "pmcl0", (NODE4, NODE6)), (client, "eth0", (CLIENT4, CLIENT6))):
        ip(ns, "addr", "add", f"{addrs[0]}/24", "dev", end)
        ip(ns, "addr", "add", f"{addrs[1]}/64", "dev", end, "nodad")
        ip(ns, "link", "set", end, "up")
    ip(client, "route", "add", "default", "via", NODE4)
    ip(client, "-6", "route", "add", "default", "via", NODE6)
    return Net(node, client, netns_factory, tmp_path, bridge_exe, cni_bin)


def pm_conf(prev: dict | None, mappings: list[dict] | None, version: str = "1.0.0",
            name: str = NET, **top: Any) -> dict:
    c: dict = {"cniVersion": version, "name": name, "type": "portmap",
               "capabilities": {"portMappings": True}}
    if mappings is not None:
        c["runtimeConfig"] = {"portMappings": mappings}
    if prev is not None:
        c["prevResult"] = prev
    c.update(top)
    return c


def pm(exe: str, cmd: str, c: dict, node: Any, cid: str, netns: str = "/run/netns/none",
       ifname: str = "eth0", **kw: Any) -> Any:
    return run_plugin(exe, cmd, c, container_id=cid, netns=netns, ifname=ifname, node=node, **kw)


def fails(fn: Any, *a: Any, **kw: Any) -> CNIError:
    with pytest.raises(CNIError) as ei:
        fn(*a, **kw)
    return ei.value


def entries(node: Any, cid: str | None = None, ifname: str = "eth0") -> set[tuple]:
    """``(set, key, data)`` of the table's elements (of one attachment when
    ``cid`` is given), keys as libnftables lists them (concat -> tuple)."""
    table = nft_table(node, *TABLE)
    if table is None:
        return set()
    tag = attachment_tag(cid, ifname) if cid else None
    out = set()
    for name in [*table.sets, *table.maps]:
        for key, data, comment in table.entries(name):
            if tag is None or comment == tag:
                k = tuple(key["concat"]) if isinstance(key, dict) else key
                out.add((name.split("_")[-1] if "_" in name else name, k, data))
    return out


def mapping(host: int, cont: int, proto: str = "tcp", host_ip: str = "",
            caps: bool = False) -> dict:
    if caps:  # containerd's spelling
        return {"HostPort": host, "ContainerPort": cont, "Protocol": proto, "HostIP": host_ip}
    return {"hostPort": host, "containerPort": cont, "protocol": proto, "hostIP": host_ip}


# --- traffic -------------------------------------------------------------------------


def _peer(addr: str) -> str:
    a = ipaddress.ip_address(addr.split("%")[0])
    return str(a.ipv4_mapped) if a.version == 6 and a.ipv4_mapped else str(a)


class Echo:
    """Echo server in ``ns`` on ``port`` (both families): answers
    ``b"<source address seen>|<data>"``. Context manager."""

    def __init__(self, ns: Any, port: int, proto: str = "tcp") -> None:
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        with NetNS.open(ns.path) as n, n.enter():
            self.sock = socket.socket(socket.AF_INET6, kind)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("::", port))
        if proto == "tcp":
            self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.proto, self.stop = proto, threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                if self.proto == "tcp":
                    conn, peer = self.sock.accept()
                    with conn:
                        conn.settimeout(2)
                        data = conn.recv(1024)
                        conn.sendall(_peer(peer[0]).encode() + b"|" + data)
                else:
                    data, peer = self.sock.recvfrom(1024)
                    self.sock.sendto(_peer(peer[0]).encode() + b"|" + data, peer)
            except OSError:
                continue

    def __enter__(self) -> Echo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def talk(ns: Any, host: str, port: int, proto: str = "tcp", timeout: float = 3.0,
         sport: int | None = None) -> str:
    """One request from ``ns`` to ``host:port``; returns the source address
    the echo server saw. Raises OSError (refused, timed out)."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with NetNS.open(ns.path) as n, n.enter():
        s = socket.socket(family, kind)
    with s:
        s.settimeout(timeout)
        if sport is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", sport))
        if proto == "tcp":
            s.connect((host, port))
            s.sendall(b"hi")
            reply = s.recv(1024)
        else:
            s.sendto(b"hi", (host, port))
            reply, _ = s.recvfrom(1024)
    seen, _, data = reply.partition(b"|")
    assert data == b"hi"
    return seen.decode()


def unreachable(ns: Any, host: str, port: int, timeout: float = 1.5) -> bool:
    try:
        talk(ns, host, port, timeout=timeout)
    except OSError:
        return True
    return False


# --- tests ---------------------------------------------------------------------------


def test_dnat_from_outside_and_from_the_node(portmap, net):
    pod = net.pod("c1")
    maps = [mapping(8080, 80, caps=True), mapping(5353, 53, "udp", caps=True)]
    c = pm_conf(pod.result, maps, snat=True)
    out = pm(portmap, "ADD", c, net.node, "c1", pod.ns.path)
    assert out == pod.result, "prevResult is passed through untouched"
    with Echo(pod.ns, 80), Echo(pod.ns, 53, "udp"):
        # from the client: DNAT in prerouting, the client's address is kept
        assert talk(net.client, NODE4, 8080) == CLIENT4
        assert talk(net.client, NODE6, 8080) == CLIENT6
        assert talk(net.client, NODE4, 5353, "udp") == CLIENT4
        assert talk(net.client, NODE6, 5353, "udp") == CLIENT6
        # any local address of the node, not only the one facing the client
        assert talk(net.client, BR4, 8080) == CLIENT4
        # from the node itself: the output hook
        assert talk(net.node, NODE4, 8080) == NODE4
        assert talk(net.node, NODE6, 8080) == NODE6
        # from localhost: masqueraded to the bridge address (route_localnet)
        assert talk(net.node, "127.0.0.1", 8080) == BR4
        assert talk(net.node, "127.0.0.1", 5353, "udp") == BR4
    assert sysctl(net.node, f"net/ipv4/conf/{BRIDGE}/route_localnet") == "1"
    # an unmapped port stays the node's own (nothing listens: refused)
    assert unreachable(net.client, NODE4, 8081)


def test_hairpin_with_and_without_snat(portmap, net):
    pod, other = net.pod("c1"), net.pod("c2")
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080, 80)]), net.node, "c1", pod.ns.path)
    pm(portmap, "ADD", pm_conf(other.result, [mapping(9090, 80)], snat=False), net.node, "c2",
       other.ns.path)
    with Echo(pod.ns, 80), Echo(other.ns, 80):
        # the container reaches its own host port: masqueraded to the bridge address
        assert talk(pod.ns, NODE4, 8080) == BR4
        assert talk(pod.ns, NODE6, 8080) == BR6
        assert talk(pod.ns, BR4, 8080) == BR4
        # snat false: no hairpin masquerade, the container answers itself directly
        # and its connection never completes; outside traffic still works
        assert unreachable(other.ns, NODE4, 9090, timeout=1.0)
        assert talk(net.client, NODE4, 9090) == CLIENT4
    sets = {s for s, _, _ in entries(net.node, "c2")}
    assert not sets & {"hairpin4", "hairpin6", "localhost4", "masqall4", "masqall6"}
    assert {s for s, _, _ in entries(net.node, "c1")} >= {"hairpin4", "hairpin6", "localhost4"}


def test_masq_all_masquerades_outside_traffic(portmap, net):
    pod = net.pod("c1")
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080, 80)], masqAll=True), net.node, "c1",
       pod.ns.path)
    with Echo(pod.ns, 80):
        assert talk(net.client, NODE4, 8080) == BR4
        assert talk(net.client, NODE6, 8080) == BR6
        assert talk(pod.ns, NODE4, 8080) == BR4
        assert talk(net.node, "127.0.0.1", 8080) == BR4
    assert {s for s, _, _ in entries(net.node, "c1")} == {
        "claims4", "claims6", "a4", "p4", "a6", "p6", "masqall4", "masqall6"}


def test_host_ip_is_honoured(portmap, net):
    pod, wide = net.pod("c1"), net.pod("c2")
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(9090, 80, host_ip=NODE4),
                                            mapping(9191, 80, host_ip=NODE6)]),
       net.node, "c1", pod.ns.path)
    # another container maps the same port on every address: allowed, and the
    # mapping with the node's address wins for that address
    pm(portmap, "ADD", pm_conf(wide.result, [mapping(9090, 80)]), net.node, "c2", wide.ns.path)
    with Echo(pod.ns, 80), Echo(wide.ns, 80):
        assert talk(net.client, NODE4, 9090) == CLIENT4
        assert talk(net.client, NODE6, 9191) == CLIENT6
        assert talk(net.client, BR4, 9090) == CLIENT4  # served by c2
        assert unreachable(net.client, BR6, 9191)      # only fd00:99::1 is mapped
        assert unreachable(net.client, NODE4, 9191)    # an IPv6 hostIP maps only IPv6
    mine = entries(net.node, "c1")
    assert ("claims4", (NODE4, "tcp", 9090), None) in mine
    assert ("ha4", (NODE4, "tcp", 9090), pod.ip4) in mine
    assert ("hp4", (NODE4, "tcp", 9090), 80) in mine
    assert ("ha6", (NODE6, "tcp", 9191), pod.ip6) in mine
    assert not any(s == "claims6" and k[2] == 9090 for s, k, _ in mine)


def test_layout_read_back_through_libnftables_json(portmap, net):
    pod = net.pod("c1")
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080, 80), mapping(6000, 60, "sctp")]),
       net.node, "c1", pod.ns.path)
    table = nft_table(net.node, *TABLE)
    hooks = {n: (c.get("type"), c.get("hook"), c.get("prio")) for n, c in table.chains.items()
             if c.get("hook")}
    assert hooks == {"prerouting": ("nat", "prerouting", -100),
                     "output": ("nat", "output", -100),
                     "postrouting": ("nat", "postrouting", 100)}
    for chain in ("prerouting", "output"):
        (rule,) = table.chain_rules(chain)
        assert rule["expr"][-1] == {"jump": {"target": "hostports"}}
        assert "fib" in rule["expr"][0]["match"]["left"]
    (jump,) = table.chain_rules("hostports")
    dnat_chain = jump["expr"][0]["jump"]["target"]
    assert jump.get("comment") == NET and dnat_chain.startswith("dnat_n")
    # four constant rules per network, each a map lookup: nothing per mapping
    rules = table.chain_rules(dnat_chain)
    assert len(rules) == 4 and all("dnat" in r["expr"][-1] for r in rules)
    assert len(table.chain_rules("postrouting")) == 5
    tag = attachment_tag("c1", "eth0")
    gid = dnat_chain[len("dnat_"):]
    got = {(k["concat"][0], k["concat"][1], d, c) for k, d, c in table.entries(f"{gid}_p4")}
    assert got == {("tcp", 8080, 80, tag), ("sctp", 6000, 60, tag)}
    assert {(d, c) for _, d, c in table.entries(f"{gid}_a6")} == {(pod.ip6, tag)}
    # a second container adds elements only: rules unchanged
    other = net.pod("c2")
    pm(portmap, "ADD", pm_conf(other.result, [mapping(8081, 80)]), net.node, "c2", other.ns.path)
    again = nft_table(net.node, *TABLE)
    assert [r["handle"] for r in again.rules] == [r["handle"] for r in table.rules]
    assert len(list(again.entries(f"{gid}_a4"))) == 3


def test_conflict_is_refused_with_nothing_applied(portmap, net):
    p1, p2 = net.pod("c1"), net.pod("c2")
    pm(portmap, "ADD", pm_conf(p1.result, [mapping(8080, 80)]), net.node, "c1", p1.ns.path)
    before = entries(net.node)
    err = fails(pm, portmap, "ADD", pm_conf(p2.result, [mapping(8081, 80), mapping(8080, 81)]),
                net.node, "c2", p2.ns.path)
    assert err.code == 7
    assert "runtimeConfig.portMappings.1" in err.msg and "c1/eth0" in err.msg
    assert entries(net.node) == before
    # another network: the host port is the node's, so still a conflict
    err = fails(pm, portmap, "ADD", pm_conf(p2.result, [mapping(8080, 80, "TCP")], name="other"),
                net.node, "c2", p2.ns.path)
    assert err.code == 7 and "c1/eth0" in err.msg
    assert entries(net.node, "c2") == set()
    with Echo(p1.ns, 80), Echo(p2.ns, 80):
        assert talk(net.client, NODE4, 8080) == CLIENT4
        assert unreachable(net.client, NODE4, 8081)
    # the same port on another protocol is no conflict
    pm(portmap, "ADD", pm_conf(p2.result, [mapping(8080, 80, "udp")]), net.node, "c2",
       p2.ns.path)


def test_del_without_port_mappings_removes_everything(portmap, net):
    p1, p2 = net.pod("c1"), net.pod("c2")
    pm(portmap, "ADD", pm_conf(p1.result, [mapping(8080, 80), mapping(8443, 443, "udp")]),
       net.node, "c1", p1.ns.path)
    pm(portmap, "ADD", pm_conf(p2.result, [mapping(9090, 80)]), net.node, "c2", p2.ns.path)
    kept = entries(net.node, "c2")
    # containerd's second DEL: no netns, no prevResult, no portMappings
    pm(portmap, "DEL", pm_conf(None, None), net.node, "c1", "")
    assert entries(net.node, "c1") == set()
    assert entries(net.node, "c2") == kept
    with Echo(p1.ns, 80), Echo(p2.ns, 80):
        assert unreachable(net.client, NODE4, 8080)
        assert talk(net.client, NODE4, 9090) == CLIENT4
    pm(portmap, "DEL", pm_conf(None, None), net.node, "c1", "")  # again: fine
    # the port is free again for another container
    pm(portmap, "ADD", pm_conf(p2.result, [mapping(8080, 80)]), net.node, "c2", p2.ns.path,
       ifname="eth0")


def test_del_of_nothing_commits_nothing(portmap, net):
    pod = net.pod("c1")
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080, 80)]), net.node, "c1", pod.ns.path)
    events = monitor(net.node, lambda: [
        pm(portmap, "DEL", pm_conf(None, None), net.node, "unknown", ""),
        pm(portmap, "DEL", pm_conf(pod.result, [mapping(8080, 80)]), net.node, "c1",
           pod.ns.path, ifname="net1"),
    ])
    assert events == []
    # and a real DEL is seen (the monitor works)
    events = monitor(net.node, lambda: pm(portmap, "DEL", pm_conf(None, None), net.node, "c1", ""))
    assert events and all("delete" in e for e in events)
    # no table at all: DEL is fine too
    events = monitor(net.node, lambda: pm(portmap, "DEL", pm_conf(None, None), net.node, "c1", ""))
    assert events == []


def monitor(node: Any, action: Any) -> list[dict]:
    """The nftables events in ``node`` while ``action`` runs (``nft -j
    monitor``, bracketed by sentinel tables so that no event is missed)."""
    def nft(*args: str) -> None:
        subprocess.run(["ip", "netns", "exec", node.name, "nft", *args], check=True,
                       capture_output=True, timeout=10)

    proc = subprocess.Popen(["ip", "netns", "exec", node.name, "nft", "-j", "monitor"],
                            stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()

    def sentinel(name: str) -> None:
        deadline = time.monotonic() + 10
        while True:  # until the monitor is seen to listen
            nft("add", "table", "ip", name)
            until = time.monotonic() + 0.5
            while time.monotonic() < until:
                if any(f'"{name}"' in ln for ln in list(lines)):
                    return
                time.sleep(0.02)
            nft("delete", "table", "ip", name)
            assert time.monotonic() < deadline, "nft monitor reports nothing"

    try:
        sentinel("pmstart")
        action()
        sentinel("pmstop")
    finally:
        proc.terminate()
        proc.wait(5)
        reader.join(5)
        for name in ("pmstart", "pmstop"):
            subprocess.run(["ip", "netns", "exec", node.name, "nft", "delete", "table", "ip",
                            name], check=False, capture_output=True)
    events = [json.loads(ln) for ln in lines if ln.strip().startswith("{")]
    marks = [json.dumps(e) for e in events]
    stop = next(i for i, m in enumerate(marks) if '"pmstop"' in m)
    start = max(i for i, m in enumerate(marks[:stop]) if '"pmstart"' in m)
    return events[start + 1:stop]


def test_stale_udp_conntrack_entries_are_removed(portmap, net):
    p1, p2 = net.pod("c1"), net.pod("c2")
    # a table in the node turns connection tracking on
    pm(portmap, "ADD", pm_conf(p1.result, [mapping(7000, 70)]), net.node, "c1", p1.ns.path)
    with Echo(p2.ns, 53, "udp"):
        # a client talks to the port before it is mapped: conntrack remembers
        # the flow as "to the node", and without cleanup would keep it so
        with pytest.raises(OSError):
            talk(net.client, NODE4, 5353, "udp", timeout=0.5, sport=40000)
        assert conntrack_count(net.node, 5353) >= 1
        pm(portmap, "ADD", pm_conf(p2.result, [mapping(5353, 53, "udp")]), net.node, "c2",
           p2.ns.path)
        assert talk(net.client, NODE4, 5353, "udp", sport=40000) == CLIENT4


def conntrack_count(node: Any, dport: int) -> int:
    code = ("import socket; from pyroute2 import Conntrack; "
            "from pyroute2.conntrack import NFCTAttrTuple; "
            f"t = NFCTAttrTuple(family=socket.AF_INET, proto=17, dport={dport}); "
            "print(len(list(Conntrack().dump_entries(tuple_orig=t))))")
    out = subprocess.run(["ip", "netns", "exec", node.name, os.sys.executable, "-c", code],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return int(out)


def test_check(portmap, net):
    pod = net.pod("c1")
    c = pm_conf(pod.result, [mapping(8080, 80), mapping(9090, 90, "udp", NODE4)])
    pm(portmap, "ADD", c, net.node, "c1", pod.ns.path)
    pm(portmap, "CHECK", c, net.node, "c1", pod.ns.path)
    # another container, other mappings: not there
    assert fails(pm, portmap, "CHECK", c, net.node, "c2", pod.ns.path).code == 999
    # prevResult has no address on net1: nothing to check (as Go)
    pm(portmap, "CHECK", c, net.node, "c1", pod.ns.path, ifname="net1")
    c2 = pm_conf(pod.result, [mapping(8080, 81)])
    err = fails(pm, portmap, "CHECK", c2, net.node, "c1", pod.ns.path)
    assert err.code == 999 and "81" in str(err)
    # prevResult is required
    err = fails(pm, portmap, "CHECK", pm_conf(None, [mapping(8080, 80)]), net.node, "c1",
                pod.ns.path)
    assert err.code == 7 and "prevResult" in err.msg
    # an entry removed behind our back is noticed
    table = nft_table(net.node, *TABLE)
    gid = next(n for n in table.maps if n.endswith("_p4"))
    with NetNS.open(net.node.path) as n, n.enter():
        Nft().run([{"delete": {"element": {"family": "inet", "table": "cni_portmap", "name": gid,
                                           "elem": [{"concat": ["tcp", 8080]}]}}}])
    err = fails(pm, portmap, "CHECK", c, net.node, "c1", pod.ns.path)
    assert err.code == 999 and "missing" in str(err)
    # DEL then CHECK fails; no mappings: nothing to check
    pm(portmap, "DEL", c, net.node, "c1", pod.ns.path)
    assert fails(pm, portmap, "CHECK", c, net.node, "c1", pod.ns.path).code == 999
    pm(portmap, "CHECK", pm_conf(pod.result, []), net.node, "c1", pod.ns.path)


def test_readd_is_idempotent_and_follows_a_new_address(portmap, net):
    pod = net.pod("c1")
    c = pm_conf(pod.result, [mapping(8080, 80)])
    pm(portmap, "ADD", c, net.node, "c1", pod.ns.path)
    first = entries(net.node)
    pm(portmap, "ADD", c, net.node, "c1", pod.ns.path)
    assert entries(net.node) == first
    # same attachment, new container port: its entries are replaced
    pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080, 8000)]), net.node, "c1", pod.ns.path)
    assert ("p4", ("tcp", 8080), 8000) in entries(net.node, "c1")
    assert ("p4", ("tcp", 8080), 80) not in entries(net.node, "c1")
    with Echo(pod.ns, 8000):
        assert talk(net.client, NODE4, 8080) == CLIENT4


def test_conditions_limit_dnat_to_their_family(portmap, net):
    pod = net.pod("c1")
    c = pm_conf(pod.result, [mapping(8080, 80)], conditionsV4=['iifname != "pmcl0"'],
                conditionsV6=[])
    pm(portmap, "ADD", c, net.node, "c1", pod.ns.path)
    with Echo(pod.ns, 80):
        assert unreachable(net.client, NODE4, 8080)        # excluded by conditionsV4
        assert talk(net.node, NODE4, 8080) == NODE4        # from the node: no iifname
        assert talk(net.client, NODE6, 8080) == CLIENT6    # IPv6 has no conditions
    table = nft_table(net.node, *TABLE)
    (jump,) = table.chain_rules("hostports")
    rules = table.chain_rules(jump["expr"][0]["jump"]["target"])
    v4 = [r for r in rules if r["expr"][-1]["dnat"]["family"] == "ip"]
    assert all({"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "pmcl0"}}
               in r["expr"] for r in v4)
