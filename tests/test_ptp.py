"""ptp against each Go yardstick's ptp (Debian's 1.1.1, upstream 1.9.1 when
built: tests/yardsticks.py, the differences accepted named there), side by side: the
same config to each, each in its own node namespace (so both hand out the
same addresses), IPAM by our host-local for both. Same result key for key
(MACs, veth names and the sandbox masked), same kernel state on both ends
(links, addresses, routes in the pod and on the node), the pod reaches the
node over the pair, CHECK passes and fails alike, DEL twice and with the
netns gone, a failed ADD leaves nothing. Each test runs in both modes
(oneshot, warm) through `cni_bin`."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from test_bridge_go import GO_VERSIONS, masked
from yardsticks import Yardstick, as_go, key_order

from cni_skel import CNIError, netlink
from cni_skel.gorules import chain_name
from cni_skel.harness import icmp_ping, install_plugin, nft_table, run_plugin, tcp_echo
from cni_skel.masq import FAMILY, TABLE, Masquerade
from cni_skel.netns import NetNS
from cni_skel.sysctl import read_sysctl

NET = "ptpnet"
SUBNET4, SUBNET6 = "10.61.0.0/24", "fd00:61::/64"
GW4, GW6 = "10.61.0.1", "fd00:61::1"
POD4, POD6 = "10.61.0.2", "fd00:61::2"
SETTLE = 5.0  # seconds: IPv6 DAD of the node end's gateway address (the kernel's ~1 s)


@pytest.fixture(scope="session")
def ptp(cni_bin: str) -> str:
    return os.path.join(cni_bin, "ptp")


@pytest.fixture(scope="session")
def go_ptp(go_yardstick: Yardstick) -> str:
    return go_yardstick.exe("ptp")


def conf(data_dir, version="1.0.0", *, v6=False, **top) -> dict:
    ranges = [[{"subnet": SUBNET4}]] + ([[{"subnet": SUBNET6}]] if v6 else [])
    routes = [{"dst": "0.0.0.0/0"}] + ([{"dst": "::/0"}] if v6 else [])
    return {"cniVersion": version, "name": NET, "type": "ptp",
            "ipam": {"type": "host-local", "ranges": ranges, "routes": routes,
                     "dataDir": str(data_dir)}, **top}


def run(exe, verb, c, node, pod, cid="ptp-c1", *, cni_bin, ifname="eth0"):
    """``verb`` as a runtime runs it in ``node``; IPAM from ``cni_bin``
    (our host-local, for Go's ptp too)."""
    return run_plugin(exe, verb, c, netns=pod.path if pod else "", node=node,
                      container_id=cid, ifname=ifname, cni_path=cni_bin)


def _name(name: str) -> str:
    return "<veth>" if name.startswith("veth") else name


def kernel_state(ns) -> dict:
    """Links, addresses and main-table routes of ``ns``, as comparable
    values: random veth names as ``<veth>``, link-local addresses (made
    from random MACs) as ``fe80::<ll>``, route outputs by link name."""
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        links = netlink.links(ipr)
        names = {lk.index: _name(lk.name) for lk in links}
        addrs = []
        for lk in links:
            for a in netlink.addresses(ipr, lk):
                shown = f"fe80::<ll>/{a.network.prefixlen}" if a.ip.is_link_local else str(a)
                addrs.append((names[lk.index], shown))
        routes = [(str(r["dst"]), str(r["gw"]) if r["gw"] else None, names.get(r["oif"]),
                   r["scope"], str(r["src"]) if r["src"] else None, r["proto"], r["type"],
                   r["priority"]) for r in netlink.routes(ipr)]
        with n.enter():  # /proc/sys/net is the opening thread's namespace's
            sysctls = {names[lk.index]: read_sysctl(f"net/ipv6/conf/{lk.name}/accept_ra")
                       for lk in links if lk.kind == "veth"}
    return {"links": sorted((names[lk.index], lk.kind, lk.mtu, lk.up) for lk in links),
            "addrs": sorted(addrs), "routes": sorted(routes, key=str), "accept_ra": sysctls}


def node_sysctls(ns) -> dict:
    with NetNS.open(ns.path) as n, n.enter():
        return {k: read_sysctl(f"net/{k}") for k in ("ipv4/ip_forward", "ipv6/conf/all/forwarding")}


def veths(ns) -> list[str]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return [lk.name for lk in netlink.links(ipr, "veth")]


def pod_links(ns) -> list[str]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return [lk.name for lk in netlink.links(ipr)]


def allocations(data_dir) -> list[str]:
    d = data_dir / NET
    return sorted(p.name for p in d.iterdir() if p.name[0].isdigit()) if d.exists() else []


def masq_elements(node, tag) -> list:
    """Our masquerade set elements tagged ``tag`` in ``node``."""
    table = nft_table(node, FAMILY, TABLE)
    if table is None:
        return []
    m = Masquerade(NET, nft=object())
    return [v for ver in (4, 6) for name in m.set_names(ver)
            for v, c in table.elements(name) if c == tag]


def go_masq_rules(node, cid) -> list[str]:
    """Go's iptables masquerade rules of container ``cid`` in ``node``."""
    chain = chain_name(NET, cid)
    out = []
    for tool in ("iptables", "ip6tables"):
        proc = subprocess.run(["ip", "netns", "exec", node.name, tool, "-w", "5", "-t", "nat",
                               "-S"], capture_output=True, text=True, timeout=30, check=True)
        out += [ln for ln in proc.stdout.splitlines() if chain in ln]
    return out


def wait_for(what, fn, timeout=SETTLE):
    """``fn()`` until truthy, at most ``timeout`` seconds; its last value."""
    deadline = time.monotonic() + timeout
    while not (value := fn()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert value, what
    return value


def tcp_ok(server_ns, server_ip, client_ns) -> bool:
    try:
        return tcp_echo(server_ns, server_ip, client_ns, timeout=1.0)[0] == b"cni-skel"
    except OSError:  # the node end's IPv6 address still tentative (DAD)
        return False


# --- the result ------------------------------------------------------------------------


@pytest.mark.parametrize("version", GO_VERSIONS)
def test_result_equals_go(ptp, go_ptp, go_yardstick, cni_bin, netns_factory, tmp_path,
                          version):
    """Every version Go speaks: the same result, key for key and in order
    (host veth first, then the pod's interface; ips on interface 1), and
    the config's dns over IPAM's."""
    results = {}
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(tmp_path / who, version, mtu=1400,
                 dns={"nameservers": ["10.61.0.53"], "search": ["example"]})
        out = run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        if who == "ours":
            out = as_go(go_yardstick, "ptp", out)
            results[who] = (masked(out, pod.path), key_order(go_yardstick, "ptp", out))
        else:
            results[who] = (masked(out, pod.path), list(out))
        for _ in range(2):
            assert run(exe, "DEL", c, node, pod, cni_bin=cni_bin) is None
        assert veths(node) == [] and allocations(tmp_path / who) == []
    assert results["ours"] == results["go"]
    if version >= "0.3.0":
        ours = results["ours"][0]
        assert [i["name"] for i in ours["interfaces"]] == ["<veth>", "eth0"]
        assert "sandbox" not in ours["interfaces"][0]
        assert ours["ips"] == [{"address": f"{POD4}/24", "gateway": GW4, "interface": 1}
                               | ({"version": "4"} if version < "1.0.0" else {})]


def test_dual_stack_result_and_kernel_state_equal_go(ptp, go_ptp, go_yardstick, cni_bin,
                                                     netns_factory, tmp_path):
    """IPv4 and IPv6, ipMasq, an MTU: same result; in the pod the same
    addresses, the subnet reached via the gateway with only the gateway
    on-link (scope link, source the pod's address); on the node the gateway
    as /32 and /128 on the host veth, a host-scoped route to each pod
    address, forwarding on, accept_ra off; the pod reaches the node over
    the pair (both families) and the node the pod."""
    seen = {}
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(tmp_path / who, v6=True, mtu=1400, ipMasq=True)
        result = run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        assert icmp_ping(pod, GW4, count=1, timeout=2)
        assert icmp_ping(node, POD4, count=1, timeout=2)
        wait_for(f"{who}: pod -> node over IPv6", lambda node=node, pod=pod:
                 tcp_ok(node, GW6, pod))
        assert tcp_echo(pod, POD6, node, timeout=2)[1] == GW6  # node -> pod, from the gw
        seen[who] = (masked(result, pod.path), kernel_state(pod), kernel_state(node),
                     node_sysctls(node))
        run(exe, "CHECK", {**c, "prevResult": result}, node, pod, cni_bin=cni_bin)
        if who == "ours":  # address and address . subnet, per family
            assert len(masq_elements(node, "ptp-c1/eth0")) == 4
        else:
            assert go_masq_rules(node, "ptp-c1")
        run(exe, "DEL", c, node, pod, cni_bin=cni_bin)
        assert veths(node) == [] and pod_links(pod) == ["lo"]
        assert allocations(tmp_path / who) == []
        assert masq_elements(node, "ptp-c1/eth0") == [] and go_masq_rules(node, "ptp-c1") == []
        with NetNS.open(node.path) as n, n.rtnl() as ipr:
            assert netlink.routes(ipr, 4) == []  # the host routes went with the veth
    ours, go = seen["ours"], seen["go"]
    assert as_go(go_yardstick, "ptp", ours[0]) == go[0]
    assert ours[1] == go[1], "pod"
    assert ours[2] == go[2], "node"
    assert ours[3] == go[3] == {"ipv4/ip_forward": "1", "ipv6/conf/all/forwarding": "1"}
    # what that state is (Go's trick: the subnet via the gateway; IPv6 routes have no scope)
    pod_routes = {r[:5] for r in ours[1]["routes"]}
    assert {(GW4 + "/32", None, "eth0", 253, POD4), (SUBNET4, GW4, "eth0", 0, POD4),
            ("0.0.0.0/0", GW4, "eth0", 0, None), (GW6 + "/128", None, "eth0", 0, POD6),
            (SUBNET6, GW6, "eth0", 0, POD6), ("::/0", GW6, "eth0", 0, None)} <= pod_routes
    assert not any(r[0] == SUBNET4 and r[1] is None for r in pod_routes)
    assert ("<veth>", f"{GW4}/32") in ours[2]["addrs"]
    assert ("<veth>", f"{GW6}/128") in ours[2]["addrs"]
    assert {(POD4 + "/32", None, "<veth>", 254), (POD6 + "/128", None, "<veth>", 0)} <= \
        {r[:4] for r in ours[2]["routes"]}
    assert ("eth0", "veth", 1400, True) in ours[1]["links"]
    assert ("<veth>", "veth", 1400, True) in ours[2]["links"]
    assert ours[2]["accept_ra"] == {"<veth>": "0"}


def test_go_and_our_pods_on_one_node_reach_each_other(ptp, go_ptp, cni_bin, node_netns,
                                                      netns_factory, tmp_path):
    """One network, one host-local store: a pod of Go's and one of ours on
    the same node, both host veths holding the gateway, talk through the
    node's host routes; each DEL leaves the other pod working."""
    c = conf(tmp_path / "ipam")
    pods = {who: netns_factory("cnsk-pod") for who in ("ours", "go")}
    ips = {}
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        result = run(exe, "ADD", c, node_netns, pods[who], cid=f"mix-{who}", cni_bin=cni_bin)
        ips[who] = result["ips"][0]["address"].split("/")[0]
    assert ips == {"ours": "10.61.0.2", "go": "10.61.0.3"}
    assert icmp_ping(pods["ours"], ips["go"], count=1, timeout=2)
    assert icmp_ping(pods["go"], ips["ours"], count=1, timeout=2)
    run(go_ptp, "DEL", c, node_netns, pods["go"], cid="mix-go", cni_bin=cni_bin)
    assert icmp_ping(pods["ours"], GW4, count=1, timeout=2)
    run(ptp, "DEL", c, node_netns, pods["ours"], cid="mix-ours", cni_bin=cni_bin)
    assert veths(node_netns) == [] and allocations(tmp_path / "ipam") == []


def test_masquerade_traffic_leaves_with_node_address(ptp, cni_bin, node_netns, netns_factory,
                                                     tmp_path):
    """ipMasq: a pod reaching a host outside its subnet (through the node's
    uplink) appears with the node's address; without ipMasq the outside
    host has no way back."""
    outside = netns_factory("cnsk-out")
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr, NetNS.open(outside.path) as o:
        netlink.create_veth_pair(ipr, "uplink0", "wan0", peer_netns=o)
        netlink.add_address(ipr, "uplink0", "10.88.0.1/24")
        netlink.link_up(ipr, "uplink0")
        with o.rtnl() as oipr:
            netlink.add_address(oipr, "wan0", "10.88.0.2/24")
            netlink.link_up(oipr, "wan0")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    masq, plain = conf(tmp_path / "a", ipMasq=True), {**conf(tmp_path / "b"), "name": "plain"}
    plain["ipam"] = {**plain["ipam"], "ranges": [[{"subnet": "10.62.0.0/24"}]]}
    run(ptp, "ADD", masq, node_netns, pods[0], cid="m0", cni_bin=cni_bin)
    run(ptp, "ADD", plain, node_netns, pods[1], cid="m1", cni_bin=cni_bin)
    assert tcp_echo(outside, "10.88.0.2", pods[0])[1] == "10.88.0.1"
    with pytest.raises(OSError):
        tcp_echo(outside, "10.88.0.2", pods[1], timeout=1.5)
    run(ptp, "DEL", masq, node_netns, pods[0], cid="m0", cni_bin=cni_bin)
    run(ptp, "DEL", plain, node_netns, pods[1], cid="m1", cni_bin=cni_bin)
    assert masq_elements(node_netns, "m0/eth0") == []


# --- CHECK -----------------------------------------------------------------------------


def _break(how, pod, result):
    with NetNS.open(pod.path) as p, p.rtnl() as ipr:
        if how == "address":
            netlink.del_address(ipr, "eth0", result["ips"][0]["address"])
        elif how == "route":
            netlink.del_route(ipr, "0.0.0.0/0")
        elif how == "mac":
            netlink.link_set(ipr, "eth0", address="02:00:00:00:00:61")
        elif how == "gone":
            netlink.delete_link(ipr, "eth0")


@pytest.mark.parametrize("how, says", [
    ("address", "10.61.0.2/24"),
    ("route", "0.0.0.0/0"),
    ("mac", "ptp: Interface eth0 Mac"),
    ("gone", "ptp: Container Interface name in prevResult: eth0 not found"),
    ("sandbox", "doesn't match configured netns"),
])
def test_check_fails_naming_what_differs(ptp, go_ptp, cni_bin, netns_factory, tmp_path, how,
                                         says):
    """A healthy pod passes CHECK; then one thing broken in the pod: both
    plugins fail (999), ours naming what differs, with Go's words where
    the check is ptp's own."""
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(tmp_path / who)
        result = run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        run(exe, "CHECK", {**c, "prevResult": result}, node, pod, cni_bin=cni_bin)
        prev = result
        if how == "sandbox":
            prev = {**result, "interfaces": [result["interfaces"][0],
                                             {**result["interfaces"][1], "sandbox": "/x"}]}
        else:
            _break(how, pod, result)
        with pytest.raises(CNIError) as err:
            run(exe, "CHECK", {**c, "prevResult": prev}, node, pod, cni_bin=cni_bin)
        assert err.value.code == 999, (who, err.value)
        if who == "ours" or how in ("mac", "gone", "sandbox"):
            assert says in err.value.msg, (who, err.value.msg)
        run(exe, "DEL", c, node, pod, cni_bin=cni_bin)


def test_check_needs_prev_result_and_masquerade(ptp, go_ptp, cni_bin, node_netns, pod_netns,
                                                tmp_path):
    """No prevResult: code 7 (Go: 999, same text); with ipMasq, CHECK also
    finds the pod's masquerade entries missing (Go does not look)."""
    c = conf(tmp_path, ipMasq=True)
    result = run(ptp, "ADD", c, node_netns, pod_netns, cni_bin=cni_bin)
    with pytest.raises(CNIError) as err:
        run(ptp, "CHECK", c, node_netns, pod_netns, cni_bin=cni_bin)
    assert (err.value.code, err.value.msg) == (7, "ptp: Required prevResult missing")
    with NetNS.open(node_netns.path) as n, n.enter():
        Masquerade(NET).nft.run(Masquerade(NET).entries({"ptp-c1/eth0"}))
    with pytest.raises(CNIError) as err:
        run(ptp, "CHECK", {**c, "prevResult": result}, node_netns, pod_netns, cni_bin=cni_bin)
    assert err.value.code == 999 and "10.61.0.2 is not in masquerade set" in err.value.msg
    run(ptp, "DEL", c, node_netns, pod_netns, cni_bin=cni_bin)


# --- DEL -------------------------------------------------------------------------------


def test_del_twice_and_with_the_netns_gone(ptp, go_ptp, cni_bin, netns_factory, tmp_path):
    """DEL after the pod's namespace is gone (its veth, and so the node's
    end, went with it), again, and with an empty CNI_NETNS: all succeed,
    IPAM releases the address; our masquerade entries go too (Go leaves
    its iptables chain when it can no longer see the pod's addresses)."""
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(tmp_path / who, ipMasq=True)
        run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        subprocess.run(["ip", "netns", "delete", pod.name], check=True, timeout=30)
        wait_for("the node end goes with the pod", lambda node=node: veths(node) == [])
        for _ in range(2):
            assert run(exe, "DEL", c, node, pod, cni_bin=cni_bin) is None
        assert run(exe, "DEL", c, node, None, cni_bin=cni_bin) is None
        assert allocations(tmp_path / who) == []
        if who == "ours":
            assert masq_elements(node, "ptp-c1/eth0") == []
        else:  # the difference: Go's chain stays until the node namespace goes
            assert go_masq_rules(node, "ptp-c1")


# --- failures --------------------------------------------------------------------------


def test_failed_add_leaves_nothing(ptp, go_ptp, cni_bin, netns_factory, tmp_path):
    """CNI_IFNAME already taken in the pod: both fail (999, naming it)
    after IPAM ADD, and both undo it: no veth on the node, the address
    released, no masquerade entry."""
    for who, exe in (("ours", ptp), ("go", go_ptp)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        with NetNS.open(pod.path) as p, p.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "eth0", "peer0")
        c = conf(tmp_path / who, ipMasq=True)
        with pytest.raises(CNIError) as err:
            run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        assert err.value.code == 999 and "eth0" in err.value.msg, (who, err.value)
        assert veths(node) == [] and allocations(tmp_path / who) == []
        assert masq_elements(node, "ptp-c1/eth0") == [] and go_masq_rules(node, "ptp-c1") == []


def test_failure_after_the_veth_is_undone(ptp, cni_bin, node_netns, pod_netns, tmp_path):
    """A route IPAM asks for that the kernel refuses (its gateway is not
    on-link) fails ADD after the pair exists: ours removes the pair, the
    masquerade entries and the address (Go leaves the veth pair)."""
    c = conf(tmp_path, ipMasq=True)
    c["ipam"]["routes"] = [{"dst": "10.70.0.0/16", "gw": "10.99.99.1"}]
    with pytest.raises(CNIError) as err:
        run(ptp, "ADD", c, node_netns, pod_netns, cni_bin=cni_bin)
    assert err.value.code == 999 and "10.70.0.0/16" in err.value.msg
    assert veths(node_netns) == [] and pod_links(pod_netns) == ["lo"]
    assert allocations(tmp_path) == [] and masq_elements(node_netns, "ptp-c1/eth0") == []
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr:
        assert netlink.routes(ipr) == []


@pytest.fixture
def fake_ipam(tmp_path, cni_worker_socket):
    """A bin dir with our ptp beside tests/thirdparty's fake IPAM (served by
    the suite worker in warm mode)."""
    d = tmp_path / "fbin"
    here = os.path.dirname(__file__)
    install_plugin(d, "fake-ipam", "thirdparty.fakeipam:FakeIPAMPlugin", pythonpath=[here],
                   worker_socket=cni_worker_socket)
    install_plugin(d, "ptp", "cni_skel_plugins.ptp:Ptp", worker_socket=cni_worker_socket)
    return d


@pytest.mark.parametrize("ipam, code, says, calls", [
    ({"fail": {"code": 11, "msg": "no room"}}, 11, "no room", ["ADD"]),
    ({"gateway": None}, 999, "gateway", ["ADD", "DEL"]),
])
def test_ipam_failure_or_no_gateway_leaves_nothing(fake_ipam, node_netns, pod_netns, tmp_path,
                                                   ipam, code, says, calls):
    """IPAM's own error goes out as is (nothing to release, as Go); an IPAM
    result without a gateway (ptp routes through it) is 999 and releases
    the address. Nothing is created either way."""
    log = tmp_path / "ipam.log"
    c = {"cniVersion": "1.0.0", "name": NET, "type": "ptp", "ipMasq": True,
         "ipam": {"type": "fake-ipam", "logFile": str(log), **ipam}}
    with pytest.raises(CNIError) as err:
        run_plugin(str(fake_ipam / "ptp"), "ADD", c, netns=pod_netns.path, node=node_netns,
                   container_id="ptp-c1")
    assert err.value.code == code and says in err.value.msg
    assert log.read_text().splitlines() == [f"{verb} ptp-c1 eth0" for verb in calls]
    assert veths(node_netns) == [] and pod_links(pod_netns) == ["lo"]
    assert masq_elements(node_netns, "ptp-c1/eth0") == []


@pytest.mark.parametrize("bad, key", [
    ({"ipam": None}, "ipam"), ({"mtu": -1}, "mtu"), ({"mtu": 70000}, "mtu"),
    ({"ipMasq": "often"}, "ipMasq"), ({"dns": {"nameservers": "x"}}, "dns"),
])
def test_bad_config_is_code_7_naming_the_key(ptp, cni_bin, node_netns, pod_netns, tmp_path,
                                             bad, key):
    c = {k: v for k, v in {**conf(tmp_path), **bad}.items() if v is not None}
    with pytest.raises(CNIError) as err:
        run(ptp, "ADD", c, node_netns, pod_netns, cni_bin=cni_bin)
    assert err.value.code == 7 and key in err.value.msg, err.value
    assert pod_links(pod_netns) == ["lo"] and veths(node_netns) == []
    assert allocations(tmp_path) == []


# --- GC and STATUS ---------------------------------------------------------------------


def test_gc_and_status_pass_to_ipam(ptp, cni_bin, node_netns, netns_factory, tmp_path):
    """GC (1.1.0): host-local releases the addresses of attachments not in
    the valid list, and their masquerade entries go; STATUS asks IPAM."""
    c = conf(tmp_path, "1.1.0", ipMasq=True)
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    for i, pod in enumerate(pods):
        run(ptp, "ADD", c, node_netns, pod, cid=f"g{i}", cni_bin=cni_bin)
    keep = {**c, "cni.dev/valid-attachments": [{"containerID": "g0", "ifname": "eth0"}]}
    run(ptp, "GC", keep, node_netns, None, cni_bin=cni_bin)
    assert masq_elements(node_netns, "g0/eth0") and not masq_elements(node_netns, "g1/eth0")
    assert allocations(tmp_path) == ["10.61.0.2"]
    assert run(ptp, "STATUS", c, node_netns, None, cni_bin=cni_bin) is None
    full = {**c, "ipam": {**c["ipam"], "ranges": [[{"subnet": "10.61.0.0/30"}]]}}
    with pytest.raises(CNIError) as err:  # host-local: 10.61.0.2, its only address, is held
        run(ptp, "STATUS", full, node_netns, None, cni_bin=cni_bin)
    assert err.value.code == 50
    for i, pod in enumerate(pods):
        run(ptp, "DEL", c, node_netns, pod, cid=f"g{i}", cni_bin=cni_bin)
    assert allocations(tmp_path) == []
