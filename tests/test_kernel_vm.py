"""The kernel-feature mechanism (tests/kernelvm.py): link kinds this machine's
kernel may lack, made in a node namespace of the test's own and read back from
the kernel (in the VM when the host lacks them); and, on the host, the probe and
the reading of the VM's results."""

from __future__ import annotations

import os
import socket

import kernelvm
import pytest

from cni_skel.netlink import bridge_vlans
from cni_skel.netns import NetNS

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
]


def info(ipr, name: str, key: str | None = None):
    """The kind of link ``name`` (``key``: that IFLA_INFO_DATA attribute instead)."""
    (link,) = ipr.link("get", ifname=name)
    if key is None:
        return link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    return link.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", key)


def gone(ipr, *names: str) -> bool:
    return not any(ipr.link_lookup(ifname=n) for n in names)


@pytest.mark.kernel("dummy")
def test_dummy(node_netns):
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="dummy0", kind="dummy")
        assert info(ipr, "dummy0") == "dummy"
        ipr.link("del", ifname="dummy0")
        assert gone(ipr, "dummy0")


@pytest.mark.kernel("dummy", "ipvlan")
def test_ipvlan_on_dummy(node_netns):
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="uplink0", kind="dummy")
        parent = ipr.link_lookup(ifname="uplink0")[0]
        ipr.link("add", ifname="ipvl0", kind="ipvlan", link=parent, ipvlan_mode=1)  # l3
        (link,) = ipr.link("get", ifname="ipvl0")
        assert info(ipr, "ipvl0") == "ipvlan"
        assert info(ipr, "ipvl0", "IFLA_IPVLAN_MODE") == 1
        assert link.get("IFLA_LINK") == parent
        ipr.link("del", ifname="uplink0")  # takes its ipvlan with it
        assert gone(ipr, "uplink0", "ipvl0")


@pytest.mark.kernel("dummy", "8021q")
def test_vlan_on_dummy(node_netns):
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="uplink0", kind="dummy")
        parent = ipr.link_lookup(ifname="uplink0")[0]
        ipr.link("add", ifname="uplink0.100", kind="vlan", link=parent, vlan_id=100)
        assert info(ipr, "uplink0.100") == "vlan"
        assert info(ipr, "uplink0.100", "IFLA_VLAN_ID") == 100
        ipr.link("del", ifname="uplink0.100")
        ipr.link("del", ifname="uplink0")
        assert gone(ipr, "uplink0", "uplink0.100")


@pytest.mark.kernel("vrf")
def test_vrf(node_netns):
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="vrf-blue", kind="vrf", vrf_table=1001)
        assert info(ipr, "vrf-blue") == "vrf"
        assert info(ipr, "vrf-blue", "IFLA_VRF_TABLE") == 1001
        ipr.link("del", ifname="vrf-blue")
        assert gone(ipr, "vrf-blue")


@pytest.mark.kernel("dummy", "bridge_vlan_filtering")
def test_bridge_vlan_filtering(node_netns):
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname="br0", kind="bridge", br_vlan_filtering=1)
        assert info(ipr, "br0", "IFLA_BR_VLAN_FILTERING") == 1
        ipr.link("add", ifname="port0", kind="dummy")
        ipr.link("set", ifname="port0", master=ipr.link_lookup(ifname="br0")[0])
        # A new port joins the bridge's default VLAN 1, PVID and untagged.
        assert bridge_vlans(ipr, "port0") == [(1, True, True)]
        ipr.vlan_filter("add", index=ipr.link_lookup(ifname="port0")[0],
                        vlan_info={"vid": 100, "flags": 0})
        assert bridge_vlans(ipr, "port0") == [(1, True, True), (100, False, False)]
        ipr.link("del", ifname="port0")
        ipr.link("del", ifname="br0")
        assert gone(ipr, "port0", "br0")


# --------------------------------------------------------------------------
# the mechanism, on the host (no VM)


def test_probe_answers_for_what_every_kernel_has():
    before = set(socket.if_nameindex())
    netns = set(os.listdir("/run/netns"))
    assert kernelvm.probe(["veth", "macvlan", "bridge"]) == {
        "veth": True, "macvlan": True, "bridge": True}
    # It worked in a namespace of its own, removed after; the root one is untouched.
    assert set(os.listdir("/run/netns")) == netns
    assert set(socket.if_nameindex()) == before


def test_vm_results_by_node_id(tmp_path):
    """The VM's JUnit XML read back by node id: pass, failure text, skip,
    and an entry without a node id ignored."""
    junit = tmp_path / "junit.xml"
    junit.write_text("""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_x" name="test_a[warm]">
  <properties><property name="nodeid" value="tests/test_x.py::test_a[warm]"/></properties>
</testcase>
<testcase classname="tests.test_x" name="test_b">
  <properties><property name="nodeid" value="tests/test_x.py::test_b"/></properties>
  <failure message="assert 1 == 2">def test_b(): ...</failure>
  <error message="failed on teardown">boom</error>
</testcase>
<testcase classname="tests.test_x" name="test_c">
  <properties><property name="nodeid" value="tests/test_x.py::test_c"/></properties>
  <skipped type="pytest.skip" message="no dummy"/>
</testcase>
<testcase classname="tests.test_x" name="test_d"/>
</testsuite></testsuites>""")
    got = kernelvm.parse_junit(junit)
    assert set(got) == {"tests/test_x.py::test_a[warm]", "tests/test_x.py::test_b",
                        "tests/test_x.py::test_c"}
    assert got["tests/test_x.py::test_a[warm]"].status == "passed"
    assert got["tests/test_x.py::test_b"].status == "failed"
    assert "assert 1 == 2" in got["tests/test_x.py::test_b"].text
    assert "failed on teardown" in got["tests/test_x.py::test_b"].text
    assert (got["tests/test_x.py::test_c"].status, got["tests/test_x.py::test_c"].text) == (
        "skipped", "no dummy")


def test_kernel_found_with_its_modules(tmp_path):
    boot, mods = tmp_path / "boot", tmp_path / "modules"
    boot.mkdir()
    for v in ("6.1.0-9-amd64", "6.1.0-10-amd64", "6.12.0-1-amd64"):
        (boot / f"vmlinuz-{v}").write_bytes(b"")
    for v in ("6.1.0-9-amd64", "6.1.0-10-amd64"):  # 6.12's modules are not installed
        (mods / v).mkdir(parents=True)
        (mods / v / "modules.dep").write_text("")
    assert kernelvm.find_kernel(str(boot), str(mods)) == (boot / "vmlinuz-6.1.0-10-amd64",
                                                         "6.1.0-10-amd64")
    with pytest.raises(kernelvm.VMUnavailable, match="make deps"):
        kernelvm.find_kernel(str(tmp_path / "none"), str(mods))
