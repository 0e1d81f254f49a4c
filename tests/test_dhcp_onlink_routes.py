"""dhcp: option 121 routes without a router (issue 49).

RFC 3442 lets a classless static route name 0.0.0.0 as its router: the
destination is on the link. Go >= 1.8.0 answers such a route with ``gw``
0.0.0.0 and ``scope`` 253 (link), and its IPAM installs it as a route on
the link; Go 1.1.1 gave it no scope. Ours answers as 1.9.1 does:

* `lease_result` unit tests (the ACK as pyroute2 decodes it);
* a real lease from dnsmasq (tests/dhcp_lan.py) on our macvlan + dhcp and
  on Go 1.9.1's macvlan + dhcp with its daemon, same server: the same
  result but the address; the pod's kernel holds the route with scope link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yardsticks
from cni_skel_plugins.dhcp import lease_result
from dhcp_lan import ROUTER, GoDhcpDaemon
from test_dhcp import dhcp_node, lease_masked, warm_env  # noqa: F401 (fixtures)

from cni_skel import netlink
from cni_skel.harness import run_plugin_raw
from cni_skel.netns import NetNS

ONLINK = "10.78.0.0/16"


def ack(*routes: tuple[str, str]) -> dict:
    """An ACK with a /24 mask, a router and option 121 ``routes``."""
    data: list[int] = []
    for dst, gw in routes:
        net, width = dst.split("/")
        octets = (int(width) + 7) // 8
        data += [int(width), *map(int, net.split(".")[:octets]), *map(int, gw.split("."))]
    return {"yiaddr": "10.56.0.20", "options": {
        "subnet_mask": "255.255.255.0", "router": ["10.56.0.1"],
        "classless_static_route": data}}


def test_a_route_without_router_is_scope_link():
    result = lease_result(ack((ONLINK, "0.0.0.0"), ("0.0.0.0/0", "10.56.0.1")), "1.0.0")
    assert result.to_version("1.0.0")["routes"] == [
        {"dst": ONLINK, "gw": "0.0.0.0", "scope": 253},
        {"dst": "0.0.0.0/0", "gw": "10.56.0.1"}]


def scope_of(pod: Any, dst: str) -> int | None:
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        return next((r["scope"] for r in netlink.routes(ipr) if str(r["dst"]) == dst), None)


def test_same_result_and_route_as_go_1_9_1(dhcp_node: Any, netns_factory: Any,  # noqa: F811
                                            tmp_path: Path):
    go = yardsticks.LATEST
    if not go.has("dhcp"):
        pytest.fail(f"Go 1.9.1 missing in {go.dir}: `make go-latest` builds it")
    node = dhcp_node(classless_routes=[(ONLINK, "0.0.0.0"), ("0.0.0.0/0", ROUTER)])
    ipam = {"request": [{"option": "121"}]}
    with GoDhcpDaemon(node.lan.node, tmp_path / "go", binary=go.exe("dhcp")) as daemon:
        go_pod, our_pod = netns_factory("cnsk-dhg"), netns_factory("cnsk-dho")
        go_conf = node.conf({**daemon.ipam(), **ipam})
        go_run = run_plugin_raw(go.exe("macvlan"), "ADD", go_conf, container_id="dh-go",
                                netns=go_pod.path, node=node.lan.node, cni_path=go.dir)
        assert go_run.exit_code == 0, (go_run, daemon.log())
        ours = node.call("ADD", node.conf(ipam), our_pod, cid="dh-ours")
        assert ours.exit_code == 0, ours
        g = lease_masked(go_run.doc)
        o = yardsticks.as_go(go, "macvlan", lease_masked(ours.doc))  # 1.9.1: no empty dns
        assert o == g
        assert o["routes"] == [{"dst": ONLINK, "gw": "0.0.0.0", "scope": 253},
                               {"dst": "0.0.0.0/0", "gw": ROUTER}]
        assert scope_of(our_pod, ONLINK) == scope_of(go_pod, ONLINK) == 253
        assert run_plugin_raw(go.exe("macvlan"), "DEL", go_conf, container_id="dh-go",
                              netns=go_pod.path, node=node.lan.node,
                              cni_path=go.dir).exit_code == 0
        assert node.call("DEL", node.conf(ipam), our_pod, cid="dh-ours").exit_code == 0
