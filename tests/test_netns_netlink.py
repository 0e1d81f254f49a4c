"""Tests for cni_skel.netns, cni_skel.netlink (on both sockets it takes:
pyroute2's IPRoute and cni_skel.rtnl.Rtnl), cni_skel.nlsock and
cni_skel.sysctl.

Run as root. Every test acts only inside network namespaces it creates
(``cnsk-<pid>-<n>``) and removes; the root namespace is only ever read (by
interface name, and one sysctl value).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import itertools
import os
import random
import socket
import subprocess
import sys
import threading

import pytest
from pyroute2 import IPRoute
from pyroute2 import netns as p2netns
from pyroute2.netlink import NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_MULTI, NLM_F_REQUEST, nlmsgerr
from pyroute2.netlink.exceptions import NetlinkDumpInterrupted, NetlinkError
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from cni_skel import linkbatch, netlink, rtnl
from cni_skel.errors import CNIError
from cni_skel.netlink import (
    Link,
    LinkExists,
    LinkNotFound,
    Rule,
    add_address,
    add_route,
    add_rule,
    address_flags,
    addresses,
    bridge_port,
    bridge_port_set,
    bridge_vlans,
    create_veth_pair,
    del_address,
    del_route,
    del_rule,
    delete_link,
    ensure_bridge,
    find_link,
    link_down,
    link_flags,
    link_index,
    link_set,
    link_up,
    move_link,
    route_get,
    routes,
    rules,
)
from cni_skel.netns import NetNS, NetNSNotFound, current_netns, open_netns
from cni_skel.rtnl import Rtnl, build, link_marshal
from cni_skel.sysctl import read_sysctl, sysctl_path, write_sysctl

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
]

_seq = itertools.count()
IFF_UP = 0x1
IFF_PROMISC = 0x100


def _root_has_link(name: str) -> bool:
    """Read-only: is there an interface ``name`` in the calling thread's netns?"""
    return any(n == name for _, n in socket.if_nameindex())


@pytest.fixture
def make_ns():
    """Factory: create a named netns, return an open NetNS on it; all removed after."""
    created: list[str] = []
    handles: list[NetNS] = []

    def make() -> NetNS:
        name = f"cnsk-{os.getpid()}-{next(_seq)}"
        p2netns.create(name)
        created.append(name)
        ns = NetNS.open(f"/var/run/netns/{name}")
        handles.append(ns)
        return ns

    try:
        yield make
    finally:
        for ns in handles:
            ns.close()
        for name in created:
            with contextlib.suppress(OSError):
                p2netns.remove(name)


@pytest.fixture
def origin():
    """The test thread's netns at start; asserts the thread is back there at the end."""
    with current_netns() as ns:
        yield ns
        assert ns.same_as_current(), "test left the thread in another netns"


def _add_test_link(ipr, name: str) -> str:
    """Create a stand-alone test link; "dummy" if the kernel has it, else ifb/bridge.

    Returns the kind used.
    """
    for kind in ("dummy", "ifb", "bridge"):
        try:
            ipr.link("add", ifname=name, kind=kind)
            return kind
        except NetlinkError as e:
            if e.code not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    raise AssertionError("no dummy/ifb/bridge support in this kernel")


def _flags(ipr, name: str) -> int:
    return ipr.link("get", ifname=name)[0]["flags"]


@pytest.fixture(params=["iproute", "rtnl"])
def sock(request):
    """Opens the socket kind under test bound to a NetNS: pyroute2's
    ``IPRoute`` (NetNS.iproute) or ours (NetNS.rtnl). Both take the
    cni_skel.netlink helpers and answer the same."""
    return lambda ns: ns.iproute() if request.param == "iproute" else ns.rtnl()


@contextlib.contextmanager
def _requests(ipr):
    """Record the message type of every request the netlink helpers send
    on ``ipr`` (either socket kind)."""
    sent: list[int] = []
    if isinstance(ipr, Rtnl):
        real = ipr.request

        def request(msg, msg_type, flags, **kw):
            sent.append(msg_type)
            return real(msg, msg_type, flags, **kw)

        ipr.request = request
        try:
            yield sent
        finally:
            del ipr.request
    else:
        real_batch = ipr.nlm_request_batch

        def batch(msgs, *a, **kw):
            sent.extend(m["header"]["type"] for m in msgs)
            return real_batch(msgs, *a, **kw)

        ipr.nlm_request_batch = batch
        try:
            yield sent
        finally:
            del ipr.nlm_request_batch


@contextlib.contextmanager
def _rtnl_requests():
    """Record the message type of every request sent on any `Rtnl` in this
    process (a link deletion's goes out on a socket of its own thread)."""
    sent: list[int] = []
    real = Rtnl.request

    def request(self, msg, msg_type, flags, **kw):
        sent.append(msg_type)
        return real(self, msg, msg_type, flags, **kw)

    Rtnl.request = request
    try:
        yield sent
    finally:
        Rtnl.request = real


# ---------------------------------------------------------------------------
# open / validate


def test_open_missing_path_is_code_3(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(NetNSNotFound) as ei:
        NetNS.open(missing)
    assert ei.value.code == 3
    assert ei.value.msg == f'failed to open netns "{missing}": no such file or directory'
    assert isinstance(ei.value, CNIError)
    with pytest.raises(NetNSNotFound):
        open_netns(missing)
    assert open_netns(missing, missing_ok=True) is None
    assert open_netns("", missing_ok=True) is None
    with pytest.raises(NetNSNotFound):
        open_netns("")


@pytest.mark.parametrize("kind", ["file", "dir", "devnull", "mntns", "fifo"])
def test_open_not_a_netns_is_code_8(tmp_path, kind):
    if kind == "file":
        path = tmp_path / "f"
        path.write_text("")
    elif kind == "dir":
        path = tmp_path
    elif kind == "devnull":
        path = "/dev/null"
    elif kind == "mntns":
        path = "/proc/self/ns/mnt"
    else:
        path = tmp_path / "fifo"
        os.mkfifo(path)  # must not block on open
    with pytest.raises(CNIError) as ei:
        NetNS.open(str(path))
    assert ei.value.code == 8
    assert ei.value.msg == f'path "{path}" is not a network namespace'
    with pytest.raises(CNIError) as ei:
        open_netns(str(path), missing_ok=True)
    assert ei.value.code == 8


def test_open_current_and_created(make_ns, origin):
    with NetNS.open("/proc/self/ns/net") as self_ns:
        assert self_ns.same_as_current()
        assert self_ns.same_as_current(thread=False)
        assert self_ns.same_as(origin)
    ns = make_ns()
    assert not ns.same_as_current()
    assert not ns.same_as(origin)
    with current_netns() as cur:
        assert cur.same_as_current()
    with open_netns(ns.path) as again:
        assert again.same_as(ns)
        assert again.identity() == ns.identity()


def test_handle_close(make_ns):
    ns = make_ns()
    h = NetNS.open(ns.path)
    fd = h.fd
    assert fd >= 0 and not h.closed
    assert os.get_inheritable(fd) is False  # O_CLOEXEC
    with h:
        pass
    assert h.closed
    h.close()  # idempotent
    with pytest.raises(ValueError):
        _ = h.fd
    assert "closed" in repr(h)


# ---------------------------------------------------------------------------
# enter / run / iproute


def test_enter_dummy_link_visible_only_inside(make_ns, origin):
    ns = make_ns()
    name = f"cnskd{os.getpid() % 100000}"
    with ns.enter() as entered:
        assert entered is ns
        assert ns.same_as_current()
        assert not origin.same_as_current()
        with IPRoute() as ipr:
            _add_test_link(ipr, name)
    # back in the original netns
    assert origin.same_as_current()
    assert not ns.same_as_current()
    assert not _root_has_link(name)
    with ns.iproute() as ipr:
        names = {m.get("ifname") for m in ipr.get_links()}
    assert names == {"lo", name}


def test_enter_nested_and_exception_restores(make_ns, origin):
    a, b = make_ns(), make_ns()
    with a.enter():
        assert a.same_as_current()
        with b.enter():
            assert b.same_as_current()
            with a.enter():  # re-entering is fine
                assert a.same_as_current()
            assert b.same_as_current()
        assert a.same_as_current()
        with pytest.raises(KeyError), b.enter():
            raise KeyError("boom")
        assert a.same_as_current()
    assert origin.same_as_current()


def test_run_returns_value(make_ns, origin):
    ns = make_ns()

    def where(x, *, y):
        return ns.same_as_current(), x + y

    assert ns.run(where, 1, y=2) == (True, 3)
    assert origin.same_as_current()
    with pytest.raises(ZeroDivisionError):
        ns.run(lambda: 1 / 0)
    assert origin.same_as_current()


def test_enter_only_affects_current_thread(make_ns, origin):
    ns = make_ns()
    seen = {}
    go, done = threading.Event(), threading.Event()

    def other():  # started before enter(): stays where it was
        go.wait(10)
        seen["other"] = ns.same_as_current()
        done.set()

    def child():  # started inside enter(): inherits the namespace (clone(2))
        seen["child"] = ns.same_as_current()

    t = threading.Thread(target=other)
    t.start()
    with ns.enter():
        go.set()
        done.wait(10)
        c = threading.Thread(target=child)
        c.start()
        c.join()
        assert ns.same_as_current()
    t.join()
    assert seen == {"other": False, "child": True}


def test_iproute_bound_to_netns_and_thread_guard(make_ns, origin):
    ns = make_ns()
    with ns.enter(), IPRoute() as inner:
        kind = _add_test_link(inner, "cnsk-mark0")
    with ns.iproute() as ipr:
        assert origin.same_as_current()  # the IPRoute does not keep us inside
        assert {m.get("ifname") for m in ipr.get_links()} == {"lo", "cnsk-mark0"}
        assert find_link(ipr, "cnsk-mark0").kind == kind
        errors = []

        def other():
            try:
                ipr.get_links()
            except RuntimeError as e:  # pyroute2 use_socket thread guard
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 1
        # still usable from the owning thread
        assert link_index(ipr, "lo") == 1


# ---------------------------------------------------------------------------
# links


def test_link_up_down_lo(make_ns, sock):
    ns = make_ns()
    with sock(ns) as ipr:
        assert not _flags(ipr, "lo") & IFF_UP
        lo = find_link(ipr, "lo")
        assert lo.index == 1 and lo.up is False and lo.kind is None
        link_up(ipr, "lo")
        assert _flags(ipr, "lo") & IFF_UP
        assert find_link(ipr, "lo").up is True
        assert link_flags(ipr, "lo") == link_flags(ipr, 1) == find_link(ipr, "lo").flags
        link_down(ipr, "lo")
        assert not _flags(ipr, "lo") & IFF_UP
        assert not link_flags(ipr, 1) & IFF_UP
        assert find_link(ipr, 1).name == "lo"


def test_find_link_missing(make_ns, sock):
    ns = make_ns()
    with sock(ns) as ipr:
        assert find_link(ipr, "nope0") is None
        assert find_link(ipr, "x" * 20) is None
        assert find_link(ipr, "") is None
        assert link_flags(ipr, "nope0") is link_flags(ipr, 999) is link_flags(ipr, "") is None
        with pytest.raises(LinkNotFound) as ei:
            link_index(ipr, "nope0")
        assert ei.value.code == 999
        assert ei.value.msg == 'link "nope0" not found'
        with pytest.raises(LinkNotFound) as ei:
            link_up(ipr, "nope0")  # by name: the kernel's ENODEV
        assert ei.value.msg == 'link "nope0" not found'
        with pytest.raises(LinkNotFound):
            link_up(ipr, "x" * 20)
        with pytest.raises(LinkNotFound):
            addresses(ipr, "nope0")
        with pytest.raises(LinkNotFound):
            move_link(ipr, "nope0", ns)
        assert delete_link(ipr, "nope0") is False
        with pytest.raises(LinkNotFound):
            delete_link(ipr, "nope0", missing_ok=False)


def test_link_set_attrs(make_ns, sock):
    ns = make_ns()
    with sock(ns) as ipr:
        create_veth_pair(ipr, "d0", "d0p")
        link_set(ipr, "d0", mtu=1280, mac="0A:58:0A:01:02:03", txqlen=77, promisc=True)
        msg = ipr.link("get", ifname="d0")[0]
        assert msg.get("mtu") == 1280
        assert msg.get("address") == "0a:58:0a:01:02:03"
        assert msg.get("txqlen") == 77
        assert msg["flags"] & IFF_PROMISC
        link_set(ipr, "d0", promisc=False, up=True)
        summary = find_link(ipr, "d0")
        assert not summary.flags & IFF_PROMISC and summary.up
        link_set(ipr, "d0")  # nothing: no-op
        link_down(ipr, "d0")
        link_set(ipr, "d0", name="d1")
        assert find_link(ipr, "d0") is None and find_link(ipr, "d1").mtu == 1280
        create_veth_pair(ipr, "d2", "d2p")
        with pytest.raises(LinkExists):
            link_set(ipr, "d2", name="d1")
        with pytest.raises(CNIError) as ei:
            link_set(ipr, "d2", mac="zz:zz")
        assert ei.value.code == 7
        with pytest.raises(CNIError) as ei:
            link_set(ipr, "d2", mtu=10**7)
        assert ei.value.code == 999
        assert ei.value.msg.startswith('set link d2: ')
        ipr.link("add", ifname="br0", kind="bridge")
        link_set(ipr, "d2", master="br0")
        assert find_link(ipr, "d2").master == link_index(ipr, "br0")
        link_set(ipr, "d2", master=0)
        assert find_link(ipr, "d2").master is None


def test_veth_pair_addresses_routes(make_ns, origin, sock):
    host_ns, cont_ns = make_ns(), make_ns()
    with sock(host_ns) as hipr, sock(cont_ns) as cipr:
        host, peer = create_veth_pair(
            hipr, "cnsk-veth0", "eth0", peer_netns=cont_ns, mtu=1400,
            mac="0a:58:0a:00:00:01", peer_mac="0A:58:0A:00:00:02",
        )
        assert host.name == "cnsk-veth0" and host.kind == "veth"
        assert peer.name == "eth0" and peer.kind == "veth"
        assert host.mtu == peer.mtu == 1400
        assert host.mac == "0a:58:0a:00:00:01"
        assert peer.mac == "0a:58:0a:00:00:02"
        assert not host.up and not peer.up
        # the peer was created directly in the container netns
        assert find_link(hipr, "eth0") is None
        assert find_link(cipr, "cnsk-veth0") is None
        assert find_link(cipr, "eth0").index == peer.index
        assert not _root_has_link("cnsk-veth0")
        # already exists
        with pytest.raises(LinkExists) as ei:
            create_veth_pair(hipr, "cnsk-veth0", "eth9", peer_netns=cont_ns)
        assert ei.value.msg == 'link "cnsk-veth0" already exists'
        with pytest.raises(LinkExists) as ei:
            create_veth_pair(hipr, "cnsk-veth1", "eth0", peer_netns=cont_ns)
        assert ei.value.msg == 'link "eth0" already exists'
        with pytest.raises(CNIError) as ei:
            create_veth_pair(hipr, "x" * 16, "eth1")
        assert ei.value.code == 7

        link_up(hipr, "cnsk-veth0")
        link_up(cipr, "eth0")
        link_up(cipr, "lo")

        # addresses
        v4 = ipaddress.ip_interface("10.77.0.2/24")
        v6 = ipaddress.ip_interface("fd00:77::2/64")
        assert add_address(cipr, "eth0", v4) is True
        assert add_address(cipr, "eth0", "10.77.0.3/24") is True
        assert add_address(cipr, "eth0", v6, nodad=True) is True
        assert add_address(cipr, "eth0", v4) is False  # idempotent
        assert add_address(hipr, "cnsk-veth0", "10.77.0.1/24") is True
        got = addresses(cipr, "eth0", family=4)
        assert got == [v4, ipaddress.ip_interface("10.77.0.3/24")]
        got6 = addresses(cipr, "eth0", family=6)
        assert v6 in got6
        assert all(a.version == 6 for a in got6)
        assert set(addresses(cipr, "eth0")) >= {v4, v6}
        bcast = [m.get("broadcast") for m in cipr.addr("dump", index=peer.index, family=2)]
        assert "10.77.0.255" in bcast
        assert del_address(cipr, "eth0", "10.77.0.3/24") is True
        assert del_address(cipr, "eth0", "10.77.0.3/24") is False
        assert addresses(cipr, "eth0", family=4) == [v4]
        with pytest.raises(CNIError) as ei:
            add_address(cipr, "eth0", "10.77.0.300/24")
        assert ei.value.code == 7

        # routes in the container netns
        assert add_route(cipr, "10.200.0.0/16", gw="10.77.0.1", dev="eth0", mtu=1300) is True
        assert add_route(cipr, "10.200.0.0/16", gw="10.77.0.1", dev="eth0") is False
        assert add_route(cipr, "default", gw="10.77.0.1") is True
        assert add_route(cipr, "10.201.0.5", dev="eth0", scope="link", priority=50) is True
        assert add_route(cipr, "fd00:200::/48", gw="fd00:77::1", dev="eth0") is True
        # what a ptp plugin's host side needs: src, scope and proto
        assert add_route(cipr, "10.204.0.7/32", dev="eth0", scope="link", src="10.77.0.2",
                         proto="static") is True
        with pytest.raises(CNIError) as ei:
            add_route(cipr, "10.205.0.0/16", dev="eth0", src="fd00:77::2")
        assert ei.value.code == 7 and "source" in ei.value.msg
        r4 = {str(r["dst"]): r for r in routes(cipr, family=4)}
        assert r4["10.204.0.7/32"]["src"] == ipaddress.ip_address("10.77.0.2")
        assert r4["10.204.0.7/32"]["scope"] == 253
        assert r4["10.204.0.7/32"]["proto"] == 4  # RTPROT_STATIC
        assert r4["10.200.0.0/16"]["proto"] == 3  # RTPROT_BOOT, the default
        assert r4["10.200.0.0/16"]["gw"] == ipaddress.ip_address("10.77.0.1")
        assert r4["10.200.0.0/16"]["oif"] == peer.index
        assert r4["10.200.0.0/16"]["mtu"] == 1300
        assert r4["10.200.0.0/16"]["table"] == 254
        assert r4["0.0.0.0/0"]["gw"] == ipaddress.ip_address("10.77.0.1")
        assert r4["10.201.0.5/32"]["scope"] == 253
        assert r4["10.201.0.5/32"]["priority"] == 50
        assert r4["10.201.0.5/32"]["gw"] is None
        assert r4["10.77.0.0/24"]["src"] == ipaddress.ip_address("10.77.0.2")
        r6 = {str(r["dst"]): r for r in routes(cipr, family=6)}
        assert r6["fd00:200::/48"]["gw"] == ipaddress.ip_address("fd00:77::1")
        assert r6["fd00:200::/48"]["priority"] == 1024
        assert all(r["family"] == 4 for r in routes(cipr, family=4))
        everything = routes(cipr, table=None)
        assert {r["table"] for r in everything} >= {254, 255}
        assert {r["family"] for r in routes(cipr)} == {4, 6}
        with pytest.raises(CNIError) as ei:
            routes(cipr, family=5)
        assert ei.value.code == 7
        # table 100
        assert add_route(cipr, "10.202.0.0/24", dev="eth0", table=100) is True
        assert [str(r["dst"]) for r in routes(cipr, table=100)] == ["10.202.0.0/24"]
        assert "10.202.0.0/24" not in {str(r["dst"]) for r in routes(cipr)}
        # errors
        with pytest.raises(CNIError) as ei:
            add_route(cipr, "10.203.0.0/16", gw="fd00::1")
        assert ei.value.code == 7
        with pytest.raises(CNIError) as ei:
            add_route(cipr, "10.203.0.0/16", gw="10.99.0.1")  # not on-link
        assert ei.value.code == 999
        assert ei.value.msg.startswith("add route 10.203.0.0/16 via 10.99.0.1: ")
        # delete (link scope route deleted without naming the scope)
        assert del_route(cipr, "10.201.0.5/32", dev="eth0", priority=50) is True
        assert del_route(cipr, "10.201.0.5/32", dev="eth0", priority=50) is False
        assert del_route(cipr, "10.200.0.0/16") is True
        assert del_route(cipr, "10.202.0.0/24", table=100) is True
        left = {str(r["dst"]) for r in routes(cipr, family=4)}
        assert "10.200.0.0/16" not in left and "10.201.0.5/32" not in left
        assert del_route(cipr, "10.200.0.0/16", dev="nope0") is False

        # delete: both ends go, idempotent
        assert delete_link(hipr, "cnsk-veth0") is True
        assert delete_link(hipr, "cnsk-veth0") is False
        assert find_link(cipr, "eth0") is None
    assert origin.same_as_current()


def test_rules_add_list_delete(make_ns, sock):
    """Policy routing: a rule without a priority gets the kernel's (just
    above the lowest-priority rule after priority 0, as Go's
    netlink.NewRule()), a given one is kept and its duplicate is EEXIST
    (False); `rules` reads every selector back typed, filters by family
    and table; `del_rule` takes what `rules` answered, and a gone rule is
    False. Bad values are code 7 before anything is sent."""
    ns = make_ns()
    with sock(ns) as ipr:
        stock = rules(ipr)
        assert {(r.family, r.priority, r.table) for r in stock} >= {
            (4, 0, netlink.RT_TABLE_LOCAL), (4, 32766, netlink.RT_TABLE_MAIN),
            (6, 32766, netlink.RT_TABLE_MAIN)}
        assert add_rule(ipr, 100, src="10.1.0.5") is True
        assert add_rule(ipr, 101, src=ipaddress.ip_network("fd00:1::5/128")) is True
        assert add_rule(ipr, 1000, src="10.1.0.0/24", dst="10.2.0.0/16", priority=50,
                        iifname="lo", fwmark=3, fwmask=0xFF) is True
        assert add_rule(ipr, 1000, src="10.1.0.0/24", dst="10.2.0.0/16", priority=50,
                        iifname="lo", fwmark=3, fwmask=0xFF) is False
        assert add_rule(ipr, 7, family=6, oifname="lo", priority=60) is True
        mine = [r for r in rules(ipr) if r not in stock]
        assert mine == [
            Rule(family=4, priority=50, table=1000, src=ipaddress.ip_network("10.1.0.0/24"),
                 dst=ipaddress.ip_network("10.2.0.0/16"), iifname="lo", fwmark=3, fwmask=0xFF),
            Rule(family=4, priority=32765, table=100, src=ipaddress.ip_network("10.1.0.5/32")),
            Rule(family=6, priority=60, table=7, oifname="lo"),
            Rule(family=6, priority=32765, table=101, src=ipaddress.ip_network("fd00:1::5/128")),
        ]
        assert rules(ipr, 6, table=101) == [mine[3]]
        assert rules(ipr, 4, table=101) == []
        for rule in mine:
            assert del_rule(ipr, rule) is True
            assert del_rule(ipr, rule) is False
        with pytest.raises(CNIError) as ei:
            del_rule(ipr, mine[0], missing_ok=False)
        assert ei.value.code == 999 and "delete rule from 10.1.0.0/24" in ei.value.msg
        assert rules(ipr) == stock
        for kwargs in ({"src": "10.0.0.1", "dst": "fd00::/64"}, {}, {"src": "nope"}):
            with pytest.raises(CNIError) as ei:
                add_rule(ipr, 5, **kwargs)
            assert ei.value.code == 7, kwargs
        with pytest.raises(CNIError) as ei:
            add_rule(ipr, 0, src="10.0.0.1")
        assert ei.value.code == 7 and "table 0" in ei.value.msg


def test_add_route_replace(make_ns, sock):
    """``replace=True`` swaps the gateway of a route that exists (plain add
    keeps it: False) and adds one that does not; any table."""
    ns = make_ns()
    with sock(ns) as ipr:
        _add_test_link(ipr, "cnsk-d0")
        link_up(ipr, "cnsk-d0")
        add_address(ipr, "cnsk-d0", "10.1.0.5/24")
        assert add_route(ipr, "10.9.0.0/16", gw="10.1.0.1", dev="cnsk-d0", table=100) is True
        assert add_route(ipr, "10.9.0.0/16", gw="10.1.0.2", dev="cnsk-d0", table=100) is False
        assert [str(r["gw"]) for r in routes(ipr, table=100)] == ["10.1.0.1"]
        assert add_route(ipr, "10.9.0.0/16", gw="10.1.0.2", dev="cnsk-d0", table=100,
                         replace=True) is True
        assert add_route(ipr, "10.8.0.0/16", gw="10.1.0.2", dev="cnsk-d0", table=100,
                         replace=True) is True
        assert sorted((str(r["dst"]), str(r["gw"])) for r in routes(ipr, table=100)) == [
            ("10.8.0.0/16", "10.1.0.2"), ("10.9.0.0/16", "10.1.0.2")]


def test_delete_link_answers_once_the_link_is_unlisted(make_ns, sock, origin):
    """`delete_link` answers when the kernel has taken the link out of its
    namespace (both veth ends gone, the names free for the next ADD), while
    the kernel's own end (an RCU barrier) runs on in a thread of this
    process that `wait_deletions` joins. A refusal is raised in the caller
    with no thread left behind; the caller's thread stays in its netns."""
    node, pod = make_ns(), make_ns()
    netlink.wait_deletions()  # those of the tests before
    before = threading.active_count()
    with sock(node) as ipr, sock(pod) as pipr:
        for i in range(4):
            _, peer = create_veth_pair(ipr, "cnsk-h0", "eth0", peer_netns=pod,
                                          peer_ipr=pipr)
            target = ("eth0", peer, peer.index, "eth0")[i]
            assert delete_link(pipr, target) is True
            assert find_link(pipr, "eth0") is None and find_link(ipr, "cnsk-h0") is None
        # a thread whose kernel end is done has ended; it is joined all the same
        assert 0 <= threading.active_count() - before <= netlink.finishing_deletions() <= 4
        netlink.wait_deletions()
        assert netlink.finishing_deletions() == 0 and threading.active_count() == before
        with pytest.raises(CNIError) as ei:
            delete_link(pipr, "lo")
        assert ei.value.code == 999 and "delete link lo" in ei.value.msg
        assert delete_link(pipr, "eth0") is False
        assert netlink.finishing_deletions() == 0 and threading.active_count() == before


_NO_THREAD_LEFT = """
import os, sys
from cni_skel.netlink import create_veth_pair, delete_link, wait_deletions
from cni_skel.netns import NetNS
with NetNS.open(sys.argv[1]) as ns, ns.rtnl() as ipr:
    for i in range(60):
        create_veth_pair(ipr, "cnskt0", "cnskt1")
        assert delete_link(ipr, "cnskt0") is True
        wait_deletions()
        assert len(os.listdir("/proc/self/task")) == 1, ("after wait_deletions", i)
        assert delete_link(ipr, "cnskt0") is False
        assert len(os.listdir("/proc/self/task")) == 1, ("link already gone", i)
"""


def test_delete_link_leaves_no_thread_listed(make_ns):
    """After each `delete_link` (answered early, then `wait_deletions`) and
    each one of a link already gone (its thread joined at once), the
    kernel lists the process's one thread only: a joined thread stays
    listed a moment longer, and the worker's serving process steps down
    when it counts more than one. Run in a process of its own: the test
    runner's threads would be counted too."""
    ns = make_ns()
    run = subprocess.run([sys.executable, "-c", _NO_THREAD_LEFT, ns.path],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]


_REAPED = """
import os, select, sys
from cni_skel import netlink
from cni_skel.netns import CLONE_NEWNET, NetNS, setns
CLONE_NEWNS = 0x00020000
fd = netlink.deletions_fd()
assert netlink.deletions_fd() == fd and netlink.reap_deletions() == frozenset()
own_mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY)
own_net = os.open("/proc/self/ns/net", os.O_RDONLY)
overlapped = 0
with NetNS.open(sys.argv[1]) as ns, ns.rtnl() as ipr:
    for i in range(20):
        # odd rounds from inside the namespace: a node's deletion, batched
        setns(ns.fd if i % 2 else own_net, CLONE_NEWNET)
        netlink.create_veth_pair(ipr, "cnskr0", "cnskr1")
        fds = set(os.listdir("/proc/self/fd"))
        assert netlink.delete_link(ipr, "cnskr0") is True
        held = set(os.listdir("/proc/self/fd")) - fds
        tids = {int(t) for t in os.listdir("/proc/self/task")} - {os.getpid()}
        left = netlink.reap_deletions()
        assert left <= tids, (left, tids)
        # what the worker's serving process allows a finishing deletion
        assert len(held) <= 4 * len(left), (i, held, left)
        if left:
            overlapped += 1
            # the deleting thread has a root and cwd of its own: this one may
            # still enter a mount namespace (setns asks that of the caller)
            setns(own_mnt, CLONE_NEWNS)
        while netlink.finishing_deletions():
            assert select.select([fd], [], [], 10)[0], "deletions_fd never readable"
            netlink.reap_deletions()
        assert netlink.reap_deletions() == frozenset()
        assert {int(t) for t in os.listdir("/proc/self/task")} == {os.getpid()}, i
        assert not select.select([fd], [], [], 0)[0], "deletions_fd not emptied"
assert overlapped, "no deletion was still finishing when delete_link answered"
"""


def test_deletions_reaped_as_they_finish(make_ns):
    """A long-lived process serves on while its deletions finish:
    `deletions_fd` becomes readable as each ends, `reap_deletions` joins the
    ended ones without waiting and names the threads still finishing (as
    /proc/self/task lists them), and meanwhile the calling thread can setns
    into a mount namespace. Run in a process of its own (its threads are
    counted, its mount namespace entered)."""
    ns = make_ns()
    run = subprocess.run([sys.executable, "-c", _REAPED, ns.path],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("fails", ["setns", "SIOCGSKNS"])
def test_delete_link_without_its_thread_waits_in_the_right_namespace(make_ns, sock,
                                                                     monkeypatch, fails):
    """Where the deleting thread cannot enter the socket's namespace (or the
    kernel cannot name it), the caller sends the request itself and waits:
    never a request from the thread's own namespace, which has a link of
    the same name here."""
    node, pod = make_ns(), make_ns()

    def refuse(*args):
        raise OSError(errno.EPERM, "refused by the test")

    monkeypatch.setattr(netlink, "setns", refuse) if fails == "setns" else \
        monkeypatch.setattr(netlink.fcntl, "ioctl", refuse)
    with sock(node) as ipr, sock(pod) as pipr, node.enter():  # this thread in the node
        create_veth_pair(ipr, "eth0", "cnsk-p0")
        create_veth_pair(ipr, "cnsk-h0", "eth0", peer_netns=pod, peer_ipr=pipr)
        assert delete_link(pipr, "eth0") is True
        assert netlink.finishing_deletions() == 0
        assert find_link(pipr, "eth0") is None and find_link(ipr, "cnsk-h0") is None
        assert find_link(ipr, "eth0") is not None  # the node's, untouched


def test_veth_same_netns_and_move_link(make_ns, sock):
    a, b = make_ns(), make_ns()
    with sock(a) as aipr, sock(b) as bipr:
        host, peer = create_veth_pair(aipr, "va", "vb")
        assert {host.name, peer.name} == {"va", "vb"}
        assert host.peer_index == peer.index and peer.peer_index == host.index
        with pytest.raises(LinkExists) as ei:
            create_veth_pair(aipr, "vc", "vb")
        assert ei.value.msg == 'link "vb" already exists'
        move_link(aipr, "vb", b)
        assert find_link(aipr, "vb") is None
        assert find_link(bipr, "vb").kind == "veth"
        _add_test_link(aipr, "vb")
        with pytest.raises(LinkExists):
            move_link(bipr, "vb", a)
        with pytest.raises(LinkNotFound):
            move_link(aipr, "nope0", b)


def test_find_link_is_typed_and_helpers_take_it_without_a_lookup(make_ns, sock):
    a = make_ns()
    with sock(a) as ipr:
        create_veth_pair(ipr, "ta", "tb")
        link_set(ipr, "ta", txqlen=321, mtu=1400)
        link = find_link(ipr, "ta")
        assert isinstance(link, Link)
        assert (link.name, link.kind, link.mtu, link.txqlen) == ("ta", "veth", 1400, 321)
        assert link.peer_index == find_link(ipr, "tb").index and link.up is False
        assert link.mac == ipr.link("get", index=link.index)[0].get("IFLA_ADDRESS")
        with pytest.raises(dataclasses.FrozenInstanceError):
            link.mtu = 1  # type: ignore[misc]
        # Given a Link or an index, no RTM_GETLINK is sent for it.
        with _requests(ipr) as sent:
            assert link_index(ipr, link) == link.index == link_index(ipr, link.index)
            link_up(ipr, link)
            assert bridge_port(ipr, link) is None  # one "get" for the port data
            assert sent == [RTM_NEWLINK, RTM_GETLINK]
        # Given a name, changes and deletes send no look-up either.
        with _requests(ipr) as sent:
            link_set(ipr, "tb", mtu=1300, up=True)
            assert find_link(ipr, "tb").mtu == 1300
            assert sent == [RTM_NEWLINK, RTM_GETLINK]
        assert find_link(ipr, link).up is True  # read again: the state now
        addrs = addresses(ipr, link)
        assert all(a.version in (4, 6) for a in addrs)
        # A Link whose device is gone is "missing", as a name would be.
        assert delete_link(ipr, link) is True
        assert delete_link(ipr, link) is False
        assert bridge_port(ipr, link) is None and bridge_vlans(ipr, link) == []
        with pytest.raises(CNIError):
            delete_link(ipr, link, missing_ok=False)


def test_find_link_on_rtnl_reads_what_a_whole_decode_reads(make_ns):
    """On an `Rtnl`, find_link and a veth's creation decode only the
    attributes a Link holds; the Link equals one made from pyroute2's whole
    ifinfmsg, for every kind of link a plugin meets."""
    a, b = make_ns(), make_ns()
    with a.rtnl() as ipr, a.iproute() as full, b.rtnl() as pipr:
        br = ensure_bridge(ipr, "tbr0", mtu=1400)
        link_up(ipr, br)
        made, peer = create_veth_pair(ipr, "th0", "tc0", b, mtu=1400, master=br,
                                      mac="0a:58:0a:01:02:03", peer_ipr=pipr)
        link_set(ipr, made, txqlen=77, up=True, promisc=True)
        for name in ("lo", "tbr0", "th0"):
            whole = full.link("get", ifname=name)[0]
            assert find_link(ipr, name) == netlink._link_summary(whole), name
        # the short way was taken: pyroute2's table held all eight attributes
        assert len(netlink._ifinfmsg_summary._keep or {}) == len(netlink._ifinfmsg_summary._KEEP)
        assert made == dataclasses.replace(netlink._link_summary(
            full.link("get", ifname="th0")[0]), up=False, flags=made.flags, operstate="DOWN",
            txqlen=made.txqlen)
        assert (made.kind, made.master, made.mac, made.mtu) == ("veth", br.index,
                                                                "0a:58:0a:01:02:03", 1400)
        got = find_link(ipr, "th0")
        assert (got.txqlen, got.up, got.flags & IFF_PROMISC) == (77, True, IFF_PROMISC)
        assert got.peer_index == peer.index and peer.kind == "veth"


def _deletions(marshal: Marshal, datagrams: list[bytes]) -> list:
    """The RTM_DELLINK messages of ``datagrams`` as ``marshal`` parses them."""
    return [m for d in datagrams for m in marshal.parse(d) if m["header"]["type"] == RTM_DELLINK]


def test_deletion_notices_decode_what_their_readers_read(make_ns):
    """The partial parsers of links (`delete_link`'s wait for its link's
    deletion notice, a batch's read of a link's group) decode a notice's
    index, name and link group as pyroute2's whole ifinfmsg does, and only
    those: pyroute2's table held every name they keep (else they would
    decode everything)."""
    ns = make_ns()
    with ns.rtnl() as ipr, ns.run(socket.socket, socket.AF_NETLINK, socket.SOCK_RAW,
                                  socket.NETLINK_ROUTE) as watch:
        watch.bind((0, 1))  # RTMGRP_LINK
        watch.settimeout(5)
        host, _ = create_veth_pair(ipr, "tn0", "tn1")
        linkbatch._set_group(ipr, host.index, linkbatch.GROUPS[0] + 5)
        delete_link(ipr, host)
        full = Marshal()
        full.msg_map = {RTM_DELLINK: ifinfmsg}
        datagrams: list[bytes] = []
        while len(_deletions(full, datagrams)) < 2:  # both ends' notices
            datagrams.append(watch.recv(65536))
    whole = _deletions(full, datagrams)
    names = _deletions(netlink._LINK_DELETED, datagrams)
    groups = _deletions(link_marshal(linkbatch._ifinfmsg_group, RTM_DELLINK), datagrams)
    assert {m.get_attr("IFLA_IFNAME") for m in whole} == {"tn0", "tn1"}
    assert [m["index"] for m in whole] == [m["index"] for m in names] \
        == [m["index"] for m in groups]
    assert [m.get_attr("IFLA_IFNAME") for m in whole] == [m.get_attr("IFLA_IFNAME")
                                                           for m in names]
    assert [m.get_attr("IFLA_GROUP") for m in whole] == [m.get_attr("IFLA_GROUP")
                                                          for m in groups]
    assert linkbatch.GROUPS[0] + 5 in [m.get_attr("IFLA_GROUP") for m in groups]
    assert [[a[0] for a in m["attrs"]] for m in names] == [["IFLA_IFNAME"]] * len(names)
    assert [[a[0] for a in m["attrs"]] for m in groups] == [["IFLA_GROUP"]] * len(groups)


# ---------------------------------------------------------------------------
# the SDK's rtnetlink socket (cni_skel.rtnl / cni_skel.nlsock)


def test_rtnl_bound_to_its_netns_from_any_thread(make_ns, origin):
    ns, other = make_ns(), make_ns()
    with ns.enter(), Rtnl() as inner:
        _add_test_link(inner, "cnsk-mark1")
    with ns.rtnl() as ipr:
        assert origin.same_as_current()  # the socket does not keep us inside
        assert find_link(ipr, "cnsk-mark1") is not None
        seen = {}

        def elsewhere():  # another thread, in yet another namespace
            with other.enter():
                seen["link"] = find_link(ipr, "cnsk-mark1")
                seen["names"] = {m.get("IFLA_IFNAME") for m in ipr.link("dump")}

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        assert seen["link"].name == "cnsk-mark1"
        assert seen["names"] == {"lo", "cnsk-mark1"}
    with other.rtnl() as oipr:
        assert find_link(oipr, "cnsk-mark1") is None
    assert not _root_has_link("cnsk-mark1")
    assert ipr.closed
    ipr.close()  # idempotent


def test_rtnl_and_iproute_answer_the_same_errors(make_ns):
    """Every kernel error reaches the caller as the same CNIError (code and
    text) on both sockets."""
    answers = {}
    for kind in ("iproute", "rtnl"):
        ns = make_ns()
        with (ns.iproute() if kind == "iproute" else ns.rtnl()) as ipr:
            create_veth_pair(ipr, "e0", "e0p")
            link_up(ipr, "e0")
            got = []
            for call in (
                lambda: link_set(ipr, "e0", mtu=10**7),                # ERANGE/EINVAL
                lambda: link_set(ipr, find_link(ipr, "e0").index + 100, up=True),  # ENODEV
                lambda: add_route(ipr, "10.203.0.0/16", gw="10.99.0.1"),  # ENETUNREACH
                lambda: del_route(ipr, "10.204.0.0/16", missing_ok=False),  # ESRCH
                lambda: delete_link(ipr, "lo"),                         # EOPNOTSUPP
                lambda: del_address(ipr, "e0", "10.9.0.1/24", missing_ok=False),
                lambda: ensure_bridge(ipr, "e0"),                       # not a bridge
                lambda: bridge_port_set(ipr, "e0", hairpin=True),       # not a port
                lambda: link_set(ipr, "e0", name="lo"),                 # LinkExists
                lambda: link_index(ipr, "nope0"),                       # LinkNotFound
            ):
                with pytest.raises(CNIError) as ei:
                    call()
                got.append((type(ei.value).__name__, ei.value.code, ei.value.msg,
                            getattr(ei.value.__cause__, "code", None)))
            answers[kind] = got
    assert answers["iproute"] == answers["rtnl"]
    assert all(code == 999 for _, code, _, _ in answers["rtnl"])
    assert answers["rtnl"][0][2].startswith("set link e0: ")
    assert answers["rtnl"][2][2].startswith("add route 10.203.0.0/16 via 10.99.0.1: ")
    assert answers["rtnl"][6][2] == '"e0" already exists but is not a bridge'


def test_rtnl_dumps_span_several_datagrams(make_ns, sock):
    ns = make_ns()
    with sock(ns) as ipr:
        create_veth_pair(ipr, "m0", "m0p")
        link_up(ipr, "m0")
        want = [ipaddress.ip_interface(f"10.{i // 250}.{i % 250}.1/32") for i in range(600)]
        for iface in want:
            add_address(ipr, "m0", iface)
        # 600 addresses do not fit one datagram: the dump is multipart
        assert [a for a in addresses(ipr, "m0", 4)] == want
        assert len([r for r in routes(ipr, table=None) if r["oif"] == find_link(ipr, "m0").index
                    and r["table"] == 255]) >= 600
        flags = address_flags(ipr, "m0", 4)
        assert [a for a, _ in flags] == want and all(f & 0x80 for _, f in flags)  # PERMANENT


def test_rtnl_dumps_are_filtered_by_the_kernel(make_ns):
    """With NETLINK_GET_STRICT_CHK the kernel answers a dump of one table's
    routes or one link's addresses with those only: the same answers as
    IPRoute's sifted full dumps, fewer messages decoded."""
    ns = make_ns()
    with ns.rtnl() as ipr, ns.iproute() as full:
        assert ipr.strict_check
        create_veth_pair(ipr, "f0", "f0p")
        for name in ("lo", "f0", "f0p"):
            link_up(ipr, name)
        add_address(ipr, "f0", "10.79.0.2/24")
        add_address(ipr, "f0p", "10.79.1.2/24")
        add_route(ipr, "10.80.0.0/16", gw="10.79.0.1")
        raw = []
        real = ipr.request

        def request(msg, msg_type, flags, **kw):
            raw.append(real(msg, msg_type, flags, **kw))
            return raw[-1]

        ipr.request = request
        try:
            main, addrs = routes(ipr), addresses(ipr, "f0")
            local = routes(ipr, table=255)
        finally:
            del ipr.request
        assert main == routes(full) and local == routes(full, table=255)
        assert addrs == addresses(full, "f0")
        assert [len(answer) for answer in raw] == [len(main), 1, len(addrs), len(local)]
        assert len(routes(ipr, table=None)) == len(main) + len(local)


def test_rtnl_dump_interrupted_is_retried_then_reported(make_ns):
    """NLM_F_DUMP_INTR on a dump part: NetlinkDumpInterrupted after the dump
    is read to its end; the helpers retry it, then answer CNIError 999."""
    ns = make_ns()

    def part(flags, seq, mtype=RTM_NEWLINK):
        msg = ifinfmsg()
        msg["index"] = 1
        msg["header"] = {"type": mtype, "flags": flags, "sequence_number": seq, "pid": 0}
        msg.encode()
        return bytes(msg.data)

    def done(seq):
        msg = nlmsgerr()  # NLMSG_DONE: a header and an int, 0
        msg["error"] = 0
        msg["header"] = {"type": 3, "flags": NLM_F_MULTI, "sequence_number": seq, "pid": 0}
        msg.encode()
        return bytes(msg.data)

    with ns.rtnl() as ipr:
        sent = []

        def transmit(data):
            sent.append(data)

        def recv():
            seq = ipr._seq
            return (part(NLM_F_MULTI | NLM_F_DUMP_INTR, seq)
                    + part(NLM_F_MULTI, seq) + part(NLM_F_MULTI, seq - 1) + done(seq))

        ipr._transmit, ipr._recv = transmit, recv
        with pytest.raises(NetlinkDumpInterrupted):
            ipr.request(ifinfmsg(), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP)
        with pytest.raises(CNIError) as ei:
            bridge_vlans(ipr, 1)
        assert ei.value.code == 999 and "dump interrupted" in ei.value.msg
        assert len(sent) == 1 + 5  # the helper tried five times


def test_nlsock_answers_sharing_a_datagram(make_ns):
    """Answers of a batch read in order, whichever datagrams carry them."""
    ns = make_ns()

    def link(seq, index):
        msg = ifinfmsg()
        msg["index"] = index
        msg["header"] = {"type": RTM_NEWLINK, "flags": 0, "sequence_number": seq, "pid": 0}
        msg.encode()
        return bytes(msg.data)

    with ns.rtnl() as ipr:
        first = ipr._seq + 1
        datagrams = [link(first - 1, 9) + link(first, 1) + link(first + 1, 2), link(first + 2, 3)]
        ipr._transmit = lambda data: None
        ipr._recv = lambda: datagrams.pop(0)
        answers = ipr.batch([(ifinfmsg(), RTM_GETLINK, NLM_F_REQUEST) for _ in range(3)])
        assert [[m["index"] for m in msgs] for msgs, _ in answers] == [[1], [2], [3]]
        assert not datagrams


def test_rtnl_timeout_and_stale_answers(make_ns):
    ns = make_ns()
    with ns.enter():
        ipr = Rtnl(timeout=0.2)
    with ipr:
        # a request whose answer is never read leaves it on the socket: the
        # next request skips it by its sequence number
        msg = ifinfmsg()
        msg["index"] = 1
        msg["header"] = {"type": RTM_GETLINK, "flags": NLM_F_REQUEST, "sequence_number": 0,
                         "pid": ipr.port}
        msg.encode()
        ipr._sock.send(msg.data)
        assert find_link(ipr, "lo").index == 1
        assert find_link(ipr, 1).name == "lo"
        # a change asked without an ACK is never answered: ETIMEDOUT
        quiet = ifinfmsg()
        quiet["index"] = 1
        with pytest.raises(NetlinkError) as ei:
            ipr.request(quiet, RTM_NEWLINK, NLM_F_REQUEST)
        assert ei.value.code == errno.ETIMEDOUT


def test_rtnl_veth_peer_in_pod_netns_enslaved_in_one_request(make_ns):
    node, pod = make_ns(), make_ns()
    with node.rtnl() as ipr, pod.rtnl() as pipr:
        br = ensure_bridge(ipr, "cnskbr0")
        assert br.kind == "bridge" and ensure_bridge(ipr, "cnskbr0") == br
        with _requests(ipr) as sent, _requests(pipr) as psent:
            host, peer = create_veth_pair(ipr, "vethc0", "eth0", peer_netns=pod, mtu=1400,
                                          master=br, peer_ipr=pipr)
        # the creation was answered with the link (NLM_F_ECHO): no GET on the node
        assert sent == [RTM_NEWLINK] and psent == [RTM_GETLINK]
        assert host.master == br.index and host.mtu == peer.mtu == 1400
        assert host.peer_index == peer.index and peer.peer_index == host.index
        assert find_link(ipr, "eth0") is None and find_link(pipr, "eth0") == peer
        assert not _root_has_link("vethc0")
        # port flags and IFF_UP in one request, applied in that order
        with _requests(ipr) as sent:
            link_set(ipr, host, hairpin=True, isolated=False, up=True)
        assert sent == [RTM_NEWLINK]
        assert bridge_port(ipr, host) == {"hairpin": True, "isolated": False}
        assert find_link(ipr, host).up
        bridge_port_set(ipr, "vethc0", hairpin=False, isolated=True)
        assert bridge_port(ipr, "vethc0") == {"hairpin": False, "isolated": True}
        # the peer's name is taken in the pod: LinkExists names it
        with pytest.raises(LinkExists) as ei:
            create_veth_pair(ipr, "vethc1", "eth0", peer_netns=pod, peer_ipr=pipr)
        assert ei.value.name == "eth0"
        link_up(pipr, peer)
        add_address(pipr, peer, "10.78.0.2/24")
        route = route_get(pipr, "10.78.0.9")
        assert route["oif"] == peer.index and route["src"] == ipaddress.ip_address("10.78.0.2")
        assert route_get(pipr, "10.99.0.1") is None  # no route there
        # deleting the pod end by name: one request, both ends go (sent by
        # a thread in pipr's namespace, on a socket of its own; pipr waits
        # for the deletion's RTNL section with an RTM_SETLINK of the gone index)
        with _requests(pipr) as psent, _rtnl_requests() as sent:
            assert delete_link(pipr, "eth0") is True
            assert delete_link(pipr, "eth0") is False
        assert psent == [19] and sent == [17, 17]  # RTM_DELLINK, no look-up
        assert find_link(ipr, "vethc0") is None


# ---------------------------------------------------------------------------
# sysctl


def test_sysctl_in_netns(make_ns, origin):
    ns = make_ns()
    root_before = read_sysctl("net.ipv4.ip_forward")  # read-only in the root netns
    with ns.enter():
        assert read_sysctl("net.ipv4.ip_forward") == "0"
        write_sysctl("net.ipv4.ip_forward", "1")
        assert read_sysctl("net/ipv4/ip_forward") == "1"
        write_sysctl("net/ipv4/conf/lo/forwarding", "1")
        assert read_sysctl("net.ipv4.conf.lo.forwarding") == "1"
        with pytest.raises(CNIError) as ei:
            write_sysctl("net.ipv4.ip_forward", "banana")
        assert ei.value.code == 7
        assert "net.ipv4.ip_forward" in ei.value.msg
        with pytest.raises(CNIError) as ei:
            read_sysctl("net.ipv4.no_such_sysctl")
        assert ei.value.code == 999
        assert "net.ipv4.no_such_sysctl" in ei.value.msg
    assert read_sysctl("net.ipv4.ip_forward") == root_before
    assert ns.run(read_sysctl, "net.ipv4.ip_forward") == "1"


@pytest.mark.parametrize(
    "key",
    ["../../etc/passwd", "/etc/passwd", "net/../kernel/hostname", "", "net..ipv4",
     "net/./ipv4/ip_forward", "net/ipv4/", ".net", "net/ipv4/ip_forward\0", "..", "/"],
)
def test_sysctl_path_escape_rejected(key):
    with pytest.raises(CNIError) as ei:
        sysctl_path(key)
    assert ei.value.code == 7
    assert key in ei.value.msg
    with pytest.raises(CNIError) as ei:
        read_sysctl(key)
    assert ei.value.code == 7
    with pytest.raises(CNIError) as ei:
        write_sysctl(key, "1")
    assert ei.value.code == 7


def test_sysctl_path_forms():
    assert sysctl_path("net.ipv4.ip_forward") == "/proc/sys/net/ipv4/ip_forward"
    assert sysctl_path("net/ipv4/ip_forward") == "/proc/sys/net/ipv4/ip_forward"
    assert sysctl_path("net/ipv4/conf/eth0.100/rp_filter") == (
        "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"
    )
    # not a path escape: the net.*-only policy is the tuning plugin's
    assert sysctl_path("kernel.hostname") == "/proc/sys/kernel/hostname"


def _encoded(msg, msg_type: int, flags: int) -> bytes:
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = 7
    msg.encode()
    return bytes(msg.data)


def test_route_requests_built_without_the_filters_encode_as_with_them():
    """`rtnl.build` fills route add/replace/append/del messages in itself
    for the keywords netlink's route helpers pass: byte for byte what
    pyroute2's request filters make of them (a seeded sample of their
    combinations, both strict-check settings); anything else (a scope or
    proto by a name of /etc/iproute2, a bare address) still goes through
    the filters."""
    rng = random.Random(36)
    dsts = [("10.77.0.0/24", 2, "10.77.0.1"), ("0.0.0.0/0", 2, "10.77.0.1"),
            ("10.77.3.4/32", 2, "10.77.0.1"), ("fd00:77::/64", 10, "fd00:77::1"),
            ("::/0", 10, "fe80::1"), ("fd00:77::9/128", 10, "fd00:77::1")]
    choices = {"gateway": (None, True), "oif": (None, 7, 4096),
               "table": (None, 100, 254, 255, 1000), "priority": (None, 0, 20),
               "scope": (None, 0, 253, 254, 255),
               "prefsrc": (None, True), "metrics": (None, {"mtu": 1400},
                                                    {"mtu": 1400, "advmss": 1360},
                                                    {"mtu": None}),
               "proto": (None, "boot", "static", "kernel", 4)}
    fast = 0
    for _ in range(1500):
        dst, family, gw = rng.choice(dsts)
        kwargs = {"dst": dst, "family": family}
        for key in rng.sample(sorted(choices), rng.randint(0, len(choices))):
            value = rng.choice(choices[key])
            if value is True:
                value = gw if key == "gateway" else gw.replace("1", "2", 1)
            if value is not None:
                kwargs[key] = value
        command = rng.choice(("add", "replace", "append", "del"))
        strict = rng.random() < 0.5
        msg, msg_type, flags = build("route", command, strict_check=strict, **kwargs)
        if command != "del":  # build's defaults for a route to add
            kwargs.setdefault("proto", "static")
            kwargs.setdefault("type", "unicast")
        fast += rtnl._route_message(kwargs, strict) is not None
        full = rtnl._filtered("route", command, strict, dict(kwargs))
        assert _encoded(msg, msg_type, flags) == _encoded(full, msg_type, flags), \
            (command, strict, kwargs)
    assert fast == 1500
    assert rtnl._route_message({"dst": "10.77.0.0/24", "family": 2}, False) is not None
    for odd in ({"dst": "10.77.0.0/24", "family": 2, "scope": "link"},
                {"dst": "10.77.0.0/24", "family": 2, "proto": "made-up"},
                {"dst": "10.77.0.4", "family": 2},
                {"dst": "10.77.0.0/24", "family": 2, "table": "main"},
                {"dst": "10.77.0.0/24", "family": 2, "tos": 4}):
        assert rtnl._route_message(odd, False) is None, odd
