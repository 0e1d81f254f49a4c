"""The leak detector of the fuzz suite sees what it must (a veth, an
address, an nftables table and element, a file, a sysctl, a changed MTU)
and lets a network's infrastructure (a bridge, its gateway address, a chain
in a shared table) pass: if it went blind, every fuzz test would pass."""

from __future__ import annotations

from typing import Any

import pytest

from cni_skel.netns import NetNS
from cni_skel.nft import Nft

from . import snapshot

pytestmark = pytest.mark.root

SYSCTL = "net/ipv4/conf/all/forwarding"


def _write(ns: Any, key: str, value: str) -> None:
    with NetNS.open(ns.path) as handle, handle.enter(), open(f"/proc/sys/{key}", "w") as fp:
        fp.write(value)


def test_snapshot_diff_names_leaks_and_passes_infrastructure(node_netns, pod_netns,
                                                             tmp_path) -> None:
    data = tmp_path / "data"
    (data / "net").mkdir(parents=True)
    (data / "net" / "lock").write_text("")
    observer = snapshot.Observer({"node": node_netns.path, "pod": pod_netns.path},
                                 [str(data)], {"pod": [SYSCTL]})
    try:
        before = observer.take()
        with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
            ipr.link("add", ifname="cnskbr0", kind="bridge")
            ipr.addr("add", index=ipr.link_lookup(ifname="cnskbr0")[0], address="10.55.0.1",
                     prefixlen=24)
            ipr.link("add", ifname="vethleak", kind="veth", peer="vethleakp")
            ns.run(lambda: Nft().run([
                {"add": {"table": {"family": "inet", "name": "cni_skel_bridge"}}},
                {"add": {"chain": {"family": "inet", "table": "cni_skel_bridge",
                                   "name": "n_x"}}},
                {"add": {"table": {"family": "inet", "name": "leaky"}}},
                {"add": {"set": {"family": "inet", "table": "leaky", "name": "s",
                                 "type": "ipv4_addr"}}},
                {"add": {"element": {"family": "inet", "table": "leaky", "name": "s",
                                     "elem": ["10.55.0.9"]}}}]))
        with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], mtu=1400)
            ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")
            ipr.addr("add", index=ipr.link_lookup(ifname="eth0")[0], address="10.55.0.9",
                     prefixlen=24)
        _write(pod_netns, SYSCTL, "1")
        (data / "net" / "10.55.0.9").write_text("c1\r\neth0")
        (data / "net" / "last_reserved_ip.0").write_text("10.55.0.9")
        after = observer.take()
    finally:
        observer.close()
    lines = snapshot.diff(before, after)
    text = "\n".join(lines)
    for expected in ("+ link node/vethleak veth", "+ link node/vethleakp veth",
                     "+ link pod/eth0 veth", "+ address 10.55.0.9/24 on pod/eth0",
                     "~ link pod/lo device: mtu 65536 -> 1400",
                     "+ nftables table node: inet leaky", "+ nftables set node: inet leaky s",
                     "+ nftables element node: inet leaky set s", "+ file net/10.55.0.9",
                     f"~ sysctl pod {SYSCTL}: '0' -> '1'",
                     "+ nftables table node: inet cni_skel_bridge"):
        assert any(line.startswith(expected) for line in lines), (expected, text)
    for passed in ("cnskbr0", "10.55.0.1", "n_x", "last_reserved_ip", "lock"):
        assert passed not in text, (passed, text)
    assert snapshot.diff(after, after) == []
