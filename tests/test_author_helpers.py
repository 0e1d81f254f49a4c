"""The SDK pieces every veth plugin needs (issue 21, "Authors"):
`cni_skel.veth.setup_veth` (Go ``ip.SetupVeth``), `cni_skel.sysctl.enable_forward`
(Go ``ip.EnableForward``), `cni_skel.ipam.configure_iface` (Go
``ipam.ConfigureIface``) and `cni_skel.masq` (Go ``ip.SetupIPMasq`` /
``TeardownIPMasq``, as per-network sets), against the kernel of test
namespaces; and the namespace fixtures of `cni_skel.testing` as an author's
conftest tunes them."""

from __future__ import annotations

import ipaddress
import os
import re

import pytest

from cni_skel import CNIError, Interface, IPConfig, Result, Route, netlink
from cni_skel.harness import SUITE_TAG
from cni_skel.ipam import configure_iface
from cni_skel.masq import (
    FAMILY,
    TABLE,
    Masquerade,
    check_ip_masq,
    gc_ip_masq,
    setup_ip_masq,
    teardown_ip_masq,
)
from cni_skel.netns import NetNS
from cni_skel.nft import Nft, generation
from cni_skel.sysctl import enable_forward, read_sysctl, write_sysctl
from cni_skel.veth import random_veth_name, setup_veth

A = ipaddress.ip_interface


def _named(ns, prefix):
    return re.fullmatch(rf"{re.escape(prefix)}-{os.getpid()}-{SUITE_TAG}-\d+", ns.name) \
        and ns.path == f"/run/netns/{ns.name}" and os.path.exists(ns.path)


def test_netns_fixtures_default_to_cnsk(netns_factory, node_netns, pod_netns, cni_netns_prefix):
    assert cni_netns_prefix == "cnsk"
    assert _named(node_netns, "cnsk-node") and _named(pod_netns, "cnsk-pod")
    assert _named(netns_factory(), "cnsk") and _named(netns_factory("mine"), "mine")


class TestPrefixOverride:
    """What an author's conftest.py does: a ``cni_netns_prefix`` fixture of
    its own (here for this class only)."""

    @pytest.fixture
    def cni_netns_prefix(self):
        yield "cnsk-author"
        # netns_factory needs this fixture, so it is torn down first: by now
        # every namespace of this test must be gone.
        ours = f"-{os.getpid()}-{SUITE_TAG}-"
        assert [n for n in os.listdir("/run/netns")
                if n.startswith("cnsk-author") and ours in n] == []

    def test_names_follow_the_prefix(self, netns_factory, node_netns, pod_netns):
        assert _named(node_netns, "cnsk-author-node") and _named(pod_netns, "cnsk-author-pod")
        assert _named(netns_factory(), "cnsk-author") and _named(netns_factory("x"), "x")


def test_random_veth_name_is_gos_format():
    names = {random_veth_name() for _ in range(50)}
    assert len(names) == 50 and all(re.fullmatch(r"veth[0-9a-f]{8}", n) for n in names)


def test_setup_veth(node_netns, pod_netns):
    with NetNS.open(node_netns.path) as node, NetNS.open(pod_netns.path) as pod, \
            node.rtnl() as ipr, pod.rtnl() as cipr:
        host, cont = node.run(setup_veth, ipr, pod, "eth0", mtu=1400,
                              mac="0a:58:0a:01:00:05", peer_ipr=cipr)
        assert re.fullmatch(r"veth[0-9a-f]{8}", host.name) and cont.name == "eth0"
        assert host.up and cont.up and cont.mac == "0a:58:0a:01:00:05"
        now_host, now_cont = netlink.find_link(ipr, host.name), netlink.find_link(cipr, "eth0")
        assert now_host.up and now_cont.up and now_host.mtu == now_cont.mtu == 1400
        assert now_cont.mac == "0a:58:0a:01:00:05" and now_cont.peer_index == host.index
        assert node.run(read_sysctl, f"net/ipv6/conf/{host.name}/accept_ra") == "0"
        # the pod's name taken: 999 naming it, nothing new left on the node
        before = netlink.find_link(ipr, host.name)
        with pytest.raises(CNIError) as err:
            node.run(setup_veth, ipr, pod, "eth0", peer_ipr=cipr)
        assert err.value.code == 999 and '"eth0" already exists' in err.value.msg
        # a given host name that is taken is not retried
        with pytest.raises(netlink.LinkExists):
            node.run(setup_veth, ipr, pod, "eth1", host_name=host.name, peer_ipr=cipr)
        assert netlink.find_link(cipr, "eth1") is None
        # up=False leaves both ends down (a bridge sets port flags and IFF_UP at once)
        h2, c2 = node.run(setup_veth, ipr, pod, "eth2", up=False)
        assert not (h2.up or c2.up)
        assert not netlink.find_link(ipr, h2.name).up and not netlink.find_link(cipr, "eth2").up
        assert netlink.find_link(ipr, host.name) == before


def _pod_view(pod, cipr, name="eth0"):
    """What the kernel holds for ``name``: link state, its addresses, routes
    through it (all tables) and the sysctls configure_iface writes."""
    link = netlink.find_link(cipr, name)
    keys = [f"net/ipv6/conf/{d}/{k}" for d in ("lo", name)
            for k in ("disable_ipv6", "keep_addr_on_down")]
    return (link.up, link.flags, netlink.addresses(cipr, link),
            [r for r in netlink.routes(cipr, table=None) if r["oif"] == link.index],
            pod.run(lambda: [read_sysctl(k) for k in keys]))


def _two_link_result(ips):
    return Result(interfaces=[Interface(name="eth0"), Interface(name="eth1")],
                  ips=[IPConfig(address=a, gateway=g, interface=i) for a, g, i in ips],
                  routes=[Route(dst="0.0.0.0/0"), Route(dst="10.99.0.0/16", gw="10.60.0.9")])


@pytest.mark.parametrize("bad", [1, 2, -1], ids=["other-interface", "past-the-end", "negative"])
def test_configure_iface_refuses_before_any_change(node_netns, pod_netns, bad):
    """Go's ipam.ConfigureIface refuses an index naming another interface
    after adding the entries before it; ours checks the whole result first."""
    with NetNS.open(node_netns.path) as node, NetNS.open(pod_netns.path) as pod, \
            node.rtnl() as ipr, pod.rtnl() as cipr:
        host, cont = node.run(setup_veth, ipr, pod, "eth0", up=False, peer_ipr=cipr)
        netlink.link_up(ipr, host)      # a carrier once eth0 is up: IPv6 DAD can finish
        result = _two_link_result([("10.60.0.5/24", "10.60.0.1", 0),
                                   ("fd00:60::5/64", "fd00:60::1", 0),
                                   ("10.61.0.5/24", None, bad)])
        before = _pod_view(pod, cipr)
        assert not before[0] and before[2] == [] and before[3] == []
        assert before[4][3] == "0"                       # eth0's keep_addr_on_down
        for link in ("eth0", cont):                      # by name, or the Link
            with pytest.raises(CNIError) as err:
                configure_iface(pod, link, result, ipr=cipr)
            assert err.value.code == 999
            assert err.value.msg == ('failed to add IP addr 10.61.0.5/24 to "eth0": '
                                     'invalid interface index')
            assert _pod_view(pod, cipr) == before
        # the same result without the stray entry goes through; no index: skipped
        result.ips[2].interface = None
        configure_iface(pod, cont, result, ipr=cipr)
        up, _flags, addrs, routes, sysctls = _pod_view(pod, cipr)
        assert up and {str(a) for a in addrs} >= {"10.60.0.5/24", "fd00:60::5/64"}
        assert "10.61.0.5/24" not in {str(a) for a in addrs}
        assert {(str(r["dst"]), str(r["gw"])) for r in routes} >= {
            ("0.0.0.0/0", "10.60.0.1"), ("10.99.0.0/16", "10.60.0.9")}
        assert sysctls[2:] == ["0", "1"]                 # IPv6 on, keep_addr_on_down


def test_enable_forward_turns_on_the_families_given(node_netns):
    with NetNS.open(node_netns.path) as node:
        def work():
            write_sysctl("net/ipv4/ip_forward", "0")
            write_sysctl("net/ipv6/conf/all/forwarding", "0")
            enable_forward([A("10.1.0.5/24")])
            v4 = read_sysctl("net/ipv4/ip_forward"), read_sysctl("net/ipv6/conf/all/forwarding")
            enable_forward([ipaddress.ip_address("fd00::5"), 4])
            return v4, read_sysctl("net/ipv6/conf/all/forwarding")
        assert node.run(work) == (("1", "0"), "1")
        with pytest.raises(CNIError) as err:
            node.run(enable_forward, [5])
        assert err.value.code == 7


def _elements(table, masq, tag):
    return sorted(str(v) for ver in (4, 6) for name in masq.set_names(ver)
                  for v, c in table.elements(name) if c == tag)


def test_masquerade_per_network_flat_and_found_by_tag(node_netns):
    def work():
        a, b = Masquerade("net-a"), Masquerade("net-b")
        setup_ip_masq("net-a", "c1/eth0", [A("10.50.0.2/24"), A("fd00:50::2/64")])
        setup_ip_masq("net-b", "c1/eth0", [A("10.51.0.2/24")])     # same tag, other network
        g = generation()
        setup_ip_masq("net-a", "c2/eth0", [A("10.50.0.3/24")])
        assert generation() == g + 1                    # a pod is one transaction
        check_ip_masq("net-a", "c2/eth0", [A("10.50.0.3/24")])
        with pytest.raises(CNIError) as err:
            check_ip_masq("net-a", "c9/eth0", [A("10.50.0.9/24")])
        assert err.value.code == 999 and "10.50.0.9" in err.value.msg
        table = Nft().table(FAMILY, TABLE)
        assert _elements(table, a, "c1/eth0")[:2] == ["10.50.0.2", "fd00:50::2"]
        assert len(table.chain_rules("postrouting")) == 4   # two jumps per network, no more
        assert table.chain_rules(a.id)[-1]["expr"] == [{"masquerade": None}]

        teardown_ip_masq("net-a", "c1/eth0")
        g = generation()
        teardown_ip_masq("net-a", "c1/eth0")            # repeatable, and costs nothing
        assert generation() == g
        table = Nft().table(FAMILY, TABLE)
        assert _elements(table, a, "c1/eth0") == []
        left = _elements(table, b, "c1/eth0")          # net-b's: pods4 and local4
        assert len(left) == 2 and left[0] == "10.51.0.2" and "10.51.0.0" in left[1]
        gc_ip_masq("net-a", keep=set())                 # only net-a's elements go
        table = Nft().table(FAMILY, TABLE)
        assert _elements(table, a, "c2/eth0") == []
        assert _elements(table, b, "c1/eth0") != []
        gc_ip_masq("net-b", keep={"c1/eth0"})
        check_ip_masq("net-b", "c1/eth0", [A("10.51.0.2/24")])

    with NetNS.open(node_netns.path) as node:
        node.run(work)


def test_masquerade_in_a_table_of_the_callers(node_netns):
    """The bridge keeps its table (cni_skel_bridge) on nodes: `table=`."""
    def work():
        setup_ip_masq("net-a", "c1/eth0", [A("10.50.0.2/24")], table="t_own")
        assert Nft().table(FAMILY, TABLE) is None
        check_ip_masq("net-a", "c1/eth0", [A("10.50.0.2/24")], table="t_own")
        teardown_ip_masq("net-a", "c1/eth0", table="t_own")
        assert _elements(Nft().table(FAMILY, "t_own"), Masquerade("net-a"), "c1/eth0") == []

    with NetNS.open(node_netns.path) as node:
        node.run(work)
