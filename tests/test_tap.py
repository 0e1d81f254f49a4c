"""tap through the real executable, side by side with Go's tap v1.9.1
(Debian's Go plugins, 1.1.1, have none), each in fresh namespaces: the same
result key for key (MACs and the sandbox masked) and the same kernel state
of the device (kind, tun flags, owner, group, multi-queue, MTU, MAC, bridge,
addresses, routes), read back with netlink. Go's side runs Go's host-local
(its own data dir); ours, ours.

Known differences, asserted as such: with both ``owner`` and ``group`` Go's
netlink path drops ``mtu`` and ``mac``, ours applies them; a failed ADD of
Go's leaves the device, ours leaves nothing.
"""

from __future__ import annotations

import os

import pytest
import yardsticks
from podlink_common import (
    allocated,
    call,
    call_raw,
    check_fails,
    del_with_netns_gone,
    gc_and_status_go_to_ipam,
    host_local,
    links_of,
    merged,
    refused,
)
from test_bridge_go import masked  # MACs and the sandbox masked

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.netns import NetNS
from cni_skel.rtnl import Rtnl
from cni_skel.sysctl import read_sysctl

NET = "tapnet"
GO = yardsticks.LATEST


@pytest.fixture(scope="session")
def tap(cni_bin: str) -> str:
    return os.path.join(cni_bin, "tap")


@pytest.fixture(scope="session")
def go_tap() -> str:
    if not GO.has("tap") or not GO.has("host-local"):
        pytest.fail(f"Go's tap v{GO.version} is missing in {GO.dir}: run `make go-latest` "
                    "(it builds upstream's plugins from ../shared/yardstick)")
    return GO.exe("tap")


def conf(data_dir, version="1.0.0", **top) -> dict:
    return merged({"cniVersion": version, "name": NET, "type": "tap",
                   "ipam": host_local(data_dir, "10.61.0.0/24", routes=[{"dst": "10.66.0.0/16"}])},
                  top)


def tun_data(ns, ifname: str = "eth0") -> dict:
    """IFLA_TUN_* of the device, through pyroute2 (None keys absent)."""
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        for msg in ipr.get_links(ifname=ifname):
            data = msg.get_attr("IFLA_LINKINFO").get_attr("IFLA_INFO_DATA")
            return {k.removeprefix("IFLA_TUN_").lower(): v for k, v in data["attrs"]
                    if not k.startswith("IFLA_TUN_NUM_")}
    return {}


def tap_state(pod, ifname: str = "eth0", *, with_mac: bool = False) -> dict:
    """What the kernel holds for the pod's device: its kind and tun data,
    MTU, up, the bridge it is a port of, its global addresses, the pod's
    main-table routes through it (the kernel's own left out); the MAC with
    ``with_mac``."""
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, ifname)
        if link is None:
            return {}
        master = netlink.find_link(ipr, link.master) if link.master else None
        addrs = sorted(str(a) for a in netlink.addresses(ipr, link) if not a.ip.is_link_local)
        routes = sorted((str(r["dst"]), str(r["gw"])) for r in netlink.routes(ipr)
                        if r["oif"] == link.index and not r["dst"].is_link_local
                        and not r["dst"].is_multicast and r["proto"] != 2)  # 2: kernel
    state = {"kind": link.kind, "tun": tun_data(pod, ifname), "mtu": link.mtu, "up": link.up,
             "bridge": master.name if master else None, "addresses": addrs, "routes": routes}
    if with_mac:
        state["mac"] = link.mac
    return state


def with_bridge(netns_factory):
    pod = netns_factory("cnsk-pod")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.ensure_bridge(ipr, "br0")
    return pod


def fresh(netns_factory):
    return netns_factory("cnsk-pod")


def go_del_twice(exe, config, node, pod, **kw):
    for _ in range(2):
        assert call(exe, "DEL", config, node, pod, **kw) is None
    assert links_of(pod, "tun") == []


#: name -> (config keys, CNI_ARGS, pod setup, what Go does not apply)
CASES = {
    "l2-defaults": ({"ipam": None}, "", fresh, ()),
    "l2-mac-mtu-multiqueue": ({"ipam": None, "mac": "02:61:00:00:00:01", "mtu": 9000,
                               "multiQueue": True}, "", fresh, ()),
    "owner-only": ({"owner": 1000, "dns": {"nameservers": ["10.61.0.53"]}}, "", fresh, ()),
    "group-only-multiqueue": ({"group": 100, "multiQueue": True}, "", fresh, ()),
    "owner-group": ({"owner": 1000, "group": 100}, "", fresh, ()),
    "owner-group-multiqueue": ({"owner": 0, "group": 0, "multiQueue": True}, "", fresh, ()),
    # the largest ids (2**32 - 2): past a C int, as the fuzzer found
    "owner-group-largest": ({"owner": 4294967294, "group": 4294967294}, "", fresh, ()),
    "owner-largest": ({"owner": 4294967294, "multiQueue": True}, "", fresh, ()),
    "owner-group-mtu-mac": ({"owner": 1000, "group": 100, "mtu": 1400,
                             "mac": "02:61:00:00:00:02"}, "", fresh, ("mtu", "mac")),
    "bridge": ({"bridge": "br0", "ipam": None}, "", with_bridge, ()),
    "mac-precedence": ({"mac": "02:61:00:00:00:03", "args": {"cni": {"mac": "02:61:00:00:00:09"}}},
                       "IgnoreUnknown=1;MAC=02:61:00:00:00:04", fresh, ()),
    "runtime-mac": ({"mac": "02:61:00:00:00:03", "runtimeConfig": {"mac": "02:61:00:00:00:05"}},
                    "IgnoreUnknown=1;MAC=02:61:00:00:00:04", fresh, ()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_result_and_kernel_state_as_go(tap, go_tap, node_netns, netns_factory, tmp_path,
                                            case):
    """Same config in fresh namespaces: results equal key for key (masked),
    the device's kernel state equal (its MAC too when one is configured);
    both CHECK, then DEL twice leaves no device and no allocation."""
    keys, cni_args, setup, not_by_go = CASES[case]
    runs = {}
    for who, exe, path in (("ours", tap, None), ("go", go_tap, GO.dir)):
        pod = setup(netns_factory)
        c = conf(tmp_path / who, **keys)
        doc = call(exe, "ADD", c, node_netns, pod, cni_path=path, cni_args=cni_args)
        runs[who] = (pod, c, doc, path)
    (o_pod, _, mine, _), (g_pod, _, theirs, _) = runs["ours"], runs["go"]
    assert masked(mine, o_pod.path) == masked(theirs, g_pod.path)
    with_mac = "mac" in keys or "MAC" in cni_args
    ours_state = tap_state(o_pod, with_mac=with_mac)
    go_state = tap_state(g_pod, with_mac=with_mac and "mac" not in not_by_go)
    assert ours_state["kind"] == "tun" and ours_state["tun"]["type"] == 2  # a tap
    assert ours_state["up"] and ours_state["tun"]["persist"] == 1
    if not_by_go:  # Go's netlink path drops them; ours applies them
        assert ours_state.pop("mac") == keys["mac"] and ours_state["mtu"] == keys["mtu"]
        assert go_state["mtu"] == 1500
        ours_state["mtu"] = go_state["mtu"]
    assert ours_state == go_state
    if case == "mac-precedence":  # CNI_ARGS MAC over the key; args.cni.mac not read
        assert mine["interfaces"][0]["mac"] == theirs["interfaces"][0]["mac"] \
            == "02:61:00:00:00:04"
    if case == "runtime-mac":
        assert mine["interfaces"][0]["mac"] == "02:61:00:00:00:05"
    for who, exe in (("ours", tap), ("go", go_tap)):
        pod, c, doc, path = runs[who]
        call(exe, "CHECK", dict(c, prevResult=doc), node_netns, pod, cni_path=path,
             cni_args=cni_args)
        go_del_twice(exe, c, node_netns, pod, cni_path=path, cni_args=cni_args)
        assert allocated(tmp_path / who, NET) == []
        if case == "bridge":
            assert links_of(pod) == ["lo", "br0"]  # the bridge stays


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.1.0"])
def test_dual_stack_result_as_go(tap, go_tap, node_netns, netns_factory, tmp_path, version):
    """IPv4 and IPv6 from IPAM, a route, the config's dns: the same result at
    each version and the same addresses and routes; Go waits 5 s for a DAD
    that can not run on a device without carrier, ours does not wait."""
    docs, pods = {}, {}
    for who, exe, path in (("ours", tap, None), ("go", go_tap, GO.dir)):
        pods[who] = netns_factory("cnsk-pod")
        c = conf(tmp_path / who, version, dns={"nameservers": ["10.61.0.53"], "search": ["pod"]},
                 ipam=host_local(tmp_path / who, "10.61.0.0/24", "fd00:61::/64",
                                 routes=[{"dst": "10.66.0.0/16"}, {"dst": "fd00:66::/64"}]))
        docs[who] = call(exe, "ADD", c, node_netns, pods[who], cni_path=path)
        if version != "0.3.1":
            call(exe, "CHECK", dict(c, prevResult=docs[who]), node_netns, pods[who],
                 cni_path=path)
    assert masked(docs["ours"], pods["ours"].path) == masked(docs["go"], pods["go"].path)
    assert [ip["address"] for ip in docs["ours"]["ips"]] == ["10.61.0.2/24", "fd00:61::2/64"]
    assert tap_state(pods["ours"]) == tap_state(pods["go"])
    with NetNS.open(pods["ours"].path) as n:
        assert n.run(read_sysctl, "net/ipv4/conf/eth0/arp_notify") == "1"  # as Go's


def test_interop_del_across(tap, go_tap, node_netns, netns_factory, tmp_path, cni_bin):
    """Go's ADD then our DEL, and our ADD then Go's DEL, on one host-local
    store: no device and no allocation is left either way."""
    for adder, add_path, deleter, del_path in ((go_tap, GO.dir, tap, cni_bin),
                                               (tap, cni_bin, go_tap, GO.dir)):
        pod = netns_factory("cnsk-pod")
        c = conf(tmp_path, owner=1000, group=100, multiQueue=True)
        call(adder, "ADD", c, node_netns, pod, cni_path=add_path)
        assert links_of(pod, "tun") == ["eth0"] and allocated(tmp_path, NET)
        go_del_twice(deleter, c, node_netns, pod, cni_path=del_path)
        assert links_of(pod) == ["lo"] and allocated(tmp_path, NET) == []


BAD = [
    ({"mtu": "1400"}, "mtu"),
    ({"mtu": -1}, "mtu"),
    ({"mtu": 70000}, "mtu"),
    ({"mtu": 20}, "mtu"),
    ({"mac": "zz"}, "mac"),
    ({"owner": -1}, "owner"),
    ({"group": "100"}, "group"),
    ({"group": 2**32}, "group"),
    ({"multiQueue": "yes"}, "multiQueue"),
    ({"selinuxContext": 5}, "selinuxContext"),
    ({"bridge": "a/b"}, "bridge"),
    ({"runtimeConfig": {"mac": "nope"}}, "runtimeConfig: Value error, mac: invalid MAC"),
]


@pytest.mark.parametrize(("keys", "key"), BAD, ids=[k.split(":")[0] for _, k in BAD])
def test_bad_input_is_code_7_naming_the_key(tap, go_tap, node_netns, netns_factory, tmp_path,
                                           keys, key):
    """A bad value is code 7 naming the key, before anything is made (Go:
    999, and for a bad MTU or MAC it leaves the device)."""
    pod = netns_factory("cnsk-pod")
    doc = refused(tap, conf(tmp_path, **keys), node_netns, pod, 7, key)
    assert doc["msg"].startswith("invalid network config")
    assert links_of(pod) == ["lo"] and allocated(tmp_path, NET) == []
    go = call_raw(go_tap, "ADD", conf(tmp_path / "go", **keys), node_netns,
                  netns_factory("cnsk-pod"), cni_path=GO.dir)
    assert go.exit_code != 0  # Go refuses each too (999)


def test_failures_leave_nothing(tap, go_tap, node_netns, netns_factory, tmp_path):
    """Go's texts, and nothing left behind (Go leaves the device): a name
    taken in the pod, a missing bridge, a bridge that is none, a SELinux
    label with SELinux off; a failure after IPAM ADD runs IPAM DEL."""
    pod = netns_factory("cnsk-pod")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.create_veth_pair(ipr, "eth0", "peer0")
    doc = refused(tap, conf(tmp_path), node_netns, pod, 999, "")
    assert doc["msg"] == 'failed to rename tap to "eth0": file exists'
    assert links_of(pod) == ["lo", "peer0", "eth0"] and allocated(tmp_path, NET) == []
    call(tap, "DEL", conf(tmp_path), node_netns, pod)
    assert links_of(pod) == ["lo", "peer0", "eth0"]  # not a tap: DEL leaves it

    def with_veth():
        ns = netns_factory("cnsk-pod")
        with NetNS.open(ns.path) as n, n.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "v1", "v2")
        return ns

    pod = with_veth()
    for bridge, text in (("br0", "failed to get bridge br0: Link not found"),
                         ("v1", "failed to set tap eth0 as a port of bridge v1: "
                                "operation not supported")):
        go = call_raw(go_tap, "ADD", conf(tmp_path / "go", bridge=bridge, ipam=None), node_netns,
                      with_veth(), cni_path=GO.dir)
        assert go.doc == {"code": 999, "msg": text}
        doc = refused(tap, conf(tmp_path, bridge=bridge), node_netns, pod, 999, "")
        assert doc["msg"] == text
        assert links_of(pod) == ["lo", "v2", "v1"] and allocated(tmp_path, NET) == []

    label = "system_u:system_r:container_t:s0"
    if not os.path.exists("/sys/fs/selinux/enforce"):
        go = call_raw(go_tap, "ADD", conf(tmp_path / "go", selinuxContext=label), node_netns,
                      netns_factory("cnsk-pod"), cni_path=GO.dir)
        doc = refused(tap, conf(tmp_path, selinuxContext=label), node_netns, pod, 999, "")
        for answer in (go.doc, doc):
            assert answer["code"] == 999
            assert answer["msg"].startswith("failed set socket label: write ")
            assert answer["msg"].endswith("proc/thread-self/attr/exec: invalid argument")
        assert links_of(pod) == ["lo", "v2", "v1"]

    # a route IPAM gives via a gateway off the subnet: refused after IPAM ADD
    bad_route = host_local(tmp_path, "10.61.0.0/24",
                           routes=[{"dst": "10.67.0.0/16", "gw": "10.200.0.1"}])
    refused(tap, conf(tmp_path, ipam=bad_route), node_netns, pod, 999, "")
    assert links_of(pod) == ["lo", "v2", "v1"] and allocated(tmp_path, NET) == []
    refused(tap, conf(tmp_path, ipam={"type": "no-such-ipam"}), node_netns, pod, 7, "no-such-ipam")
    assert links_of(pod) == ["lo", "v2", "v1"]


def test_del_idempotent_netns_gone_gc_status(tap, node_netns, netns_factory, tmp_path):
    """DEL twice; DEL with the netns gone and with none; CHECK without
    prevResult is 7 and names what differs; GC and STATUS go to IPAM."""
    pod = netns_factory("cnsk-pod")
    c = conf(tmp_path, owner=1000, bridge="br0")
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.ensure_bridge(ipr, "br0")
    r = call(tap, "ADD", c, node_netns, pod)
    assert links_of(node_netns) == ["lo"]  # the node untouched
    prev = dict(c, prevResult=r)
    call(tap, "CHECK", prev, node_netns, pod)
    check_fails(tap, c, node_netns, pod, "Required prevResult missing", code=7)
    check_fails(tap, dict(prev, owner=1001), node_netns, pod, "owner 1000", "1001")
    check_fails(tap, dict(prev, multiQueue=True), node_netns, pod, "multiQueue")
    check_fails(tap, dict(prev, bridge="br1"), node_netns, pod, "bridge br1")
    for change, text in ((lambda ipr: netlink.del_address(ipr, "eth0", "10.61.0.2/24"),
                          'IP address 10.61.0.2/24 not found on "eth0"'),
                         (lambda ipr: netlink.link_down(ipr, "eth0"), "eth0 is down"),
                         (lambda ipr: netlink.delete_link(ipr, "eth0"),
                          "Container Interface name in prevResult: eth0 not found")):
        with NetNS.open(pod.path) as n, n.rtnl() as ipr:
            change(ipr)
        check_fails(tap, prev, node_netns, pod, text)
    for _ in range(2):
        assert call(tap, "DEL", c, node_netns, pod) is None
    assert links_of(pod) == ["lo", "br0"] and allocated(tmp_path, NET) == []

    pod = netns_factory("cnsk-pod")
    call(tap, "ADD", conf(tmp_path), node_netns, pod)
    del_with_netns_gone(tap, conf(tmp_path), node_netns, pod, tmp_path, NET)
    gc_and_status_go_to_ipam(tap, conf(tmp_path, "1.1.0"), node_netns,
                             netns_factory("cnsk-pod"), tmp_path, NET)


def test_l2_only_at_0_2_0_is_refused_first(tap, node_netns, netns_factory, tmp_path):
    """No IPAM at 0.1.0/0.2.0 (a result with no IP) is code 1 before any
    device is made (Go: 999 ``cannot convert: no valid IP addresses``,
    device left)."""
    pod = netns_factory("cnsk-pod")
    run = call_raw(tap, "ADD", conf(tmp_path, "0.2.0", ipam=None), node_netns, pod)
    assert run.exit_code == 1 and run.doc["code"] == 1, run.doc
    assert links_of(pod) == ["lo"]


def test_create_tap_sdk(netns_factory):
    """`netlink.create_tap`: in a given netns or in the socket's, with its
    flags, owner and group, MTU and MAC; a taken name is LinkExists and
    leaves nothing."""
    pod = netns_factory("cnsk-pod")
    with NetNS.open(pod.path) as n, n.rtnl() as cipr, Rtnl() as ipr:
        link = netlink.create_tap(ipr, "tap0", netns=n, netns_ipr=cipr, mtu=1400,
                                  mac="02:61:00:00:00:07", owner=7, multi_queue=True)
        assert (link.name, link.kind, link.mtu, link.mac, link.up) == \
            ("tap0", "tun", 1400, "02:61:00:00:00:07", False)
        other = netlink.create_tap(cipr, "tap1", group=8, vnet_hdr=True, pi=True)
        assert other.kind == "tun" and netlink.find_link(ipr, "tap1") is None
        with pytest.raises(netlink.LinkExists):
            netlink.create_tap(cipr, "tap0")
        with pytest.raises(CNIError) as e:
            netlink.create_tap(cipr, "tap2", owner=-1)
        assert e.value.code == 7
    assert tun_data(pod, "tap0") == {"type": 2, "owner": 7, "pi": 0, "vnet_hdr": 0,
                                     "persist": 1, "multi_queue": 1}
    assert tun_data(pod, "tap1") == {"type": 2, "group": 8, "pi": 1, "vnet_hdr": 1,
                                     "persist": 1, "multi_queue": 0}
    assert links_of(pod) == ["lo", "tap0", "tap1"]
