"""Interop of the interface plugins (ptp, macvlan, host-device; ipvlan, vlan
and dummy share macvlan's code, plugins/podlink.py, and are held to Go in
the kernel VM by their own tests) with Go's meta plugins, run by our
runtime CLI as a shell user runs it (issue 33): one conflist [P with our
host-local, Go's tuning, Go's portmap, Go's bandwidth], ``cni-skel add|check|del NETWORK NETNS
--plugin-netns NODE`` (NETCONFPATH, CNI_PATH, CNI_SKEL_CACHE_DIR,
CAP_ARGS), side by side with the same conflist run on Go's own P and
host-local.

Each side has its own node and pod namespaces; macvlan's master is a veth
end in the node, and so is host-device's device.
Go's bandwidth 1.1.1 needs a veth whose peer is a host interface of the
result (ptp's): for the other plugins it refuses ADD and CHECK, the same
way after ours as after Go's. Then the chain is run again without rates
(bandwidth passes ADD through) to see tuning and portmap at work over our
plugin. Go 1.1.1's portmap fails every CHECK of a mapping (see
`PORTMAP_CHECK`), so a CHECK with the mappings shows P and tuning pass,
and one without them lets bandwidth's CHECK run. Kernel state is read
back: the pod's sysctl and link, Go portmap's DNAT rules (iptables-nft,
``iptables -t nat -S`` and ip6tables' in the node), bandwidth's qdiscs
(tc dump), and the node's links, addresses and routes, which DEL must
leave as they were before ADD.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from podlink_common import allocated, pod_state
from yardsticks import DEBIAN, Yardstick, differs

from cni_skel import netlink
from cni_skel.harness import TestNetNS
from cni_skel.netns import NetNS
from cni_skel.sysctl import read_sysctl

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
NET = "ifinterop"
SUBNET4, GW4 = "10.77.0.0/24", "10.77.0.1"
SUBNET6, GW6 = "fd00:77::/64", "fd00:77::1"
SOMAXCONN = "512"
MTU = 1400
HOST_PORT, CONTAINER_PORT = 8080, 80
DEVICE = "hdev0"  # host-device's device, a veth end in the node
META = ("tuning", "portmap", "bandwidth")  # always Go's
PORTS = [{"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "tcp"}]
RATES = {"ingressRate": 8_000_000, "ingressBurst": 80_000,
         "egressRate": 16_000_000, "egressBurst": 160_000}

#: What each plugin adds to the chain's first entry (with its IPAM).
PLUGIN_KEYS: dict[str, dict] = {
    "ptp": {},
    "macvlan": {"master": "eth0", "mode": "bridge"},
    "host-device": {"device": DEVICE},
    "ipvlan": {"master": "eth0", "mode": "l2"},
    "vlan": {"master": "eth0", "vlanId": 100},
    "dummy": {},
}

#: How Go's bandwidth 1.1.1 ends a chain with rates (ADD and CHECK): only
#: ptp's result holds the pod veth's host peer; the others have no veth in
#: the pod, or (host-device) a veth whose peer is not in the result.
NO_PEER = "container interface eth0 has no veth peer"
BANDWIDTH_REFUSAL = {
    "macvlan": NO_PEER, "ipvlan": NO_PEER, "vlan": NO_PEER, "dummy": NO_PEER,
    "host-device": "no veth peer of container interface found in host ns",
}
#: Go's host-device fails a second DEL (the device is back on the node:
#: nothing in the pod to move out), each release in its words (1.9.1: the
#: known difference "second DEL"); ours succeeds, as the spec asks.
GO_DEL_AGAIN = {"host-device": 'failed to find "eth0": Link not found'}
GO_DEL_AGAIN_SINCE_1_6 = {"host-device": 'failed to find "eth0" in containerNS: Link not found'}
#: Go 1.1.1 portmap's CHECK of any mapping: it checks the rules of each
#: address family in both iptables and ip6tables (fixed in v1.3.0, "Only
#: check ipv6 when an IPv6 is configured").
PORTMAP_CHECK = "could not check ipv6 dnat: rule"


# --- one side: a node, a pod, a bin dir, a conflist -----------------------------


@dataclass
class Outcome:
    """How a CLI command ended: ``ok`` (and the result), or the failing
    plugin, its place in the list, the code and the message (portmap's
    chain name masked: it hashes the container ID)."""

    ok: bool
    plugin: str = ""
    index: int = 0
    code: int = 0
    msg: str = ""
    result: Any = None


class Side:
    """One side of the comparison: ``who`` ("ours" or "go") runs P and
    host-local from ``p_dir``, Go's tuning, portmap and bandwidth, in a node
    and a pod namespace of its own."""

    def __init__(self, who: str, plugin: str, p_dir: str, netns_factory: Any,
                 tmp_path: Any, go: Yardstick = DEBIAN) -> None:
        self.who, self.plugin, self.go = who, plugin, go
        self.root = tmp_path / who
        self.node: TestNetNS = netns_factory("cnsk-node")
        self.pod: TestNetNS = netns_factory("cnsk-pod")
        bin_dir = self.root / "bin"
        bin_dir.mkdir(parents=True)
        for name, src in ((plugin, p_dir), ("host-local", p_dir),
                          *((m, go.dir) for m in META)):
            os.symlink(os.path.join(src, name), bin_dir / name)
        conf_dir = self.root / "net.d"
        conf_dir.mkdir()
        (conf_dir / f"10-{NET}.conflist").write_text(json.dumps(self.conflist()))
        self.env = {**os.environ, "NETCONFPATH": str(conf_dir), "CNI_PATH": str(bin_dir),
                    "CNI_SKEL_CACHE_DIR": str(self.root / "cache")}
        with NetNS.open(self.node.path) as n, n.rtnl() as ipr:
            netlink.link_up(ipr, "lo")
            if plugin == "host-device":
                netlink.create_veth_pair(ipr, DEVICE, DEVICE + "p")
                netlink.link_up(ipr, DEVICE + "p")
                netlink.link_up(ipr, DEVICE)
            else:
                netlink.create_veth_pair(ipr, "eth0", "eth0p")
                netlink.link_up(ipr, "eth0p")
                netlink.link_up(ipr, "eth0")
                netlink.add_address(ipr, "eth0", "10.90.0.1/24")
        #: What DEL must leave on the node: what was there before ADD.
        self.after_del = node_state(self.node)
        if who == "go" and plugin == "host-device":  # Go returns the device down
            self.after_del["links"] = sorted(
                (name, kind, mtu, up and name != DEVICE, mac)
                for name, kind, mtu, up, mac in self.after_del["links"])

    def conflist(self) -> dict:
        ipam = {"type": "host-local", "dataDir": str(self.root / "ipam"),
                "ranges": [[{"subnet": SUBNET4, "gateway": GW4}],
                           [{"subnet": SUBNET6, "gateway": GW6}]],
                # A gw in each route: Go 1.1.1's CHECK (ValidateExpectedRoute)
                # looks for a route without one as gw-less and misses it.
                "routes": [{"dst": "10.78.0.0/16", "gw": GW4},
                           {"dst": "fd00:78::/48", "gw": GW6}]}
        first = {"type": self.plugin, **PLUGIN_KEYS[self.plugin], "ipam": ipam}
        if self.plugin == "host-device":  # ours keeps the device's state there; Go ignores it
            first["dataDir"] = str(self.root / "host-device")
        return {"cniVersion": "1.0.0", "name": NET, "plugins": [
            first,
            {"type": "tuning", "sysctl": {"net.core.somaxconn": SOMAXCONN}, "mtu": MTU,
             "dataDir": str(self.root / "tuning")},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        ]}

    def run(self, verb: str, cap_args: dict) -> Outcome:
        """``cni-skel VERB --plugin-netns NODE NET POD`` with ``CAP_ARGS``
        (given on every command, as a runtime does: a DEL after a failed ADD
        has no cached ones, and portmap needs its mappings to find its rules)."""
        proc = subprocess.run(
            [CLI, verb, "--plugin-netns", self.node.path, NET, self.pod.path],
            env={**self.env, "CAP_ARGS": json.dumps(cap_args)}, capture_output=True,
            text=True, timeout=120, check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        if proc.returncode == 0:
            return Outcome(True, result=json.loads(proc.stdout) if proc.stdout.strip() else None)
        where = re.search(r'failed in plugin "([^"]+)" \((\d+) of', proc.stderr)
        code = re.search(r"^  code (\d+): (.*)$", proc.stderr, re.M)
        assert where and code, f"{self.who}: {verb}: {proc.stderr}"
        return Outcome(False, where[1], int(where[2]), int(code[1]),
                       re.sub(r"CNI-DN-[0-9a-f]+", "CNI-DN-*", code[2]))

    def delete_twice(self, cap_args: dict) -> None:
        """DEL succeeds twice (Go's host-device: once, see `GO_DEL_AGAIN`)
        and leaves the node as before ADD (``after_del``), the pod without
        its interface, no IP allocated, no DNAT, nothing cached."""
        out = self.run("del", cap_args)
        assert out.ok, (self.who, out)
        out = self.run("del", cap_args)
        if self.who == "go" and self.plugin in GO_DEL_AGAIN:
            texts = GO_DEL_AGAIN_SINCE_1_6 if differs(self.go, self.plugin, "second DEL") \
                else GO_DEL_AGAIN
            assert (out.ok, out.plugin, out.index, out.code, out.msg) == \
                (False, self.plugin, 1, 999, texts[self.plugin]), out
        else:
            assert out.ok, (self.who, out)
        assert node_state(self.node) == self.after_del, self.who
        assert pod_state(self.pod) == {}, self.who
        assert allocated(self.root / "ipam", NET) == []
        assert dnat_rules(self.node) == []
        cache = self.root / "cache" / "results"
        assert not cache.exists() or list(cache.iterdir()) == []


# --- what the kernel holds ----------------------------------------------------


def node_state(ns: TestNetNS) -> dict:
    """The node's links (name, kind, MTU, up, MAC), global addresses and
    main-table routes (the kernel's IPv6 link-local ones left out: they come
    back on their own, a moment after a link does)."""
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        links = netlink.links(ipr)
        names = {lk.index: lk.name for lk in links}
        addrs = sorted((lk.name, str(a)) for lk in links for a in netlink.addresses(ipr, lk)
                       if not a.ip.is_link_local)
        routes = sorted((str(r["dst"]), str(r["gw"]), names.get(r["oif"], "?"))
                        for r in netlink.routes(ipr) if not r["dst"].is_link_local)
    return {"links": sorted((lk.name, lk.kind, lk.mtu, lk.up, lk.mac) for lk in links),
            "addresses": addrs, "routes": routes}


def somaxconn(pod: TestNetNS) -> str:
    with NetNS.open(pod.path) as n:
        return n.run(read_sysctl, "net/core/somaxconn")


def dnat_rules(node: TestNetNS) -> list[str]:
    """Go portmap's per-container rules in the node (``iptables -t nat -S``
    and ip6tables', the chain hash and the container ID masked): empty when
    it has none."""
    lines = []
    for tool in ("iptables", "ip6tables"):
        proc = subprocess.run(["ip", "netns", "exec", node.name, tool, "-w", "5", "-t", "nat",
                               "-S"], capture_output=True, text=True, timeout=30, check=True)
        lines += [f"{tool} {ln}" for ln in proc.stdout.splitlines() if "CNI-DN-" in ln]
    return sorted(re.sub(r'id: \\"[^\\]*\\"', "id", re.sub(r"CNI-DN-[0-9a-f]+", "CNI-DN-*", ln))
                  for ln in lines)


def qdiscs(node: TestNetNS, ifname: str) -> list[tuple]:
    """The qdiscs of ``ifname`` in the node (tc dump): kind, parent, and for
    tbf its rate (bytes/s), buffer and limit; plus the kinds of the ingress
    filters (bandwidth's redirect to its ifb)."""
    with NetNS.open(node.path) as n, n.iproute() as ipr:
        (index,) = ipr.link_lookup(ifname=ifname)
        out = []
        for q in ipr.get_qdiscs(index=index):
            kind = q.get_attr("TCA_KIND")
            entry: tuple = (kind, q["parent"])
            if kind == "tbf":
                parms = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
                entry += (parms["rate"], parms["buffer"], parms["limit"])
            out.append(entry)
            if kind == "ingress":
                out += [("filter", f.get_attr("TCA_KIND"))
                        for f in ipr.get_filters(index=index, parent=0xFFFF0000)
                        if f.get_attr("TCA_KIND")]
    return sorted(out, key=repr)


def masked(doc: Any, sandbox: str) -> Any:
    """A result with what differs per run masked: MACs, the sandbox path,
    host veth names (``veth`` + hex) and bandwidth's ifb names (``bwp`` + hex)."""
    if isinstance(doc, dict):
        return {k: "<mac>" if k == "mac" else masked(v, sandbox) for k, v in doc.items()}
    if isinstance(doc, list):
        return [masked(x, sandbox) for x in doc]
    if doc == sandbox:
        return "<sandbox>"
    if isinstance(doc, str):
        return re.sub(r"^(veth|bwp)[0-9a-f]+$", r"<\1>", doc)
    return doc


# --- the test -----------------------------------------------------------------


@pytest.mark.parametrize("plugin", ["ptp", "macvlan", "host-device"])
def test_chain_with_go_meta_plugins_as_go(plugin, cni_bin, go_yardstick, netns_factory,
                                          tmp_path):
    """The chain [P + host-local, tuning, portmap, bandwidth] through the
    runtime CLI ends the same way on ours as on Go's P and host-local
    (`chain_as_go`), in both modes, against each Go set (its own meta
    plugins on both sides)."""
    chain_as_go(plugin, cni_bin, netns_factory, tmp_path, go_yardstick)


def chain_as_go(plugin: str, ours: str, netns_factory: Any, tmp_path: Any,
                go: Yardstick = DEBIAN) -> None:
    """Run the chain on our P and host-local (from ``ours``) and on ``go``'s.

    ptp: ADD succeeds with every meta plugin's work in the kernel. The
    others: Go's bandwidth refuses ADD (no host veth peer) at the same place
    with the same code, after P, tuning and portmap did theirs; DEL cleans
    up; without rates the chain succeeds. CHECK with the port mappings
    stops at Go 1.1.1's portmap on both sides (it checks the IPv4 rules in
    ip6tables too; fixed in v1.3.0), so P and tuning passed; 1.9.1's portmap
    passes it, so it runs on to bandwidth. CHECK without them passes (ptp)
    or stops at bandwidth. DEL twice leaves the node as it was (Go's
    host-device fails the second and leaves its device down)."""
    sides = [Side("ours", plugin, ours, netns_factory, tmp_path, go)]
    if go.has(plugin):  # Go 1.1.1 has no dummy
        sides.append(Side("go", plugin, go.dir, netns_factory, tmp_path, go))
    caps = {"portMappings": PORTS, "bandwidth": RATES}

    adds = [s.run("add", caps) for s in sides]
    if plugin != "ptp":
        same_failure(adds, "bandwidth", 4, BANDWIDTH_REFUSAL[plugin])
        applied(sides, None, host_peer=False)  # what ran before bandwidth, alike
        for s in sides:
            s.delete_twice(caps)
        caps = {"portMappings": PORTS}
        adds = [s.run("add", caps) for s in sides]
    assert all(a.ok for a in adds), adds
    applied(sides, adds, host_peer=plugin == "ptp")

    with_ports = [s.run("check", caps) for s in sides]
    if go == DEBIAN:
        same_failure(with_ports, "portmap", 3, PORTMAP_CHECK)
    elif plugin == "ptp":
        assert all(c.ok for c in with_ports), with_ports
    else:
        same_failure(with_ports, "bandwidth", 4, BANDWIDTH_REFUSAL[plugin])
    no_ports = {k: v for k, v in caps.items() if k != "portMappings"}
    checks = [s.run("check", no_ports) for s in sides]
    if plugin == "ptp":
        assert all(c.ok for c in checks), checks
    else:
        same_failure(checks, "bandwidth", 4, BANDWIDTH_REFUSAL[plugin])
    for s in sides:
        s.delete_twice(caps)


def same_failure(outs: list[Outcome], plugin: str, index: int, msg: str) -> None:
    """Every side failed in ``plugin`` (``index`` of 4) with 999 and the
    same message, which starts with ``msg``."""
    for out in outs:
        assert (out.ok, out.plugin, out.index, out.code) == (False, plugin, index, 999), outs
        assert out.msg.startswith(msg), outs
    assert len({out.msg for out in outs}) == 1, outs


def applied(sides: list[Side], adds: list[Outcome] | None, *, host_peer: bool) -> None:
    """Each side's pod and node hold what P, tuning and portmap (and with
    ``host_peer``, bandwidth) did, the same on every side; the results
    (``adds``, when the chain ended) are equal once masked."""
    seen = []
    for i, s in enumerate(sides):
        pod = pod_state(s.pod)
        assert pod["mtu"] == MTU and pod["up"], (s.who, pod)
        ip4, ip6 = (a.split("/")[0] for a in pod["addresses"])
        assert somaxconn(s.pod) == SOMAXCONN, s.who
        rules = dnat_rules(s.node)
        for dest in (f"{ip4}:{CONTAINER_PORT}", f"[{ip6}]:{CONTAINER_PORT}"):
            assert any(f"--dport {HOST_PORT}" in r and f"--to-destination {dest}" in r
                       for r in rules), (s.who, rules)
        state = {"pod": pod, "rules": rules}
        if adds is not None:
            result = adds[i].result
            state["result"] = masked(result, s.pod.path)
            if host_peer:
                host = [x["name"] for x in result["interfaces"] if not x.get("sandbox")]
                ifb = [n for n in host if n.startswith("bwp")]
                veth = [n for n in host if not n.startswith("bwp")]
                assert len(ifb) == 1 and len(veth) == 1, (s.who, result["interfaces"])
                on_veth, on_ifb = qdiscs(s.node, veth[0]), qdiscs(s.node, ifb[0])
                # Ingress: a tbf on the host veth; egress: the veth's ingress
                # redirected (u32 filter) to the ifb, which has the tbf.
                assert [q[2] for q in on_veth if q[0] == "tbf"] == \
                    [RATES["ingressRate"] // 8], (s.who, on_veth)
                assert [q[2] for q in on_ifb if q[0] == "tbf"] == \
                    [RATES["egressRate"] // 8], (s.who, on_ifb)
                assert ("filter", "u32") in on_veth, (s.who, on_veth)
                state["qdiscs"] = [on_veth, on_ifb]
        seen.append(state)
    for other in seen[1:]:
        assert other == seen[0]
