"""bridge through the real executable, run inside a node namespace as a
runtime runs it, with our host-local as IPAM. Everything is read back from
the kernel (pyroute2) and nftables (libnftables JSON). Shapes against Go and
interop are in test_bridge_go.py."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import time

import pytest
from pyroute2 import IPRoute

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.harness import nft_table, remove_netns, run_plugin, run_plugin_raw, tcp_echo
from cni_skel.netns import NetNS
from cni_skel.nft import Nft

TABLE = "cni_skel_bridge"


@pytest.fixture(scope="session")
def bridge(cni_bin: str) -> str:
    return os.path.join(cni_bin, "bridge")


@pytest.fixture
def node(node_netns):
    return node_netns


def conf(tmp_path, version="1.1.0", name="brnet", subnets=("10.77.0.0/24",), **top) -> dict:
    c = {"cniVersion": version, "name": name, "type": "bridge", "bridge": "cnsk0",
         "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                  "ranges": [[{"subnet": s}] for s in subnets]}}
    c.update(top)
    if c.get("ipam") is None:
        c.pop("ipam")
    return c


def add(exe, c, node, pod, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "ADD", c, container_id=cid, netns=pod.path if pod else "",
                      ifname=ifname, node=node, **kw)


def delete(exe, c, node, pod, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "DEL", c, container_id=cid, netns=pod.path if pod else "",
                      ifname=ifname, node=node, **kw)


def check(exe, c, node, pod, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "CHECK", c, container_id=cid, netns=pod.path if pod else "",
                      ifname=ifname, node=node, **kw)


def link(ns, name):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return netlink.find_link(ipr, name)


def port(ns, name):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return netlink.bridge_port(ipr, name)


def addrs(ns, name, family=None):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return [a for a in netlink.addresses(ipr, name, family) if not a.ip.is_link_local]


def kroutes(ns):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return netlink.routes(ipr)


def veths(ns):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return sorted(m.get("IFLA_IFNAME") for m in ipr.get_links()
                      if m.get(("linkinfo", "kind")) == "veth")


def allocated(tmp_path, name="brnet"):
    d = tmp_path / "ipam" / name
    if not d.exists():
        return []
    return sorted(p.name for p in d.iterdir()
                  if p.name != "lock" and not p.name.startswith(("last_reserved_ip", ".")))


def ip_of(result, version=4):
    return next(ipaddress.ip_interface(i["address"]) for i in result["ips"]
                if ipaddress.ip_interface(i["address"]).version == version)


# --- the main job ------------------------------------------------------------


def test_two_pods_dual_stack_talk_and_reach_gateway(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, subnets=("10.77.0.0/24", "fd00:77::/64"), isDefaultGateway=True)
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    results = [add(bridge, c, node, p, cid=f"c{i}") for i, p in enumerate(pods)]

    r = results[0]
    assert [i["name"] for i in r["interfaces"]][::2] == ["cnsk0", "eth0"]
    assert r["interfaces"][1]["name"].startswith("veth") and len(r["interfaces"][1]["name"]) == 12
    assert r["interfaces"][2]["sandbox"] == pods[0].path
    assert [i["interface"] for i in r["ips"]] == [2, 2]
    assert [i["gateway"] for i in r["ips"]] == ["10.77.0.1", "fd00:77::1"]
    assert r["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.77.0.1"},
                           {"dst": "::/0", "gw": "fd00:77::1"}]

    # the kernel: bridge up with both gateways, host veth enslaved and up,
    # container side with its addresses, MAC and default routes
    br = link(node, "cnsk0")
    assert br.kind == "bridge" and br.up
    assert {str(a) for a in addrs(node, "cnsk0")} == {"10.77.0.1/24", "fd00:77::1/64"}
    assert br.mac == r["interfaces"][0]["mac"] or br.mac == results[1]["interfaces"][0]["mac"]
    for res, pod in zip(results, pods, strict=True):
        host = link(node, res["interfaces"][1]["name"])
        cont = link(pod, "eth0")
        assert host.master == br.index and host.operstate == "UP"
        assert host.peer_index == cont.index and cont.peer_index == host.index
        assert cont.mac == res["interfaces"][2]["mac"] and cont.up
        assert {str(a) for a in addrs(pod, "eth0")} == {i["address"] for i in res["ips"]}
        defaults = {(str(rt["dst"]), str(rt["gw"])) for rt in kroutes(pod) if rt["gw"]}
        assert defaults == {("0.0.0.0/0", "10.77.0.1"), ("::/0", "fd00:77::1")}
    with NetNS.open(node.path) as n, n.enter():
        with open("/proc/sys/net/ipv4/ip_forward") as f:
            assert f.read().strip() == "1"
        with open("/proc/sys/net/ipv6/conf/all/forwarding") as f:
            assert f.read().strip() == "1"

    # traffic: pod to pod over both families, pod to its gateway on the node
    b4, b6 = str(ip_of(results[1]).ip), str(ip_of(results[1], 6).ip)
    assert tcp_echo(pods[1], b4, pods[0], payload=b"v4")[0] == b"v4"
    echoed, peer = tcp_echo(pods[1], b6, pods[0], payload=b"v6")
    assert echoed == b"v6" and peer == str(ip_of(results[0], 6).ip)
    assert tcp_echo(node, "10.77.0.1", pods[0], payload=b"gw")[0] == b"gw"

    for i, p in enumerate(pods):
        delete(bridge, c, node, p, cid=f"c{i}")
        delete(bridge, c, node, p, cid=f"c{i}")  # repeated DEL succeeds
    assert veths(node) == []
    assert link(node, "cnsk0") is not None  # the bridge is never deleted
    assert allocated(tmp_path) == []


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0",
                                     "1.1.0"])
def test_every_version(bridge, node, pod_netns, tmp_path, version):
    c = conf(tmp_path, version=version, isGateway=True)
    r = add(bridge, c, node, pod_netns)
    assert r["cniVersion"] == version
    if version in ("0.1.0", "0.2.0"):
        assert r["ip4"]["ip"].startswith("10.77.0.") and r["ip4"]["gateway"] == "10.77.0.1"
    else:
        assert len(r["interfaces"]) == 3 and r["ips"][0]["interface"] == 2
    assert addrs(pod_netns, "eth0")
    delete(bridge, c, node, pod_netns)
    assert link(pod_netns, "eth0") is None and allocated(tmp_path) == []


def test_mtu_hairpin_isolation_promisc(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, mtu=1400, hairpinMode=True, portIsolation=True)
    pod = netns_factory("cnsk-pod")
    r = add(bridge, c, node, pod)
    host = r["interfaces"][1]["name"]
    assert link(pod, "eth0").mtu == 1400 and link(node, host).mtu == 1400
    assert link(node, "cnsk0").mtu == 1400
    assert port(node, host) == {"hairpin": True, "isolated": True}
    delete(bridge, c, node, pod)

    c2 = conf(tmp_path, bridge="cnsk1", promiscMode=True)
    pod2 = netns_factory("cnsk-pod")
    r = add(bridge, c2, node, pod2, cid="c2")
    assert link(node, "cnsk1").flags & netlink.IFF_PROMISC
    assert port(node, r["interfaces"][1]["name"]) == {"hairpin": False, "isolated": False}
    check(bridge, dict(c2, prevResult=r), node, pod2, cid="c2")
    delete(bridge, c2, node, pod2, cid="c2")


def _kernel_has_vlan_filtering(netns_factory) -> bool:
    probe = netns_factory("cnsk-probe")
    with NetNS.open(probe.path) as n, n.iproute() as ipr:
        try:
            netlink.ensure_bridge(ipr, "probe0", vlan_filtering=True)
            return True
        except CNIError:
            return False


@pytest.mark.parametrize("vlan_conf", [{"vlan": 100},
                                       {"vlanTrunk": [{"id": 101}, {"minID": 200, "maxID": 202}]},
                                       {"vlan": 100, "vlanTrunk": [{"id": 5}],
                                        "preserveDefaultVlan": True}])
def test_vlan_and_trunk(bridge, node, pod_netns, netns_factory, tmp_path, vlan_conf):
    """VLAN filtering needs CONFIG_BRIDGE_VLAN_FILTERING. Where the kernel has
    it, the port's VLANs are read back; where it lacks it (this project's CI
    kernel), ADD must fail cleanly with the kernel's reason and leave
    nothing behind - the same as Go's bridge there."""
    c = conf(tmp_path, **vlan_conf)
    if _kernel_has_vlan_filtering(netns_factory):
        r = add(bridge, c, node, pod_netns)
        vlans = set()
        with NetNS.open(node.path) as n, n.iproute() as ipr:
            vlans = set(netlink.bridge_vlans(ipr, r["interfaces"][1]["name"]))
        if vlan_conf.get("vlan"):
            assert (100, True, True) in vlans
        trunk = {v for v, _, _ in vlans}
        for item in vlan_conf.get("vlanTrunk", []):
            assert set(range(item.get("minID", item.get("id")),
                             item.get("maxID", item.get("id")) + 1)) <= trunk
        assert (1 in trunk) == bool(vlan_conf.get("preserveDefaultVlan")
                                    or not vlan_conf.get("vlan"))
        delete(bridge, c, node, pod_netns)
    else:
        run = run_plugin_raw(bridge, "ADD", c, container_id="c1", netns=pod_netns.path,
                             node=node)
        assert run.exit_code != 0 and run.doc["code"] == 999
        assert "not supported" in run.doc["msg"] and "cnsk0" in run.doc["msg"]
        assert veths(node) == [] and link(pod_netns, "eth0") is None
        assert allocated(tmp_path) == []


# --- nftables -----------------------------------------------------------------


def _elements(node, family):
    table = nft_table(node, family, TABLE)
    if table is None:
        return {}
    return {name: sorted(str(c) for _, c in table.elements(name)) for name in table.sets}


def test_masquerade_and_spoofcheck_entries_add_del_gc(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, subnets=("10.77.0.0/24", "fd00:77::/64"), isGateway=True, ipMasq=True,
             macspoofchk=True)
    pods = [netns_factory("cnsk-pod") for _ in range(3)]
    results = [add(bridge, c, node, p, cid=f"c{i}") for i, p in enumerate(pods)]
    masq = _elements(node, "inet")
    assert len(masq) == 4
    for entries in masq.values():
        assert entries == ["c0/eth0", "c1/eth0", "c2/eth0"]
    table = nft_table(node, "inet", TABLE)
    pods4 = next(n for n in table.sets if n.endswith("_pods4"))
    assert sorted(v for v, _ in table.elements(pods4)) == sorted(
        str(ip_of(r).ip) for r in results)
    spoof = nft_table(node, "bridge", TABLE)
    # the network's own spoof-check sets (test_gc_isolation.py: two networks)
    ports = next(n for n in spoof.sets if n.endswith("_spoofchk_ports"))
    allowed = next(n for n in spoof.sets if n.endswith("_spoofchk_allowed"))
    assert sorted(v for v, _ in spoof.elements(ports)) == sorted(
        r["interfaces"][1]["name"] for r in results)
    assert sorted(tuple(v["concat"]) for v, _ in spoof.elements(allowed)) == sorted(
        (r["interfaces"][1]["name"], r["interfaces"][2]["mac"]) for r in results)
    # the rules exist once, however many pods
    assert len(table.chain_rules("postrouting")) == 2
    assert len(spoof.chain_rules("prerouting")) == 1

    # DEL with an empty CNI_NETNS and no prevResult still finds c0's entries
    delete(bridge, c, node, None, cid="c0")
    assert all(v == ["c1/eth0", "c2/eth0"] for v in _elements(node, "inet").values())
    assert all(v == ["c1/eth0", "c2/eth0"] for v in _elements(node, "bridge").values())

    # GC keeps valid attachments only (c1), IPAM GC included
    gc = dict(c, **{"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]})
    run_plugin(bridge, "GC", gc, container_id="", netns="", ifname="", node=node)
    assert all(v == ["c1/eth0"] for v in _elements(node, "inet").values())
    assert all(v == ["c1/eth0"] for v in _elements(node, "bridge").values())
    assert allocated(tmp_path) == [str(ip_of(results[1]).ip), str(ip_of(results[1], 6).ip)]
    delete(bridge, c, node, pods[1], cid="c1")
    assert all(v == [] for v in _elements(node, "inet").values())


def test_masquerade_traffic_leaves_with_node_address(bridge, node, netns_factory, tmp_path):
    """A pod reaching an outside host appears with the node's address; pod to
    pod on the same subnet is not masqueraded."""
    outside = netns_factory("cnsk-out")
    with NetNS.open(node.path) as n, n.iproute() as ipr, NetNS.open(outside.path) as o:
        netlink.create_veth_pair(ipr, "uplink0", "wan0", peer_netns=o)
        netlink.add_address(ipr, "uplink0", "10.88.0.1/24")
        netlink.link_up(ipr, "uplink0")
        with o.iproute() as oipr:
            netlink.add_address(oipr, "wan0", "10.88.0.2/24")
            netlink.link_up(oipr, "wan0")
    c = conf(tmp_path, isDefaultGateway=True, ipMasq=True)
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    results = [add(bridge, c, node, p, cid=f"c{i}") for i, p in enumerate(pods)]
    _, peer = tcp_echo(outside, "10.88.0.2", pods[0])
    assert peer == "10.88.0.1"  # masqueraded to the node's uplink address
    _, peer = tcp_echo(pods[1], str(ip_of(results[1]).ip), pods[0])
    assert peer == str(ip_of(results[0]).ip)  # same subnet: untouched
    delete(bridge, c, node, pods[0], cid="c0")
    # without its entry, c0 is no longer masqueraded (nor routed back)
    c0 = add(bridge, conf(tmp_path, isDefaultGateway=True), node, pods[0], cid="c0")
    with pytest.raises(OSError):
        tcp_echo(outside, "10.88.0.2", pods[0], timeout=1.5)
    assert ip_of(c0)
    for i, p in enumerate(pods):
        delete(bridge, c, node, p, cid=f"c{i}")


def test_spoofcheck_drops_frames_from_another_mac(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, macspoofchk=True)
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    results = [add(bridge, c, node, p, cid=f"c{i}") for i, p in enumerate(pods)]
    target = str(ip_of(results[1]).ip)
    assert tcp_echo(pods[1], target, pods[0])[0] == b"cni-skel"
    with NetNS.open(pods[0].path) as n, n.iproute() as ipr:
        netlink.link_set(ipr, "eth0", mac="02:00:00:00:00:99")
    with pytest.raises(OSError):
        tcp_echo(pods[1], target, pods[0], timeout=1.5)
    # CHECK notices the changed MAC
    with pytest.raises(CNIError, match="Mac"):
        check(bridge, dict(c, prevResult=results[0]), node, pods[0], cid="c0")
    for i, p in enumerate(pods):
        delete(bridge, c, node, p, cid=f"c{i}")
    spoof = _elements(node, "bridge")
    assert sorted(n.split("_", 2)[-1] for n in spoof) == ["spoofchk_allowed", "spoofchk_ports"]
    assert all(v == [] for v in spoof.values())


# --- CHECK ----------------------------------------------------------------------


def test_check_passes_then_fails_after_changes_behind_its_back(bridge, node, pod_netns,
                                                               tmp_path):
    c = conf(tmp_path, isDefaultGateway=True, ipMasq=True)
    r = add(bridge, c, node, pod_netns)
    cc = dict(c, prevResult=r)
    assert check(bridge, cc, node, pod_netns) is None

    table = nft_table(node, "inet", TABLE)
    pods4 = next(n for n in table.sets if n.endswith("_pods4"))
    with NetNS.open(node.path) as n:
        n.run(lambda: Nft().run([{"delete": {"element": {
            "family": "inet", "table": TABLE, "name": pods4, "elem": [str(ip_of(r).ip)]}}}]))
    with pytest.raises(CNIError, match="masquerade set"):
        check(bridge, cc, node, pod_netns)

    with NetNS.open(pod_netns.path) as n, n.iproute() as ipr:
        netlink.del_address(ipr, "eth0", r["ips"][0]["address"])
    with pytest.raises(CNIError, match="not found"):
        check(bridge, cc, node, pod_netns)

    with NetNS.open(pod_netns.path) as n, n.iproute() as ipr:
        netlink.add_address(ipr, "eth0", r["ips"][0]["address"])
        netlink.add_route(ipr, "0.0.0.0/0", gw="10.77.0.1", dev="eth0")
    with NetNS.open(node.path) as n, n.iproute() as ipr:
        netlink.link_set(ipr, r["interfaces"][1]["name"], master=0)
    with pytest.raises(CNIError, match="veth created for bridge"):
        check(bridge, cc, node, pod_netns)
    delete(bridge, c, node, pod_netns)


def test_check_needs_prev_result_and_040(bridge, node, pod_netns, tmp_path):
    c = conf(tmp_path)
    add(bridge, c, node, pod_netns)
    with pytest.raises(CNIError) as e:
        check(bridge, c, node, pod_netns)
    assert e.value.code == 7 and "prevResult" in e.value.msg
    run = run_plugin_raw(bridge, "CHECK", conf(tmp_path, version="0.3.1"), container_id="c1",
                         netns=pod_netns.path, node=node)
    assert run.exit_code == 1 and run.doc["code"] == 1  # as Go's vector
    delete(bridge, c, node, pod_netns)


# --- rollback and failures ------------------------------------------------------


def test_failing_ipam_leaves_no_veth(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, subnets=("10.77.0.0/30",))  # one usable address
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    add(bridge, c, node, pods[0], cid="c0")
    run = run_plugin_raw(bridge, "ADD", c, container_id="c1", netns=pods[1].path, node=node)
    assert run.exit_code != 0 and run.doc["code"] == 50  # host-local: range exhausted
    assert link(pods[1], "eth0") is None
    assert len(veths(node)) == 1
    delete(bridge, c, node, pods[1], cid="c1")
    delete(bridge, c, node, pods[0], cid="c0")
    assert veths(node) == []


def test_failure_after_ipam_releases_address_and_veth(bridge, node, pod_netns, tmp_path):
    with NetNS.open(node.path) as n, n.iproute() as ipr:
        netlink.ensure_bridge(ipr, "cnsk0")
        netlink.add_address(ipr, "cnsk0", "10.99.0.1/24")
    c = conf(tmp_path, isGateway=True, ipMasq=True)
    run = run_plugin_raw(bridge, "ADD", c, container_id="c1", netns=pod_netns.path, node=node)
    assert run.exit_code != 0
    assert run.doc["msg"] == '"cnsk0" already has an IP address different from 10.77.0.1/24'
    assert allocated(tmp_path) == [] and veths(node) == []
    assert link(pod_netns, "eth0") is None
    assert nft_table(node, "inet", TABLE) is None

    # forceAddress replaces the foreign address
    c["forceAddress"] = True
    add(bridge, c, node, pod_netns)
    assert [str(a) for a in addrs(node, "cnsk0", 4)] == ["10.77.0.1/24"]
    delete(bridge, c, node, pod_netns)
    assert allocated(tmp_path) == []


def test_del_after_netns_is_gone_releases_the_address(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, ipMasq=True)
    pod = netns_factory("cnsk-pod")
    add(bridge, c, node, pod)
    assert allocated(tmp_path)
    remove_netns(pod)
    delete(bridge, c, node, pod)  # CNI_NETNS names a path that no longer exists
    delete(bridge, c, node, None)  # and the runtime's repeat with an empty one
    assert allocated(tmp_path) == []
    # The node's veth end goes with the pod namespace, which the kernel
    # dismantles asynchronously (cleanup_net) after its last reference.
    deadline = time.monotonic() + 10
    while veths(node) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert veths(node) == []
    assert all(v == [] for v in _elements(node, "inet").values())


def test_parallel_adds_on_a_new_bridge(bridge, node, netns_factory, tmp_path):
    c = conf(tmp_path, subnets=("10.77.0.0/24", "fd00:77::/64"), isGateway=True, ipMasq=True,
             macspoofchk=True)
    pods = [netns_factory("cnsk-pod") for _ in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(
            lambda ip: run_plugin_raw(bridge, "ADD", c, container_id=f"p{ip[0]}",
                                      netns=ip[1].path, node=node),
            enumerate(pods)))
    assert [r.exit_code for r in runs] == [0] * 8, [r.doc for r in runs if r.exit_code]
    v4 = {ip_of(r.doc) for r in runs}
    assert len(v4) == 8
    assert len(veths(node)) == 8
    table = nft_table(node, "inet", TABLE)
    assert len(table.chain_rules("postrouting")) == 2  # no duplicated rules
    assert len(nft_table(node, "bridge", TABLE).chain_rules("prerouting")) == 1
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda ip: delete(bridge, c, node, ip[1], cid=f"p{ip[0]}"),
                      enumerate(pods)))
    assert veths(node) == [] and allocated(tmp_path) == []


# --- configuration ----------------------------------------------------------------


@pytest.mark.parametrize("top, code, text", [
    ({"vlan": 5000}, 7, "invalid VLAN ID 5000 (must be between 0 and 4094)"),
    ({"vlanTrunk": [{"minID": 10}]}, 7, "maxID is missing"),
    ({"vlanTrunk": [{"minID": 20, "maxID": 10}]}, 7, "minID is greater than maxID"),
    ({"vlanTrunk": [{"id": 0}]}, 7, "incorrect trunk id parameter"),
    ({"hairpinMode": True, "promiscMode": True}, 7, "hairpin mode and promiscuous mode"),
    ({"disableContainerInterface": True}, 7, "cannot use IPAM"),
    ({"ipMasqBackend": "bogus"}, 7, "ipMasqBackend"),
    ({"mtu": -1}, 7, "mtu"),
    ({"runtimeConfig": {"mac": "zz:00:00:00:00:00"}}, 7, "MAC"),
])
def test_bad_config(bridge, node, pod_netns, tmp_path, top, code, text):
    run = run_plugin_raw(bridge, "ADD", conf(tmp_path, **top), container_id="c1",
                         netns=pod_netns.path, node=node)
    assert run.exit_code != 0 and run.doc["code"] == code, run.doc
    assert text in run.doc["msg"] + run.doc.get("details", "")
    assert link(node, "cnsk0") is None and allocated(tmp_path) == []


def test_name_taken_by_another_link_kind(bridge, node, pod_netns, tmp_path):
    with NetNS.open(node.path) as n, n.iproute() as ipr:
        netlink.create_veth_pair(ipr, "cnsk0", "cnsk0p")
    run = run_plugin_raw(bridge, "ADD", conf(tmp_path), container_id="c1",
                         netns=pod_netns.path, node=node)
    assert run.doc["msg"] == '"cnsk0" already exists but is not a bridge'
    assert allocated(tmp_path) == [] and link(pod_netns, "eth0") is None


def test_existing_container_interface_is_an_error(bridge, node, pod_netns, tmp_path):
    with NetNS.open(pod_netns.path) as n, n.iproute() as ipr:
        netlink.create_veth_pair(ipr, "eth0", "other0")
    run = run_plugin_raw(bridge, "ADD", conf(tmp_path), container_id="c1",
                         netns=pod_netns.path, node=node)
    assert run.exit_code != 0 and "eth0" in run.doc["msg"] and "already exists" in run.doc["msg"]
    assert veths(node) == [] and allocated(tmp_path) == []


@pytest.mark.parametrize("env_mac, args_mac, rt_mac, want", [
    ("02:00:00:00:00:01", None, None, "02:00:00:00:00:01"),
    ("02:00:00:00:00:01", "02:00:00:00:00:02", None, "02:00:00:00:00:02"),
    ("02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03", "02:00:00:00:00:03"),
    (None, None, "02:00:00:00:00:03", "02:00:00:00:00:03"),
])
def test_mac_precedence(bridge, node, pod_netns, tmp_path, env_mac, args_mac, rt_mac, want):
    top = {}
    if args_mac:
        top["args"] = {"cni": {"mac": args_mac}}
    if rt_mac:
        top["runtimeConfig"] = {"mac": rt_mac}
    c = conf(tmp_path, **top)
    r = add(bridge, c, node, pod_netns, cni_args=f"IgnoreUnknown=1;MAC={env_mac}"
            if env_mac else "")
    assert r["interfaces"][2]["mac"] == want and link(pod_netns, "eth0").mac == want
    delete(bridge, c, node, pod_netns)


def test_layer2_only_and_disabled_container_interface(bridge, node, netns_factory, tmp_path):
    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path, ipam=None)
    r = add(bridge, c, node, pod)
    assert "ips" not in r and len(r["interfaces"]) == 3
    assert link(pod, "eth0").up and addrs(pod, "eth0") == []
    delete(bridge, c, node, pod)

    pod2 = netns_factory("cnsk-pod")
    c2 = conf(tmp_path, ipam=None, disableContainerInterface=True)
    add(bridge, c2, node, pod2, cid="c2")
    assert not link(pod2, "eth0").up
    delete(bridge, c2, node, pod2, cid="c2")
    assert veths(node) == []


def test_dns_from_config_overrides_ipam(bridge, node, pod_netns, tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.1.1.1\nsearch ipam.example\n")
    c = conf(tmp_path)
    c["ipam"]["resolvConf"] = str(resolv)
    r = add(bridge, c, node, pod_netns)
    assert r["dns"] == {"nameservers": ["10.1.1.1"], "search": ["ipam.example"]}
    delete(bridge, c, node, pod_netns)
    c["dns"] = {"nameservers": ["10.2.2.2"]}
    r = add(bridge, c, node, pod_netns)
    assert r["dns"] == {"nameservers": ["10.2.2.2"]}
    delete(bridge, c, node, pod_netns)


def test_status_forwards_to_ipam(bridge, node, tmp_path):
    c = conf(tmp_path, ipMasq=True)
    assert run_plugin(bridge, "STATUS", c, container_id="", netns="", ifname="",
                      node=node) is None
    bad = conf(tmp_path)
    bad["ipam"]["type"] = "no-such-ipam"
    run = run_plugin_raw(bridge, "STATUS", bad, container_id="", netns="", ifname="",
                         node=node)
    assert run.exit_code != 0 and "no-such-ipam" in run.doc["msg"]


def test_root_namespace_untouched(bridge, node, pod_netns, tmp_path):
    with IPRoute() as ipr:
        before = {m.get("IFLA_IFNAME") for m in ipr.get_links()}
    c = conf(tmp_path, ipMasq=True, macspoofchk=True)
    add(bridge, c, node, pod_netns)
    with IPRoute() as ipr:
        assert {m.get("IFLA_IFNAME") for m in ipr.get_links()} == before
    delete(bridge, c, node, pod_netns)
