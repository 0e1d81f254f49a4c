"""vrf through the real executable, chained after our ptp (which makes the
pod's interface and routes from host-local's addresses), side by side with
Debian's Go vrf 1.1.1 on an identical pod. This machine's kernel may have no
VRF support: the tests are marked ``kernel("vrf")`` and then run in the
suite's VM (tests/kernelvm.py)."""

from __future__ import annotations

import os

import pytest
from podlink_common import call, call_raw, check_fails, host_local, link_of
from test_bridge_go import masked
from yardsticks import as_go, differs

from cni_skel import netlink
from cni_skel.harness import icmp_ping, remove_netns
from cni_skel.netns import NetNS

# Emulated, a one-shot call costs 5x a warm one; the plugin's code is the same.
pytestmark = pytest.mark.kernel("vrf", vm_modes=("warm",))

NET = "vrfnet"


@pytest.fixture(scope="session")
def vrf(cni_bin: str) -> str:
    return os.path.join(cni_bin, "vrf")


@pytest.fixture(scope="session")
def ptp(cni_bin: str) -> str:
    return os.path.join(cni_bin, "ptp")


def ptp_conf(data_dir, dual_stack: bool = False) -> dict:
    """ptp's config; IPv4 only unless ``dual_stack`` (each IPv6 address
    waits out duplicate address detection twice: costly in the VM)."""
    subnets = ("10.59.0.0/24", "fd00:59::/64") if dual_stack else ("10.59.0.0/24",)
    routes = [{"dst": "10.66.0.0/16"}, {"dst": "fd00:66::/48"}][:len(subnets)]
    return {"cniVersion": "1.0.0", "name": NET, "type": "ptp",
            "ipam": host_local(data_dir, *subnets, routes=routes)}


def vrf_conf(prev: dict | None, version: str = "1.0.0", **extra) -> dict:
    conf = {"cniVersion": version, "name": NET, "type": "vrf", "vrfname": "red", **extra}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def pod_with_iface(ptp: str, netns_factory, data_dir, ifname: str = "eth0", node=None,
                   pod=None, dual_stack: bool = False):
    node = node or netns_factory("cnsk-node")
    pod = pod or netns_factory("cnsk-pod")
    prev = call(ptp, "ADD", ptp_conf(data_dir, dual_stack), node, pod, ifname=ifname)
    return node, pod, prev


def state(pod, ifname: str = "eth0") -> dict:
    """The VRFs of the pod (name, table, up, members), ``ifname``'s global
    addresses and the routes through it by table (kernel-made ones left out
    of the main table's)."""
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, ifname)
        vrfs = {v.name: (v.vrf_table, v.up, sorted(lk.name for lk in netlink.links(ipr)
                                                   if lk.master == v.index))
                for v in netlink.links(ipr, "vrf")}
        if link is None:
            return {"vrfs": vrfs}
        addrs = sorted(str(a) for a in netlink.addresses(ipr, link) if not a.ip.is_link_local)
        tables: dict[int, list] = {}
        for r in netlink.routes(ipr, table=None):
            if r["oif"] == link.index and r["type"] == 1 and not r["dst"].is_link_local:
                tables.setdefault(r["table"], []).append((str(r["dst"]), str(r["gw"])))
        return {"vrfs": vrfs, "addresses": addrs,
                "tables": {t: sorted(v) for t, v in tables.items()}}


# --- the main job ------------------------------------------------------------


def test_same_vrf_as_go(vrf, go_yardstick, ptp, netns_factory, tmp_path):
    """The VRF (table 1, up) holds eth0, which keeps its IPv4 and IPv6
    addresses; the result is prevResult. Go 1.1.1's vrf on an identical pod
    makes the same VRF and membership and keeps the same addresses; its
    routes through eth0 are lost, ours are in the VRF's table (ptp's
    gateway /32 included: Go's since 1.2 copy universe-scope routes only).
    CHECK passes; DEL (twice) releases eth0, with its addresses and routes
    back in the main table, and removes the VRF."""
    seen = {}
    copies = differs(go_yardstick, "vrf", "routes copied to the table")
    for who, exe in (("ours", vrf), ("go", go_yardstick.exe("vrf"))):
        node, pod, prev = pod_with_iface(ptp, netns_factory, tmp_path / who, dual_stack=True)
        if who == "go" and copies:  # ptp's scope-link gateway /32 is not copied
            run = call_raw(exe, "ADD", vrf_conf(prev), node, pod)
            assert run.exit_code == 1 and run.doc["msg"].startswith(
                "cmdAdd failed: could not add route '{Ifindex: 2 Dst: 10.66.0.0/16 Src: <nil> "
                "Gw: 10.59.0.1"), run.doc
            assert run.doc["msg"].endswith("network is unreachable"), run.doc
            continue
        out = call(exe, "ADD", vrf_conf(prev), node, pod)
        passed = prev if who == "ours" else as_go(go_yardstick, "vrf", prev)
        assert masked(out, pod.path) == masked(passed, pod.path)
        seen[who] = (node, pod, prev, state(pod))
    ours = seen["ours"][3]
    assert ours["vrfs"] == {"red": (1, True, ["eth0"])}
    assert ours["addresses"] == ["10.59.0.2/24", "fd00:59::2/64"]
    if not copies:
        go = seen["go"][3]
        assert ours["vrfs"] == go["vrfs"] and ours["addresses"] == go["addresses"]
        assert ("10.66.0.0/16", "10.59.0.1") not in go["tables"].get(1, [])
    assert ("10.66.0.0/16", "10.59.0.1") in ours["tables"][1]
    assert ("fd00:66::/48", "fd00:59::1") in ours["tables"][1]
    assert netlink.RT_TABLE_MAIN not in ours["tables"]

    node, pod, prev, _ = seen["ours"]
    call(vrf, "CHECK", vrf_conf(prev), node, pod)
    for _ in range(2):
        assert call(vrf, "DEL", vrf_conf(None), node, pod) is None
    after = state(pod)
    assert after["vrfs"] == {} and link_of(pod, "eth0").master is None
    # leaving drops the IPv6 addresses and the routes again: both are back
    assert after["addresses"] == ["10.59.0.2/24", "fd00:59::2/64"]
    assert {("10.66.0.0/16", "10.59.0.1"), ("fd00:66::/48", "fd00:59::1")} \
        <= set(after["tables"][netlink.RT_TABLE_MAIN])


def test_same_addresses_in_two_vrfs(vrf, ptp, netns_factory, tmp_path):
    """Two interfaces of one pod with the same address, each in a VRF of its
    own (red, blue: tables 1 and 2), each reached from its own node over its
    own link: the VRFs keep them apart."""
    pod = netns_factory("cnsk-pod")
    nodes = []
    for ifname, name, store in (("eth0", "red", "a"), ("net1", "blue", "b")):
        node, _, prev = pod_with_iface(ptp, netns_factory, tmp_path / store, ifname, pod=pod)
        call(vrf, "ADD", vrf_conf(prev, vrfname=name), node, pod, ifname=ifname)
        nodes.append(node)
    assert state(pod)["vrfs"] == {"red": (1, True, ["eth0"]), "blue": (2, True, ["net1"])}
    assert state(pod, "eth0")["addresses"] == state(pod, "net1")["addresses"]
    for node in nodes:
        assert icmp_ping(node, "10.59.0.2", count=2, timeout=2)


def test_interfaces_share_a_vrf(vrf, ptp, netns_factory, tmp_path):
    """A second interface joins the existing VRF; the first DEL keeps the
    VRF for the other, the second removes it."""
    pod = netns_factory("cnsk-pod")
    node_a, _, prev_a = pod_with_iface(ptp, netns_factory, tmp_path / "a", "eth0", pod=pod)
    call(vrf, "ADD", vrf_conf(prev_a, table=7), node_a, pod)
    node_b, _, prev_b = pod_with_iface(ptp, netns_factory, tmp_path / "b", "net1", pod=pod)
    call(vrf, "ADD", vrf_conf(prev_b), node_b, pod, ifname="net1")
    assert state(pod)["vrfs"] == {"red": (7, True, ["eth0", "net1"])}
    call(vrf, "DEL", vrf_conf(None), node_a, pod)
    assert state(pod)["vrfs"] == {"red": (7, True, ["net1"])}
    call(vrf, "DEL", vrf_conf(None), node_b, pod, ifname="net1")
    assert state(pod)["vrfs"] == {}


# --- CHECK, DEL, bad input ---------------------------------------------------


def test_check_and_del_when_things_are_gone(vrf, go_yardstick, ptp, netns_factory, tmp_path):
    """CHECK fails (999) once eth0 left the VRF or with another table (Go's
    passes whatever it finds); DEL succeeds with the VRF, the interface or
    the namespace gone."""
    node, pod, prev = pod_with_iface(ptp, netns_factory, tmp_path)
    call(vrf, "ADD", vrf_conf(prev), node, pod)
    check_fails(vrf, vrf_conf(prev, table=9), node, pod, "routing table 1, not 9")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.link_set(ipr, "eth0", master=0)
    check_fails(vrf, vrf_conf(prev), node, pod, "Failed to find eth0 associated to vrf red")
    if differs(go_yardstick, "vrf", "CHECK looks"):
        check_fails(go_yardstick.exe("vrf"), vrf_conf(prev), node, pod,
                    "failed to find eth0 associated to vrf red")
    else:
        call(go_yardstick.exe("vrf"), "CHECK", vrf_conf(prev), node, pod)
    assert call(vrf, "DEL", vrf_conf(None), node, pod) is None  # eth0 out: the VRF goes
    assert state(pod)["vrfs"] == {}
    assert call(vrf, "DEL", vrf_conf(None), node, pod) is None
    remove_netns(pod)
    assert call(vrf, "DEL", vrf_conf(None), node, pod) is None


BAD = [
    (lambda p: vrf_conf(p, vrfname=None), 7, "expected to have a valid vrf name"),
    (lambda p: vrf_conf(p, vrfname="red%d"), 7, "vrfname"),
    (lambda p: vrf_conf(None), 7, "missing prevResult from earlier plugin"),
    (lambda p: vrf_conf(p, vrfname="lo"), 999, "Netlink lo is not a VRF"),
    (lambda p: vrf_conf(p, table=-1), 7, "table"),
]


def test_bad_input_changes_nothing(vrf, ptp, netns_factory, tmp_path):
    """Each refused with its code, naming the problem; the pod as before."""
    node, pod, prev = pod_with_iface(ptp, netns_factory, tmp_path)
    before = state(pod)
    for conf, code, text in BAD:
        run = call_raw(vrf, "ADD", {k: v for k, v in conf(prev).items() if v is not None},
                       node, pod)
        assert run.exit_code == 1 and run.doc["code"] == code, run.doc
        assert text in run.doc["msg"] + run.doc.get("details", ""), run.doc
        assert state(pod) == before


def test_refusals_leave_nothing(vrf, ptp, netns_factory, tmp_path):
    """The VRF with another table, an interface with a master already, a
    missing interface (after the VRF was made: it is removed again), and
    0.2.0 (Go's vrf starts at 0.3.1)."""
    node, pod, prev = pod_with_iface(ptp, netns_factory, tmp_path)
    call(vrf, "ADD", vrf_conf(prev, table=5), node, pod)
    before = state(pod)
    run = call_raw(vrf, "ADD", vrf_conf(prev, table=6), node, pod)
    assert run.doc["code"] == 999 and "already exist with different routing table 5" \
        in run.doc["msg"]
    run = call_raw(vrf, "ADD", vrf_conf(prev, vrfname="blue"), node, pod)
    assert run.doc["code"] == 999 and "has already a master set: red" in run.doc["msg"]
    assert state(pod) == before
    run = call_raw(vrf, "ADD", vrf_conf(prev, vrfname="green"), node, pod, ifname="net7")
    assert run.doc["code"] == 999 and "could not get link by name net7" in run.doc["msg"]
    assert state(pod) == before  # no green VRF left
    run = call_raw(vrf, "ADD", vrf_conf(prev, version="0.2.0"), node, pod)
    assert run.exit_code == 1 and run.doc["code"] == 1, run.doc
