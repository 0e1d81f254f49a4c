"""examples/village and its chapter, docs/village.md.

The chapter runs as written (its ``sh run`` blocks in order in a fresh
directory, its ``python file=PATH`` blocks written in between, as
tests/test_tutorial.py runs docs/tutorial.md) and ends with the project's own
test passing; the project it builds is examples/village, byte for byte. The
example uses cni-skel's public names only, and lints clean as an author's
project.

Then the example's two executables (village, village-ipam) in namespaces, in
both modes: a node whose uplink is a veth into a "LAN" namespace (10.10.0.0/24,
the LAN's router 10.10.0.1 on the far end, the node's default gateway), two
pods on it. Go's bridge plugin leaves its bridge when the last pod goes, and so
does village: ``village0`` stays on the node after every DEL.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from doc_runner import non_public_imports, run_page, steps, third_party_lint

from cni_skel import CNIError, netlink
from cni_skel.harness import icmp_ping
from cni_skel.netns import NetNS
from cni_skel.sysctl import write_sysctl
from cni_skel.testing import install_plugin, run_plugin

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "village.md"
EXAMPLE = ROOT / "examples" / "village"
NETWORK = "village-net"


# --- the chapter -------------------------------------------------------------------------


def example_files() -> dict[str, str]:
    """examples/village's files, by path below it (no caches)."""
    return {str(p.relative_to(EXAMPLE)): p.read_text() for p in sorted(EXAMPLE.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_chapter_writes_the_example():
    written = {path.removeprefix("village/"): text for path, text in steps(DOC) if path != "run"}
    example = example_files()
    for path, text in written.items():
        assert text == example.get(path), f"docs/village.md's {path} is not examples/village's"
    # the rest of the example is what `cni-skel new-plugin village` writes
    assert set(example) - set(written) == {"cni_village/__init__.py"}


def test_the_chapter_runs_as_written(tmp_path):
    """From `cni-skel new-plugin village` to the project's test passing, with
    the cni-skel of this checkout (its bin directory first on PATH)."""
    last = run_page(DOC, tmp_path)
    assert re.search(r"\b1 passed\b", last), last
    project = tmp_path / "village"
    for path, text in example_files().items():  # generated __init__.py included
        assert (project / path).read_text() == text, path
    entry_points = (project / "pyproject.toml").read_text()
    assert entry_points.count('\nvillage = "cni_village:Village"\n') == 1
    assert entry_points.count('\nvillage-ipam = "cni_village.ipam:VillageIPAM"\n') == 1


@pytest.mark.parametrize("path", ["cni_village/plugin.py", "cni_village/ipam.py",
                                  "tests/test_plugin.py"])
def test_the_example_uses_public_names_only(path):
    """Only cni_skel.PUBLIC and the __all__ of PUBLIC_MODULES (docs/stability.md)."""
    assert non_public_imports(EXAMPLE / path) == []


def test_the_example_is_lint_clean_as_a_third_party_project():
    proc = third_party_lint(EXAMPLE)
    assert proc.returncode == 0, proc.stdout


# --- in namespaces -----------------------------------------------------------------------


@pytest.fixture
def village(tmp_path, cni_worker_socket):
    """The example's two executables in one bin dir, in each mode (warm: served
    by the suite worker, which loads cni_village)."""
    bin_dir = tmp_path / "bin"
    install_plugin(bin_dir, "village-ipam", "cni_village.ipam:VillageIPAM",
                   pythonpath=[str(EXAMPLE)], worker_socket=cni_worker_socket)
    return install_plugin(bin_dir, "village", "cni_village:Village",
                          pythonpath=[str(EXAMPLE)], worker_socket=cni_worker_socket)


@pytest.fixture
def lan(node_netns, netns_factory):
    """The LAN namespace, wired to the node's uplink0 (node 10.10.0.2, LAN
    router 10.10.0.1, the node's default gateway). It learns neighbours from
    gratuitous ARP (arp_accept), so a pod's announcement shows in its table."""
    lan = netns_factory("cnsk-lan")
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr, \
            NetNS.open(lan.path) as ln, ln.rtnl() as lipr:
        uplink, peer = netlink.create_veth_pair(ipr, "uplink0", "lan0", peer_netns=ln,
                                                peer_ipr=lipr)
        netlink.add_address(ipr, uplink, "10.10.0.2/24")
        netlink.link_up(ipr, uplink)
        netlink.add_route(ipr, "0.0.0.0/0", gw="10.10.0.1")
        netlink.add_address(lipr, peer, "10.10.0.1/24")
        netlink.link_up(lipr, peer)
        ln.run(write_sysctl, "net/ipv4/conf/lan0/arp_accept", "1")
    return lan


def _conf(tmp_path, lan_end="10.10.0.249", **extra):
    return {"cniVersion": "1.1.0", "name": NETWORK, "type": "village", **extra,
            "ipam": {"type": "village-ipam", "dataDir": str(tmp_path / "ipam"),
                     "cluster": {"subnet": "10.244.1.0/24"},
                     "lan": {"subnet": "10.10.0.0/24", "rangeStart": "10.10.0.200",
                             "rangeEnd": lan_end}}}


def _run(exe, verb, conf, pod, node, cid):
    return run_plugin(exe, verb, conf, netns=pod.path if pod else "", node=node,
                      container_id=cid)


def _links(ns) -> dict[str, netlink.Link]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return {link.name: link for link in netlink.links(ipr)}


def _addresses(ns, name) -> list[str]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return [str(a) for a in netlink.addresses(ipr, name, 4)]


def _allocations(tmp_path) -> dict[str, bytes]:
    """host-local's layout: one file per address (and the lock file)."""
    d = tmp_path / "ipam" / NETWORK
    return {p.name: p.read_bytes() for p in d.iterdir() if p.name != "lock"} if d.exists() \
        else {}


def _neighbours(ns) -> dict[str, str]:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return {m.get_attr("NDA_DST"): m.get_attr("NDA_LLADDR") for m in ipr.get_neighbours(2)}


def test_two_pods_on_the_cluster_and_the_lan(village, tmp_path, node_netns, lan,
                                             netns_factory):
    conf = _conf(tmp_path)
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    r1, r2 = (_run(village, "ADD", conf, pod, node_netns, f"pod-{i}")
              for i, pod in enumerate(pods, 1))

    # the result: bridge, node end, eth0, net1; eth0's IP first (the pod's IP)
    bridge_if, host_if, eth0_if, net1_if = r1["interfaces"]
    assert bridge_if == {"name": "village0", "mac": bridge_if["mac"]}
    assert host_if["name"].startswith("veth") and "sandbox" not in host_if
    assert eth0_if == {"name": "eth0", "mac": eth0_if["mac"], "sandbox": pods[0].path}
    assert net1_if == {"name": "net1", "mac": net1_if["mac"], "sandbox": pods[0].path}
    assert r1["ips"] == [{"address": "10.244.1.2/24", "gateway": "10.244.1.1", "interface": 2},
                         {"address": "10.10.0.200/24", "interface": 3}]
    assert r1["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}]
    assert [ip["address"] for ip in r2["ips"]] == ["10.244.1.3/24", "10.10.0.201/24"]

    # the kernel: the bridge holds the gateway, both node ends are its ports
    node = _links(node_netns)
    bridge = node["village0"]
    assert bridge.kind == "bridge" and bridge.up  # its MAC pinned: no port changes it
    assert bridge.mac == bridge_if["mac"] == r2["interfaces"][0]["mac"]
    assert _addresses(node_netns, "village0") == ["10.244.1.1/24"]
    assert [ln.name for ln in node.values() if ln.master == bridge.index] == \
        [host_if["name"], r2["interfaces"][1]["name"]]
    pod = _links(pods[0])
    assert pod["eth0"].kind == "veth" and pod["eth0"].mac == eth0_if["mac"] and pod["eth0"].up
    net1 = pod["net1"]
    assert (net1.kind, net1.mode, net1.mac, net1.up) == ("macvlan", "bridge", net1_if["mac"], True)
    assert net1.link_netnsid is not None and net1.parent == node["uplink0"].index
    assert _addresses(pods[0], "eth0") == ["10.244.1.2/24"]
    assert _addresses(pods[0], "net1") == ["10.10.0.200/24"]
    with NetNS.open(pods[0].path) as n, n.rtnl() as ipr:
        default = [r for r in netlink.routes(ipr, 4) if r["dst"].prefixlen == 0]
        assert [(str(r["gw"]), r["oif"]) for r in default] == [("10.244.1.1", pod["eth0"].index)]
        assert netlink.route_get(ipr, "10.10.0.1")["oif"] == net1.index    # the LAN
        assert netlink.route_get(ipr, "10.244.1.3")["oif"] == pod["eth0"].index  # pod 2
    # announced: the LAN learnt net1's MAC from its gratuitous ARP, before any ping
    assert _neighbours(lan).get("10.10.0.200") == net1.mac

    # host-local's bytes, one file per address
    assert _allocations(tmp_path) == {
        "10.244.1.2": b"pod-1\r\neth0", "10.10.0.200": b"pod-1\r\neth0",
        "10.244.1.3": b"pod-2\r\neth0", "10.10.0.201": b"pod-2\r\neth0"}

    # traffic: pod 1 to the LAN over net1, to pod 2 over eth0; the LAN to pod 1
    assert icmp_ping(pods[0], "10.10.0.1", count=1, timeout=2)
    assert icmp_ping(pods[0], "10.244.1.3", count=1, timeout=2)
    assert icmp_ping(lan, "10.10.0.200", count=1, timeout=2)
    assert icmp_ping(pods[1], "10.10.0.200", count=1, timeout=2)  # pod to pod on the LAN

    for i, (pod, result) in enumerate(zip(pods, (r1, r2), strict=True), 1):
        _run(village, "CHECK", {**conf, "prevResult": result}, pod, node_netns, f"pod-{i}")
    with NetNS.open(pods[1].path) as n, n.rtnl() as ipr:
        netlink.del_address(ipr, "net1", "10.10.0.201/24")
    with pytest.raises(CNIError) as err:
        _run(village, "CHECK", {**conf, "prevResult": r2}, pods[1], node_netns, "pod-2")
    assert err.value.code == 999 and "10.10.0.201" in err.value.msg and "net1" in err.value.msg
    with NetNS.open(pods[1].path) as n, n.rtnl() as ipr:
        netlink.delete_link(ipr, "net1")
    with pytest.raises(CNIError) as err:
        _run(village, "CHECK", {**conf, "prevResult": r2}, pods[1], node_netns, "pod-2")
    assert err.value.code == 999 and "net1" in err.value.msg

    for i, pod in enumerate(pods, 1):
        _run(village, "DEL", conf, pod, node_netns, f"pod-{i}")
        assert _links(pod).keys() == {"lo"}
    assert _links(node_netns).keys() == {"lo", "uplink0", "village0"}  # the bridge stays
    assert _allocations(tmp_path) == {}
    _run(village, "DEL", conf, pods[0], node_netns, "pod-1")  # repeatable
    _run(village, "DEL", conf, None, node_netns, "pod-2")     # the netns gone


def test_lan_range_used_up(village, tmp_path, node_netns, lan, netns_factory):
    """One LAN address: the second pod's ADD fails with code 50 and leaves
    nothing, its cluster address not held; STATUS says 50 meanwhile, GC
    releases what no valid attachment holds."""
    conf = _conf(tmp_path, lan_end="10.10.0.200")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    _run(village, "ADD", conf, pods[0], node_netns, "pod-1")
    with pytest.raises(CNIError) as err:
        _run(village, "ADD", conf, pods[1], node_netns, "pod-2")
    assert err.value.code == 50 and "lan range is full" in err.value.msg
    assert _links(pods[1]).keys() == {"lo"}
    assert len([ln for ln in _links(node_netns).values() if ln.kind == "veth"]) == 2  # + uplink
    assert sorted(_allocations(tmp_path)) == ["10.10.0.200", "10.244.1.2"]
    with pytest.raises(CNIError) as err:
        _run(village, "STATUS", conf, None, node_netns, "")
    assert err.value.code == 50

    keep = {**conf, "cni.dev/valid-attachments": [{"containerID": "pod-1", "ifname": "eth0"}]}
    _run(village, "GC", keep, None, node_netns, "")
    assert sorted(_allocations(tmp_path)) == ["10.10.0.200", "10.244.1.2"]
    _run(village, "GC", {**conf, "cni.dev/valid-attachments": []}, None, node_netns, "")
    assert _allocations(tmp_path) == {}
    _run(village, "STATUS", conf, None, node_netns, "")
    _run(village, "DEL", conf, pods[0], node_netns, "pod-1")
    assert _links(pods[0]).keys() == {"lo"}


@pytest.mark.parametrize("case", ["missing uplink", "net1 taken"])
def test_failed_add_undoes_everything(village, tmp_path, node_netns, lan, pod_netns, case):
    """A step after IPAM ADD and the veth fails: the veth goes, IPAM DEL runs."""
    conf = _conf(tmp_path)
    if case == "missing uplink":
        conf["uplink"] = "nope0"
    else:
        with NetNS.open(pod_netns.path) as n, n.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "net1", "peer1")
    with pytest.raises(CNIError) as err:
        _run(village, "ADD", conf, pod_netns, node_netns, "pod-1")
    assert err.value.code == 999
    assert ("nope0" if case == "missing uplink" else "net1") in err.value.msg
    left = {"lo"} if case == "missing uplink" else {"lo", "net1", "peer1"}
    assert _links(pod_netns).keys() == left
    assert _links(node_netns).keys() == {"lo", "uplink0", "village0"}
    assert _allocations(tmp_path) == {}


def test_no_uplink_and_no_default_route(village, tmp_path, node_netns, lan, pod_netns):
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr:
        netlink.del_route(ipr, "0.0.0.0/0", gw="10.10.0.1")
    with pytest.raises(CNIError) as err:
        _run(village, "ADD", _conf(tmp_path), pod_netns, node_netns, "pod-1")
    assert err.value.code == 7 and err.value.msg.startswith("uplink:")
    assert _allocations(tmp_path) == {} and _links(pod_netns).keys() == {"lo"}
    # named, it needs no default route
    result = _run(village, "ADD", _conf(tmp_path, uplink="uplink0"), pod_netns, node_netns,
                  "pod-1")
    assert result["ips"][1]["address"] == "10.10.0.200/24"
    _run(village, "DEL", _conf(tmp_path), pod_netns, node_netns, "pod-1")


@pytest.mark.parametrize("where, value", [
    (("bridge",), "a/b"),
    (("ipam", "lan", "rangeStart"), "10.11.0.1"),          # outside the LAN subnet
    (("ipam", "cluster", "subnet"), "10.244.1.1/24"),      # host bits set
])
def test_bad_config_is_code_7_naming_the_key(village, tmp_path, node_netns, lan, pod_netns,
                                             where, value):
    conf = _conf(tmp_path)
    parent = conf
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    with pytest.raises(CNIError) as err:
        _run(village, "ADD", conf, pod_netns, node_netns, "pod-1")
    assert err.value.code == 7 and where[-1] in err.value.msg
    assert _links(pod_netns).keys() == {"lo"} and _allocations(tmp_path) == {}


def test_ipam_alone(village, tmp_path, node_netns, pod_netns):
    """village-ipam run directly: a repeated ADD answers the same addresses,
    CHECK is code 3 for an attachment holding none, DEL releases."""
    ipam = os.path.join(os.path.dirname(village), "village-ipam")
    conf = {**_conf(tmp_path), "type": "village-ipam"}
    run = {"node": node_netns, "netns": pod_netns.path}  # unused by IPAM, required for ADD
    first = run_plugin(ipam, "ADD", conf, container_id="c1", **run)
    assert first["ips"] == [{"address": "10.244.1.2/24", "gateway": "10.244.1.1"},
                            {"address": "10.10.0.200/24"}]
    assert run_plugin(ipam, "ADD", conf, container_id="c1", **run) == first
    run_plugin(ipam, "CHECK", conf, container_id="c1", **run)
    with pytest.raises(CNIError) as err:
        run_plugin(ipam, "CHECK", conf, container_id="c2", **run)
    assert err.value.code == 3 and "c2" in err.value.msg
    run_plugin(ipam, "DEL", conf, container_id="c1", **run)
    run_plugin(ipam, "DEL", conf, container_id="c1", **run)
    assert _allocations(tmp_path) == {}
