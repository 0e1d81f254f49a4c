"""macvlan through the real executable, run in a node namespace as a runtime
runs it, side by side with each Go yardstick's macvlan (Debian's 1.1.1,
upstream 1.9.1 when built: tests/yardsticks.py, the differences accepted
named there). The
master is a veth end in the node whose peer sits in a "LAN" namespace, so
the LAN reaches the pod over the macvlan. Kernel state is read back with
netlink; IPAM is our host-local (Go's for Go's macvlan)."""

from __future__ import annotations

import os

import pytest
from podlink_common import (
    allocated,
    bad_master_as_go,
    call,
    call_raw,
    check_fails,
    del_with_netns_gone,
    gc_and_status_go_to_ipam,
    host_local,
    link_of,
    links_of,
    make_lan,
    merged,
    pod_state,
    refused,
    side_by_side,
)

from cni_skel import netlink
from cni_skel.harness import icmp_ping
from cni_skel.netns import NetNS
from cni_skel.sysctl import read_sysctl, write_sysctl

NET = "mvnet"
LAN_IP = "10.55.0.1/24"


@pytest.fixture(scope="session")
def macvlan(cni_bin: str) -> str:
    return os.path.join(cni_bin, "macvlan")


def conf(data_dir, version="1.0.0", **top) -> dict:
    return merged({"cniVersion": version, "name": NET, "type": "macvlan", "master": "eth0",
                   "ipam": host_local(data_dir, "10.55.0.0/24")}, top)


def setup(netns_factory):
    lan = make_lan(netns_factory, lan_ips=(LAN_IP,))
    return lan.node, netns_factory("cnsk-pod")


def neighbour_mac(ns, ip: str) -> str | None:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        for msg in ipr.get_neighbours(dst=ip):
            if msg.get_attr("NDA_LLADDR"):
                return msg.get_attr("NDA_LLADDR")
    return None


# --- the main job ------------------------------------------------------------


def test_pod_on_the_lan_check_del(macvlan, netns_factory, tmp_path):
    """ADD (dual stack, a route, mode and MTU), the LAN learns the pod's MAC
    from the announcement and pings it over the macvlan, CHECK passes, DEL
    twice leaves nothing."""
    lan = make_lan(netns_factory, lan_ips=(LAN_IP, "fd00:55::1/64"))
    pod = netns_factory("cnsk-pod")
    with NetNS.open(lan.lan.path) as ln:  # the LAN takes gratuitous ARP in
        ln.run(write_sysctl, "net/ipv4/conf/lan0/arp_accept", "1")
    c = conf(tmp_path, mode="private", mtu=1400, dns={"nameservers": ["10.55.0.1"]},
             ipam=host_local(tmp_path, "10.55.0.0/24", "fd00:55::/64",
                             routes=[{"dst": "10.66.0.0/16"}]))
    r = call(macvlan, "ADD", c, lan.node, pod)
    link = link_of(pod, "eth0")
    assert r["interfaces"] == [{"name": "eth0", "mac": link.mac, "sandbox": pod.path}]
    assert [ip["address"] for ip in r["ips"]] == ["10.55.0.2/24", "fd00:55::2/64"]
    assert {ip["interface"] for ip in r["ips"]} == {0}
    assert r["dns"] == {"nameservers": ["10.55.0.1"]}
    master = link_of(lan.node, "eth0")
    assert (link.kind, link.mode, link.mtu, link.up) == ("macvlan", "private", 1400, True)
    assert link.parent == master.index and link.link_netnsid is not None
    state = pod_state(pod)
    assert state["addresses"] == ["10.55.0.2/24", "fd00:55::2/64"]
    assert ("10.66.0.0/16", "10.55.0.1") in state["routes"]
    with NetNS.open(pod.path) as n:
        for key in ("ipv4/conf/eth0/arp_notify", "ipv6/conf/eth0/ndisc_notify"):
            assert n.run(read_sysctl, f"net/{key}") == "1", key
    assert neighbour_mac(lan.lan, "10.55.0.2") == link.mac  # announced, before any ping
    assert icmp_ping(lan.lan, "10.55.0.2", count=2, timeout=1)
    assert links_of(lan.node) == ["lo", "eth0"]  # nothing on the node side

    call(macvlan, "CHECK", dict(c, prevResult=r), lan.node, pod)
    for _ in range(2):
        assert call(macvlan, "DEL", c, lan.node, pod) is None
    assert link_of(pod, "eth0") is None and allocated(tmp_path, NET) == []
    assert link_of(lan.node, "eth0") is not None  # the master stays


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_same_result_and_kernel_state_as_go(macvlan, go_yardstick, netns_factory, tmp_path,
                                            version):
    """Same config, same CNI_ARGS MAC: the results are equal key for key
    (sandbox masked) and so is the pod's link; both CHECK (0.4.0+) and DEL
    twice."""
    def conf_of(who):
        return conf(tmp_path / who, version, mode="vepa", mtu=1450,
                    dns={"nameservers": ["10.55.0.1"], "search": ["lan"]},
                    ipam=host_local(tmp_path / who, "10.55.0.0/24",
                                    routes=[{"dst": "0.0.0.0/0"}]))

    run = side_by_side(macvlan, go_yardstick, conf_of, netns_factory, setup,
                       cni_args="IgnoreUnknown=1;MAC=02:55:00:00:00:05")
    run.same()
    assert run.mine["interfaces"][0]["mac"] == run.theirs["interfaces"][0]["mac"] \
        == "02:55:00:00:00:05"
    assert pod_state(run.o[1], with_mac=True) == pod_state(run.g[1], with_mac=True)
    assert pod_state(run.o[1])["mode"] == "vepa"
    run.finish(conf_of, version, NET, tmp_path)


def test_layer2_only_same_as_go(macvlan, go_yardstick, netns_factory, tmp_path):
    """No IPAM: the link is up with no address; the result holds the
    interface only, as Go's at 0.3.1 and 1.0.0;
    0.2.0 cannot carry it: code 1 and nothing made (Go: 999, link left)."""
    for version in ("0.3.1", "1.0.0"):
        run = side_by_side(macvlan, go_yardstick,
                           lambda _who, v=version: conf(tmp_path, v, ipam=None),
                           netns_factory, setup)
        run.same()
        # an empty dns: printed at 0.3.1, left out at 1.0.0 (as Go >= 1.6)
        assert "ips" not in run.mine and run.mine.get("dns") == ({} if version < "1" else None)
        assert pod_state(run.o[1])["up"] and pod_state(run.o[1])["addresses"] == []
        call(macvlan, "CHECK", dict(conf(tmp_path, ipam=None), prevResult=run.mine), *run.o)
    node, pod = setup(netns_factory)
    refused(macvlan, conf(tmp_path, "0.2.0", ipam=None), node, pod, 1, "version 0.2.0")
    assert link_of(pod, "eth0") is None


# --- CHECK --------------------------------------------------------------------


def test_check_names_what_differs(macvlan, netns_factory, tmp_path):
    node, pod = setup(netns_factory)
    c = conf(tmp_path, ipam=host_local(tmp_path, "10.55.0.0/24", routes=[{"dst": "10.66.0.0/16"}]))
    r = call(macvlan, "ADD", c, node, pod)
    prev = dict(c, prevResult=r)
    call(macvlan, "CHECK", prev, node, pod)

    def fails(config, *words, code=999):
        check_fails(macvlan, config, node, pod, *words, code=code)

    fails(c, "prevResult", code=7)
    fails(dict(prev, mode="private"), "mode bridge does not match expected value: private")
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        netlink.create_veth_pair(ipr, "eth1", "eth1p")
    fails(dict(prev, master="eth1"), 'not on master "eth1"')
    fails(dict(prev, master="nope"), 'failed to lookup master "nope"')
    other = dict(r, interfaces=[dict(r["interfaces"][0], mac="02:00:00:00:00:99")])
    fails(dict(c, prevResult=other), "Mac 02:00:00:00:00:99 doesn't match")
    other = dict(r, interfaces=[dict(r["interfaces"][0], sandbox="/run/netns/elsewhere")])
    fails(dict(c, prevResult=other), "Sandbox in prevResult")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.del_route(ipr, "10.66.0.0/16", dev="eth0")
    fails(prev, "route 10.66.0.0/16 not found")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.del_address(ipr, "eth0", "10.55.0.2/24")
    fails(prev, "10.55.0.2/24", '"eth0"')
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.link_down(ipr, "eth0")
    fails(prev, "eth0 is down")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.delete_link(ipr, "eth0")
        netlink.create_veth_pair(ipr, "eth0", "peer0")
    fails(prev, "not of type macvlan")
    call(macvlan, "DEL", c, node, pod)
    assert link_of(pod, "eth0") is not None  # DEL leaves a link that is not a macvlan
    assert allocated(tmp_path, NET) == []


# --- DEL and failures -----------------------------------------------------------


def test_del_with_the_netns_gone(macvlan, netns_factory, tmp_path):
    node, pod = setup(netns_factory)
    c = conf(tmp_path)
    call(macvlan, "ADD", c, node, pod)
    assert allocated(tmp_path, NET) == ["10.55.0.2"]
    del_with_netns_gone(macvlan, c, node, pod, tmp_path, NET)
    # The master is not needed: a DEL after it went still succeeds (Go 1.1.1 fails).
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        netlink.delete_link(ipr, "eth0")
    call(macvlan, "DEL", c, node, None)


def test_failed_add_leaves_nothing(macvlan, go_yardstick, netns_factory, tmp_path):
    """Bad master (Go's code), a name taken in the pod (Go's code), an IPAM
    that fails, a route the kernel refuses after IPAM: no link, no address."""
    bad_master_as_go(macvlan, go_yardstick.exe("macvlan"), conf(tmp_path, master="nope"),
                     netns_factory, setup)
    for exe, d in ((macvlan, "ours"), (go_yardstick.exe("macvlan"), "go")):
        node, pod = setup(netns_factory)
        with NetNS.open(pod.path) as n, n.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "eth0", "peer0")
        refused(exe, conf(tmp_path / d), node, pod, 999, "file exists",
                cni_path=None if d == "ours" else go_yardstick.dir)
        assert link_of(pod, "eth0").kind == "veth"  # the pod's own link untouched
        assert allocated(tmp_path / d, NET) == []

    node, pod = setup(netns_factory)
    full = conf(tmp_path, ipam=host_local(tmp_path, "10.55.0.0/30"))  # one address
    call(macvlan, "ADD", full, node, pod, cid="first")
    other = netns_factory("cnsk-pod")
    refused(macvlan, full, node, other, 50, "", cid="second")  # host-local: no address left
    assert links_of(other) == ["lo"]
    call(macvlan, "DEL", full, node, pod, cid="first")

    bad_route = conf(tmp_path, ipam=host_local(
        tmp_path, "10.55.0.0/24", routes=[{"dst": "10.77.0.0/16", "gw": "10.200.0.1"}]))
    refused(macvlan, bad_route, node, pod, 999, "10.77.0.0/16")
    assert links_of(pod) == ["lo"] and allocated(tmp_path, NET) == []
    assert links_of(node) == ["lo", "eth0"]


def test_bad_config_is_code_7_naming_the_key(macvlan, netns_factory, tmp_path):
    node, pod = setup(netns_factory)
    for top, code, text in [
        ({"mode": "foo"}, 7, 'mode: Value error, unknown macvlan mode: "foo"'),
        ({"mtu": -1}, 7, "mtu"),
        ({"mtu": 9000}, 7, "invalid MTU 9000, must be [0, master MTU(1500)]"),
        ({"mac": "zz"}, 7, "mac"),
        ({"runtimeConfig": {"mac": "02:00:00:00:00"}}, 7, "runtimeConfig: Value error, mac: "),
        ({"args": {"cni": {"mac": 5}}}, 7, "args: Value error, cni.mac: "),
        ({"linkInContainer": "x"}, 7, "linkInContainer"),
        ({"master": "a/b"}, 7, "master"),
        ({"bcqueuelen": -1}, 7, "bcqueuelen"),
        ({"bcqueuelen": 2**32}, 7, "bcqueuelen"),
    ]:
        refused(macvlan, conf(tmp_path, **top), node, pod, code, text)
    refused(macvlan, conf(tmp_path), node, pod, 4, "MAC", cni_args="MAC=zz")
    assert links_of(pod) == ["lo"] and allocated(tmp_path, NET) == []


# --- where the master comes from, the MAC ---------------------------------------


def test_default_master_and_link_in_container(macvlan, netns_factory, tmp_path):
    """No ``master``: the node's default-route interface, as Go; with
    ``linkInContainer`` the master is a link of the pod and the macvlan is
    made beside it. Both reach the LAN."""
    lan = make_lan(netns_factory, master="uplink0", lan_ips=(LAN_IP,),
                   default_route="10.55.0.1")
    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path, master="")
    call(macvlan, "ADD", c, lan.node, pod)
    assert link_of(pod, "eth0").parent == link_of(lan.node, "uplink0").index
    assert icmp_ping(pod, "10.55.0.1", count=1, timeout=1)
    call(macvlan, "DEL", c, lan.node, pod)

    node = netns_factory("cnsk-node")
    lan2 = make_lan(netns_factory, master="vf0", lan_ips=(LAN_IP,), node=pod)  # master in pod
    c = conf(tmp_path, master="vf0", linkInContainer=True)
    r = call(macvlan, "ADD", c, node, lan2.node, ifname="net1")
    link = link_of(pod, "net1")
    assert link.parent == link_of(pod, "vf0").index and link.link_netnsid is None
    assert icmp_ping(lan2.lan, r["ips"][0]["address"].split("/")[0], count=1, timeout=1)
    call(macvlan, "CHECK", dict(c, prevResult=r), node, pod, ifname="net1")
    call(macvlan, "DEL", c, node, pod, ifname="net1")
    assert links_of(pod) == ["lo", "vf0"] and links_of(node) == ["lo"]


def test_mac_precedence_as_go(macvlan, go_yardstick, netns_factory, tmp_path):
    """``mac`` < CNI_ARGS ``MAC`` < ``args.cni.mac`` (ours, as bridge) <
    ``runtimeConfig.mac``; Go agrees where it has the key."""
    node, pod = setup(netns_factory)
    go_node, go_pod = setup(netns_factory)
    cases = [({"mac": "02:00:00:00:00:01"}, "", "02:00:00:00:00:01"),
             ({"mac": "02:00:00:00:00:01"}, "MAC=02:00:00:00:00:02", "02:00:00:00:00:02"),
             ({"runtimeConfig": {"mac": "02:00:00:00:00:03"}}, "MAC=02:00:00:00:00:02",
              "02:00:00:00:00:03")]
    for top, env, want in cases:
        c = conf(tmp_path, ipam=None, **top)
        r = call(macvlan, "ADD", c, node, pod, cni_args=env)
        g = call(go_yardstick.exe("macvlan"), "ADD", c, go_node, go_pod, cni_args=env)
        assert r["interfaces"][0]["mac"] == g["interfaces"][0]["mac"] == want
        assert link_of(pod, "eth0").mac == want
        call(macvlan, "DEL", c, node, pod)
        call(go_yardstick.exe("macvlan"), "DEL", c, go_node, go_pod)
    c = conf(tmp_path, ipam=None, args={"cni": {"mac": "02:00:00:00:00:04"}})
    assert call(macvlan, "ADD", c, node, pod, cni_args="MAC=02:00:00:00:00:02")[
        "interfaces"][0]["mac"] == "02:00:00:00:00:04"
    call(macvlan, "DEL", c, node, pod)


def bc_queue_len(ns, name: str) -> int | None:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        (msg,) = ipr.get_links(ifname=name)
        return msg.get_attr("IFLA_LINKINFO").get_attr("IFLA_INFO_DATA").get_attr(
            "IFLA_MACVLAN_BC_QUEUE_LEN")


def test_bcqueuelen_reaches_the_kernel(macvlan, netns_factory, tmp_path):
    """``bcqueuelen`` (Go >= 1.6's key) is the macvlan's broadcast queue
    length in the kernel; 0 or no key leaves the kernel's 1000."""
    node, pod = setup(netns_factory)
    for top, want in (({"bcqueuelen": 3000}, 3000), ({"bcqueuelen": 0}, 1000), ({}, 1000)):
        c = conf(tmp_path, ipam=None, **top)
        call(macvlan, "ADD", c, node, pod)
        assert bc_queue_len(pod, "eth0") == want
        call(macvlan, "DEL", c, node, pod)
        assert links_of(pod) == ["lo"]


def test_gc_and_status_go_to_ipam(macvlan, netns_factory, tmp_path):
    node, pod = setup(netns_factory)
    gc_and_status_go_to_ipam(macvlan, conf(tmp_path, "1.1.0"), node, pod, tmp_path, NET)
    bad = conf(tmp_path, "1.1.0", ipam={"type": "no-such-ipam"})
    run = call_raw(macvlan, "STATUS", bad, node, None, cid="", ifname="")
    assert run.exit_code == 1 and "no-such-ipam" in run.doc["msg"]
