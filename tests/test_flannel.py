"""flannel through the real executable: it reads a subnet file the test
writes (as flannel's daemon would), saves the delegate config flannel-io's
Go plugin would save, byte for byte, and delegates to our bridge and
host-local (or Go's, from /usr/lib/cni) in namespaces the test made. Debian
ships no flannel plugin, so the saved file is checked against flannel-io's
format (sorted keys, compact JSON) rather than side by side."""

from __future__ import annotations

import json
import os

import pytest
from podlink_common import GO_CNI_DIR, allocated, call, call_raw, link_of, links_of

from cni_skel import netlink
from cni_skel.netns import NetNS

NET = "flnet"
V4 = ("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\n"
      "FLANNEL_IPMASQ=true\n")
DUAL = V4 + "FLANNEL_IPV6_NETWORK=fd00:244::/56\nFLANNEL_IPV6_SUBNET=fd00:244:0:1::1/64\n"


@pytest.fixture(scope="session")
def flannel(cni_bin: str) -> str:
    return os.path.join(cni_bin, "flannel")


@pytest.fixture
def node_pod(netns_factory):
    return netns_factory("cnsk-node"), netns_factory("cnsk-pod")


def setup(tmp_path, env: str | None = V4, version: str = "1.0.0", **extra) -> dict:
    """A subnet file with ``env`` (none when None) and the flannel config
    naming it; host-local's store under tmp_path/ipam (as ``ipam.dataDir``)."""
    subnet = tmp_path / "subnet.env"
    if env is not None:
        subnet.write_text(env)
    conf = {"cniVersion": version, "name": NET, "type": "flannel", "subnetFile": str(subnet),
            "dataDir": str(tmp_path / "flannel"),
            "ipam": {"dataDir": str(tmp_path / "ipam")}, **extra}
    return conf


def saved(tmp_path, cid: str = "c1") -> bytes:
    return (tmp_path / "flannel" / cid).read_bytes()


def pod_addresses(pod) -> list[str]:
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, "eth0")
        return sorted(str(a) for a in netlink.addresses(ipr, link) if not a.ip.is_link_local)


def pod_routes(pod) -> set[tuple[str, str]]:
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        return {(str(r["dst"]), str(r["gw"])) for r in netlink.routes(ipr)}


# --- the main job ------------------------------------------------------------


def test_bridge_pod_from_the_subnet_file(flannel, node_pod, tmp_path):
    """ADD: the delegate config is flannel-io's (sorted, compact: bridge,
    isGateway, ipMasq the opposite of FLANNEL_IPMASQ, FLANNEL_MTU, the node
    subnet's network as host-local's range, the cluster network as its
    route), saved
    0600 in a 0700 dataDir; the result is bridge's; the pod holds an address
    of the node subnet and a route to the cluster network. DEL (twice)
    removes the veth, the address and the saved file."""
    node, pod = node_pod
    conf = setup(tmp_path)
    r = call(flannel, "ADD", conf, node, pod)
    assert saved(tmp_path) == (
        b'{"cniVersion":"1.0.0","ipMasq":false,"ipam":{"dataDir":"' + str(tmp_path).encode()
        + b'/ipam","ranges":[[{"subnet":"10.244.1.0/24"}]],"routes":[{"dst":"10.244.0.0/16"}],'
        b'"type":"host-local"},"isGateway":true,"mtu":1450,"name":"flnet","type":"bridge"}')
    assert os.stat(tmp_path / "flannel").st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "flannel" / "c1").st_mode & 0o777 == 0o600
    assert r["interfaces"][0]["name"] == "cni0"
    assert [ip["address"] for ip in r["ips"]] == ["10.244.1.2/24"]
    assert pod_addresses(pod) == ["10.244.1.2/24"]
    assert ("10.244.0.0/16", "10.244.1.1") in pod_routes(pod)
    assert link_of(pod, "eth0").mtu == 1450
    call(flannel, "CHECK", dict(conf, prevResult=r), node, pod)
    for _ in range(2):
        assert call(flannel, "DEL", conf, node, pod) is None
    assert link_of(pod, "eth0") is None
    assert allocated(tmp_path / "ipam", NET) == []
    assert not (tmp_path / "flannel" / "c1").exists()
    assert links_of(node, "veth") == []


def test_dual_stack_and_delegate_keys(flannel, node_pod, tmp_path):
    """IPv6 subnet and networks join the ranges and routes; ``delegate``'s
    own keys win over flannel's defaults; ``ipam.routes`` come first;
    ``runtimeConfig`` reaches the delegate (bridge's ``mac``)."""
    node, pod = node_pod
    conf = setup(tmp_path, DUAL, delegate={"ipMasq": True, "mtu": 1400, "bridge": "cnskfl0"},
                 runtimeConfig={"mac": "0a:58:0a:f4:01:99"},
                 ipam={"dataDir": str(tmp_path / "ipam"), "routes": [{"dst": "10.96.0.0/12"}]})
    r = call(flannel, "ADD", conf, node, pod)
    doc = json.loads(saved(tmp_path))
    assert doc["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}],
                                     [{"subnet": "fd00:244:0:1::/64"}]]
    assert doc["ipam"]["routes"] == [{"dst": "10.96.0.0/12"}, {"dst": "10.244.0.0/16"},
                                     {"dst": "fd00:244::/56"}]
    assert (doc["ipMasq"], doc["mtu"], doc["bridge"]) == (True, 1400, "cnskfl0")
    assert doc["runtimeConfig"] == {"mac": "0a:58:0a:f4:01:99"}
    assert r["interfaces"][0]["name"] == "cnskfl0"
    assert link_of(pod, "eth0").mac == "0a:58:0a:f4:01:99"
    assert pod_addresses(pod) == ["10.244.1.2/24", "fd00:244:0:1::2/64"]
    assert {("10.96.0.0/12", "10.244.1.1"), ("fd00:244::/56", "fd00:244:0:1::1")} \
        <= pod_routes(pod)
    call(flannel, "DEL", conf, node, pod)
    assert link_of(pod, "eth0") is None and allocated(tmp_path / "ipam", NET) == []


def test_delegates_to_go_bridge(flannel, node_pod, tmp_path):
    """CNI_PATH of Debian's Go plugins: our flannel runs Go's bridge and
    host-local with the same config, and DEL with the saved one."""
    node, pod = node_pod
    conf = setup(tmp_path)
    r = call(flannel, "ADD", conf, node, pod, cni_path=GO_CNI_DIR)
    assert [ip["address"] for ip in r["ips"]] == ["10.244.1.2/24"]
    assert pod_addresses(pod) == ["10.244.1.2/24"]
    call(flannel, "DEL", conf, node, pod, cni_path=GO_CNI_DIR)
    assert link_of(pod, "eth0") is None and allocated(tmp_path / "ipam", NET) == []


def test_del_without_netns_keeps_the_saved_config(flannel, node_pod, tmp_path):
    """A DEL with no CNI_NETNS (the delegate cannot reach the pod's end)
    succeeds and keeps the saved config; the DEL naming the namespace then
    removes the veth and the file."""
    node, pod = node_pod
    conf = setup(tmp_path)
    call(flannel, "ADD", conf, node, pod)
    assert call(flannel, "DEL", conf, node, None) is None
    assert (tmp_path / "flannel" / "c1").exists()
    assert allocated(tmp_path / "ipam", NET) == []
    call(flannel, "DEL", conf, node, pod)
    assert link_of(pod, "eth0") is None and not (tmp_path / "flannel" / "c1").exists()
    assert links_of(node, "veth") == []


def test_del_uses_the_saved_config(flannel, node_pod, tmp_path):
    """The subnet file gone (flannel restarted) and the config changed: DEL
    still runs the delegate with what ADD saved. A config saved by Go's
    flannel (the same JSON written by hand) is deleted the same way."""
    node, pod = node_pod
    conf = setup(tmp_path)
    call(flannel, "ADD", conf, node, pod)
    os.unlink(tmp_path / "subnet.env")
    call(flannel, "DEL", dict(conf, delegate={"type": "ptp"}), node, pod)
    assert link_of(pod, "eth0") is None and allocated(tmp_path / "ipam", NET) == []

    (tmp_path / "subnet.env").write_text(V4)
    call(flannel, "ADD", conf, node, pod, cid="c2")
    go_saved = saved(tmp_path, "c2")
    os.unlink(tmp_path / "flannel" / "c2")
    (tmp_path / "flannel" / "c2").write_bytes(go_saved)  # as flannel-io's writeAndSyncFile
    call(flannel, "DEL", conf, node, pod, cid="c2")
    assert link_of(pod, "eth0") is None and not (tmp_path / "flannel" / "c2").exists()


def test_gc_and_status(flannel, netns_factory, tmp_path):
    """1.1.0: STATUS passes (the delegate's), and is 50 without the subnet
    file; GC releases the address of the attachment not in the valid list
    (host-local, through bridge's GC) and keeps both saved configs: the DEL
    the runtime sends for it still removes its veth."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod"), netns_factory("cnsk-pod")]
    conf = setup(tmp_path, version="1.1.0")
    for i, pod in enumerate(pods):
        call(flannel, "ADD", conf, node, pod, cid=f"c{i}")
    assert len(allocated(tmp_path / "ipam", NET)) == 2
    assert call(flannel, "STATUS", conf, node, None, cid="", ifname="") is None
    gc = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": "c0", "ifname": "eth0"}]})
    assert call(flannel, "GC", gc, node, None, cid="", ifname="") is None
    assert sorted(os.listdir(tmp_path / "flannel")) == ["c0", "c1"]
    assert allocated(tmp_path / "ipam", NET) == ["10.244.1.2"]
    os.unlink(tmp_path / "subnet.env")
    run = call_raw(flannel, "STATUS", conf, node, None, cid="", ifname="")
    assert run.exit_code == 1 and run.doc["code"] == 50, run.doc
    for i, pod in enumerate(pods):
        call(flannel, "DEL", conf, node, pod, cid=f"c{i}")
        assert link_of(pod, "eth0") is None
    assert os.listdir(tmp_path / "flannel") == [] and links_of(node, "veth") == []


# --- bad input -------------------------------------------------------------


@pytest.mark.parametrize(("env", "extra", "code", "text"), [
    (None, {}, 11, "no such file or directory. Check the flannel pod log"),
    ("FLANNEL_SUBNET=10.244.1.1/24\n", {}, 999,
     "is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_MTU, FLANNEL_IPMASQ"),
    (V4.replace("10.244.1.1/24", "10.244.1.1"), {}, 999, 'FLANNEL_SUBNET: invalid CIDR'),
    (V4, {"delegate": {"name": "x"}}, 7, "must not have 'name' field"),
    (V4, {"delegate": {"ipam": {}}}, 7, "must not have 'ipam' field"),
    (V4, {"delegate": {"type": 5}}, 7, "must have (string) 'type' field"),
    (V4, {"delegate": {"type": "cnsk-missing"}}, 7, "failed to find plugin \"cnsk-missing\""),
])
def test_refused_and_nothing_left(flannel, node_pod, tmp_path, env, extra, code, text):
    """Refused with a spec code naming the problem (11 while flannel has
    not written its subnet file yet); no saved config, no veth, no address."""
    node, pod = node_pod
    run = call_raw(flannel, "ADD", setup(tmp_path, env, **extra), node, pod)
    assert run.exit_code == 1 and run.doc["code"] == code, run.doc
    assert text in run.doc["msg"] + run.doc.get("details", ""), run.doc
    assert not (tmp_path / "flannel" / "c1").exists()
    assert links_of(pod) == ["lo"] and allocated(tmp_path / "ipam", NET) == []
