"""portmap's ``backend: "iptables"`` and Go's portmap state (issue 49),
against each Go yardstick (tests/yardsticks.py).

* ours writes exactly Go's layout: side by side (same network, container
  ID, pod addresses and config, each in its own node namespace) ``iptables
  -t nat -S`` and ``ip6tables -t nat -S`` are equal line for line, for
  plain mappings, ``masqAll``, ``markMasqBit``, ``externalSetMarkChain``,
  iptables conditions, ``snat: false`` and more than 15 ports of a protocol;
* the host ports answer from outside and from the node, and stop after DEL;
* Go's CHECK and DEL take our pods, ours take Go's (also a config without
  ``backend``: our nftables backend recognises Go's pods);
* Go 1.9.1's nftables backend (``ip``/``ip6 cni_hostport``): our CHECK
  passes on its pods, our DEL removes exactly the container's rules;
* GC removes the chains of containers left out; a failed ADD leaves
  nothing (the IPv6 half refused after the IPv4 half was written).

What the kernel holds is read with ``iptables -S`` (the text Go's
go-iptables writes and compares) and libnftables JSON.
"""

from __future__ import annotations

import difflib
import subprocess

import pytest
import yardsticks
from cni_skel_plugins.portmap import goiptables as G
from test_gomasq import nat
from test_portmap import (  # noqa: F401  (bridge_exe, net, portmap: fixtures)
    CLIENT4,
    NODE4,
    NODE6,
    Echo,
    Net,
    bridge_exe,
    mapping,
    net,
    pm_conf,
    portmap,
    talk,
    unreachable,
)

from cni_skel.errors import CNIError
from cni_skel.harness import nft_table, run_plugin
from cni_skel.netns import NetNS

CID = "pm-go-c1"


def sh(node, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", node.name, *argv], check=True, timeout=30,
                   capture_output=True)


def pod_chains(node, cid: str = CID) -> list[str]:
    """Lines of ``nat`` naming the container's DNAT chain (its rules and jumps)."""
    chain = G.dnat_chain("pmnet", cid)
    return [ln for v in (4, 6) for ln in nat(node)[v] if chain in ln]


def pm(exe, verb, c, node, pod, cid=CID, **kw):
    return run_plugin(exe, verb, c, container_id=cid, netns=pod.ns.path if pod else "",
                      ifname="eth0", node=node, **kw)


MAPPINGS = [mapping(8080, 80), mapping(8053, 53, "udp"), mapping(9090, 90, host_ip=NODE4),
            mapping(9091, 91, host_ip=NODE6), mapping(9092, 92, host_ip="0.0.0.0")]
MANY = [mapping(10000 + i, 80) for i in range(17)]  # multiport takes 15 a rule

VARIANTS = {
    "plain": ({}, MAPPINGS),
    "masqAll": ({"masqAll": True}, MAPPINGS),
    "markMasqBit": ({"markMasqBit": 5}, MAPPINGS),
    "externalSetMarkChain": ({"externalSetMarkChain": "KUBE-MARK-MASQ"}, MAPPINGS),
    "conditions": ({"conditionsV4": ["-s", "10.99.0.0/24"],
                    "conditionsV6": ["!", "-s", "fd00:98::/64"]}, MAPPINGS),
    "no-snat": ({"snat": False}, MAPPINGS),
    "many-ports": ({}, MANY),
    "repeated": ({}, [mapping(8080, 80), mapping(8080, 80)]),  # Go's rules go in once
}


def checks_dual_stack(y: yardsticks.Yardstick) -> bool:
    """Go 1.1.1's portmap CHECK looks for a pod's IPv4 rules in ip6tables
    too, so it fails on its own dual-stack pods; 1.9.1 checks each address
    in its own IP version."""
    return y.version != "1.1.1"


def go_node(factory):
    node = factory("cnsk-pmnode")
    sh(node, "ip", "link", "set", "lo", "up")
    return node


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_layout_equals_go(variant, portmap, bridge_exe, cni_bin, go_yardstick,  # noqa: F811
                          netns_factory, tmp_path):
    """Same config, same pod address: the nat tables of ours and of Go
    equal line for line; each CHECK passes; each DEL removes the pod's
    chain and jumps, and Go's shared chains stay (as Go leaves them)."""
    top, mappings = VARIANTS[variant]
    y = go_yardstick
    if "masqAll" in top and not yardsticks.differs(y, "portmap", "masqAll"):
        y = yardsticks.LATEST  # a Go that reads the key
    seen = {}
    for who, exe in (("ours", portmap), ("go", y.exe("portmap"))):
        node = go_node(netns_factory)
        if "externalSetMarkChain" in top:
            for tool in ("iptables", "ip6tables"):
                sh(node, tool, "-t", "nat", "-N", "KUBE-MARK-MASQ")
        pod = Net(node, None, netns_factory, tmp_path / who, bridge_exe, cni_bin).pod(CID)
        c = pm_conf(pod.result, mappings, backend="iptables", **top)
        pm(exe, "ADD", c, node, pod)
        seen[who] = nat(node)
        if who == "ours" or checks_dual_stack(y):
            pm(exe, "CHECK", c, node, pod)
        pm(exe, "DEL", c, node, pod)
        assert pod_chains(node) == [], who
        assert any(G.DNAT_CHAIN in ln for ln in nat(node)[4]), who
    for v in (4, 6):
        diff = list(difflib.unified_diff(seen["go"][v], seen["ours"][v], "go", "ours",
                                         lineterm=""))
        assert not diff, "\n".join(diff)
    chain = G.dnat_chain("pmnet", CID)
    assert f"-N {chain}" in seen["ours"][4] and f"-N {chain}" in seen["ours"][6]


def test_host_ports_answer_and_stop_after_del(portmap, net):  # noqa: F811
    """Traffic through Go's layout written by ours: from another host over
    IPv4 and IPv6, from the node itself (127.0.0.1: route_localnet and the
    localhost mark), to the hostIP mapping; nothing after DEL."""
    pod = net.pod(CID)
    c = pm_conf(pod.result, [mapping(8080, 80), mapping(9090, 90, host_ip=NODE4)],
                backend="iptables")
    with Echo(pod.ns, 80), Echo(pod.ns, 90):
        pm(portmap, "ADD", c, net.node, pod)
        assert talk(net.client, NODE4, 8080) == CLIENT4
        assert talk(net.client, NODE6, 8080)
        assert talk(net.node, "127.0.0.1", 8080)
        assert talk(net.client, NODE4, 9090) == CLIENT4
        assert unreachable(net.client, NODE6, 9090)
        pm(portmap, "CHECK", c, net.node, pod)
        pm(portmap, "DEL", c, net.node, pod)
        assert unreachable(net.client, NODE4, 8080)
        pm(portmap, "DEL", c, net.node, pod)  # again: nothing left, no error
    assert pod_chains(net.node) == []
    assert nft_table(net.node, "inet", "cni_portmap") is None


@pytest.mark.parametrize("backend", ["iptables", None])
def test_go_and_ours_take_each_others_pods(backend, portmap, net, go_yardstick):  # noqa: F811
    """A pod Go mapped and one ours mapped, on one node: CHECK of each
    passes on the other's (ours also with no ``backend``, which is our
    nftables backend: it recognises Go's pod), each DEL removes the other's
    chain and leaves the other pod's alone."""
    go = go_yardstick.exe("portmap")
    go_pod, our_pod = net.pod("pm-go"), net.pod("pm-ours")
    go_c = pm_conf(go_pod.result, [mapping(8080, 80)])
    our_c = pm_conf(our_pod.result, [mapping(8081, 80)], backend="iptables")
    ours_on_go = go_c if backend is None else {**go_c, "backend": backend}
    pm(go, "ADD", go_c, net.node, go_pod, "pm-go")
    pm(portmap, "ADD", our_c, net.node, our_pod, "pm-ours")
    with Echo(go_pod.ns, 80), Echo(our_pod.ns, 80):
        assert talk(net.client, NODE4, 8080) and talk(net.client, NODE4, 8081)
    pm(portmap, "CHECK", ours_on_go, net.node, go_pod, "pm-go")
    if checks_dual_stack(go_yardstick):
        pm(go, "CHECK", our_c, net.node, our_pod, "pm-ours")
    pm(portmap, "DEL", ours_on_go, net.node, go_pod, "pm-go")
    assert pod_chains(net.node, "pm-go") == [] and pod_chains(net.node, "pm-ours")
    pm(go, "DEL", our_c, net.node, our_pod, "pm-ours")
    assert pod_chains(net.node, "pm-ours") == []


def test_check_names_the_missing_rule(portmap, net):  # noqa: F811
    """CHECK fails (999) once a DNAT rule of the pod is gone, naming it."""
    pod = net.pod(CID)
    c = pm_conf(pod.result, [mapping(8080, 80)], backend="iptables")
    pm(portmap, "ADD", c, net.node, pod)
    chain = G.dnat_chain("pmnet", CID)
    sh(net.node, "iptables", "-t", "nat", "-D", chain, "-p", "tcp", "--dport", "8080", "-j",
       "DNAT", "--to-destination", f"{pod.ip4}:80")
    with pytest.raises(CNIError) as ei:
        pm(portmap, "CHECK", c, net.node, pod)
    assert ei.value.code == 999 and "--to-destination" in ei.value.msg, ei.value
    pm(portmap, "DEL", c, net.node, pod)
    assert pod_chains(net.node) == []


def test_gc_removes_chains_of_containers_left_out(portmap, net):  # noqa: F811
    pods = [net.pod("pm-a"), net.pod("pm-b")]
    for i, pod in enumerate(pods):
        pm(portmap, "ADD", pm_conf(pod.result, [mapping(8080 + i, 80)], backend="iptables"),
           net.node, pod, pod.cid)
    keep = [{"containerID": "pm-a", "ifname": "eth0"}]
    gc = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap", "backend": "iptables",
          "cni.dev/valid-attachments": keep}
    run_plugin(portmap, "GC", gc, container_id="", netns="", ifname="", node=net.node)
    assert pod_chains(net.node, "pm-a") and pod_chains(net.node, "pm-b") == []


def test_failed_add_leaves_nothing(portmap, net):  # noqa: F811
    """``externalSetMarkChain`` that exists for IPv4 only: the IPv6 restore
    fails (iptables: no such target) after the IPv4 one was written; the
    error is 999 naming ip6tables-restore, and the IPv4 chain is gone."""
    sh(net.node, "iptables", "-t", "nat", "-N", "PM-MARK")
    pod = net.pod(CID)
    c = pm_conf(pod.result, [mapping(8080, 80)], backend="iptables",
                externalSetMarkChain="PM-MARK")
    with pytest.raises(CNIError) as ei:
        pm(portmap, "ADD", c, net.node, pod)
    assert ei.value.code == 999 and "ip6tables-restore" in ei.value.msg, ei.value
    assert pod_chains(net.node) == []


def test_go_nftables_pods_check_and_del(portmap, net):  # noqa: F811
    """Go 1.9.1 with ``backend: "nftables"``: rules in ``ip``/``ip6
    cni_hostport`` commented with the container ID. Our CHECK (no backend)
    passes on them; our DEL removes the container's rules and no other's;
    a missing rule fails our CHECK."""
    go = yardsticks.LATEST
    if not go.has("portmap"):
        pytest.fail(f"Go v{go.version} is missing in {go.dir}: run `make go-latest`")
    pods = [net.pod("pm-n1"), net.pod("pm-n2")]
    confs = [pm_conf(p.result, [mapping(8080 + i, 80)]) for i, p in enumerate(pods)]
    for p, c in zip(pods, confs, strict=True):
        pm(go.exe("portmap"), "ADD", {**c, "backend": "nftables"}, net.node, p, p.cid)

    def rules(cid: str) -> list[str]:
        with NetNS.open(net.node.path) as n:
            return [f"{r.family} {r.chain}" for r in n.run(G.nft_rules, cid)]

    # hostports and 2 masquerading (hairpin, localhost) for IPv4; hostports and 1 for IPv6
    assert len(rules("pm-n1")) == 5
    pm(portmap, "CHECK", confs[0], net.node, pods[0], "pm-n1")
    pm(portmap, "DEL", confs[0], net.node, pods[0], "pm-n1")
    assert rules("pm-n1") == [] and len(rules("pm-n2")) == 5
    sh(net.node, "nft", "flush", "chain", "ip", "cni_hostport", "hostports")
    with pytest.raises(CNIError) as ei:
        pm(portmap, "CHECK", confs[1], net.node, pods[1], "pm-n2")
    assert ei.value.code == 999
    pm(portmap, "DEL", confs[1], net.node, pods[1], "pm-n2")
    assert rules("pm-n2") == []


def test_backend_absent_with_iptables_keys_is_iptables(portmap, net):  # noqa: F811
    """A config written for Go's default (no ``backend``, iptables
    conditions): Go's layout, as Go 1.9.1 would write it."""
    pod = net.pod(CID)
    c = pm_conf(pod.result, [mapping(8080, 80)], conditionsV4=["-s", "10.99.0.0/24"])
    pm(portmap, "ADD", c, net.node, pod)
    assert any("-s 10.99.0.0/24" in ln for ln in pod_chains(net.node))
    assert nft_table(net.node, "inet", "cni_portmap") is None
    pm(portmap, "DEL", c, net.node, pod)
    assert pod_chains(net.node) == []

