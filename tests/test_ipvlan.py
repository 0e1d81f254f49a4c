"""ipvlan through the real executable beside each Go yardstick's ipvlan
(Debian's 1.1.1, upstream 1.9.1 when built: tests/yardsticks.py), on a
veth master whose peer is a "LAN" namespace. This machine's kernel may have
no ipvlan: the tests are marked ``kernel("ipvlan")`` and then run in the
suite's VM (tests/kernelvm.py), so there are few, each checking a lot."""

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
    pod_state,
    refused,
    side_by_side,
)

from cni_skel import netlink
from cni_skel.harness import icmp_ping
from cni_skel.netns import NetNS

pytestmark = pytest.mark.kernel("ipvlan")

NET = "ipvnet"
LAN_IP = "10.56.0.1/24"


@pytest.fixture(scope="session")
def ipvlan(cni_bin: str) -> str:
    return os.path.join(cni_bin, "ipvlan")


def conf(data_dir, version="1.0.0", **top) -> dict:
    # A gateway on the route: Go 1.1.1's CHECK misses a route given without one.
    route = {"dst": "10.66.0.0/16", "gw": "10.56.0.1"}
    return merged({"cniVersion": version, "name": NET, "type": "ipvlan", "master": "eth0",
                   "ipam": host_local(data_dir, "10.56.0.0/24", routes=[route])}, top)


def setup(netns_factory):
    lan = make_lan(netns_factory, lan_ips=(LAN_IP,))
    return lan.node, netns_factory("cnsk-pod")


def test_same_as_go_reaches_the_lan_check_del(ipvlan, go_yardstick, netns_factory, tmp_path):
    """For 0.3.1, 0.4.0 and 1.0.0: the result equals Go's (MAC and sandbox
    masked), the pod's link too (kind, mode, MTU, addresses, routes); CHECK
    passes, then names what differs; DEL twice. The LAN pings the pod (l2);
    DEL with the netns gone."""
    for version, mode in (("0.3.1", "l3"), ("0.4.0", "l2"), ("1.0.0", "l2")):
        def conf_of(who, v=version, m=mode):
            return conf(tmp_path / who, v, mode=m, mtu=1400, dns={"nameservers": ["10.56.0.1"]})

        def differs(node, pod, prev):
            check_fails(ipvlan, {**prev, "prevResult": None}, node, pod, "prevResult", code=7)
            check_fails(ipvlan, dict(prev, mode="l3s"),
                        node, pod, "Container IPVlan mode l2 does not match expected value: l3s")
            address = prev["prevResult"]["ips"][0]["address"]
            with NetNS.open(pod.path) as n, n.rtnl() as ipr:
                netlink.del_address(ipr, "eth0", address)
            check_fails(ipvlan, prev, node, pod, f'IP address {address} not found on "eth0"')

        run = side_by_side(ipvlan, go_yardstick, conf_of, netns_factory, setup)
        run.same()
        node, pod = run.o
        link, master = link_of(pod, "eth0"), link_of(node, "eth0")
        assert (link.kind, link.mode, link.mtu, link.up) == ("ipvlan", mode, 1400, True)
        assert link.parent == master.index and link.mac == master.mac  # the master's MAC
        assert run.mine["interfaces"][0]["mac"] == master.mac
        run.finish(conf_of, version, NET, tmp_path, differs if version == "1.0.0" else None)

    lan = make_lan(netns_factory, lan_ips=(LAN_IP,))
    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path / "ours")
    r = call(ipvlan, "ADD", c, lan.node, pod)
    assert icmp_ping(lan.lan, r["ips"][0]["address"].split("/")[0], count=2, timeout=2)
    del_with_netns_gone(ipvlan, c, lan.node, pod, tmp_path / "ours", NET)
    assert links_of(lan.node) == ["lo", "eth0"]


def test_chained_and_failures(ipvlan, go_yardstick, netns_factory, tmp_path):
    """Chained without IPAM (Go 1.1.1): the master is prevResult's single
    interface, the addresses prevResult's, the same result as Go's. A bad
    master is Go's code; an IPAM failure leaves nothing; config errors are
    code 7 naming the key; GC and STATUS go to IPAM."""
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.56.0.9/24", "gateway": "10.56.0.1"}],
            "routes": [{"dst": "10.67.0.0/16"}]}
    chained = {"cniVersion": "1.0.0", "name": NET, "type": "ipvlan", "prevResult": prev}
    run = side_by_side(ipvlan, go_yardstick, lambda _who: chained, netns_factory, setup)
    run.same()
    assert pod_state(run.o[1])["addresses"] == ["10.56.0.9/24"]
    call(ipvlan, "DEL", chained, *run.o)
    assert link_of(run.o[1], "eth0") is None

    bad_master_as_go(ipvlan, go_yardstick.exe("ipvlan"), conf(tmp_path, master="nope"),
                     netns_factory, setup)
    node, pod = setup(netns_factory)
    refused(ipvlan, conf(tmp_path, ipam={"type": "no-such-ipam"}), node, pod, 7, "no-such-ipam")
    for top, text in (({"mode": "l4"}, 'mode: Value error, unknown ipvlan mode: "l4"'),
                      ({"mtu": 9000}, "invalid MTU 9000, must be [0, master MTU(1500)]"),
                      ({"ipam": None}, "requires an IPAM configuration"),
                      ({"master": "", "prevResult": dict(prev, interfaces=[])},
                       "chained master failure")):
        refused(ipvlan, conf(tmp_path, **top), node, pod, 7, text)
    assert links_of(pod) == ["lo"]
    gc_and_status_go_to_ipam(ipvlan, conf(tmp_path, "1.1.0"), node, pod, tmp_path, NET)
