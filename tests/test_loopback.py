"""loopback through the real executable, per cniVersion, with `lo` read back
from the kernel; interop with the Go loopback."""

from __future__ import annotations

import os

import pytest
from conftest import load_vector
from yardsticks import as_go

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.harness import remove_netns, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.version import ALL_VERSIONS


def lo_up(path: str) -> bool:
    with NetNS.open(path) as ns, ns.iproute() as ipr:
        return netlink.find_link(ipr, "lo").up


def conf(version: str | None, **extra) -> dict:
    c = {"name": "lo-net", "type": "loopback", **extra}
    if version is not None:
        c["cniVersion"] = version
    return c


EXPECTED = {
    # spec shapes per generation (the Go loopback prints the 1.0.0 shape
    # under every label; see test_types for that deviation)
    "0.1.0": lambda p: {"cniVersion": "0.1.0", "ip4": {"ip": "127.0.0.1/8"},
                        "ip6": {"ip": "::1/128"}, "dns": {}},
    "0.3.1": lambda p: {"cniVersion": "0.3.1",
                        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": p}],
                        "ips": [{"version": "4", "interface": 0, "address": "127.0.0.1/8"},
                                {"version": "6", "interface": 0, "address": "::1/128"}],
                        "dns": {}},
    "1.0.0": lambda p: {"cniVersion": "1.0.0",
                        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": p}],
                        "ips": [{"interface": 0, "address": "127.0.0.1/8"},
                                {"interface": 0, "address": "::1/128"}]},  # no empty dns
}
EXPECTED["0.2.0"] = lambda p: {**EXPECTED["0.1.0"](p), "cniVersion": "0.2.0"}
EXPECTED["0.3.0"] = lambda p: {**EXPECTED["0.3.1"](p), "cniVersion": "0.3.0"}
EXPECTED["0.4.0"] = lambda p: {**EXPECTED["0.3.1"](p), "cniVersion": "0.4.0"}
EXPECTED["1.1.0"] = lambda p: {**EXPECTED["1.0.0"](p), "cniVersion": "1.1.0"}


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_add_check_del_per_version(version, loopback, node_netns, pod_netns):
    pod = pod_netns.path
    assert not lo_up(pod)
    result = run_plugin(loopback, "ADD", conf(version), netns=pod, ifname="lo", node=node_netns)
    assert lo_up(pod), "ADD must bring lo up in the pod netns"
    assert result == EXPECTED[version](pod)
    if version in ("1.0.0", "1.1.0", "0.3.1", "0.4.0"):
        vec = load_vector(f"loopback-add-{version}") if version != "1.1.0" else None
        if vec and version == "1.0.0":
            # Same document as the Go loopback, bar the sandbox path.
            assert result["ips"] == vec["stdout"]["ips"]
            assert result["interfaces"][0]["mac"] == vec["stdout"]["interfaces"][0]["mac"]
    if version in ("0.4.0", "1.0.0", "1.1.0"):
        assert run_plugin(loopback, "CHECK", conf(version, prevResult=result), netns=pod,
                          ifname="lo", node=node_netns) is None
    else:
        with pytest.raises(CNIError) as ei:
            run_plugin(loopback, "CHECK", conf(version), netns=pod, ifname="lo",
                       node=node_netns)
        assert ei.value.code == 1 and ei.value.msg == "config version does not allow CHECK"
    assert run_plugin(loopback, "DEL", conf(version), netns=pod, ifname="lo",
                      node=node_netns) is None
    assert not lo_up(pod)


def test_missing_cni_version_is_010(loopback, node_netns, pod_netns):
    result = run_plugin(loopback, "ADD", conf(None), netns=pod_netns.path, ifname="lo",
                        node=node_netns)
    assert result["cniVersion"] == "0.1.0" and result["ip4"] == {"ip": "127.0.0.1/8"}


def test_chained_returns_prev_result_unchanged(loopback, node_netns, pod_netns):
    prev = {"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:00:00:05",
                            "sandbox": pod_netns.path}],
            "ips": [{"address": "10.0.0.5/24", "gateway": "10.0.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.1"]}}
    result = run_plugin(loopback, "ADD", conf("1.0.0", prevResult=prev), netns=pod_netns.path,
                        node=node_netns)
    assert result == prev
    assert lo_up(pod_netns.path)
    # A 0.3.1 prevResult handed to a 1.0.0 config comes out as 1.0.0.
    old = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.5/24"}]}
    result = run_plugin(loopback, "ADD", conf("1.0.0", prevResult=old), netns=pod_netns.path,
                        node=node_netns)
    assert result == {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/24"}]}


def test_check_fails_when_lo_is_down(loopback, node_netns, pod_netns):
    c = conf("1.1.0")
    result = run_plugin(loopback, "ADD", c, netns=pod_netns.path, node=node_netns)
    with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
        netlink.link_down(ipr, "lo")
    with pytest.raises(CNIError) as ei:
        run_plugin(loopback, "CHECK", {**c, "prevResult": result}, netns=pod_netns.path,
                   node=node_netns)
    assert "down" in ei.value.msg


def test_add_again_when_up_and_after_del(loopback, node_netns, pod_netns):
    """ADD on an ``lo`` already up answers what the first ADD did; after DEL
    (``lo`` down, its IPv6 address gone with it) the addresses are read back
    once the kernel has put them on again."""
    c = conf("1.1.0")
    first = run_plugin(loopback, "ADD", c, netns=pod_netns.path, node=node_netns)
    assert first == EXPECTED["1.1.0"](pod_netns.path)
    assert run_plugin(loopback, "ADD", c, netns=pod_netns.path, node=node_netns) == first
    run_plugin(loopback, "DEL", c, netns=pod_netns.path, node=node_netns)
    assert not lo_up(pod_netns.path)
    assert run_plugin(loopback, "ADD", c, netns=pod_netns.path, node=node_netns) == first
    assert lo_up(pod_netns.path)


def test_a_non_loopback_address_is_999_and_lo_stays_down(loopback, node_netns, pod_netns):
    """Go's error text, naming the address without its prefix; Go leaves
    ``lo`` up, we put it back down as we found it."""
    with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
        netlink.add_address(ipr, "lo", "10.9.9.9/32")
    with pytest.raises(CNIError) as ei:
        run_plugin(loopback, "ADD", conf("1.0.0"), netns=pod_netns.path, node=node_netns)
    assert ei.value.code == 999
    assert ei.value.msg == 'loopback interface found with non-loopback address "10.9.9.9"'
    assert not lo_up(pod_netns.path)


def test_del_is_idempotent_and_survives_a_gone_netns(loopback, node_netns, netns_factory):
    pod = netns_factory("cnsk-gone")
    c = conf("1.0.0")
    run_plugin(loopback, "ADD", c, netns=pod.path, node=node_netns)
    for _ in range(2):
        assert run_plugin(loopback, "DEL", c, netns=pod.path, node=node_netns) is None
    remove_netns(pod)
    assert not os.path.exists(pod.path)
    # containerd's repeated DEL: with the old path, then with CNI_NETNS="".
    assert run_plugin(loopback, "DEL", c, netns=pod.path, node=node_netns) is None
    assert run_plugin(loopback, "DEL", c, netns="", node=node_netns) is None


def test_add_on_missing_netns_is_code_3(loopback, node_netns):
    with pytest.raises(CNIError) as ei:
        run_plugin(loopback, "ADD", conf("1.0.0"), netns="/run/netns/cnsk-never-made",
                   node=node_netns)
    assert ei.value.code == 3


def test_add_on_a_file_that_is_no_netns_is_code_8(loopback, node_netns, tmp_path):
    bogus = tmp_path / "not-a-netns"
    bogus.write_text("")
    with pytest.raises(CNIError) as ei:
        run_plugin(loopback, "ADD", conf("1.0.0"), netns=str(bogus), node=node_netns)
    assert ei.value.code == 8


def test_refuses_the_plugins_own_netns(loopback, node_netns):
    # The plugin runs in node_netns; pointing CNI_NETNS at it must not
    # reconfigure the node (Go skel rule, code 8), unless overridden.
    run = run_plugin_raw(loopback, "ADD", conf("1.0.0"), netns=node_netns.path,
                         node=node_netns)
    assert run.exit_code == 1 and run.doc["code"] == 8
    assert not lo_up(node_netns.path)


def test_containerd_loopback_call(loopback, node_netns, pod_netns):
    """What containerd's CRI plugin really sends (runtime-captures.md)."""
    cni_args = ("K8S_POD_NAME=demo-pod1;K8S_POD_INFRA_CONTAINER_ID=b467fd2e;"
                "K8S_POD_UID=uid-demo-pod1;IgnoreUnknown=1;K8S_POD_NAMESPACE=demo-ns")
    result = run_plugin(loopback, "ADD", {"cniVersion": "0.3.1", "name": "cni-loopback",
                        "type": "loopback"}, netns=pod_netns.path, ifname="lo",
                        cni_args=cni_args, container_id="b467fd2eb259810409f8", node=node_netns)
    assert result["interfaces"] == [{"name": "lo", "mac": "00:00:00:00:00:00",
                                     "sandbox": pod_netns.path}]


@pytest.mark.parametrize("first,second", [("ours", "go"), ("go", "ours")])
def test_interop_with_go_loopback(first, second, loopback, go_yardstick, node_netns, pod_netns):
    exes = {"ours": loopback, "go": go_yardstick.exe("loopback")}
    c = conf("1.0.0")
    result = run_plugin(exes[first], "ADD", c, netns=pod_netns.path, ifname="lo",
                        node=node_netns)
    assert lo_up(pod_netns.path)
    run_plugin(exes[second], "CHECK", {**c, "prevResult": result}, netns=pod_netns.path,
               ifname="lo", node=node_netns)
    run_plugin(exes[second], "DEL", c, netns=pod_netns.path, ifname="lo", node=node_netns)
    assert not lo_up(pod_netns.path)
    go = run_plugin(exes["go"], "ADD", c, netns=pod_netns.path, ifname="lo", node=node_netns)
    ours = run_plugin(exes["ours"], "ADD", c, netns=pod_netns.path, ifname="lo",
                      node=node_netns)
    assert go == as_go(go_yardstick, "loopback", ours), "same 1.0.0 document from both"
