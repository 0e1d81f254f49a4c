"""The leak detector of the fuzz suite sees what it must (a veth, an
address, an nftables table and element, a file, a sysctl, a changed MTU, an
ipset entry, a per-pod iptables rule) and lets a network's infrastructure (a
bridge, its gateway address, a chain in a shared table, the firewall's
per-node layout) pass: if it went blind, every fuzz test would pass."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from cni_skel.conformance import snapshot
from cni_skel.ipset import IPSets
from cni_skel.netns import NetNS
from cni_skel.nft import Nft

pytestmark = pytest.mark.root

SYSCTL = "net/ipv4/conf/all/forwarding"


def _iptables(ns: Any, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns.name, "iptables", "-w", "10", *argv],
                   capture_output=True, timeout=30, check=True)


def _write(ns: Any, key: str, value: str) -> None:
    with NetNS.open(ns.path) as handle, handle.enter(), open(f"/proc/sys/{key}", "w") as fp:
        fp.write(value)


def test_snapshot_diff_names_leaks_and_passes_infrastructure(node_netns, pod_netns,
                                                             tmp_path) -> None:
    data = tmp_path / "data"
    (data / "net").mkdir(parents=True)
    (data / "net" / "lock").write_text("")
    observer = snapshot.Observer({"node": node_netns.path, "pod": pod_netns.path},
                                 [str(data)], {"pod": [SYSCTL]})
    try:
        before = observer.take()
        with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
            ipr.link("add", ifname="cnskbr0", kind="bridge")
            ipr.addr("add", index=ipr.link_lookup(ifname="cnskbr0")[0], address="10.55.0.1",
                     prefixlen=24)
            ipr.link("set", index=ipr.link_lookup(ifname="cnskbr0")[0], state="up")
            ipr.link("add", ifname="vethleak", kind="veth", peer="vethleakp")
            ns.run(lambda: Nft().run([
                {"add": {"table": {"family": "inet", "name": "cni_skel_bridge"}}},
                {"add": {"chain": {"family": "inet", "table": "cni_skel_bridge",
                                   "name": "n_x"}}},
                {"add": {"table": {"family": "inet", "name": "leaky"}}},
                {"add": {"set": {"family": "inet", "table": "leaky", "name": "s",
                                 "type": "ipv4_addr"}}},
                {"add": {"element": {"family": "inet", "table": "leaky", "name": "s",
                                     "elem": ["10.55.0.9"]}}}]))
        with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], mtu=1400)
            ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")
            ipr.addr("add", index=ipr.link_lookup(ifname="eth0")[0], address="10.55.0.9",
                     prefixlen=24)
            for link in ("eth0", "eth0p"):
                ipr.link("set", index=ipr.link_lookup(ifname=link)[0], state="up")
            ipr.route("add", dst="10.77.0.0/16", gateway="10.55.0.254", table=100,
                      oif=ipr.link_lookup(ifname="eth0")[0])
        _write(pod_netns, SYSCTL, "1")
        (data / "net" / "10.55.0.9").write_text("c1\r\neth0")
        (data / "net" / "last_reserved_ip.0").write_text("10.55.0.9")
        after = observer.take()
    finally:
        observer.close()
    lines = snapshot.diff(before, after)
    text = "\n".join(lines)
    for expected in ("+ link node/vethleak veth", "+ link node/vethleakp veth",
                     "+ link pod/eth0 veth", "+ address 10.55.0.9/24 on pod/eth0",
                     "~ link pod/lo device: mtu 65536 -> 1400",
                     "+ nftables table node: inet leaky", "+ nftables set node: inet leaky s",
                     "+ nftables element node: inet leaky set s", "+ file net/10.55.0.9",
                     f"~ sysctl pod {SYSCTL}: '0' -> '1'",
                     "+ nftables table node: inet cni_skel_bridge",
                     "+ route pod: table 100 10.77.0.0/16 via 10.55.0.254 dev eth0",
                     "+ route pod: table 254 10.55.0.0/24 dev eth0 metric 0 proto 2"):
        assert any(line.startswith(expected) for line in lines), (expected, text)
    for passed in ("cnskbr0", "10.55.0.1", "n_x", "last_reserved_ip", "lock"):
        assert passed not in text, (passed, text)
    assert snapshot.diff(after, after) == []


def _nodefw(*cmds: dict) -> None:
    Nft().run([{"add": c} for c in cmds])


def _pod_ipset() -> None:
    with IPSets() as sets:
        sets.ensure("CNI-FW-POD4", 4)
        sets.add("CNI-FW-POD4", "10.55.0.9", "fz c1")


def test_snapshot_sees_pod_entries_and_passes_the_firewall_layout(node_netns) -> None:
    comment = ["-m", "comment", "--comment"]
    stage1 = ["CNI-ISOLATION-STAGE-1", "-j", "RETURN", *comment, "fz isolation"]
    fw = {"family": "inet", "table": "nodefw"}
    _iptables(node_netns, "-P", "FORWARD", "DROP")
    _iptables(node_netns, "-N", "CNI-ISOLATION-STAGE-1")
    _iptables(node_netns, "-A", *stage1)
    with NetNS.open(node_netns.path) as ns:
        ns.run(_nodefw, {"table": {"family": "inet", "name": "nodefw"}},
               {"chain": {**fw, "name": "forward", "type": "filter", "hook": "forward",
                          "prio": 0, "policy": "drop"}})
    observer = snapshot.Observer({"node": node_netns.path})
    try:
        before = observer.take()
        with NetNS.open(node_netns.path) as ns:
            ns.run(_pod_ipset)
            ns.run(_nodefw,
                   {"set": {**fw, "name": "cni_firewall_pods4", "type": "ipv4_addr"}},
                   {"chain": {**fw, "name": "cni_firewall"}},
                   {"rule": {**fw, "chain": "cni_firewall", "expr": [
                       {"match": {"op": "==", "left": {"payload": {"protocol": "ip",
                                                                   "field": "saddr"}},
                                  "right": "@cni_firewall_pods4"}}, {"accept": None}]}},
                   {"rule": {**fw, "chain": "forward", "comment": "fz pods",
                             "expr": [{"jump": {"target": "cni_firewall"}}]}},
                   {"element": {**fw, "name": "cni_firewall_pods4", "elem": ["10.55.0.9"]}})
        for chain in ("CNI-FORWARD", "FZ-ADMIN", "LEAKY"):
            _iptables(node_netns, "-N", chain)
        _iptables(node_netns, "-I", "FORWARD", *comment, "fz rules", "-j", "CNI-FORWARD")
        _iptables(node_netns, "-I", "CNI-FORWARD", *comment, "fz admin", "-j", "FZ-ADMIN")
        _iptables(node_netns, "-A", "CNI-FORWARD", "-m", "set", "--match-set", "CNI-FW-POD4",
                  "src", *comment, "fz set", "-j", "ACCEPT")
        _iptables(node_netns, "-A", "CNI-FORWARD", "-s", "10.55.0.9/32", "-j", "ACCEPT")
        _iptables(node_netns, "-A", *stage1)  # a second copy of a layout rule
        _iptables(node_netns, "-P", "FORWARD", "ACCEPT")
        after = observer.take()
    finally:
        observer.close()
    lines = snapshot.diff(before, after)
    raw = snapshot.diff(before, after, None)
    text = "\n".join(lines)
    for expected in ("+ ipset entry node: CNI-FW-POD4 10.55.0.9 (comment 'fz c1')",
                     "+ nftables element node: inet nodefw set cni_firewall_pods4",
                     "+ nftables chain node: ip filter LEAKY",
                     "~ nftables chain node: ip filter FORWARD",
                     "~ nftables rule node: ip filter chain CNI-ISOLATION-STAGE-1"):
        assert any(line.startswith(expected) for line in lines), (expected, text)
    go_rule = [line for line in lines if line.startswith("+ nftables rule node: ip filter")]
    assert len(go_rule) == 1 and "10.55.0.9" in go_rule[0], text
    for passed in ("+ nftables chain node: ip filter CNI-FORWARD",
                   "+ nftables chain node: ip filter FZ-ADMIN", "+ ipset node:",
                   "+ nftables chain node: inet nodefw cni_firewall",
                   "+ nftables set node: inet nodefw cni_firewall_pods4",
                   "+ nftables rule node: inet nodefw"):
        assert not any(line.startswith(passed) for line in lines), (passed, text)
        # seen, and let pass: not merely unseen
        assert any(line.startswith(passed) for line in raw), (passed, raw)
