"""vlan through the real executable beside each Go yardstick's vlan (Debian's
1.1.1, upstream 1.9.1 when built: tests/yardsticks.py), on a veth
master whose peer is a "LAN" namespace that speaks the same VLAN. This
machine's kernel may have no 8021q: the tests are marked ``kernel("8021q")``
and then run in the suite's VM (tests/kernelvm.py), so there are few, each
checking a lot."""

from __future__ import annotations

import os

import pytest
from podlink_common import (
    bad_master_as_go,
    call,
    check_fails,
    del_with_netns_gone,
    gc_and_status_go_to_ipam,
    host_local,
    link_of,
    links_of,
    make_lan,
    merged,
    refused,
    side_by_side,
)

from cni_skel import netlink
from cni_skel.harness import icmp_ping
from cni_skel.netns import NetNS

pytestmark = pytest.mark.kernel("8021q")

NET = "vlnet"
VID = 100


@pytest.fixture(scope="session")
def vlan(cni_bin: str) -> str:
    return os.path.join(cni_bin, "vlan")


def conf(data_dir, version="1.0.0", **top) -> dict:
    # A gateway on the route: Go 1.1.1's CHECK misses a route given without one.
    route = {"dst": "10.66.0.0/16", "gw": "10.57.0.1"}
    return merged({"cniVersion": version, "name": NET, "type": "vlan", "master": "eth0",
                   "vlanId": VID,
                   "ipam": host_local(data_dir, "10.57.0.0/24", routes=[route])}, top)


def vlan_lan(netns_factory):
    """A LAN whose ``lan0`` carries VLAN ``VID`` as ``lan0.100``, 10.57.0.1/24."""
    lan = make_lan(netns_factory)
    with NetNS.open(lan.lan.path) as n, n.rtnl() as ipr:
        tagged = netlink.create_vlan(ipr, "lan0.100", "lan0", VID)
        netlink.add_address(ipr, tagged, "10.57.0.1/24")
        netlink.link_up(ipr, tagged)
    return lan


def setup(netns_factory):
    return vlan_lan(netns_factory).node, netns_factory("cnsk-pod")


def test_same_as_go_tagged_traffic_check_del(vlan, go_yardstick, netns_factory, tmp_path):
    """For 0.3.1, 0.4.0 and 1.0.0: the result equals Go's (MAC and sandbox
    masked), the pod's link too (kind, VLAN ID, MTU, addresses, routes);
    CHECK passes, then names a VLAN ID and an MTU that differ; DEL twice.
    The LAN pings the pod over VLAN 100; DEL with the netns gone."""
    for version in ("0.3.1", "0.4.0", "1.0.0"):
        def conf_of(who, v=version):
            return conf(tmp_path / who, v, mtu=1400, dns={"nameservers": ["10.57.0.1"]})

        def differs(node, pod, prev):
            check_fails(vlan, {**prev, "prevResult": None}, node, pod, "prevResult", code=7)
            check_fails(vlan, dict(prev, vlanId=101), node, pod, "VLAN ID is 100, configured 101")
            check_fails(vlan, dict(prev, mtu=1300), node, pod, "configured MTU of eth0 is 1300")

        run = side_by_side(vlan, go_yardstick, conf_of, netns_factory, setup)
        run.same()
        node, pod = run.o
        link = link_of(pod, "eth0")
        assert (link.kind, link.vlan_id, link.mtu, link.up) == ("vlan", VID, 1400, True)
        assert link.parent == link_of(node, "eth0").index and link.link_netnsid is not None
        run.finish(conf_of, version, NET, tmp_path, differs if version == "1.0.0" else None)

    lan = vlan_lan(netns_factory)
    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path / "ours")
    r = call(vlan, "ADD", c, lan.node, pod)
    assert icmp_ping(lan.lan, r["ips"][0]["address"].split("/")[0], count=2, timeout=2)
    del_with_netns_gone(vlan, c, lan.node, pod, tmp_path / "ours", NET)
    assert links_of(lan.node) == ["lo", "eth0"]


def test_failures_leave_nothing(vlan, go_yardstick, netns_factory, tmp_path):
    """Config errors are code 7 with Go's texts (Go: 999), a bad master is
    Go's code, an IPAM failure leaves no link (Go 1.1.1 leaves it); GC and
    STATUS go to IPAM."""
    node, pod = setup(netns_factory)
    for top, text in (({"master": ""}, '"master" field is required'),
                      ({"vlanId": 4095}, "invalid VLAN ID 4095 (must be between 0 and 4095"),
                      ({"vlanId": "x"}, "vlanId"),
                      ({"ipam": None}, "vlan interface requires an IPAM configuration"),
                      ({"mtu": 9000}, "invalid MTU 9000, must be [0, master MTU(1500)]"),
                      ({"ipam": {"type": "no-such-ipam"}}, "no-such-ipam")):
        refused(vlan, conf(tmp_path, **top), node, pod, 7, text)
    assert links_of(pod) == ["lo"]
    bad_master_as_go(vlan, go_yardstick.exe("vlan"), conf(tmp_path, master="nope"),
                     netns_factory, setup)
    gc_and_status_go_to_ipam(vlan, conf(tmp_path, "1.1.0"), node, pod, tmp_path, NET)
