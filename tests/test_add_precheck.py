"""A failed ADD leaves nothing applied: a result the config's cniVersion
cannot carry (no IP at 0.1.0/0.2.0, whose results have only ip4/ip6) is
refused with code 1 before the first side effect (`check_expressible`), in
tuning, bridge without ipam, portmap and loopback; the same configs succeed
at 0.3.0 and later.

Plugins run as real executables (both modes, through ``cni_bin``) inside a
node namespace; what they could have changed is read back from the kernel
(pyroute2, /proc/sys inside the pod namespace), from nftables (libnftables
JSON) and from the filesystem (tuning's dataDir, host-local's files).
"""

from __future__ import annotations

import os
import shlex

import pytest
from yardsticks import printed

from cni_skel import netlink
from cni_skel.errors import ERR_INCOMPATIBLE_CNI_VERSION, ERR_INTERNAL, CNIError
from cni_skel.harness import TestNetNS, nft_table, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.types import Result, check_expressible, parse_result, result_to_version
from cni_skel.version import ALL_VERSIONS

OLD = ("0.1.0", "0.2.0")
NEW = tuple(v for v in ALL_VERSIONS if v not in OLD)
CID = "pre1"
ORIG_MAC = "02:00:00:00:00:1a"
NEW_MAC = "02:00:00:00:00:1b"
BRIDGE = "cnskpre0"
BRIDGE_TABLE = "cni_skel_bridge"
PORTMAP_TABLE = ("inet", "cni_portmap")

# tuning with /etc/cni/tuning hidden (an empty tmpfs, in a mount namespace
# of its own), so a node's sysctl allowlist cannot decide these tests.
TUNING_WRAPPER = """#!/bin/sh
exec /usr/bin/unshare --mount --propagation private /bin/sh -ec '
if [ -d /etc/cni/tuning ]; then mount -t tmpfs cnsk-empty /etc/cni/tuning; fi
exec "$0"' {exe}
"""

# An IPAM that allocates through host-local (so its file exists) but
# answers ADD without any IP; every other verb is host-local's own.
NOIP_IPAM = """#!/bin/sh
if [ "$CNI_COMMAND" = ADD ]; then
    out=$({hl}) || {{ printf '%s' "$out"; exit 1; }}
    printf '{{"dns": {{}}}}'
    exit 0
fi
exec {hl}
"""


def refused(run, version: str) -> None:
    """``run`` is the spec Error for a result ``version`` cannot carry."""
    assert run.exit_code == 1, run
    assert run.doc == {"cniVersion": version, "code": ERR_INCOMPATIBLE_CNI_VERSION,
                       "msg": f"cannot convert result to version {version}",
                       "details": "no IP addresses to express as ip4/ip6"}, run.doc


# --- reading the kernel and the filesystem ----------------------------------------


def links(ns: TestNetNS) -> set[str]:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return {m.get("IFLA_IFNAME") for m in ipr.get_links()}


def link_state(ns: TestNetNS, ifname: str) -> dict:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        msg = ipr.link("get", ifname=ifname)[0]
    return {"mac": msg.get("IFLA_ADDRESS"), "mtu": msg.get("IFLA_MTU"),
            "up": bool(msg["flags"] & 0x1), "promisc": bool(msg["flags"] & 0x100),
            "allmulti": bool(msg["flags"] & 0x200), "txqlen": msg.get("IFLA_TXQLEN")}


def lo_addrs(ns: TestNetNS) -> list[str]:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return [str(a) for a in netlink.addresses(ipr, "lo")]


def sysctl(ns: TestNetNS, rel: str) -> str:
    def read() -> str:
        with open(f"/proc/sys/{rel}") as fp:
            return fp.read().strip()

    with NetNS.open(ns.path) as n:
        return n.run(read)


def nft_elements(ns: TestNetNS, family: str, table: str) -> int:
    """Elements in every set and map of the table (0 when it is absent)."""
    t = nft_table(ns, family, table)
    if t is None:
        return 0
    return sum(len(list(t.elements(name))) for name in [*t.sets, *t.maps])


def files(path) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def addr_files(ipam_dir, network: str) -> list[str]:
    """host-local's per-address files of ``network``."""
    return [f for f in files(ipam_dir / network)
            if f != "lock" and not f.startswith(("last_reserved_ip", "."))]


# --- the SDK's question --------------------------------------------------------------


def test_check_expressible_matches_the_conversion():
    with_ip = parse_result({"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.5/24"}]})
    ip6_only = parse_result({"cniVersion": "1.1.0", "ips": [{"address": "fd00::5/64"}]})
    several = parse_result({"cniVersion": "1.1.0",
                            "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/x"}],
                            "ips": [{"address": "10.1.0.5/24", "interface": 1},
                                    {"address": "10.1.0.6/24", "interface": 1}]})
    no_ip = parse_result({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]})
    for version in ALL_VERSIONS:
        for result in (with_ip, ip6_only, several):
            check_expressible(version, result)
            result_to_version(result, version)  # and the conversion agrees
        check_expressible(version, has_ip=True)
        if version in NEW:
            check_expressible(version, no_ip)
            check_expressible(version, has_ip=False)
            result_to_version(no_ip, version)
            continue
        errors = []
        for call in (lambda v=version: check_expressible(v, no_ip),
                     lambda v=version: check_expressible(v, has_ip=False),
                     lambda v=version: check_expressible(v, Result()),
                     lambda v=version: result_to_version(no_ip, v)):
            with pytest.raises(CNIError) as ei:
                call()
            errors.append((ei.value.code, ei.value.msg, ei.value.details))
        assert errors == [(ERR_INCOMPATIBLE_CNI_VERSION, f"cannot convert result to version "
                           f"{version}", "no IP addresses to express as ip4/ip6")] * 4


def test_check_expressible_edges():
    # A config without cniVersion is 0.1.0.
    for empty in ("", None):
        with pytest.raises(CNIError) as ei:
            check_expressible(empty, has_ip=False)
        assert ei.value.msg == "cannot convert result to version 0.1.0"
    with pytest.raises(CNIError) as ei:
        check_expressible("0.5.0", has_ip=True)
    assert ei.value.code == ERR_INCOMPATIBLE_CNI_VERSION and "0.5.0" in ei.value.details
    for bad in ({}, {"result": Result(), "has_ip": True}):
        with pytest.raises(TypeError):
            check_expressible("1.0.0", **bad)


# --- tuning --------------------------------------------------------------------------


@pytest.fixture
def tuning(cni_bin, tmp_path) -> str:
    wrapper = tmp_path / "tuning"
    wrapper.write_text(TUNING_WRAPPER.format(exe=shlex.quote(os.path.join(cni_bin, "tuning"))))
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture
def pod_eth0(node_netns, pod_netns) -> TestNetNS:
    """eth0 (MAC ORIG_MAC, up) in the pod, its peer vh0 in the node."""
    with NetNS.open(node_netns.path) as n, NetNS.open(pod_netns.path) as p, \
            n.iproute() as ipr:
        netlink.create_veth_pair(ipr, "vh0", "eth0", p, peer_mac=ORIG_MAC)
        netlink.link_up(ipr, "vh0")
        with p.iproute() as pipr:
            netlink.link_up(pipr, "eth0")
    return pod_netns


SYSCTLS = ("net/core/somaxconn", "net/ipv4/conf/eth0/rp_filter")


def _other(current: str, choices: tuple[str, ...]) -> str:
    return next(c for c in choices if c != current)


def tuning_conf(version: str, prev: dict, pod: TestNetNS, data_dir: str) -> dict:
    """Every kind of setting tuning has, each to a value the pod does not hold."""
    return {"cniVersion": version, "name": "prenet", "type": "tuning", "dataDir": data_dir,
            "sysctl": {"net.core.somaxconn": _other(sysctl(pod, SYSCTLS[0]), ("511", "512")),
                       "net.ipv4.conf.IFNAME.rp_filter":
                           _other(sysctl(pod, SYSCTLS[1]), ("2", "1"))},
            "mac": NEW_MAC, "mtu": 1400, "promisc": True, "allmulti": True, "txQLen": 500,
            "prevResult": prev}


def ipless_prev(version: str, pod: TestNetNS, label: str) -> dict:
    """A prevResult without IP: ``label`` "newer" (1.0.0 shape, interfaces
    only) or "same" (labelled ``version``, that version's shape)."""
    if label == "same" and version in OLD:
        return {"cniVersion": version, "dns": {"nameservers": ["10.0.0.53"]}}
    return {"cniVersion": "1.0.0" if label == "newer" else version,
            "interfaces": [{"name": "eth0", "mac": ORIG_MAC, "sandbox": pod.path}]}


def pod_state(pod: TestNetNS) -> tuple[dict, dict]:
    return link_state(pod, "eth0"), {rel: sysctl(pod, rel) for rel in SYSCTLS}


@pytest.mark.parametrize("label", ["newer", "same"])
@pytest.mark.parametrize("version", OLD)
def test_tuning_refuses_before_touching_anything(version, label, tuning, node_netns, pod_eth0,
                                                 tmp_path):
    data_dir = tmp_path / "tuning-data"
    before = pod_state(pod_eth0)
    c = tuning_conf(version, ipless_prev(version, pod_eth0, label), pod_eth0, str(data_dir))
    run = run_plugin_raw(tuning, "ADD", c, container_id=CID, netns=pod_eth0.path,
                         node=node_netns)
    refused(run, version)
    assert pod_state(pod_eth0) == before
    assert files(data_dir) == []
    # The runtime's DEL after the failed ADD finds nothing to restore.
    assert run_plugin(tuning, "DEL", c, container_id=CID, netns=pod_eth0.path,
                      node=node_netns) is None
    assert pod_state(pod_eth0) == before


@pytest.mark.parametrize("version", NEW)
def test_tuning_same_config_applies_from_030(version, tuning, node_netns, pod_eth0, tmp_path):
    data_dir = tmp_path / "tuning-data"
    before = pod_state(pod_eth0)
    c = tuning_conf(version, ipless_prev(version, pod_eth0, "same"), pod_eth0, str(data_dir))
    result = run_plugin(tuning, "ADD", c, container_id=CID, netns=pod_eth0.path,
                        node=node_netns)
    assert result["cniVersion"] == version and "ips" not in result
    assert result["interfaces"][0]["mac"] == NEW_MAC
    link, sysctls = pod_state(pod_eth0)
    assert link == {**before[0], "mac": NEW_MAC, "mtu": 1400, "promisc": True,
                    "allmulti": True, "txqlen": 500}
    assert sysctls == {SYSCTLS[0]: c["sysctl"]["net.core.somaxconn"],
                       SYSCTLS[1]: c["sysctl"]["net.ipv4.conf.IFNAME.rp_filter"]}
    assert files(data_dir) == [f"{CID}_eth0.json"]
    run_plugin(tuning, "DEL", c, container_id=CID, netns=pod_eth0.path, node=node_netns)
    assert pod_state(pod_eth0) == before
    assert files(data_dir) == []


# --- bridge --------------------------------------------------------------------------


@pytest.fixture
def bridge(cni_bin) -> str:
    return os.path.join(cni_bin, "bridge")


def bridge_conf(version: str, tmp_path, ipam: str | None = None) -> dict:
    c = {"cniVersion": version, "name": "prebr", "type": "bridge", "bridge": BRIDGE,
         "macspoofchk": True}
    if ipam is not None:
        c["ipam"] = {"type": ipam, "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": "10.78.0.0/24"}]]}
    return c


def node_veths(node: TestNetNS) -> list[str]:
    return sorted(n for n in links(node) if n.startswith("veth"))


def bridge_untouched(node: TestNetNS, pod: TestNetNS, *, bridge_made: bool = False) -> None:
    """No veth on either side, no spoof-check element; no bridge either
    unless ``bridge_made`` (bridge never removes the shared bridge, as Go)."""
    assert node_veths(node) == []
    assert links(pod) == {"lo"}
    if not bridge_made:
        assert BRIDGE not in links(node)
    assert nft_elements(node, "bridge", BRIDGE_TABLE) == 0
    assert nft_elements(node, "inet", BRIDGE_TABLE) == 0


@pytest.mark.parametrize("version", OLD)
def test_bridge_l2_refuses_before_creating_anything(version, bridge, node_netns, pod_netns,
                                                    tmp_path):
    c = bridge_conf(version, tmp_path)
    run = run_plugin_raw(bridge, "ADD", c, container_id=CID, netns=pod_netns.path,
                         node=node_netns)
    refused(run, version)
    bridge_untouched(node_netns, pod_netns)
    assert run_plugin(bridge, "DEL", c, container_id=CID, netns=pod_netns.path,
                      node=node_netns) is None


@pytest.mark.parametrize("version", NEW)
def test_bridge_l2_same_config_works_from_030(version, bridge, node_netns, pod_netns,
                                               tmp_path):
    c = bridge_conf(version, tmp_path)
    result = run_plugin(bridge, "ADD", c, container_id=CID, netns=pod_netns.path,
                        node=node_netns)
    assert [i["name"] for i in result["interfaces"]][::2] == [BRIDGE, "eth0"]
    assert "ips" not in result
    assert len(node_veths(node_netns)) == 1 and "eth0" in links(pod_netns)
    assert nft_elements(node_netns, "bridge", BRIDGE_TABLE) > 0
    run_plugin(bridge, "DEL", c, container_id=CID, netns=pod_netns.path, node=node_netns)
    bridge_untouched(node_netns, pod_netns, bridge_made=True)


@pytest.mark.parametrize("version", OLD)
def test_bridge_with_ipam_still_works_at_old_versions(version, bridge, node_netns, pod_netns,
                                                      tmp_path):
    # As Go's vectors bridge-add-0.1.0/0.2.0: an address, so ip4 is there.
    c = bridge_conf(version, tmp_path, ipam="host-local")
    result = run_plugin(bridge, "ADD", c, container_id=CID, netns=pod_netns.path,
                        node=node_netns)
    assert result["cniVersion"] == version and result["ip4"]["ip"].startswith("10.78.0.")
    assert addr_files(tmp_path / "ipam", "prebr") == [result["ip4"]["ip"].split("/")[0]]
    run_plugin(bridge, "DEL", c, container_id=CID, netns=pod_netns.path, node=node_netns)
    assert addr_files(tmp_path / "ipam", "prebr") == []
    bridge_untouched(node_netns, pod_netns, bridge_made=True)


@pytest.mark.parametrize("version", OLD)
def test_bridge_failure_after_ipam_releases_the_address(version, bridge, cni_bin, node_netns,
                                                        pod_netns, tmp_path):
    # IPAM allocates (host-local writes its file) but answers without IP:
    # the ADD fails after IPAM ADD, so the roll-back must run IPAM DEL.
    ipam_bin = tmp_path / "ipam-bin"
    ipam_bin.mkdir()
    noip = ipam_bin / "cnsk-noip"
    noip.write_text(NOIP_IPAM.format(hl=shlex.quote(os.path.join(cni_bin, "host-local"))))
    noip.chmod(0o755)
    c = bridge_conf(version, tmp_path, ipam="cnsk-noip")
    run = run_plugin_raw(bridge, "ADD", c, container_id=CID, netns=pod_netns.path,
                         node=node_netns, cni_path=f"{ipam_bin}:{cni_bin}")
    assert run.exit_code == 1 and run.doc["code"] == ERR_INTERNAL, run
    assert run.doc["msg"] == "IPAM plugin returned missing IP config"
    assert (tmp_path / "ipam" / "prebr").is_dir()  # host-local did allocate ...
    assert addr_files(tmp_path / "ipam", "prebr") == []  # ... and IPAM DEL released it
    bridge_untouched(node_netns, pod_netns, bridge_made=True)


# --- portmap -------------------------------------------------------------------------


@pytest.fixture
def portmap(cni_bin) -> str:
    return os.path.join(cni_bin, "portmap")


def portmap_conf(version: str, prev: dict) -> dict:
    return {"cniVersion": version, "name": "prepm", "type": "portmap",
            "runtimeConfig": {"portMappings": [
                {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]},
            "prevResult": prev}


@pytest.mark.parametrize("label", ["newer", "same"])
@pytest.mark.parametrize("version", OLD)
def test_portmap_refuses_an_ipless_prev_result(version, label, portmap, node_netns, pod_netns):
    c = portmap_conf(version, ipless_prev(version, pod_netns, label))
    run = run_plugin_raw(portmap, "ADD", c, container_id=CID, netns=pod_netns.path,
                         node=node_netns)
    refused(run, version)
    assert nft_elements(node_netns, *PORTMAP_TABLE) == 0


@pytest.mark.parametrize("version", NEW)
def test_portmap_same_config_passes_through_from_030(version, portmap, node_netns, pod_netns):
    prev = ipless_prev(version, pod_netns, "same")
    c = portmap_conf(version, prev)
    result = run_plugin(portmap, "ADD", c, container_id=CID, netns=pod_netns.path,
                        node=node_netns)
    assert result == printed(prev)
    assert nft_elements(node_netns, *PORTMAP_TABLE) == 0  # no container address to map to


# --- loopback ------------------------------------------------------------------------


def lo_conf(version: str, prev: dict | None = None) -> dict:
    c = {"cniVersion": version, "name": "prelo", "type": "loopback"}
    if prev is not None:
        c["prevResult"] = prev
    return c


def starve_lo(pod: TestNetNS) -> None:
    """An MTU under IPv4's 68 and IPv6's 1280: going up, lo gets no address."""
    with NetNS.open(pod.path) as n, n.iproute() as ipr:
        netlink.link_set(ipr, "lo", mtu=60)


@pytest.mark.parametrize("version", OLD)
def test_loopback_chained_refuses_before_lo_goes_up(version, loopback, node_netns, pod_netns):
    before = link_state(pod_netns, "lo")
    assert not before["up"]
    c = lo_conf(version, ipless_prev(version, pod_netns, "newer"))
    run = run_plugin_raw(loopback, "ADD", c, netns=pod_netns.path, ifname="lo",
                         node=node_netns)
    refused(run, version)
    assert link_state(pod_netns, "lo") == before and lo_addrs(pod_netns) == []


@pytest.mark.parametrize("version", OLD)
def test_loopback_without_address_puts_lo_back_down(version, loopback, node_netns, pod_netns):
    starve_lo(pod_netns)
    before = link_state(pod_netns, "lo")
    run = run_plugin_raw(loopback, "ADD", lo_conf(version), netns=pod_netns.path, ifname="lo",
                         node=node_netns)
    refused(run, version)
    assert link_state(pod_netns, "lo") == before and not before["up"]


@pytest.mark.parametrize("version", OLD)
def test_loopback_leaves_an_up_lo_up(version, loopback, node_netns, pod_netns):
    # lo already up, its addresses removed: nothing to change, nothing changed.
    with NetNS.open(pod_netns.path) as n, n.iproute() as ipr:
        netlink.link_up(ipr, "lo")
        for addr in netlink.addresses(ipr, "lo"):
            netlink.del_address(ipr, "lo", addr)
    before = link_state(pod_netns, "lo")
    run = run_plugin_raw(loopback, "ADD", lo_conf(version), netns=pod_netns.path, ifname="lo",
                         node=node_netns)
    refused(run, version)
    assert link_state(pod_netns, "lo") == before and before["up"]
    assert lo_addrs(pod_netns) == []


@pytest.mark.parametrize("version", NEW)
def test_loopback_same_configs_work_from_030(version, loopback, node_netns, netns_factory):
    starved = netns_factory("cnsk-pod")
    starve_lo(starved)
    result = run_plugin(loopback, "ADD", lo_conf(version), netns=starved.path, ifname="lo",
                        node=node_netns)
    assert link_state(starved, "lo")["up"] and "ips" not in result
    assert [i["name"] for i in result["interfaces"]] == ["lo"]

    pod = netns_factory("cnsk-pod")
    prev = ipless_prev(version, pod, "same")
    result = run_plugin(loopback, "ADD", lo_conf(version, prev), netns=pod.path, ifname="lo",
                        node=node_netns)
    assert result == printed(prev)
    assert link_state(pod, "lo")["up"]


def test_loopback_old_versions_with_addresses_still_succeed(loopback, node_netns,
                                                            netns_factory):
    # Go succeeds here (vectors loopback-add-0.1.0/0.2.0); so do we, in the
    # spec's ip4/ip6 shape.
    for version in OLD:
        pod = netns_factory("cnsk-pod")
        result = run_plugin(loopback, "ADD", lo_conf(version), netns=pod.path, ifname="lo",
                            node=node_netns)
        assert result == {"cniVersion": version, "ip4": {"ip": "127.0.0.1/8"},
                          "ip6": {"ip": "::1/128"}, "dns": {}}
