"""What the tests of the pod-link plugins (macvlan, ipvlan, vlan, dummy)
share: a node namespace whose master is a veth end with its peer in a "LAN"
namespace, calls run like a runtime, the kernel state of the pod's link, and
results with what differs per run masked.

Not a test module: test_macvlan.py, test_ipvlan.py, test_vlan.py and
test_dummy.py import it (tests/ is on sys.path through conftest.py).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

import pytest
from test_bridge_go import masked  # MACs and the sandbox masked
from yardsticks import DEBIAN, GO_DEBIAN_DIR, Yardstick, as_go

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.harness import TestNetNS, remove_netns, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS

GO_CNI_DIR = GO_DEBIAN_DIR  # the 1.1.1 yardstick (tests/yardsticks.py)


@dataclass
class Lan:
    """A node namespace and a LAN namespace joined by a veth: ``master`` in
    the node (up, no address), ``lan0`` in the LAN (up, ``lan_ips``)."""

    node: TestNetNS
    lan: TestNetNS
    master: str


def make_lan(netns_factory: Any, master: str = "eth0", lan_ips: tuple[str, ...] = (),
             default_route: str | None = None, node: TestNetNS | None = None) -> Lan:
    """A `Lan`: ``default_route`` (a gateway address on the LAN) gives the
    node a default route through ``master`` (with an address of the
    subnet, ``.254``, so the gateway is on-link)."""
    node = node or netns_factory("cnsk-node")
    lan = netns_factory("cnsk-lan")
    with NetNS.open(node.path) as n, n.rtnl() as ipr, NetNS.open(lan.path) as ln, \
            ln.rtnl() as lipr:
        netlink.create_veth_pair(ipr, master, "lan0", peer_netns=ln, peer_ipr=lipr)
        netlink.link_up(ipr, master)
        netlink.link_up(lipr, "lan0")
        for ip in lan_ips:
            netlink.add_address(lipr, "lan0", ip)
        if default_route is not None:
            net = ipaddress.ip_interface(lan_ips[0]).network
            netlink.add_address(ipr, master, f"{net.network_address + 254}/{net.prefixlen}")
            netlink.add_route(ipr, "0.0.0.0/0", gw=default_route, dev=master)
    return Lan(node, lan, master)


def call(exe: str, verb: str, conf: dict, node: TestNetNS | None, pod: TestNetNS | str | None,
         cid: str = "c1", ifname: str = "eth0", **kw: Any) -> Any:
    """`run_plugin` the way a runtime calls: CNI_NETNS is the pod's path
    (``""`` for None; a str is taken as the path)."""
    path = pod if isinstance(pod, str) else (pod.path if pod is not None else "")
    return run_plugin(exe, verb, conf, container_id=cid, netns=path, ifname=ifname, node=node,
                      **kw)


def call_raw(exe: str, verb: str, conf: dict, node: TestNetNS | None,
             pod: TestNetNS | None, cid: str = "c1", ifname: str = "eth0", **kw: Any) -> Any:
    """`run_plugin_raw` as `call` (for the error answers)."""
    return run_plugin_raw(exe, verb, conf, container_id=cid,
                          netns=pod.path if pod is not None else "", ifname=ifname,
                          node=node, **kw)


def go_exe(name: str, y: Yardstick = DEBIAN) -> str:
    """Go's ``name`` of yardstick ``y`` (Debian's 1.1.1 unless given)."""
    return y.exe(name)


def link_of(ns: TestNetNS, name: str) -> netlink.Link | None:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return netlink.find_link(ipr, name)


def links_of(ns: TestNetNS, kind: str | None = None) -> list[str]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return [lk.name for lk in netlink.links(ipr, kind)]


def pod_state(pod: TestNetNS, ifname: str = "eth0", *, with_mac: bool = False) -> dict:
    """What the kernel holds for the pod's link: kind, mode, VLAN ID, MTU,
    up, its global addresses and the pod's main-table routes through it
    (the kernel's own IPv6 ones left out); its MAC with ``with_mac``."""
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, ifname)
        if link is None:
            return {}
        addrs = sorted(str(a) for a in netlink.addresses(ipr, link) if not a.ip.is_link_local)
        routes = sorted((str(r["dst"]), str(r["gw"])) for r in netlink.routes(ipr)
                        if r["oif"] == link.index and not r["dst"].is_link_local
                        and not r["dst"].is_multicast and r["proto"] != 2)  # 2: kernel
    state = {"kind": link.kind, "mode": link.mode, "vlan_id": link.vlan_id, "mtu": link.mtu,
             "up": link.up, "addresses": addrs, "routes": routes}
    if with_mac:
        state["mac"] = link.mac
    return state


def allocated(data_dir: Any, network: str) -> list[str]:
    """host-local's allocations of ``network`` in ``data_dir``."""
    d = data_dir / network
    if not d.exists():
        return []
    return sorted(p.name for p in d.iterdir()
                  if p.name != "lock" and not p.name.startswith(("last_reserved_ip", ".")))


def merged(base: dict, top: dict) -> dict:
    """``base`` updated with ``top``; a key ``top`` sets to None is dropped."""
    return {k: v for k, v in {**base, **top}.items() if v is not None}


def host_local(data_dir: Any, *subnets: str, **extra: Any) -> dict:
    """An ``ipam`` section for host-local: one range set per subnet."""
    return {"type": "host-local", "dataDir": str(data_dir),
            "ranges": [[{"subnet": s}] for s in subnets], **extra}


@dataclass
class SideBySide:
    """One ADD of the same config by our plugin and by Go's (of yardstick
    ``y``), each in a node of its own: the executables, results and
    ``(node, pod)`` pairs."""

    ours: str
    go: str
    mine: dict
    theirs: dict
    o: tuple[TestNetNS, TestNetNS]
    g: tuple[TestNetNS, TestNetNS]
    y: Yardstick = DEBIAN

    def same(self) -> None:
        """The results are equal with MACs and sandboxes masked, ours read
        as ``y``'s Go prints it (`yardsticks.as_go`: the known differences
        of later Go), and so is the kernel state of the pods' links
        (`pod_state`)."""
        mine = as_go(self.y, os.path.basename(self.ours), self.mine)
        assert masked(mine, self.o[1].path) == masked(self.theirs, self.g[1].path)
        assert pod_state(self.o[1]) == pod_state(self.g[1])

    def finish(self, conf_of: Any, version: str, net: str, data_dir: Any,
               ours_extra: Any = None) -> None:
        """Both: CHECK with the result as prevResult (from 0.4.0), then
        ``ours_extra(node, pod, prev_config)`` for ours, then DEL twice;
        the pod link and the IPAM allocations (``data_dir / who``) are gone."""
        for exe, (node, pod), who, path, res in ((self.ours, self.o, "ours", None, self.mine),
                                                 (self.go, self.g, "go", self.y.dir,
                                                  self.theirs)):
            prev = dict(conf_of(who), prevResult=res)
            if version != "0.3.1":
                call(exe, "CHECK", prev, node, pod, cni_path=path)
            if ours_extra is not None and who == "ours":
                ours_extra(node, pod, prev)
            for _ in range(2):
                assert call(exe, "DEL", conf_of(who), node, pod, cni_path=path) is None
            assert link_of(pod, "eth0") is None and allocated(data_dir / who, net) == []


def side_by_side(ours: str, y: Yardstick, conf_of: Any, netns_factory: Any, setup: Any,
                 **kw: Any) -> SideBySide:
    """ADD the same config with our plugin and the same-named one of Go
    yardstick ``y``, each in a node of its own (``setup(netns_factory)``
    returns ``(node, pod)``); ``conf_of(who)`` gives the config for
    ``"ours"`` / ``"go"`` (their own IPAM data dirs). Go's delegates run
    from ``y``'s directory."""
    go = y.exe(os.path.basename(ours))
    o_node, o_pod = setup(netns_factory)
    g_node, g_pod = setup(netns_factory)
    mine = call(ours, "ADD", conf_of("ours"), o_node, o_pod, **kw)
    theirs = call(go, "ADD", conf_of("go"), g_node, g_pod, cni_path=y.dir, **kw)
    return SideBySide(ours, go, mine, theirs, (o_node, o_pod), (g_node, g_pod), y)


def check_fails(exe: str, config: dict, node: TestNetNS, pod: TestNetNS, *words: str,
                code: int = 999, **kw: Any) -> None:
    """CHECK is refused with ``code`` and a message holding every one of ``words``."""
    with pytest.raises(CNIError) as e:
        call(exe, "CHECK", config, node, pod, **kw)
    assert e.value.code == code, e.value
    for w in words:
        assert w in e.value.msg, e.value.msg


def refused(exe: str, config: dict, node: TestNetNS, pod: TestNetNS, code: int, text: str,
            **kw: Any) -> dict:
    """ADD fails with ``code`` and ``text`` in its msg or details; its answer."""
    run = call_raw(exe, "ADD", config, node, pod, **kw)
    assert run.exit_code == 1 and run.doc["code"] == code, (config, run.doc)
    assert text in run.doc["msg"] + run.doc.get("details", ""), (config, run.doc)
    return run.doc


def bad_master_as_go(ours: str, go: str, config: dict, netns_factory: Any, setup: Any) -> None:
    """ADD with a master that does not exist: Go's code (999) from both, and
    nothing in either pod."""
    answers = []
    for exe in (ours, go):
        node, pod = setup(netns_factory)
        answers.append(refused(exe, config, node, pod, 999, ""))
        assert links_of(pod) == ["lo"]
    assert '"nope"' in answers[0]["msg"]


def del_with_netns_gone(exe: str, config: dict, node: TestNetNS, pod: TestNetNS,
                        data_dir: Any, net: str) -> None:
    """After ADD: the pod namespace goes, DEL with its path and again with
    none both succeed and release the address."""
    remove_netns(pod)
    call(exe, "DEL", config, node, pod)
    call(exe, "DEL", config, node, None)
    assert allocated(data_dir, net) == []


def gc_and_status_go_to_ipam(exe: str, config: dict, node: TestNetNS, pod: TestNetNS,
                             data_dir: Any, net: str, **kw: Any) -> None:
    """A 1.1.0 ``config``: STATUS passes, GC with no valid attachment has
    host-local release a pod's address, its DEL still succeeds."""
    call(exe, "ADD", config, node, pod, cid="stale", **kw)
    assert allocated(data_dir, net)
    assert call(exe, "STATUS", config, node, None, cid="", ifname="") is None
    gc = dict(config, **{"cni.dev/valid-attachments": []})
    assert call(exe, "GC", gc, node, None, cid="", ifname="") is None
    assert allocated(data_dir, net) == []
    call(exe, "DEL", config, node, pod, cid="stale", **kw)
    assert links_of(pod) == ["lo"]
