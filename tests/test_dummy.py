"""dummy through the real executable. Debian's Go plugins (1.1.1) have no
dummy, so the result is compared with Go v1.9.1's, written out from its
source (one interface, every IP on it, IPAM's routes and DNS) and side by
side with its binary (tests/yardsticks.py). This
machine's kernel may have no dummy: the tests are marked ``kernel("dummy")``
and then run in the suite's VM (tests/kernelvm.py)."""

from __future__ import annotations

import os

import pytest
import yardsticks
from podlink_common import (
    allocated,
    call,
    check_fails,
    del_with_netns_gone,
    gc_and_status_go_to_ipam,
    host_local,
    link_of,
    links_of,
    merged,
    pod_state,
    refused,
    side_by_side,
)

from cni_skel import netlink
from cni_skel.netns import NetNS

pytestmark = pytest.mark.kernel("dummy")

NET = "dmnet"


@pytest.fixture(scope="session")
def dummy(cni_bin: str) -> str:
    return os.path.join(cni_bin, "dummy")


def conf(tmp_path, version="1.0.0", **top) -> dict:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.58.0.53\n")
    return merged({"cniVersion": version, "name": NET, "type": "dummy",
                   "dns": {"nameservers": ["10.9.9.9"]},  # not copied: Go's keeps IPAM's
                   "ipam": host_local(tmp_path, "10.58.0.0/24", "fd00:58::/64",
                                      routes=[{"dst": "10.66.0.0/16"}],
                                      resolvConf=str(resolv))}, top)


def go_191_result(version: str, mac: str, sandbox: str, host: int) -> dict:
    """Go dummy v1.9.1's answer for `conf` (host-local's ``.host`` addresses)."""
    ips = [{"address": f"10.58.0.{host}/24", "gateway": "10.58.0.1"},
           {"address": f"fd00:58::{host}/64", "gateway": "fd00:58::1"}]
    if version in ("0.3.1", "0.4.0"):
        ips = [dict(ip, version="4" if "." in ip["address"] else "6") for ip in ips]
    return {"cniVersion": version,
            "interfaces": [{"name": "eth0", "mac": mac, "sandbox": sandbox}],
            "ips": [dict(ip, interface=0) for ip in ips],
            "routes": [{"dst": "10.66.0.0/16"}],
            "dns": {"nameservers": ["10.58.0.53"]}}


def test_add_check_del(dummy, node_netns, netns_factory, tmp_path):
    """For 0.3.1, 0.4.0 and 1.0.0: Go v1.9.1's result, a dummy link up in
    the pod with IPAM's addresses and routes; CHECK passes, then names what
    differs; DEL twice, then with the netns gone, leaves nothing."""
    for host, version in enumerate(("0.3.1", "0.4.0", "1.0.0"), 2):  # host-local goes round
        pod = netns_factory("cnsk-pod")
        c = conf(tmp_path, version)
        r = call(dummy, "ADD", c, node_netns, pod)
        link = link_of(pod, "eth0")
        assert r == go_191_result(version, link.mac, pod.path, host)
        state = pod_state(pod)
        assert (state["kind"], state["up"]) == ("dummy", True)
        assert state["addresses"] == [f"10.58.0.{host}/24", f"fd00:58::{host}/64"]
        assert ("10.66.0.0/16", "10.58.0.1") in state["routes"]
        assert links_of(node_netns) == ["lo"]
        if version != "0.3.1":
            call(dummy, "CHECK", dict(c, prevResult=r), node_netns, pod)
        if version == "1.0.0":
            prev = dict(c, prevResult=r)
            for change, text in ((lambda ipr: None, None),
                                 (lambda ipr: netlink.del_address(ipr, "eth0", "10.58.0.4/24"),
                                  'IP address 10.58.0.4/24 not found on "eth0"'),
                                 (lambda ipr: netlink.link_down(ipr, "eth0"), "eth0 is down"),
                                 (lambda ipr: netlink.delete_link(ipr, "eth0"),
                                  "Container Interface name in prevResult: eth0 not found")):
                with NetNS.open(pod.path) as n, n.rtnl() as ipr:
                    change(ipr)
                if text is not None:
                    check_fails(dummy, prev, node_netns, pod, text)
        for _ in range(2):
            assert call(dummy, "DEL", c, node_netns, pod) is None
        assert link_of(pod, "eth0") is None and allocated(tmp_path, NET) == []

    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path)
    call(dummy, "ADD", c, node_netns, pod)
    del_with_netns_gone(dummy, c, node_netns, pod, tmp_path, NET)


def _node_and_pod(factory):
    return factory("cnsk-node"), factory("cnsk-pod")


def test_same_as_go_191(dummy, netns_factory, tmp_path):
    """Side by side with Go v1.9.1's dummy binary (Debian's 1.1.1 has
    none), each in fresh namespaces, for 0.3.1, 0.4.0 and 1.0.0: the same
    result (MAC and sandbox masked) and the same pod link (kind, state,
    addresses, routes); CHECK passes on both, DEL twice leaves nothing."""
    go = yardsticks.LATEST
    if not go.has("dummy"):
        pytest.fail(f"Go v{go.version} is missing in {go.dir}: run `make go-latest`")
    for version in ("0.3.1", "0.4.0", "1.0.0"):
        for who in ("ours", "go"):
            (tmp_path / version / who).mkdir(parents=True)

        def conf_of(who, v=version):
            return conf(tmp_path / v / who, v)

        run = side_by_side(dummy, go, conf_of, netns_factory, _node_and_pod)
        run.same()
        run.finish(conf_of, version, NET, tmp_path / version)


def test_failures_leave_nothing(dummy, node_netns, netns_factory, tmp_path):
    """No IPAM is code 7 (Go's text); an IPAM failure leaves no link; a
    name taken in the pod is 999 and releases the address, and DEL leaves
    that link alone; GC and STATUS go to IPAM."""
    pod = netns_factory("cnsk-pod")
    doc = refused(dummy, conf(tmp_path, ipam=None), node_netns, pod, 7, "")
    assert doc["msg"] == "dummy interface requires an IPAM configuration"
    refused(dummy, conf(tmp_path, ipam={"type": "no-such-ipam"}), node_netns, pod, 7,
            "no-such-ipam")
    assert links_of(pod) == ["lo"]
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.create_veth_pair(ipr, "eth0", "peer0")
    refused(dummy, conf(tmp_path), node_netns, pod, 999, "file exists")
    assert link_of(pod, "eth0").kind == "veth" and allocated(tmp_path, NET) == []
    call(dummy, "DEL", conf(tmp_path), node_netns, pod)
    assert link_of(pod, "eth0").kind == "veth"  # not ours: DEL leaves it
    gc_and_status_go_to_ipam(dummy, conf(tmp_path, "1.1.0"), node_netns,
                             netns_factory("cnsk-pod"), tmp_path, NET)
