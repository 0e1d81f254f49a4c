"""bandwidth through the real executable, chained after our ptp (which makes
the pod, the node's end of its veth and, with our host-local, its address),
side by side with Debian's Go bandwidth 1.1.1 on an identical pod: the same
result, the same qdiscs, filter and ifb read back from the node's namespace
with netlink (cni_skel.tc), CHECK passing and failing, DEL twice and with the
pod gone, GC, a failed ADD leaving nothing, bad input. And the point of it
all: TCP between the pod and the node's namespace, measured against the
configured rates. Each test runs in both modes (oneshot, warm) through
`cni_bin`."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import pytest
from cni_skel_plugins.bandwidth import Bandwidth, ifb_name
from podlink_common import call, call_raw, check_fails, host_local, links_of
from test_bridge_go import masked
from yardsticks import as_go

from cni_skel import netlink, tc
from cni_skel.harness import TestNetNS, remove_netns
from cni_skel.netns import NetNS
from cni_skel.tags import network_tag

NET = "bwnet"
SUBNET, GW = "10.72.0.0/24", "10.72.0.1"
#: A config's limits (bits per second, bits): both directions, and each alone.
BOTH = {"ingressRate": 12_000_000, "ingressBurst": 400_000,
        "egressRate": 20_000_000, "egressBurst": 400_000}
INGRESS = {"ingressRate": 10_000_000, "ingressBurst": 2_000_000}
EGRESS = {"egressRate": 16_000_000, "egressBurst": 400_000}
PORT = 5201


@pytest.fixture(scope="session")
def bandwidth(cni_bin: str) -> str:
    return os.path.join(cni_bin, "bandwidth")


@pytest.fixture(scope="session")
def ptp(cni_bin: str) -> str:
    return os.path.join(cni_bin, "ptp")


@dataclass
class Pod:
    """A node namespace, a pod namespace and ptp's result (bandwidth's
    prevResult) for container ``cid``."""

    node: TestNetNS
    pod: TestNetNS
    prev: dict
    cid: str


def make_pod(ptp: str, netns_factory, data_dir, version: str = "1.0.0", cid: str = "c1",
             node: TestNetNS | None = None) -> Pod:
    """A pod made by our ptp (with our host-local) in ``node`` (a new one
    when None)."""
    node = node or netns_factory("cnsk-node")
    pod = netns_factory("cnsk-pod")
    conf = {"cniVersion": version, "name": NET, "type": "ptp",
            "ipam": host_local(data_dir, SUBNET, routes=[{"dst": "0.0.0.0/0"}])}
    return Pod(node, pod, call(ptp, "ADD", conf, node, pod, cid=cid), cid)


def bw_conf(version: str, prev: dict | None, name: str = NET, **extra) -> dict:
    conf = {"cniVersion": version, "name": name, "type": "bandwidth", **extra}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def veth_of(ipr) -> netlink.Link:
    """The node's end of the (first) pod's veth."""
    return next(lk for lk in netlink.links(ipr, "veth"))


def shaping(node: TestNetNS) -> dict:
    """What bandwidth leaves in the node: the ifbs (name, MTU, up), every
    qdisc (link, kind, handle, parent, TBF rate/buffer/limit) and the
    filters on the veth's ingress qdisc; veth names as ``<veth>``."""
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        links = netlink.links(ipr)
        names = {lk.index: "<veth>" if lk.kind == "veth" else lk.name for lk in links}
        veths = [lk for lk in links if lk.kind == "veth"]
        return {
            "ifbs": [(lk.name, lk.mtu, lk.up) for lk in links if lk.kind == "ifb"],
            "qdiscs": [(names[q.index], q.kind, tc.format_handle(q.handle),
                        tc.format_handle(q.parent), q.tbf)
                       for q in tc.qdiscs(ipr) if names.get(q.index, "lo") != "lo"],
            "filters": [(f.kind, tc.format_handle(f.parent), f.priority, f.protocol,
                         tc.format_handle(f.classid), f.match_all, names.get(f.redirect))
                        for lk in veths for f in tc.filters(ipr, lk)],
        }


def expected(limits: dict, cid: str = "c1") -> dict:
    """`shaping` of one pod with these limits, as Go 1.1.1 leaves it."""
    ifb = ifb_name(NET, cid)
    qdiscs = [("<veth>", "noqueue", "none", "root", None)]
    if "ingressRate" in limits:
        qdiscs = [("<veth>", "tbf", "1:", "root",
                   tc.tbf_parameters(limits["ingressRate"], limits["ingressBurst"]))]
    if "egressRate" not in limits:
        return {"ifbs": [], "qdiscs": qdiscs, "filters": []}
    return {"ifbs": [(ifb, 1500, True)],
            "qdiscs": [*qdiscs, ("<veth>", "ingress", "ffff:", "ffff:fff1", None),
                       (ifb, "tbf", "1:", "root",
                        tc.tbf_parameters(limits["egressRate"], limits["egressBurst"]))],
            "filters": [("u32", "ffff:", 1, tc.ETH_P_ALL, "1:1", True, ifb)]}


def the_ifb(node: TestNetNS) -> netlink.Link:
    """The node's one ifb."""
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        (ifb,) = netlink.links(ipr, "ifb")
        return ifb


def filter_actions(node: TestNetNS) -> tuple[str, ...]:
    """The action kinds of the one filter on the node's veth."""
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        (f,) = tc.filters(ipr, veth_of(ipr))
        return f.actions


# --- side by side with Go ------------------------------------------------------


@pytest.mark.parametrize(("version", "limits"), [("1.0.0", BOTH), ("0.4.0", INGRESS),
                                                 ("0.3.1", EGRESS)],
                         ids=["both-1.0.0", "ingress-0.4.0", "egress-0.3.1"])
def test_same_result_and_kernel_state_as_go(bandwidth, go_yardstick, ptp, netns_factory, tmp_path,
                                            version, limits):
    """On identical pods, ours and Go's answer the same result (prevResult,
    plus the ifb when egress is shaped) and leave the same qdiscs, TBF
    values, filter and ifb. Where they differ, on purpose: our ifb carries
    an alias (what GC goes by) and the kernel's txqlen (Go 1.1.1 sets 0 by
    accident), and our filter has one redirect action (Go's two, the second
    never reached). CHECK passes on both pods by both plugins (from 0.4.0);
    DEL (twice) deletes the ifb; ours removes the veth's qdiscs too (Go's
    leaves them to the veth's deletion), so that a second ADD on the same
    veth works."""
    runs = {}
    for who, exe in (("ours", bandwidth), ("go", go_yardstick.exe("bandwidth"))):
        p = make_pod(ptp, netns_factory, tmp_path / who, version)
        out = call(exe, "ADD", bw_conf(version, p.prev, **limits), p.node, p.pod)
        runs[who] = (p, out, shaping(p.node))
    (p, out, state), (gp, gout, gstate) = runs["ours"], runs["go"]
    assert masked(as_go(go_yardstick, "bandwidth", out), p.pod.path) == \
        masked(gout, gp.pod.path)
    ifbs = [{"name": ifb_name(NET, "c1"), "mac": "<mac>"}] if "egressRate" in limits else []
    assert masked(out, p.pod.path) == masked(dict(p.prev, interfaces=p.prev["interfaces"] + ifbs),
                                             p.pod.path)
    assert state == gstate == expected(limits)

    if "egressRate" in limits:
        ours_ifb, go_ifb = (the_ifb(x.node) for x in (p, gp))
        assert ours_ifb.alias == f"cni-skel bandwidth {network_tag(NET)}" and go_ifb.alias is None
        assert (ours_ifb.txqlen, go_ifb.txqlen) == (32, 0)
        assert [filter_actions(x.node) for x in (p, gp)] == [("mirred",), ("mirred", "mirred")]

    conf = bw_conf(version, None, **limits)
    for x, result in ((p, out), (gp, gout)):
        if version != "0.3.1":
            for exe in (bandwidth, go_yardstick.exe("bandwidth")):
                call(exe, "CHECK", dict(conf, prevResult=result), x.node, x.pod)
    for x, exe in ((p, bandwidth), (gp, go_yardstick.exe("bandwidth"))):
        for _ in range(2):
            assert call(exe, "DEL", conf, x.node, x.pod) is None
        after = shaping(x.node)
        assert after["ifbs"] == []
        left = [q for q in expected(limits)["qdiscs"] if q[0] == "<veth>"]
        assert after["qdiscs"] == (expected({})["qdiscs"] if exe == bandwidth else left), exe
    again = call(bandwidth, "ADD", bw_conf(version, p.prev, **limits), p.node, p.pod)
    assert masked(again, p.pod.path) == masked(out, p.pod.path)
    assert shaping(p.node) == state


def test_no_limits_passes_prev_result_through(bandwidth, go_yardstick, ptp, netns_factory,
                                              tmp_path):
    """No limit anywhere, or every limit 0: prevResult unchanged and nothing
    shaped, as Go."""
    p = make_pod(ptp, netns_factory, tmp_path)
    before = shaping(p.node)
    for extra in ({}, dict.fromkeys(BOTH, 0)):
        for exe in (bandwidth, go_yardstick.exe("bandwidth")):
            out = call(exe, "ADD", bw_conf("1.0.0", p.prev, **extra), p.node, p.pod)
            prev = p.prev if exe == bandwidth else as_go(go_yardstick, "bandwidth", p.prev)
            assert masked(out, p.pod.path) == masked(prev, p.pod.path)
    assert shaping(p.node) == before == expected({})


def test_runtime_config_and_which_wins(bandwidth, go_yardstick, ptp, netns_factory, tmp_path):
    """``runtimeConfig.bandwidth`` (kubelet's capability; the key matched
    case-insensitively, ``bandWidth`` as in Go's test) shapes when the config
    has none of the four keys; one top-level key (even 0) makes the
    top-level ones win, as Go's embedded entry: a lone top-level burst is
    refused, a lone 0 shapes nothing. Same answers and state from Go's."""
    runtime = {"runtimeConfig": {"bandWidth": BOTH}}
    for who, exe in (("ours", bandwidth), ("go", go_yardstick.exe("bandwidth"))):
        p = make_pod(ptp, netns_factory, tmp_path / who)
        run = call_raw(exe, "ADD", bw_conf("1.0.0", p.prev, ingressBurst=123, **runtime),
                       p.node, p.pod)
        assert run.exit_code == 1 and run.doc["code"] == (7 if who == "ours" else 999)
        assert run.doc["msg"] == "if burst is set, rate must also be set"
        out = call(exe, "ADD", bw_conf("1.0.0", p.prev, egressRate=0, **runtime), p.node, p.pod)
        prev = p.prev if who == "ours" else as_go(go_yardstick, "bandwidth", p.prev)
        assert masked(out, p.pod.path) == masked(prev, p.pod.path)
        assert shaping(p.node) == expected({})
        out = call(exe, "ADD", bw_conf("1.0.0", p.prev, **runtime), p.node, p.pod)
        assert [i["name"] for i in out["interfaces"]][-1] == ifb_name(NET, "c1")
        assert shaping(p.node) == expected(BOTH), who


# --- CHECK ---------------------------------------------------------------------


def test_check_names_what_differs(bandwidth, go_yardstick, ptp, netns_factory, tmp_path):
    """A rate or a burst changed behind the plugin's back: ours and Go's
    CHECK fail (999) with Go's words, ours naming the link and both values.
    The veth's TBF or its ingress qdisc (and so the redirect) gone: ours
    fails naming it; Go's passes (it stops at the first qdisc that is no
    TBF, and never looks at the redirect)."""
    p = make_pod(ptp, netns_factory, tmp_path)
    conf = bw_conf("1.0.0", p.prev, **BOTH)
    out = call(bandwidth, "ADD", conf, p.node, p.pod)
    conf = dict(conf, prevResult=out)
    call(bandwidth, "CHECK", conf, p.node, p.pod)
    ifb = ifb_name(NET, "c1")
    with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
        veth = veth_of(ipr)
        tc.add_tbf(ipr, veth, 8_000_000, BOTH["ingressBurst"], replace=True)
    check_fails(bandwidth, conf, p.node, p.pod, "Rate doesn't match", f'"{veth.name}"',
                "rate 1000000 bytes/s, want 1500000")
    check_fails(go_yardstick.exe("bandwidth"), conf, p.node, p.pod, "Rate doesn't match")

    with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
        tc.add_tbf(ipr, veth, BOTH["ingressRate"], BOTH["ingressBurst"], replace=True)
        tc.add_tbf(ipr, ifb, BOTH["egressRate"], 200_000, replace=True)
    check_fails(bandwidth, conf, p.node, p.pod, "Limit doesn't match", f'egress TBF on "{ifb}"')
    check_fails(go_yardstick.exe("bandwidth"), conf, p.node, p.pod, "Limit doesn't match")

    with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
        tc.add_tbf(ipr, ifb, BOTH["egressRate"], BOTH["egressBurst"], replace=True)
        tc.del_qdisc(ipr, veth, tc.HANDLE_INGRESS)
    check_fails(bandwidth, conf, p.node, p.pod, f'no ingress qdisc on "{veth.name}"')
    call(go_yardstick.exe("bandwidth"), "CHECK", conf, p.node, p.pod)

    with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
        tc.del_qdisc(ipr, veth)
    check_fails(bandwidth, conf, p.node, p.pod, f'no TBF qdisc on "{veth.name}" for ingress',
                "noqueue")
    call(go_yardstick.exe("bandwidth"), "CHECK", conf, p.node, p.pod)
    check_fails(bandwidth, bw_conf("1.0.0", None, **BOTH), p.node, p.pod, "chained plugin",
                code=7)


# --- DEL, GC, STATUS -------------------------------------------------------------


def test_del_with_the_pod_gone(bandwidth, go_yardstick, ptp, netns_factory, tmp_path):
    """DEL needs no namespace: with the pod's gone (its path, then none at
    all) ours and Go's delete the ifb and succeed, twice."""
    for who, exe in (("ours", bandwidth), ("go", go_yardstick.exe("bandwidth"))):
        p = make_pod(ptp, netns_factory, tmp_path / who)
        call(exe, "ADD", bw_conf("1.0.0", p.prev, **EGRESS), p.node, p.pod)
        remove_netns(p.pod)
        conf = bw_conf("1.0.0", None, **EGRESS)
        for pod in (p.pod, None, None):
            assert call(exe, "DEL", conf, p.node, pod) is None
        assert shaping(p.node)["ifbs"] == []


def test_del_without_the_pod_then_with_it(bandwidth, ptp, netns_factory, tmp_path):
    """A DEL without CNI_NETNS deletes the ifb only (it cannot find the
    veth); the DEL naming the pod then removes the veth's qdiscs, whose
    redirect points at a gone ifb, and ADD works again on that veth."""
    p = make_pod(ptp, netns_factory, tmp_path)
    limits = {**EGRESS, "ingressRate": 12_000_000, "ingressBurst": 1_200_000}
    out = call(bandwidth, "ADD", bw_conf("1.0.0", p.prev, **limits), p.node, p.pod)
    shaped = shaping(p.node)
    conf = bw_conf("1.0.0", None, **limits)
    assert call(bandwidth, "DEL", conf, p.node, None) is None
    assert shaping(p.node)["ifbs"] == [] and shaping(p.node)["qdiscs"] != expected({})["qdiscs"]
    assert call(bandwidth, "DEL", conf, p.node, p.pod) is None
    assert shaping(p.node) == expected({})
    again = call(bandwidth, "ADD", bw_conf("1.0.0", p.prev, **limits), p.node, p.pod)
    assert masked(again, p.pod.path) == masked(out, p.pod.path) and shaping(p.node) == shaped


def test_gc_deletes_this_networks_stale_ifbs(bandwidth, ptp, netns_factory, tmp_path):
    """GC (1.1.0) with ``keep`` the one valid attachment: the ifb of the
    stale one goes, with the ingress qdisc of its veth (still there); the
    valid one's, one of another network (its alias),
    one Go made (no alias) and a link of that name that is no ifb (a veth
    with the alias) stay.
    Without the list: 7, nothing deleted. STATUS succeeds. (Go's bandwidth
    has neither.) What is left is what ``cni-skel uninstall`` reports."""
    keep = make_pod(ptp, netns_factory, tmp_path, "1.1.0", cid="keep")
    stale = make_pod(ptp, netns_factory, tmp_path, "1.1.0", cid="stale", node=keep.node)
    for x in (keep, stale):
        call(bandwidth, "ADD", bw_conf("1.1.0", x.prev, **EGRESS), x.node, x.pod, cid=x.cid)
    others = {ifb_name("othernet", "x"), ifb_name(NET, "by-go"), ifb_name(NET, "veth")}
    with NetNS.open(keep.node.path) as n, n.rtnl() as ipr:
        other = tc.create_ifb(ipr, ifb_name("othernet", "x"))
        netlink.link_set(ipr, other, ifalias=f"cni-skel bandwidth {network_tag('othernet')}")
        tc.create_ifb(ipr, ifb_name(NET, "by-go"))
        veth, _ = netlink.create_veth_pair(ipr, ifb_name(NET, "veth"), "cnsk-peer")
        netlink.link_set(ipr, veth, ifalias=f"cni-skel bandwidth {network_tag(NET)}")
    node = keep.node
    gc = bw_conf("1.1.0", None)
    check_fails_gc = call_raw(bandwidth, "GC", gc, node, None, cid="", ifname="")
    assert check_fails_gc.exit_code == 1 and check_fails_gc.doc["code"] == 7
    everything = {ifb_name(NET, "keep"), ifb_name(NET, "stale"), *others}
    assert everything <= set(links_of(node))
    valid = [{"containerID": "keep", "ifname": "eth0"}]
    assert call(bandwidth, "GC", dict(gc, **{"cni.dev/valid-attachments": valid}), node, None,
                cid="", ifname="") is None
    assert set(links_of(node)) & everything == everything - {ifb_name(NET, "stale")}
    # the stale pod's veth no longer redirects to a gone ifb: its ingress qdisc went too
    stale_ingress = [q for q in shaping(node)["qdiscs"] if q[1] == "ingress"]
    assert len(stale_ingress) == 1  # the kept pod's
    with NetNS.open(node.path) as n, n.enter():
        assert Bandwidth.node_state() == [
            "2 ifb link(s) shaping pods' egress, deleted by their DEL or GC"]
    assert call(bandwidth, "STATUS", gc, node, None, cid="", ifname="") is None
    call(bandwidth, "ADD", bw_conf("1.1.0", stale.prev, **EGRESS), node, stale.pod,
         cid="stale")  # ADD works again on that veth
    assert call(bandwidth, "DEL", gc, node, stale.pod, cid="stale") is None
    call(bandwidth, "CHECK", bw_conf("1.1.0", keep.prev, **EGRESS), node, keep.pod, cid="keep")


# --- failures ----------------------------------------------------------------------


def test_failed_add_leaves_nothing(bandwidth, go_yardstick, ptp, netns_factory, tmp_path):
    """A link already has the ifb's name: ADD fails (999) after the veth's
    TBF was made, which goes again; the link is left alone, by the DEL too
    (it is no ifb). Go leaves the TBF behind, and its DEL deletes the link.
    Then the veth has an ingress qdisc of someone else's: ADD fails after
    the TBF and the ifb, both undone, the other qdisc kept."""
    name = ifb_name(NET, "c1")
    states = {}
    for who, exe in (("ours", bandwidth), ("go", go_yardstick.exe("bandwidth"))):
        p = make_pod(ptp, netns_factory, tmp_path / who)
        with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
            netlink.create_veth_pair(ipr, name, "cnsk-peer")
        run = call_raw(exe, "ADD", bw_conf("1.0.0", p.prev, **BOTH), p.node, p.pod)
        assert run.exit_code == 1 and run.doc["code"] == 999, run.doc
        states[who] = (p, run.doc["msg"], shaping(p.node))
        call(exe, "DEL", bw_conf("1.0.0", None, **BOTH), p.node, p.pod)
        states[who] += (name in links_of(p.node),)
    p, msg, state, kept = states["ours"]
    assert msg == f'link "{name}" already exists' and kept
    assert state == expected({})
    assert states["go"][1] == "adding link: file exists" and not states["go"][3]
    ingress_only = {k: v for k, v in BOTH.items() if k.startswith("ingress")}
    assert states["go"][2] == expected(ingress_only)

    with NetNS.open(p.node.path) as n, n.rtnl() as ipr:
        netlink.delete_link(ipr, name)
        tc.add_ingress_qdisc(ipr, veth_of(ipr))
    run = call_raw(bandwidth, "ADD", bw_conf("1.0.0", p.prev, **BOTH), p.node, p.pod)
    assert run.exit_code == 1 and run.doc["code"] == 999
    assert run.doc["msg"].startswith("add ingress qdisc on ") and "file exists" in run.doc["msg"]
    assert shaping(p.node) == {"ifbs": [], "filters": [], "qdiscs": [
        ("<veth>", "noqueue", "none", "root", None), ("<veth>", "ingress", "ffff:", "ffff:fff1",
                                                      None)]}


def test_bad_input_is_refused_before_any_change(bandwidth, go_yardstick, ptp, netns_factory,
                                                tmp_path):
    """Refused with Go's words and the spec's code (Go: 999 for all of them,
    or a parse error), nothing changed on the node."""
    p = make_pod(ptp, netns_factory, tmp_path)
    before = shaping(p.node)
    pod_only = dict(p.prev, interfaces=[i for i in p.prev["interfaces"] if i.get("sandbox")],
                    ips=[dict(ip, interface=0) for ip in p.prev["ips"]])
    cases = [
        ({"ingressRate": 1000}, p.prev, "eth0", 7, "if rate is set, burst must also be set"),
        ({"egressBurst": 1000}, p.prev, "eth0", 7, "if burst is set, rate must also be set"),
        ({"ingressRate": 8000, "ingressBurst": 8 * (2**32 - 1)}, p.prev, "eth0", 7,
         "burst cannot be more than 4GB"),
        ({"ingressRate": -8, "ingressBurst": 800}, p.prev, "eth0", 7, "ingressRate"),
        ({"egressRate": 1.5e6, "egressBurst": 800}, p.prev, "eth0", 7, "egressRate"),
        ({"egressRate": "10M", "egressBurst": 800}, p.prev, "eth0", 7, "egressRate"),
        ({"ingressRate": 4, "ingressBurst": 800}, p.prev, "eth0", 7, "less than one byte"),
        (BOTH, None, "eth0", 7, "must be called as chained plugin"),
        (BOTH, dict(p.prev, interfaces=[], ips=[]), "eth0", 7, "no interfaces provided"),
        (BOTH, pod_only, "eth0", 999, "no veth peer of container interface found in host ns"),
        (BOTH, p.prev, "net9", 999, "container interface net9 has no veth peer"),
    ]
    for limits, prev, ifname, code, text in cases:
        run = call_raw(bandwidth, "ADD", bw_conf("1.0.0", prev, **limits), p.node, p.pod,
                       ifname=ifname)
        assert run.exit_code == 1 and run.doc["code"] == code, (limits, run.doc)
        assert text in run.doc["msg"] + run.doc.get("details", ""), (limits, run.doc)
        if code == 999 or text.startswith(("if ", "burst")):  # Go says the same (as 999)
            go = call_raw(go_yardstick.exe("bandwidth"), "ADD", bw_conf("1.0.0", prev, **limits),
                          p.node, p.pod, ifname=ifname)
            assert go.doc["code"] == 999 and go.doc["msg"].startswith(text), go.doc
        assert shaping(p.node) == before


# --- traffic ------------------------------------------------------------------------


def transfer(sender: TestNetNS, receiver: TestNetNS, ip: str, nbytes: int,
             timeout: float = 10.0) -> float:
    """Send ``nbytes`` over TCP from ``sender`` to ``ip``:`PORT` in
    ``receiver``; the payload rate the receiver saw over the second half of
    them, in bits per second (past the bucket's burst and TCP's start).
    Every step bounded by ``timeout``."""
    with NetNS.open(receiver.path) as r, r.enter():  # a socket stays in its namespace
        listener = socket.create_server((ip, PORT))
    with NetNS.open(sender.path) as s, s.enter():
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.settimeout(timeout)
    client.settimeout(timeout)
    failed: list[OSError] = []

    def send() -> None:
        try:
            with client:
                client.connect((ip, PORT))
                client.sendall(bytes(nbytes))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    got, half, start, end = 0, None, 0.0, 0.0
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(timeout)
            while chunk := conn.recv(1 << 16):
                got += len(chunk)
                end = time.monotonic()
                if half is None and got >= nbytes // 2:
                    half, start = got, end
    finally:
        listener.close()
        thread.join(timeout)
    assert not failed and got == nbytes and half is not None, (failed, got)
    return (got - half) * 8 / (end - start)


def test_rates_hold_for_tcp(bandwidth, ptp, netns_factory, tmp_path, record_property):
    """TCP from the pod to the node (through the ifb) runs at egressRate,
    from the node to the pod (through the veth's TBF) at ingressRate, each
    within 15 % (the payload: 1448 of each 1514-byte frame, 4 % under the
    rate); unshaped, the same pair runs many times faster."""
    p = make_pod(ptp, netns_factory, tmp_path)
    pod_ip = p.prev["ips"][0]["address"].split("/")[0]
    unshaped = transfer(p.pod, p.node, GW, 8_000_000)
    assert unshaped > 5 * BOTH["egressRate"]
    call(bandwidth, "ADD", bw_conf("1.0.0", p.prev, **BOTH), p.node, p.pod)
    egress = transfer(p.pod, p.node, GW, BOTH["egressRate"] // 8 * 3)  # 3 s
    ingress = transfer(p.node, p.pod, pod_ip, BOTH["ingressRate"] // 8 * 3)
    record_property("rates", {"egress": egress, "ingress": ingress, "unshaped": unshaped})
    print(f"egress {egress / 1e6:.2f} Mbit/s of {BOTH['egressRate'] / 1e6:g}, ingress "
          f"{ingress / 1e6:.2f} of {BOTH['ingressRate'] / 1e6:g}, unshaped {unshaped / 1e6:.0f}")
    assert abs(egress / BOTH["egressRate"] - 1) < 0.15, egress
    assert abs(ingress / BOTH["ingressRate"] - 1) < 0.15, ingress
