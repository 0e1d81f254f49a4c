"""cni_skel.tc on real links in a namespace the test made: Go's TBF
arithmetic, TBF / ingress qdiscs and the u32 redirect filter made and read
back typed (on both socket kinds), the ifb link, and the error codes. The
plugin that uses them (and the traffic they shape) is tests/test_bandwidth.py."""

from __future__ import annotations

import pytest

from cni_skel import netlink, tc
from cni_skel.errors import CNIError
from cni_skel.netns import NetNS


@pytest.fixture(params=["rtnl", "iproute"])
def ipr(request, netns_factory):
    """A socket of either kind in a namespace holding veth pair va <-> vb, up."""
    ns = netns_factory("cnsk-tc")
    with NetNS.open(ns.path) as n, (n.rtnl() if request.param == "rtnl" else n.iproute()) as sock:
        netlink.create_veth_pair(sock, "va", "vb")
        netlink.link_up(sock, "va")
        netlink.link_up(sock, "vb")
        yield sock


def kinds(ipr, link) -> list[tuple[str, str, str]]:
    return [(q.kind, tc.format_handle(q.handle), tc.format_handle(q.parent))
            for q in tc.qdiscs(ipr, link)]


# --- arithmetic ---------------------------------------------------------------


@pytest.mark.parametrize(("rate", "burst", "want"), [
    # Go's own test values (Rate 2, Limit 1) and what Go 1.1.1 sent for these
    # (read back from the kernel after /usr/lib/cni/bandwidth made them).
    (16, 8, tc.TbfParameters(rate=2, buffer=7_812_500, limit=1)),
    (10_000_000, 2_000_000, tc.TbfParameters(rate=1_250_000, buffer=3_125_000, limit=281_250)),
    (16_000_000, 400_000, tc.TbfParameters(rate=2_000_000, buffer=390_625, limit=100_000)),
    (1_000_007, 99_999, tc.TbfParameters(rate=125_000, buffer=1_562_375, limit=15_624)),
])
def test_tbf_parameters_are_gos(rate, burst, want):
    got = tc.tbf_parameters(rate, burst)
    assert got == want
    assert abs(got.burst - burst // 8) <= 1  # the bucket, back in bytes


def test_tbf_parameters_saturate_where_go_wraps():
    """kubelet's "no limit" burst (2^31-1 bits) at 1 Mbit/s: 2147 s of
    bucket, 3.4e10 ticks; Go's uint32 wraps it, ours stays at 2^32-1."""
    got = tc.tbf_parameters(1_000_000, 2**31 - 1)
    assert got.buffer == 2**32 - 1 and got.limit == 125_000 * 25 // 1000 + (2**31 - 1) // 8
    assert tc.tbf_parameters(8 * 2**32, 8 * (2**32 - 2)).limit == 2**32 - 1


@pytest.mark.parametrize(("rate", "burst", "text"), [
    (7, 800, "less than one byte"), (8000, 0, "less than one byte"),
    (8000, 8 * (2**32 - 1), "burst cannot be more than 4GB"), (True, 800, "whole number"),
    (8000.0, 800, "whole number"), ("8000", 800, "whole number"),
])
def test_tbf_parameters_refuse_bad_values(rate, burst, text):
    with pytest.raises(CNIError) as e:
        tc.tbf_parameters(rate, burst)
    assert e.value.code == 7 and text in e.value.msg


def test_handles():
    assert tc.make_handle(1, 0) == 0x10000 and tc.make_handle(0xFFFF, 0) == 0xFFFF0000
    assert [tc.format_handle(h) for h in (0x10000, 0x10001, 0xFFFF0000, tc.HANDLE_INGRESS,
                                          tc.HANDLE_ROOT, 0)] == \
        ["1:", "1:1", "ffff:", "ffff:fff1", "root", "none"]
    with pytest.raises(CNIError) as e:
        tc.make_handle(0x10000, 0)
    assert e.value.code == 7


# --- qdiscs -------------------------------------------------------------------


def test_tbf_add_read_replace_delete(ipr):
    """add_tbf makes the root TBF ``1:`` that qdiscs reads back with the
    values sent; a second add is EEXIST (999 naming the link), replace
    changes it, del_qdisc gives the link its default back."""
    assert kinds(ipr, "va") == [("noqueue", "none", "root")]
    sent = tc.add_tbf(ipr, "va", 10_000_000, 2_000_000)
    (q,) = tc.qdiscs(ipr, "va")
    assert (q.kind, q.handle, q.parent, q.tbf) == ("tbf", 0x10000, tc.HANDLE_ROOT, sent)
    assert q.index == netlink.link_index(ipr, "va")
    with pytest.raises(CNIError) as e:
        tc.add_tbf(ipr, "va", 8_000_000, 2_000_000)
    assert e.value.code == 999 and e.value.msg == 'add tbf qdisc on "va": file exists'
    tc.add_tbf(ipr, "va", 8_000_000, 2_000_000, replace=True)
    assert tc.qdiscs(ipr, "va")[0].tbf.rate == 1_000_000
    assert tc.del_qdisc(ipr, "va") is True
    assert kinds(ipr, "va") == [("noqueue", "none", "root")]
    assert tc.del_qdisc(ipr, "va") is False
    with pytest.raises(CNIError) as e:
        tc.del_qdisc(ipr, "va", missing_ok=False)
    assert e.value.code == 999 and "no such file" in e.value.msg


def test_tbf_rate_of_2_to_the_32_bytes_and_more(ipr):
    """40 Gbit/s is 5e9 bytes/s: TCA_TBF_RATE64 (what pyroute2's table
    lacked) carries it both ways."""
    sent = tc.add_tbf(ipr, "va", 40_000_000_000, 8_000_000)
    assert sent.rate == 5_000_000_000
    assert tc.qdiscs(ipr, "va")[0].tbf == sent


def test_every_links_qdiscs_and_a_missing_link(ipr):
    tc.add_tbf(ipr, "vb", 1_000_000, 100_000)
    by_link = {(q.index, q.kind) for q in tc.qdiscs(ipr)}
    assert (netlink.link_index(ipr, "vb"), "tbf") in by_link
    assert (netlink.link_index(ipr, "va"), "noqueue") in by_link
    for call in (lambda: tc.qdiscs(ipr, "nope"), lambda: tc.add_tbf(ipr, "nope", 800, 800),
                 lambda: tc.add_ingress_qdisc(ipr, "nope")):
        with pytest.raises(netlink.LinkNotFound):
            call()
    assert tc.del_qdisc(ipr, "nope") is False
    with pytest.raises(CNIError) as e:
        tc.add_tbf(ipr, "va", 4, 800)
    assert e.value.code == 7


def test_ingress_qdisc_and_redirect_filter(ipr):
    """The ingress qdisc ``ffff:`` and on it a u32 match-all filter (prio 1,
    protocol all, flowid 1:1) with one mirred egress redirect to the ifb;
    deleting the ingress qdisc takes the filter with it."""
    ifb = tc.create_ifb(ipr, "ifb0", mtu=1400)
    with pytest.raises(CNIError) as e:  # no ingress qdisc to hang it on
        tc.add_redirect_filter(ipr, "va", ifb)
    assert e.value.code == 999 and '"va"' in e.value.msg
    tc.add_ingress_qdisc(ipr, "va")
    assert kinds(ipr, "va") == [("noqueue", "none", "root"), ("ingress", "ffff:", "ffff:fff1")]
    with pytest.raises(CNIError) as e:
        tc.add_ingress_qdisc(ipr, "va")
    assert e.value.code == 999 and "file exists" in e.value.msg
    assert tc.filters(ipr, "va") == []
    tc.add_redirect_filter(ipr, "va", "ifb0")
    (f,) = tc.filters(ipr, "va")
    assert (f.kind, f.parent, f.priority, f.protocol, f.classid, f.match_all, f.redirect,
            f.actions) == ("u32", 0xFFFF0000, 1, tc.ETH_P_ALL, 0x10001, True, ifb.index,
                           ("mirred",))
    assert tc.filters(ipr, "vb") == []  # no ingress qdisc there: nothing listed
    assert tc.del_qdisc(ipr, "va", tc.HANDLE_INGRESS) is True
    assert kinds(ipr, "va") == [("noqueue", "none", "root")]
    assert tc.filters(ipr, "va") == []


# --- ifb ----------------------------------------------------------------------


def test_create_ifb(ipr):
    ifb = tc.create_ifb(ipr, "ifb0", mtu=1400)
    assert (ifb.name, ifb.kind, ifb.mtu, ifb.up) == ("ifb0", "ifb", 1400, True)
    assert ifb == netlink.find_link(ipr, "ifb0")
    assert tc.create_ifb(ipr, "ifb1", up=False).up is False
    with pytest.raises(netlink.LinkExists):
        tc.create_ifb(ipr, "ifb0")
    for bad in ({"name": "a/b"}, {"name": "x" * 16}, {"name": "ifb2", "mtu": 0},
                {"name": "ifb2", "mtu": "9000"}):
        with pytest.raises(CNIError) as e:
            tc.create_ifb(ipr, bad.pop("name"), **bad)
        assert e.value.code == 7
