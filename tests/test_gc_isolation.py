"""GC and DEL of one network touch only that network's state (issue 9).

Two networks per plugin on one node, attachments on each; GC of network A
lists only A's valid attachments (as libcni does: one GC per network), then
a DEL of an A attachment; what network B holds must not change: nftables
elements (libnftables JSON listing), files (bytes), and for bridge the
traffic of B's pods (masquerade to the outside, pod to pod, spoofed frames
still dropped). Also the bridge upgrade path: spoof-check elements in the
sets every network shared before per-network sets are still removed by DEL
and GC of their network, and CHECK still accepts them.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

import pytest
from cni_skel_plugins.bridge.rules import LEGACY_ALLOWED, LEGACY_PORTS

from cni_skel import netlink
from cni_skel.harness import TestNetNS, nft_table, run_plugin, tcp_echo
from cni_skel.netns import NetNS
from cni_skel.nft import Nft, network_tag

BRIDGE_TABLE = "cni_skel_bridge"
NODE_UP, OUTSIDE = "10.91.0.1", "10.91.0.2"


def bridge_id(network: str) -> str:
    """The prefix of a network's objects in bridge's tables."""
    return network_tag(network, prefix="n_", width=16)


def elements(node: TestNetNS, family: str, table: str) -> set[tuple[str, str, Any]]:
    """Every element of the table: (set or map, key as JSON, comment)."""
    t = nft_table(node, family, table)
    if t is None:
        return set()
    return {(name, json.dumps(key, sort_keys=True), comment)
            for name in [*t.sets, *t.maps] for key, _data, comment in t.entries(name)}


def tagged(state: set[tuple[str, str, Any]], *cids: str) -> set[tuple[str, str, Any]]:
    """The elements whose comment is the tag of one of ``cids`` (any ifname)."""
    return {e for e in state if isinstance(e[2], str) and e[2].split("/")[0] in cids}


def files(directory: Any) -> dict[str, bytes]:
    """Address / saved-value files (bytes) of a directory, locks and marks aside."""
    d = str(directory)
    if not os.path.isdir(d):
        return {}
    out = {}
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name == "lock" or name.startswith((".", "last_reserved_ip")) \
                or not os.path.isfile(path):
            continue
        with open(path, "rb") as fp:
            out[name] = fp.read()
    return out


def gc(exe: str, conf: dict, node: TestNetNS, valid: list[tuple[str, str]]) -> None:
    c = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": cid, "ifname": ifn}
                                                    for cid, ifn in valid]})
    c.pop("prevResult", None)
    run_plugin(exe, "GC", c, container_id="", netns="", ifname="", node=node)


def ip4(result: dict) -> str:
    return next(str(ipaddress.ip_interface(i["address"]).ip) for i in result["ips"]
                if ipaddress.ip_interface(i["address"]).version == 4)


def set_mac(ns: TestNetNS, mac: str) -> None:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        netlink.link_set(ipr, "eth0", mac=mac)


def mac_of(ns: TestNetNS, name: str = "eth0") -> str:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        link = netlink.find_link(ipr, name)
    assert link is not None
    return link.mac


# --- bridge ---------------------------------------------------------------------------


def br_conf(tmp_path: Any, name: str, bridge: str, subnet: str) -> dict:
    return {"cniVersion": "1.1.0", "name": name, "type": "bridge", "bridge": bridge,
            "isDefaultGateway": True, "ipMasq": True, "macspoofchk": True,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": subnet}]]}}


@pytest.fixture
def uplink(node_netns, netns_factory) -> TestNetNS:
    """An outside host linked to the node (node NODE_UP, outside OUTSIDE)."""
    outside = netns_factory("cnsk-out")
    with NetNS.open(node_netns.path) as n, n.iproute() as ipr, NetNS.open(outside.path) as o:
        netlink.create_veth_pair(ipr, "uplink0", "wan0", peer_netns=o)
        netlink.add_address(ipr, "uplink0", f"{NODE_UP}/24")
        netlink.link_up(ipr, "uplink0")
        with o.iproute() as oipr:
            netlink.add_address(oipr, "wan0", f"{OUTSIDE}/24")
            netlink.link_up(oipr, "wan0")
    return outside


def _b_traffic_ok(pods: dict[str, TestNetNS], results: dict[str, dict],
                  outside: TestNetNS) -> None:
    """B's pods: masqueraded to the outside, direct between them, and a
    spoofed source MAC still dropped (spoof check on)."""
    _, peer = tcp_echo(outside, OUTSIDE, pods["gb0"])
    assert peer == NODE_UP, "B's pod is no longer masqueraded"
    _, peer = tcp_echo(pods["gb1"], ip4(results["gb1"]), pods["gb0"])
    assert peer == ip4(results["gb0"]), "B's pod-to-pod traffic was masqueraded"
    real = mac_of(pods["gb0"])
    set_mac(pods["gb0"], "02:00:00:00:0b:99")
    try:
        with pytest.raises(OSError):
            tcp_echo(pods["gb1"], ip4(results["gb1"]), pods["gb0"], timeout=1.5)
    finally:
        set_mac(pods["gb0"], real)
    assert tcp_echo(pods["gb1"], ip4(results["gb1"]), pods["gb0"])[0] == b"cni-skel"


def test_bridge_gc_and_del_of_one_network_leave_the_other_intact(
        cni_bin, node_netns, netns_factory, uplink, tmp_path):
    exe = os.path.join(cni_bin, "bridge")
    node = node_netns
    nets = {"a": br_conf(tmp_path, "gcneta", "cnskga0", "10.74.0.0/24"),
            "b": br_conf(tmp_path, "gcnetb", "cnskgb0", "10.75.0.0/24")}
    pods: dict[str, TestNetNS] = {}
    results: dict[str, dict] = {}
    for cid in ("ga0", "ga1", "gb0", "gb1"):
        pods[cid] = netns_factory("cnsk-gcpod")
        results[cid] = run_plugin(exe, "ADD", nets[cid[1]], container_id=cid,
                                  netns=pods[cid].path, ifname="eth0", node=node)

    def b_state() -> tuple:
        return (tagged(elements(node, "inet", BRIDGE_TABLE), "gb0", "gb1"),
                tagged(elements(node, "bridge", BRIDGE_TABLE), "gb0", "gb1"),
                files(tmp_path / "ipam" / "gcnetb"))

    before = b_state()
    masq_b, spoof_b, ipam_b = before
    assert len(masq_b) == 2 * 2 and len(spoof_b) == 2 * 2 and len(ipam_b) == 2
    # each network has its own spoof-check sets: none holds both networks' pods
    spoof = elements(node, "bridge", BRIDGE_TABLE)
    for name in {e[0] for e in spoof}:
        owners = {e[2][1] for e in spoof if e[0] == name}
        assert len(owners) == 1 and name.startswith(bridge_id(f"gcnet{owners.pop()}"))
    _b_traffic_ok(pods, results, uplink)

    # GC of A, listing only A's valid attachment (B's are not A's business)
    gc(exe, nets["a"], node, [("ga0", "eth0")])
    assert b_state() == before
    inet = elements(node, "inet", BRIDGE_TABLE)
    spoof = elements(node, "bridge", BRIDGE_TABLE)
    assert tagged(inet, "ga1") == set() and tagged(spoof, "ga1") == set()
    assert len(tagged(inet, "ga0")) == 2 and len(tagged(spoof, "ga0")) == 2
    assert list(files(tmp_path / "ipam" / "gcneta")) == [ip4(results["ga0"])]
    _b_traffic_ok(pods, results, uplink)

    # DEL of an A pod: the same
    run_plugin(exe, "DEL", nets["a"], container_id="ga0", netns=pods["ga0"].path,
               ifname="eth0", node=node)
    assert b_state() == before
    assert tagged(elements(node, "inet", BRIDGE_TABLE), "ga0", "ga1") == set()
    assert tagged(elements(node, "bridge", BRIDGE_TABLE), "ga0", "ga1") == set()
    assert files(tmp_path / "ipam" / "gcneta") == {}
    _b_traffic_ok(pods, results, uplink)

    for cid in ("ga1", "gb0", "gb1"):
        run_plugin(exe, "DEL", nets[cid[1]], container_id=cid, netns=pods[cid].path,
                   ifname="eth0", node=node)
    assert elements(node, "inet", BRIDGE_TABLE) == set()
    assert elements(node, "bridge", BRIDGE_TABLE) == set()


def _legacy_layout(elems: list[tuple[str, str, str]]) -> list[dict]:
    """What versions before per-network sets made: one pair of sets shared by
    every network, one rule; ``elems``: (host veth, MAC, tag)."""
    t = {"family": "bridge", "table": BRIDGE_TABLE}
    return [
        {"add": {"table": {"family": "bridge", "name": BRIDGE_TABLE}}},
        {"add": {"chain": {**t, "name": "prerouting", "type": "filter", "hook": "prerouting",
                           "prio": -300, "policy": "accept"}}},
        {"add": {"set": {**t, "name": LEGACY_ALLOWED, "type": ["ifname", "ether_addr"]}}},
        {"add": {"set": {**t, "name": LEGACY_PORTS, "type": "ifname"}}},
        {"add": {"rule": {**t, "chain": "prerouting", "comment": "macspoofchk", "expr": [
            {"match": {"op": "==", "left": {"meta": {"key": "iifname"}},
                       "right": f"@{LEGACY_PORTS}"}},
            {"match": {"op": "!=", "left": {"concat": [
                {"meta": {"key": "iifname"}},
                {"payload": {"protocol": "ether", "field": "saddr"}}]},
                "right": f"@{LEGACY_ALLOWED}"}},
            {"drop": None}]}}},
        {"add": {"element": {**t, "name": LEGACY_ALLOWED, "elem": [
            {"elem": {"val": {"concat": [port, mac]}, "comment": tag}}
            for port, mac, tag in elems]}}},
        {"add": {"element": {**t, "name": LEGACY_PORTS, "elem": [
            {"elem": {"val": port, "comment": tag}} for port, _mac, tag in elems]}}},
    ]


def _to_legacy(node: TestNetNS, network: str, cid: str) -> list[tuple[str, str, str]]:
    """Move attachment ``cid``'s spoof-check elements from its network's sets
    to the old shared ones (a pod made before the upgrade)."""
    t = nft_table(node, "bridge", BRIDGE_TABLE)
    nid = bridge_id(network)
    tag = f"{cid}/eth0"
    [(port, mac)] = [tuple(v["concat"]) for v, c in t.elements(f"{nid}_spoofchk_allowed")
                     if c == tag]
    base = {"family": "bridge", "table": BRIDGE_TABLE}
    cmds = [{"delete": {"element": {**base, "name": f"{nid}_spoofchk_allowed",
                                    "elem": [{"concat": [port, mac]}]}}},
            {"delete": {"element": {**base, "name": f"{nid}_spoofchk_ports",
                                    "elem": [port]}}}]
    with NetNS.open(node.path) as n:
        n.run(lambda: Nft().run(cmds))
    return [(port, mac, tag)]


def test_bridge_old_shared_spoof_sets_keep_working_after_an_upgrade(
        cni_bin, node_netns, netns_factory, tmp_path):
    exe = os.path.join(cni_bin, "bridge")
    node = node_netns
    a = br_conf(tmp_path, "upneta", "cnskua0", "10.77.0.0/24")
    b = br_conf(tmp_path, "upnetb", "cnskub0", "10.78.0.0/24")
    pods = {cid: netns_factory("cnsk-uppod") for cid in ("ua0", "ua1", "ub0")}
    results = {cid: run_plugin(exe, "ADD", a if cid[1] == "a" else b, container_id=cid,
                               netns=pods[cid].path, ifname="eth0", node=node)
               for cid in pods}
    old = []
    for cid in pods:
        old += _to_legacy(node, a["name"] if cid[1] == "a" else b["name"], cid)
    # and one of a pod whose veth is gone without a DEL
    old.append(("vethdead0001", "02:00:00:00:de:ad", "udead/eth0"))
    with NetNS.open(node.path) as n:
        n.run(lambda: Nft().run(_legacy_layout(old)))

    def legacy() -> set[str]:
        t = nft_table(node, "bridge", BRIDGE_TABLE)
        tags = {c for _, c in t.elements(LEGACY_PORTS)}
        assert tags == {c for _, c in t.elements(LEGACY_ALLOWED)}
        return tags

    assert legacy() == {"ua0/eth0", "ua1/eth0", "ub0/eth0", "udead/eth0"}
    # the old rule still drops ua0's spoofed frames, CHECK still passes
    assert tcp_echo(pods["ua1"], ip4(results["ua1"]), pods["ua0"])[0] == b"cni-skel"
    real = mac_of(pods["ua0"])
    set_mac(pods["ua0"], "02:00:00:00:0a:99")
    with pytest.raises(OSError):
        tcp_echo(pods["ua1"], ip4(results["ua1"]), pods["ua0"], timeout=1.5)
    set_mac(pods["ua0"], real)
    run_plugin(exe, "CHECK", dict(a, prevResult=results["ua0"]), container_id="ua0",
               netns=pods["ua0"].path, ifname="eth0", node=node)
    # a pod added after the upgrade goes to A's own sets and talks to the old one
    new = netns_factory("cnsk-uppod")
    r = run_plugin(exe, "ADD", a, container_id="ua9", netns=new.path, ifname="eth0", node=node)
    assert tcp_echo(pods["ua0"], ip4(results["ua0"]), new)[0] == b"cni-skel"
    nid = bridge_id(a["name"])
    assert tagged(elements(node, "bridge", BRIDGE_TABLE), "ua9") == {
        (f"{nid}_spoofchk_ports", json.dumps(r["interfaces"][1]["name"]), "ua9/eth0"),
        (f"{nid}_spoofchk_allowed", json.dumps({"concat": [r["interfaces"][1]["name"],
                                                           r["interfaces"][2]["mac"]]},
                                               sort_keys=True), "ua9/eth0")}
    run_plugin(exe, "DEL", a, container_id="ua9", netns=new.path, ifname="eth0", node=node)

    # GC of A (ua0 valid): ua1's old elements go (its veth is on A's bridge
    # but nothing says which network an old element is: kept while the veth
    # lives), the dead veth's go, B's stay
    gc(exe, a, node, [("ua0", "eth0")])
    assert legacy() == {"ua0/eth0", "ua1/eth0", "ub0/eth0"}
    run_plugin(exe, "DEL", a, container_id="ua1", netns=pods["ua1"].path, ifname="eth0",
               node=node)
    assert legacy() == {"ua0/eth0", "ub0/eth0"}
    # GC now that ua1's veth is gone with its DEL, and nothing else
    gc(exe, a, node, [("ua0", "eth0")])
    assert legacy() == {"ua0/eth0", "ub0/eth0"}
    # DEL of the old pod of A removes its old elements, and only those
    run_plugin(exe, "DEL", a, container_id="ua0", netns=pods["ua0"].path, ifname="eth0",
               node=node)
    assert legacy() == {"ub0/eth0"}
    run_plugin(exe, "DEL", b, container_id="ub0", netns=pods["ub0"].path, ifname="eth0",
               node=node)
    assert legacy() == set()
    assert elements(node, "bridge", BRIDGE_TABLE) == set()


# --- portmap --------------------------------------------------------------------------


PM_SANDBOX = "/run/netns/cnsk-gc-unused"  # portmap never enters the container


def pm_conf(name: str, ip: str, ports: list[int], ifname: str = "eth0",
            masq_all: bool = False) -> dict:
    return {"cniVersion": "1.1.0", "name": name, "type": "portmap", "masqAll": masq_all,
            "runtimeConfig": {"portMappings": [
                {"hostPort": p, "containerPort": 80, "protocol": proto}
                for p in ports for proto in ("tcp", "udp")]},
            "prevResult": {"cniVersion": "1.1.0",
                           "interfaces": [{"name": ifname, "sandbox": PM_SANDBOX}],
                           "ips": [{"address": f"{ip}/24", "interface": 0},
                                   {"address": f"fd00:79::{ip.split('.')[-1]}/64",
                                    "interface": 0}]}}


def test_portmap_gc_and_del_of_one_network_leave_the_other_intact(cni_bin, node_netns):
    exe = os.path.join(cni_bin, "portmap")
    node = node_netns
    pods = {  # cid -> (network, container IP, host ports, ifname)
        "pa0": ("pmneta", "10.79.0.10", [8100], "eth0"),
        "pa1": ("pmneta", "10.79.0.11", [8101], "eth0"),
        "pb0": ("pmnetb", "10.79.0.20", [8200], "eth0"),
        "pb1": ("pmnetb", "10.79.0.21", [8201], "eth0"),
        # one pod in both networks: eth0 in A above would clash; net1 in B
        "pa2": ("pmnetb", "10.79.0.12", [8202], "net1"),
    }
    confs = {cid: pm_conf(net, ip, ports, ifn, masq_all=(cid == "pb1"))
             for cid, (net, ip, ports, ifn) in pods.items()}
    for cid in ("pb0", "pb1", "pa2"):
        run_plugin(exe, "ADD", confs[cid], container_id=cid, netns=PM_SANDBOX,
                   ifname=pods[cid][3], node=node)
    b_only = elements(node, "inet", "cni_portmap")
    assert len(b_only) > 20  # maps, claims, hairpin, localhost, masqall, records
    for cid in ("pa0", "pa1"):
        run_plugin(exe, "ADD", confs[cid], container_id=cid, netns=PM_SANDBOX,
                   ifname="eth0", node=node)
    # also a GC of A with a pa2 attachment that A never had (eth0): nothing of B's
    gc(exe, confs["pa0"], node, [("pa0", "eth0"), ("pa2", "eth0")])
    now = elements(node, "inet", "cni_portmap")
    assert b_only <= now, f"GC of A removed B's: {sorted(b_only - now)}"
    assert tagged(now, "pa1") == set() and tagged(now, "pa0")
    run_plugin(exe, "DEL", confs["pa0"], container_id="pa0", netns=PM_SANDBOX,
               ifname="eth0", node=node)
    assert elements(node, "inet", "cni_portmap") == b_only, "records included"
    # GC of A with nothing valid: B untouched still
    gc(exe, confs["pa0"], node, [])
    assert elements(node, "inet", "cni_portmap") == b_only
    t = nft_table(node, "inet", "cni_portmap")
    assert any(name.startswith("dnat_") for name in t.chains)
    for cid in ("pb0", "pb1", "pa2"):
        run_plugin(exe, "DEL", confs[cid], container_id=cid, netns=PM_SANDBOX,
                   ifname=pods[cid][3], node=node)
    assert elements(node, "inet", "cni_portmap") == set()


# --- tuning ---------------------------------------------------------------------------


def tu_conf(name: str, data: str, pod: TestNetNS, ifname: str, mtu: int) -> dict:
    return {"cniVersion": "1.1.0", "name": name, "type": "tuning", "dataDir": data, "mtu": mtu,
            "prevResult": {"cniVersion": "1.1.0",
                           "interfaces": [{"name": ifname, "sandbox": pod.path}],
                           "ips": [{"address": "10.80.0.5/24", "interface": 0}]}}


def link_mtu(ns: TestNetNS, name: str) -> int:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        link = netlink.find_link(ipr, name)
    assert link is not None
    return link.mtu


def test_tuning_gc_and_del_of_one_network_leave_the_other_intact(
        cni_bin, node_netns, netns_factory, tmp_path):
    exe = os.path.join(cni_bin, "tuning")
    node = node_netns
    data = str(tmp_path / "tuning")
    pod1, pod2 = netns_factory("cnsk-tupod"), netns_factory("cnsk-tupod")
    with NetNS.open(node.path) as n, n.iproute() as ipr:
        for i, (pod, ifname) in enumerate([(pod1, "eth0"), (pod1, "net1"), (pod2, "eth0")]):
            with NetNS.open(pod.path) as p:
                netlink.create_veth_pair(ipr, f"vhtu{i}", ifname, p)
    # t1: eth0 in network A, net1 in network B; t2: eth0 in A
    attachments = [("t1", pod1, "eth0", "tuneta", 1400), ("t1", pod1, "net1", "tunetb", 1300),
                   ("t2", pod2, "eth0", "tuneta", 1400)]
    confs = {}
    for cid, pod, ifname, net, mtu in attachments:
        confs[(cid, ifname)] = tu_conf(net, data, pod, ifname, mtu)
        run_plugin(exe, "ADD", confs[(cid, ifname)], container_id=cid, netns=pod.path,
                   ifname=ifname, node=node)
    # a saved file of the Go plugin (no network key): nobody's GC may judge it
    go_file = {"mtu": 1500}
    with open(os.path.join(data, "t3_eth0.json"), "w") as fp:
        json.dump(go_file, fp)
    b_file = files(data)["t1_net1.json"]

    gc(exe, confs[("t1", "eth0")], node, [("t1", "eth0")])
    assert sorted(files(data)) == ["t1_eth0.json", "t1_net1.json", "t3_eth0.json"]
    assert files(data)["t1_net1.json"] == b_file
    run_plugin(exe, "DEL", confs[("t1", "eth0")], container_id="t1", netns=pod1.path,
               ifname="eth0", node=node)
    assert files(data) == {"t1_net1.json": b_file, "t3_eth0.json": json.dumps(go_file).encode()}
    assert link_mtu(pod1, "eth0") == 1500 and link_mtu(pod1, "net1") == 1300
    gc(exe, confs[("t1", "eth0")], node, [])
    assert sorted(files(data)) == ["t1_net1.json", "t3_eth0.json"]
    run_plugin(exe, "DEL", confs[("t1", "net1")], container_id="t1", netns=pod1.path,
               ifname="net1", node=node)
    assert link_mtu(pod1, "net1") == 1500
    assert sorted(files(data)) == ["t3_eth0.json"]


# --- host-local -----------------------------------------------------------------------


def hl_conf(name: str, data: str) -> dict:
    # The same two ranges in both networks: allocations are per network.
    return {"cniVersion": "1.1.0", "name": name, "type": "host-local",
            "ipam": {"type": "host-local", "dataDir": data,
                     "ranges": [[{"subnet": "10.81.0.0/24"}], [{"subnet": "10.82.0.0/24"}]]}}


def test_host_local_gc_and_del_of_one_network_leave_the_other_intact(
        cni_bin, node_netns, tmp_path):
    exe = os.path.join(cni_bin, "host-local")
    node = node_netns
    data = str(tmp_path / "ipam")
    a, b = hl_conf("hlneta", data), hl_conf("hlnetb", data)
    for cid, ifname, conf in [("h1", "eth0", a), ("h2", "eth0", a),
                              ("h1", "net1", b), ("h3", "eth0", b)]:
        run_plugin(exe, "ADD", conf, container_id=cid, netns="/run/netns/cnsk-hl-unused",
                   ifname=ifname, node=node)
    # an allocation written by an old Go host-local: the container ID alone
    with open(os.path.join(data, "hlnetb", "10.81.0.200"), "w") as fp:
        fp.write("h2")
    b_files = files(os.path.join(data, "hlnetb"))
    assert len(b_files) == 5
    assert len(files(os.path.join(data, "hlneta"))) == 4

    gc(exe, a, node, [("h1", "eth0")])
    assert files(os.path.join(data, "hlnetb")) == b_files
    assert sorted(files(os.path.join(data, "hlneta")).values()) == [b"h1\r\neth0"] * 2
    run_plugin(exe, "DEL", a, container_id="h1", netns="", ifname="eth0", node=node)
    assert files(os.path.join(data, "hlneta")) == {}
    assert files(os.path.join(data, "hlnetb")) == b_files
    # a DEL in A of the container that B's old file names: B's file stays
    run_plugin(exe, "DEL", a, container_id="h2", netns="", ifname="eth0", node=node)
    gc(exe, a, node, [])
    assert files(os.path.join(data, "hlnetb")) == b_files
