"""firewall through the real executable, chained after our bridge (which
makes the pod and, with host-local, its address), beside Debian's Go
firewall 1.1.1 on an identical pod: the same result and chains; the pod's
traffic through a node whose iptables FORWARD policy is DROP and through a
node whose own nftables forward chain drops; same-bridge isolation between
two bridges; CHECK, DEL twice, a Go-made pod's DEL, GC, a failed ADD
leaving nothing, bad input. Every test runs in both modes (`cni_bin`).
The iptables rules are read back from the kernel through libnftables
(iptables-nft writes nftables tables), the ipsets through netlink.
The firewalld backend runs against Debian's firewalld started by the test
on a private bus in the node namespace (tests/firewalld_node.py; the
backend's own calls: tests/test_firewalld.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
from cni_skel_plugins.firewall import owner
from cni_skel_plugins.firewall.firewalld import Firewalld
from firewalld_node import firewalld_in, missing_tools
from podlink_common import call, call_raw, check_fails, host_local, make_lan
from yardsticks import as_go

from cni_skel import CNIError, netlink
from cni_skel.harness import TestNetNS, tcp_echo
from cni_skel.ipset import IPSets
from cni_skel.iptables import IPTables
from cni_skel.netns import NetNS
from cni_skel.nft import Nft

NET = "fwnet"
SUBNET, GW = "10.73.0.0/24", "10.73.0.1"
LAN_IP, NODE_LAN_IP = "10.74.0.1", "10.74.0.254"
SET4 = "CNI-FW-POD4"


@pytest.fixture(scope="session")
def firewall(cni_bin: str) -> str:
    return os.path.join(cni_bin, "firewall")


@pytest.fixture(scope="session")
def bridge(cni_bin: str) -> str:
    return os.path.join(cni_bin, "bridge")


def sh(ns: TestNetNS, *argv: str) -> subprocess.CompletedProcess:
    """A command in ``ns`` (test set-up only: iptables policies, nft text)."""
    return subprocess.run(["ip", "netns", "exec", ns.name, *argv], capture_output=True,
                          text=True, timeout=30, check=True)


def in_ns(ns: TestNetNS, fn, *args):
    with NetNS.open(ns.path) as n:
        return n.run(fn, *args)


def ipset_entries(ns: TestNetNS, name: str = SET4) -> dict[str, str | None]:
    def read() -> dict[str, str | None]:
        with IPSets() as s:
            return {str(e.address): e.comment for e in s.entries(name)}
    return in_ns(ns, read)


def jumps(ns: TestNetNS, family: str = "ip", table: str = "filter") -> dict[str, list[str]]:
    """Chain -> the chains its rules jump to, in order, as the kernel holds
    them (iptables-nft's table read with libnftables)."""
    def read() -> dict[str, list[str]]:
        listing = Nft().table(family, table)
        if listing is None:
            return {}
        out: dict[str, list[str]] = {name: [] for name in listing.chains}
        for rule in listing.rules:
            for e in rule["expr"]:
                if "jump" in e:
                    out[rule["chain"]].append(e["jump"]["target"])
        return out
    return in_ns(ns, read)


def rule_count(ns: TestNetNS, chain: str, family: str = "ip", table: str = "filter") -> int:
    def read() -> int:
        listing = Nft().table(family, table)
        return len(listing.chain_rules(chain)) if listing else 0
    return in_ns(ns, read)


class Node:
    """A node namespace with our bridge's pods on 10.73.0.0/24 and a LAN
    namespace behind its ``eth0`` (10.74.0.1, the node 10.74.0.254)."""

    def __init__(self, netns_factory, bridge: str, data_dir, brname: str = "cni-fw0",
                 subnet: str = SUBNET, node: TestNetNS | None = None) -> None:
        lan = make_lan(netns_factory, lan_ips=(f"{LAN_IP}/24",), default_route=LAN_IP,
                       node=node)
        self.node, self.lan = lan.node, lan.lan
        with NetNS.open(self.lan.path) as n, n.rtnl() as ipr:
            netlink.add_route(ipr, "10.73.0.0/16", gw=NODE_LAN_IP)
        self.bridge, self.data_dir, self.brname, self.subnet = bridge, data_dir, brname, subnet

    def bridge_conf(self, version: str = "1.0.0") -> dict:
        return {"cniVersion": version, "name": NET, "type": "bridge", "bridge": self.brname,
                "isGateway": True, "ipam": host_local(self.data_dir, self.subnet,
                                                      routes=[{"dst": "0.0.0.0/0"}])}

    def pod(self, netns_factory, cid: str = "c1") -> tuple[TestNetNS, dict]:
        pod = netns_factory("cnsk-pod")
        return pod, call(self.bridge, "ADD", self.bridge_conf(), self.node, pod, cid=cid)

    def reaches_lan(self, pod: TestNetNS) -> bool:
        try:
            return tcp_echo(self.lan, LAN_IP, pod, timeout=1.0)[0] == b"cni-skel"
        except OSError:
            return False


def fw_conf(prev: dict | None, version: str = "1.0.0", name: str = NET, **extra) -> dict:
    conf = {"cniVersion": version, "name": name, "type": "firewall", **extra}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def pod_ip(prev: dict) -> str:
    return prev["ips"][0]["address"].split("/")[0]


def test_forward_drop_policy_lets_the_pod_through_as_go(firewall, go_yardstick, bridge,
                                                        netns_factory, tmp_path):
    """iptables FORWARD policy DROP (as Docker sets it): the pod reaches
    the LAN only once firewall ran, for ours and for Go's on an identical
    node; both write the same chains and jumps, ours puts the pod in an
    ipset owned by its attachment where Go writes two rules per pod."""
    seen = {}
    for who, exe in (("ours", firewall), ("go", go_yardstick.exe("firewall"))):
        n = Node(netns_factory, bridge, tmp_path / who)
        sh(n.node, "iptables", "-P", "FORWARD", "DROP")
        pod, prev = n.pod(netns_factory)
        assert not n.reaches_lan(pod)
        conf = fw_conf(prev, backend="iptables", dataDir=str(tmp_path / f"fw-{who}"))
        assert call(exe, "ADD", conf, n.node, pod) == \
            (prev if who == "ours" else as_go(go_yardstick, "firewall", prev))
        assert n.reaches_lan(pod)
        seen[who] = (jumps(n.node), n, pod, conf, prev)
    ours, go = seen["ours"][0], seen["go"][0]
    assert ours["FORWARD"][0] == go["FORWARD"][0] == "CNI-FORWARD"
    assert ours["CNI-FORWARD"] == go["CNI-FORWARD"] == ["CNI-ADMIN"]
    assert "CNI-ADMIN" in ours and "CNI-ADMIN" in go
    o_node, g_node = seen["ours"][1].node, seen["go"][1].node
    assert rule_count(o_node, "CNI-FORWARD") == 3  # admin jump + two set rules
    assert rule_count(g_node, "CNI-FORWARD") == 3  # admin jump + two rules of the pod
    ip = pod_ip(seen["ours"][4])
    assert ipset_entries(o_node) == {ip: owner(NET, "c1", "eth0")}
    # CHECK passes for both, DEL twice for both: the pod is cut off again
    for who, exe in (("ours", firewall), ("go", go_yardstick.exe("firewall"))):
        _, n, pod, conf, _ = seen[who]
        call(exe, "CHECK", conf, n.node, pod)
        for _ in range(2):
            assert call(exe, "DEL", conf, n.node, pod) is None
        assert not n.reaches_lan(pod)
    assert ipset_entries(o_node) == {}
    assert rule_count(g_node, "CNI-FORWARD") == 1


def test_a_second_pod_costs_one_set_entry(firewall, bridge, netns_factory, tmp_path):
    n = Node(netns_factory, bridge, tmp_path)
    sh(n.node, "iptables", "-P", "FORWARD", "DROP")
    pods = [n.pod(netns_factory, cid) for cid in ("c1", "c2")]
    for cid, (pod, prev) in zip(("c1", "c2"), pods, strict=True):
        call(firewall, "ADD", fw_conf(prev, dataDir=str(tmp_path / "fw")), n.node, pod, cid=cid)
    assert rule_count(n.node, "CNI-FORWARD") == 3
    assert rule_count(n.node, "FORWARD") == 1
    assert ipset_entries(n.node) == {pod_ip(prev): owner(NET, cid, "eth0")
                                     for cid, (_, prev) in zip(("c1", "c2"), pods, strict=True)}
    assert all(n.reaches_lan(pod) for pod, _ in pods)
    # one pod's DEL leaves the other let through
    call(firewall, "DEL", fw_conf(pods[0][1], dataDir=str(tmp_path / "fw")), n.node,
         pods[0][0], cid="c1")
    assert not n.reaches_lan(pods[0][0]) and n.reaches_lan(pods[1][0])


def test_a_flushed_filter_is_written_again_by_the_next_add(firewall, bridge, netns_factory,
                                                            tmp_path):
    """Docker restarting, or an operator's ``iptables -F``, empties the
    chains: CHECK says what is missing, and the next ADD writes them again
    (each ADD checks, as Go's); the set kept every pod."""
    n = Node(netns_factory, bridge, tmp_path)
    sh(n.node, "iptables", "-P", "FORWARD", "DROP")
    (p1, r1), (p2, r2) = n.pod(netns_factory, "c1"), n.pod(netns_factory, "c2")
    fw_dir = str(tmp_path / "fw")
    call(firewall, "ADD", fw_conf(r1, dataDir=fw_dir), n.node, p1)
    sh(n.node, "iptables", "-F", "FORWARD")
    sh(n.node, "iptables", "-F", "CNI-FORWARD")
    assert not n.reaches_lan(p1)
    check_fails(firewall, fw_conf(r1, dataDir=fw_dir), n.node, p1, "FORWARD rule", "not found")
    call(firewall, "ADD", fw_conf(r2, dataDir=fw_dir), n.node, p2, cid="c2")
    assert n.reaches_lan(p1) and n.reaches_lan(p2)
    assert rule_count(n.node, "CNI-FORWARD") == 3
    call(firewall, "CHECK", fw_conf(r1, dataDir=fw_dir), n.node, p1)


def test_our_del_removes_go_rules_of_a_go_made_pod(firewall, go_yardstick, bridge, netns_factory,
                                                   tmp_path):
    """A node moving from Go's firewall to ours: Go's ADD, our DEL (no
    record of ours): Go's two rules for the pod are gone."""
    n = Node(netns_factory, bridge, tmp_path)
    sh(n.node, "iptables", "-P", "FORWARD", "DROP")
    pod, prev = n.pod(netns_factory)
    conf = fw_conf(prev, backend="iptables", dataDir=str(tmp_path / "fw"))
    call(go_yardstick.exe("firewall"), "ADD", conf, n.node, pod)
    assert rule_count(n.node, "CNI-FORWARD") == 3
    call(firewall, "CHECK", conf, n.node, pod)  # Go's rules count for the pod
    assert call(firewall, "DEL", conf, n.node, pod) is None
    assert rule_count(n.node, "CNI-FORWARD") == 1
    assert not n.reaches_lan(pod)


def test_native_nftables_drop_chain(firewall, bridge, netns_factory, tmp_path):
    """A node filtering in nftables only (its own inet table, forward
    policy drop; no iptables rules): without a backend the pod is let
    through by an accept inside that chain's table; DEL takes it out."""
    n = Node(netns_factory, bridge, tmp_path)
    sh(n.node, "nft", "add table inet nodefw; add chain inet nodefw forward "
       "{ type filter hook forward priority 0; policy drop; }; "
       "add rule inet nodefw forward ip daddr 10.74.0.99 accept")
    pod, prev = n.pod(netns_factory)
    assert not n.reaches_lan(pod)
    conf = fw_conf(prev, dataDir=str(tmp_path / "fw"))
    call(firewall, "ADD", conf, n.node, pod)
    assert n.reaches_lan(pod)
    assert jumps(n.node, "inet", "nodefw")["forward"] == ["cni_firewall"]
    call(firewall, "CHECK", conf, n.node, pod)
    for _ in range(2):
        call(firewall, "DEL", conf, n.node, pod)
    assert not n.reaches_lan(pod)
    check_fails(firewall, conf, n.node, pod, "is not in set cni_firewall_pods4")


def nft_set(ns: TestNetNS, table: str, name: str = "cni_firewall_pods4") -> list[str]:
    """The addresses in set ``name`` of inet ``table``."""
    def read() -> list[str]:
        listing = Nft().table("inet", table)
        return sorted(value for value, _ in listing.elements(name)) if listing else []
    return in_ns(ns, read)


def test_two_drop_chains_take_the_pod_in_one_transaction(firewall, bridge, netns_factory,
                                                         tmp_path):
    """Two nftables tables drop forwarded traffic; the second one's pod set
    is full (size 1, taken): the ADD fails and the first table, written
    before it, holds no element of the pod either (one transaction for
    both). With room in both, ADD lets the pod through both and DEL takes
    it out of both."""
    n = Node(netns_factory, bridge, tmp_path)
    for t in ("nodefw_a", "nodefw_b"):
        sh(n.node, "nft", f"add table inet {t}; add chain inet {t} forward "
           "{ type filter hook forward priority 0; policy drop; }")
    sh(n.node, "nft", "add set inet nodefw_b cni_firewall_pods4 "
       "{ type ipv4_addr; size 1; elements = { 10.73.0.250 } }")
    pod, prev = n.pod(netns_factory)
    conf = fw_conf(prev, dataDir=str(tmp_path / "fw"))
    run = call_raw(firewall, "ADD", conf, n.node, pod)
    assert run.exit_code != 0, run.doc
    assert nft_set(n.node, "nodefw_a") == [] and nft_set(n.node, "nodefw_b") == ["10.73.0.250"]
    assert not n.reaches_lan(pod)

    sh(n.node, "nft", "flush set inet nodefw_b cni_firewall_pods4")
    call(firewall, "ADD", conf, n.node, pod)
    assert nft_set(n.node, "nodefw_a") == nft_set(n.node, "nodefw_b") == [pod_ip(prev)]
    assert n.reaches_lan(pod)
    for _ in range(2):
        call(firewall, "DEL", conf, n.node, pod)
    assert nft_set(n.node, "nodefw_a") == nft_set(n.node, "nodefw_b") == []
    assert not n.reaches_lan(pod)


def test_same_bridge_policy_isolates_bridges_as_go(firewall, go_yardstick, bridge, netns_factory,
                                                   tmp_path):
    """ingressPolicy same-bridge on two bridges of one node: a pod of one
    does not reach a pod of the other; the chains are Go's (its ADD on an
    identical node writes the same jumps)."""
    for who, exe in (("ours", firewall), ("go", go_yardstick.exe("firewall"))):
        node = netns_factory("cnsk-node")
        a = Node(netns_factory, bridge, tmp_path / who / "a", "cni-fwa", "10.73.1.0/24", node)
        b_node = Node.__new__(Node)
        b_node.node, b_node.lan = node, a.lan
        b_node.bridge, b_node.data_dir = bridge, tmp_path / who / "b"
        b_node.brname, b_node.subnet = "cni-fwb", "10.73.2.0/24"
        pa, ra = a.pod(netns_factory, "ca")
        pb, rb = b_node.pod(netns_factory, "cb")
        ip_b = pod_ip(rb)
        assert tcp_echo(pb, ip_b, pa, timeout=2.0)[0] == b"cni-skel"  # open before
        for cid, pod, prev in (("ca", pa, ra), ("cb", pb, rb)):
            call(exe, "ADD", fw_conf(prev, backend="iptables", ingressPolicy="same-bridge",
                                     dataDir=str(tmp_path / who / "fw")), node, pod, cid=cid)
        with pytest.raises(OSError):
            tcp_echo(pb, ip_b, pa, timeout=1.0)
        j = jumps(node)
        assert j["FORWARD"][:2] == ["CNI-ISOLATION-STAGE-1", "CNI-FORWARD"], who
        assert j["CNI-ISOLATION-STAGE-1"] == ["CNI-ISOLATION-STAGE-2"] * 2, who
        assert rule_count(node, "CNI-ISOLATION-STAGE-2") == 3, who  # two drops, a return


def test_gc_removes_what_attachments_gone_had(firewall, bridge, netns_factory, tmp_path):
    n = Node(netns_factory, bridge, tmp_path)
    fw_dir = str(tmp_path / "fw")
    pods = {cid: n.pod(netns_factory, cid) for cid in ("c1", "c2")}
    for cid, (pod, prev) in pods.items():
        call(firewall, "ADD", fw_conf(prev, dataDir=fw_dir), n.node, pod, cid=cid)
    # another network's pod in the same set stays whatever this GC keeps
    other_prev = dict(pods["c1"][1], ips=[{"address": "10.73.9.9/24", "gateway": GW}])
    call(firewall, "ADD", fw_conf(other_prev, name="other", dataDir=fw_dir), n.node,
         pods["c1"][0], cid="o1")
    gc = fw_conf(None, version="1.1.0", dataDir=fw_dir,
                 **{"cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "eth0"}]})
    call(firewall, "GC", gc, n.node, None)
    assert set(ipset_entries(n.node)) == {pod_ip(pods["c2"][1]), "10.73.9.9"}
    assert sorted(os.listdir(fw_dir)) == ["c2_eth0.json", "o1_eth0.json"]


def test_failed_add_leaves_nothing(firewall, bridge, netns_factory, tmp_path):
    """The record can not be written (dataDir is a file): code 5, and the
    pod's set entry is taken out again."""
    n = Node(netns_factory, bridge, tmp_path)
    pod, prev = n.pod(netns_factory)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run = call_raw(firewall, "ADD", fw_conf(prev, backend="iptables", dataDir=str(blocker)),
                   n.node, pod)
    assert run.exit_code != 0 and run.doc["code"] == 5, run.doc
    assert ipset_entries(n.node) == {}


@pytest.mark.parametrize("extra, code, words", [
    ({"backend": "ipchains"}, 7, "backend"),
    ({"ingressPolicy": "closed"}, 7, "ingressPolicy"),
    ({"iptablesAdminChainName": "bad name"}, 7, "iptablesAdminChainName"),
    ({"firewalldZone": 5}, 7, "firewalldZone"),
])
def test_bad_config_is_refused_before_any_change(firewall, bridge, netns_factory, tmp_path,
                                                  extra, code, words):
    n = Node(netns_factory, bridge, tmp_path)
    pod, prev = n.pod(netns_factory)
    run = call_raw(firewall, "ADD", fw_conf(prev, dataDir=str(tmp_path / "fw"), **extra),
                   n.node, pod)
    assert run.exit_code != 0 and run.doc["code"] == code, run.doc
    assert words in run.doc["msg"] + run.doc.get("details", "")
    assert jumps(n.node) == {} and ipset_entries(n.node) == {}


def test_missing_prev_result_and_old_versions(firewall, bridge, netns_factory, tmp_path):
    n = Node(netns_factory, bridge, tmp_path)
    pod, prev = n.pod(netns_factory)
    with pytest.raises(CNIError) as e:
        call(firewall, "ADD", fw_conf(None), n.node, pod)
    assert e.value.code == 7 and "prevResult" in e.value.msg
    # same-bridge needs prevResult's interfaces (Go's message)
    with pytest.raises(CNIError) as e:
        call(firewall, "ADD", fw_conf(dict(prev, interfaces=[]), ingressPolicy="same-bridge"),
             n.node, pod)
    assert e.value.code == 7 and "chain" in e.value.msg
    # ... and one a link can have: it goes into iptables rules
    for name in ("x" * 200_000, "br 0", "br%d"):
        with pytest.raises(CNIError) as e:
            call(firewall, "ADD", fw_conf(dict(prev, interfaces=[{"name": name}]),
                                          ingressPolicy="isolated"), n.node, pod)
        assert e.value.code == 7 and "interfaces[0].name" in e.value.msg
    # Go's firewall speaks 0.4.0 and later only
    with pytest.raises(CNIError) as e:
        call(firewall, "ADD", fw_conf(prev, version="0.3.1"), n.node, pod)
    assert e.value.code == 1
    assert jumps(n.node) == {}


def test_firewalld_backend_as_go(firewall, go_yardstick, bridge, netns_factory, tmp_path):
    """firewalld (Debian's, on a private bus in the node namespace) rejects
    forwarding from the default zone: the pod reaches the LAN once its
    address is a source of the trusted zone. Ours and Go's, chosen by
    ``backend`` and found running without one; CHECK, DEL (ours undoes its
    record, and Go's ADD is undone by our DEL from prevResult), GC."""
    if missing := missing_tools():
        pytest.fail(f"{', '.join(missing)} missing: `make deps` installs Debian's firewalld")
    n = Node(netns_factory, bridge, tmp_path)
    with firewalld_in(n.node.name, tmp_path / "firewalld") as fwd_node:
        env = fwd_node.env()
        pods = {cid: n.pod(netns_factory, cid) for cid in ("c1", "c2", "c3")}
        assert not n.reaches_lan(pods["c1"][0])
        fw_dir = str(tmp_path / "fw")

        def conf(cid: str, **extra) -> dict:
            return fw_conf(pods[cid][1], dataDir=fw_dir, **extra)

        def sources() -> set[str]:
            with Firewalld(fwd_node.bus_address) as fwd:
                return set(fwd.sources("trusted"))

        call(firewall, "ADD", conf("c1", backend="firewalld"), n.node, pods["c1"][0], env=env)
        call(firewall, "ADD", conf("c2"), n.node, pods["c2"][0], cid="c2", env=env)
        call(go_yardstick.exe("firewall"), "ADD", conf("c3"), n.node, pods["c3"][0], cid="c3",
             env=env)
        ips = {cid: pod_ip(prev) for cid, (_, prev) in pods.items()}
        assert sources() == {f"{ip}/32" for ip in ips.values()}
        assert n.reaches_lan(pods["c1"][0])
        assert ipset_entries(n.node) == {} and jumps(n.node) == {}  # firewalld only
        call(firewall, "CHECK", conf("c1"), n.node, pods["c1"][0], env=env)
        # our DEL: c1 from its record, c3 (Go-made, no record) from prevResult
        for cid in ("c1", "c3"):
            for _ in range(2):
                call(firewall, "DEL", conf(cid), n.node, pods[cid][0], cid=cid, env=env)
        assert sources() == {f"{ips['c2']}/32"}
        assert not n.reaches_lan(pods["c1"][0])
        check_fails(firewall, conf("c1"), n.node, pods["c1"][0], "failed to find the address",
                    env=env)
        # GC of the network keeping nothing: c2's source goes with its record
        gc = fw_conf(None, version="1.1.0", dataDir=fw_dir, **{"cni.dev/valid-attachments": []})
        call(firewall, "GC", gc, n.node, None, env=env)
        assert sources() == set() and os.listdir(fw_dir) == []
        call(firewall, "ADD", conf("c1", backend="firewalld"), n.node, pods["c1"][0], env=env)
    # firewalld stopped (its runtime sources gone with it): DEL still succeeds
    call(firewall, "DEL", conf("c1", backend="firewalld"), n.node, pods["c1"][0], env=env)
    assert os.listdir(fw_dir) == []


def test_iptables_that_can_not_run_is_a_cni_error(netns_factory):
    """An argument list the kernel will not exec (E2BIG) is code 999 naming
    the tool, not an OSError out of the plugin."""
    with pytest.raises(CNIError) as e:
        in_ns(netns_factory("cnsk-node"), IPTables(4).exists, "FORWARD",
              ["-s", "x" * 300_000, "-j", "ACCEPT"])
    assert e.value.code == 999 and "iptables could not be run" in e.value.msg
