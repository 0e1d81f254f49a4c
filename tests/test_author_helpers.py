"""The SDK pieces every veth plugin needs (issue 21, "Authors"):
`cni_skel.veth.setup_veth` (Go ``ip.SetupVeth``), `cni_skel.sysctl.enable_forward`
(Go ``ip.EnableForward``) and `cni_skel.masq` (Go ``ip.SetupIPMasq`` /
``TeardownIPMasq``, as per-network sets), against the kernel of test
namespaces."""

from __future__ import annotations

import ipaddress
import re

import pytest

from cni_skel import CNIError, netlink
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
