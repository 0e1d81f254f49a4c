"""The chains people run, end to end on Debian's containerd (CRI, the
kubelet's path) and through `cni_skel.runtime` (libcni's role, what
podman and cnitool drive), every plugin ours, in both modes:

* podman's CNI default: bridge + host-local, portmap, firewall, tuning,
  on a node whose iptables FORWARD policy is DROP (as Docker leaves it);
* k3s's: flannel (delegating to bridge + host-local), portmap and
  bandwidth, the pod's rates from its bandwidth annotations.

Each pod serves HTTP; the test asserts on traffic and on what the kernel
holds (ipset entries, qdiscs), then that nothing is left after the pods go.
The node, containerd and pods: tests/test_containerd.py's.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from podlink_common import make_lan
from test_containerd import CLIENT_IP, NODE_IP, Pod, http_get, running_node

from cni_skel import netlink, tc
from cni_skel.harness import tcp_echo
from cni_skel.ipset import IPSets
from cni_skel.netns import NetNS
from cni_skel.runtime import Runtime, RuntimeConf

PODMAN_SUBNET = "10.88.0.0/16"
K3S_NETWORK, K3S_SUBNET = "10.42.0.0/16", "10.42.0.1/24"


def podman_default(d: str) -> dict:
    """podman 3's 87-podman-bridge.conflist, its paths moved under ``d``."""
    return {"cniVersion": "0.4.0", "name": "podman", "plugins": [
        {"type": "bridge", "bridge": "cni-podman0", "isGateway": True, "ipMasq": True,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "dataDir": os.path.join(d, "ipam"),
                  "routes": [{"dst": "0.0.0.0/0"}],
                  "ranges": [[{"subnet": PODMAN_SUBNET, "gateway": "10.88.0.1"}]]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "firewall", "dataDir": os.path.join(d, "firewall")},
        {"type": "tuning"},
    ]}


def k3s_default(d: str) -> dict:
    """k3s's 10-flannel.conflist, its paths moved under ``d``."""
    return {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [
        {"type": "flannel", "subnetFile": os.path.join(d, "subnet.env"),
         "dataDir": os.path.join(d, "flannel"),
         "ipam": {"dataDir": os.path.join(d, "ipam")},
         "delegate": {"hairpinMode": True, "forceAddress": True, "isDefaultGateway": True}},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    ]}


def sh(ns_path: str, *argv: str) -> None:
    subprocess.run(["nsenter", f"--net={ns_path}", *argv], check=True, capture_output=True,
                   timeout=30)


def pod_set_entries(ns_path: str) -> set[str]:
    with NetNS.open(ns_path) as ns, ns.enter(), IPSets() as s:
        return {str(e.address) for e in s.entries("CNI-FW-POD4")}


def veth_root_qdiscs(ns_path: str) -> list[tc.Qdisc]:
    with NetNS.open(ns_path) as ns, ns.rtnl() as ipr:
        return [q for link in netlink.links(ipr, "veth") for q in tc.qdiscs(ipr, link)
                if q.parent == tc.HANDLE_ROOT and q.kind == "tbf"]


def test_podman_default_chain_through_a_drop_policy(tmp_path, cni_mode, cni_worker_socket):
    d = str(tmp_path)
    with running_node(tmp_path, cni_mode, cni_worker_socket,
                      {"87-podman-bridge.conflist": podman_default(d)}) as node:
        sh(node.node_ns.path, "iptables", "-P", "FORWARD", "DROP")
        a, b = Pod(node, "pod-a", 18090), Pod(node, "pod-b", 18091)
        assert pod_set_entries(node.node_ns.path) == {a.ip, b.ip}
        # out through the node's DROP policy (masqueraded), and host ports
        assert a.wget(b.ip, 8080) == "pod pod-b\n"
        code, out = a.exec("busybox", "ping", "-c", "1", "-W", "2", CLIENT_IP)
        assert code == 0, out
        assert http_get(node.node_ns.path, NODE_IP, 18091) == "pod pod-b\n"
        for p in (a, b):
            p.stop()
        assert pod_set_entries(node.node_ns.path) == set()
        assert os.listdir(os.path.join(d, "firewall")) == []
        calls = node.calls()
        assert calls and all(c["exit"] == 0 for c in calls), \
            [(c["plugin"], c["command"], c["result"]) for c in calls if c["exit"]]
        assert {c["plugin"] for c in calls} >= {"bridge", "host-local", "portmap", "firewall",
                                               "tuning"}


def test_k3s_default_chain_with_bandwidth(tmp_path, cni_mode, cni_worker_socket):
    d = str(tmp_path)
    with open(os.path.join(d, "subnet.env"), "w") as f:
        f.write(f"FLANNEL_NETWORK={K3S_NETWORK}\nFLANNEL_SUBNET={K3S_SUBNET}\n"
                "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n")
    with running_node(tmp_path, cni_mode, cni_worker_socket,
                      {"10-flannel.conflist": k3s_default(d)}) as node:
        shaped = {"kubernetes.io/ingress-bandwidth": "10M",
                  "kubernetes.io/egress-bandwidth": "20M"}
        a = Pod(node, "pod-a", 18092, annotations=shaped)
        b = Pod(node, "pod-b", 18093)
        assert a.ip.startswith("10.42.0.") and b.ip.startswith("10.42.0.")
        # the shaped pod's veth end holds a TBF of its ingress rate (bytes/s)
        rates = [q.tbf.rate for q in veth_root_qdiscs(node.node_ns.path)]
        assert rates == [10_000_000 // 8], rates
        assert a.wget(b.ip, 8080) == "pod pod-b\n"
        assert http_get(node.client_ns.path, NODE_IP, 18092) == "pod pod-a\n"
        for p in (a, b):
            p.stop()
        assert veth_root_qdiscs(node.node_ns.path) == []
        assert os.listdir(os.path.join(d, "flannel")) == []
        calls = node.calls()
        assert calls and all(c["exit"] == 0 for c in calls), \
            [(c["plugin"], c["command"], c["result"]) for c in calls if c["exit"]]
        bw = [c for c in calls if c["plugin"] == "bandwidth" and c["command"] == "ADD"]
        assert any(c["config"].get("runtimeConfig", {}).get("bandwidth") for c in bw)


@pytest.fixture(autouse=True)
def _no_bus(monkeypatch, tmp_path):
    # firewall without a backend asks firewalld first: never the machine's bus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")


@pytest.mark.parametrize("chain", ["podman", "k3s"])
def test_chains_through_the_runtime(chain, cni_bin, netns_factory, tmp_path):
    """The same conflists run by our runtime (libcni's ADD, CHECK, DEL and
    GC) in a node namespace with a LAN behind it and a DROP forward policy:
    two pods reach the LAN, CHECK passes, the bandwidth capability reaches
    the kernel; GC with no valid attachment leaves no pod state."""
    d = str(tmp_path)
    lan = make_lan(netns_factory, lan_ips=("10.74.0.1/24",), default_route="10.74.0.1")
    with NetNS.open(lan.lan.path) as n, n.rtnl() as ipr:
        netlink.add_route(ipr, "10.42.0.0/16", gw="10.74.0.254")
        netlink.add_route(ipr, "10.88.0.0/16", gw="10.74.0.254")
    sh(lan.node.path, "iptables", "-P", "FORWARD", "DROP")
    doc = podman_default(d) if chain == "podman" else k3s_default(d)
    if chain == "k3s":
        with open(os.path.join(d, "subnet.env"), "w") as f:
            f.write(f"FLANNEL_NETWORK={K3S_NETWORK}\nFLANNEL_SUBNET={K3S_SUBNET}\n"
                    "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n")
        # k3s leaves forwarding to flannel's own rules: let pods through here
        doc["plugins"].append({"type": "firewall", "dataDir": os.path.join(d, "firewall")})
    os.makedirs(os.path.join(d, "net.d"))
    with open(os.path.join(d, "net.d", "10-chain.conflist"), "w") as f:
        json.dump(doc, f)
    cni = Runtime(conf_dir=os.path.join(d, "net.d"), bin_dirs=[cni_bin],
                  cache_dir=os.path.join(d, "cache"), plugin_netns=lan.node.path)
    net = cni.load_conflist(doc["name"])
    caps = {"portMappings": [{"hostPort": 18100, "containerPort": 8080, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 400_000,
                          "egressRate": 8_000_000, "egressBurst": 400_000}}
    pods = []
    for cid in ("r1", "r2"):
        pod = netns_factory("cnsk-pod")
        rt = RuntimeConf(cid, pod.path, "eth0", capability_args=caps if cid == "r1" else {})
        cni.add(net, rt)
        cni.check(net, rt)
        pods.append((pod, rt))
    for pod, _ in pods:
        assert tcp_echo(lan.lan, "10.74.0.1", pod, timeout=2.0)[0] == b"cni-skel"
    if chain == "k3s":
        assert [q.tbf.rate for q in veth_root_qdiscs(lan.node.path)] == [1_000_000]
    cni.delete(net, pods[0][1])
    cni.delete(net, pods[0][1])
    assert pod_set_entries(lan.node.path) == {
        str(ip.address.ip) for ip in cni.get_cached_result(net, pods[1][1]).ips}
    cni.gc(net, [])
    assert pod_set_entries(lan.node.path) == set()
    assert os.listdir(os.path.join(d, "firewall")) == []
    assert veth_root_qdiscs(lan.node.path) == []
