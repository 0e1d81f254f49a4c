"""host-device, side by side with each Go yardstick's host-device (Debian's
1.1.1, upstream 1.9.1 when built: tests/yardsticks.py, the differences
accepted named there): the same result and kernel state for the same config, and
what we do beyond Go (DEL restores the MTU and up state, is idempotent,
survives a gone netns; a failed ADD puts the device back).

The "device" is a link the test makes in its node namespace (a veth end, or
a macvlan on a veth), never one of the machine's. /sys is the real one: the
plugins run through ``ip netns exec`` (warm: the worker enters the caller's
mount namespace), so /sys shows the node namespace's links. Where a test
needs a PCI device the machine may not have, it builds a copy of the /sys
tree and runs the plugin's own look-ups on it (``sys_root``)."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import time

import pytest
from cni_skel_plugins.host_device import HostDevice
from cni_skel_plugins.host_device.config import HostDeviceConf
from cni_skel_plugins.host_device.sysfs import find_device, has_dpdk_driver, parse_mac
from pyroute2 import IPRoute
from test_bridge_go import masked
from yardsticks import Yardstick, as_go, differs

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.gorules import GoHandOver
from cni_skel.harness import install_plugin, remove_netns, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS

DEV = "hdev0"  # sorts before its peer and "lo": the first link of /sys/devices/virtual/net
MTU = 1400


@pytest.fixture(scope="session")
def host_device(cni_bin: str) -> str:
    return os.path.join(cni_bin, "host-device")


@pytest.fixture(scope="session")
def go_hd(go_yardstick: Yardstick) -> str:
    """Go's host-device, of each yardstick."""
    return go_yardstick.exe("host-device")


def make_device(node, name=DEV, *, mtu=MTU, up=True, kind="veth", alias=None) -> netlink.Link:
    """A device on the "node": a veth end (peer ``<name>p``) or a macvlan
    on a veth of its own."""
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        if kind == "veth":
            netlink.create_veth_pair(ipr, name, name + "p", mtu=mtu)
        else:
            netlink.create_veth_pair(ipr, name + "u", name + "v")
            netlink.link_up(ipr, name + "u")
            netlink.create_macvlan(ipr, name, name + "u", mtu=mtu)
        netlink.link_set(ipr, name, up=up or None, ifalias=alias)
        return netlink.find_link(ipr, name)


def state(ns, name) -> dict | None:
    """What the kernel holds for link ``name`` in ``ns`` (None: no such link)."""
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        for m in ipr.get_links():
            if m.get("IFLA_IFNAME") == name:
                info = m.get("IFLA_LINKINFO")
                return {"name": name, "mac": m.get("IFLA_ADDRESS"), "mtu": m.get("IFLA_MTU"),
                        "up": bool(m["flags"] & 1), "alias": m.get("IFLA_IFALIAS"),
                        "kind": info.get("IFLA_INFO_KIND") if info is not None else None}
    return None


def names(ns) -> list[str]:
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return [lk.name for lk in netlink.links(ipr)]


def wait_gone(ns, name, timeout=5.0) -> bool:
    """The kernel dismantles a removed netns (and destroys its virtual
    devices) a moment later, in a work queue."""
    deadline = time.monotonic() + timeout
    while state(ns, name) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def conf(tmp_path, side="ours", version="1.0.0", ipam=False, **keys) -> dict:
    c = {"cniVersion": version, "name": "hdnet", "type": "host-device", "device": DEV,
         "dataDir": str(tmp_path / side / "state")}
    if ipam:
        c["ipam"] = {"type": "host-local", "subnet": "10.71.0.0/24",
                     "dataDir": str(tmp_path / side / "ipam"),
                     "routes": [{"dst": "10.72.0.0/16", "gw": "10.71.0.1"}]}
        c["dns"] = {"nameservers": ["10.71.0.53"], "search": ["pods.example"]}
    c.update(keys)
    return c


def allocated(tmp_path, side="ours") -> list[str]:
    d = tmp_path / side / "ipam" / "hdnet"
    return sorted(p.name for p in d.iterdir() if p.name.startswith("10.")) if d.exists() else []


def saved_files(tmp_path, side="ours") -> list[str]:
    d = tmp_path / side / "state"
    return sorted(p.name for p in d.glob("*.json")) if d.exists() else []


def cmd(exe, verb, c, node, pod, cni_path, cid="c1", **kw):
    return run_plugin(exe, verb, c, container_id=cid, netns=pod.path if pod else "",
                      node=node, cni_path=cni_path, **kw)


# --- ADD / CHECK / DEL against Go ---------------------------------------------


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_l2_only_result_and_kernel_state_equal_go(host_device, go_hd, go_yardstick, cni_bin,
                                                  netns_factory, tmp_path, version):
    """No ipam: the device moves, named CNI_IFNAME, alias its node name, up,
    same MAC and MTU; the result is Go's key for key. DEL brings it back
    under its name; ours also up again as it was (Go leaves it down) and
    with its own alias (Go 1.1.1 leaves its name there, later Go clears it
    as we do)."""
    sides = {}
    for side, exe in (("go", go_hd), ("ours", host_device)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        dev = make_device(node)
        c = conf(tmp_path, side, version)
        result = cmd(exe, "ADD", c, node, pod, cni_bin)
        sides[side] = (node, pod, dev, c, result)
        assert result["interfaces"][0]["mac"] == dev.mac
        assert state(pod, "eth0") == {"name": "eth0", "mac": dev.mac, "mtu": MTU, "up": True,
                                      "alias": DEV, "kind": "veth"}
        assert state(node, DEV) is None
    go, ours = sides["go"], sides["ours"]
    assert masked(as_go(go_yardstick, "host-device", ours[4]), ours[1].path) == \
        masked(go[4], go[1].path)
    assert ours[4]["interfaces"][0]["sandbox"] == ours[1].path
    for side, exe in (("go", go_hd), ("ours", host_device)):
        node, pod, dev, c, result = sides[side]
        if version != "0.3.1":
            assert cmd(exe, "CHECK", dict(c, prevResult=result), node, pod, cni_bin) is None
        assert cmd(exe, "DEL", c, node, pod, cni_bin) is None
        assert names(pod) == ["lo"]
        back = state(node, DEV)
        assert (back["mac"], back["mtu"], back["kind"]) == (dev.mac, MTU, "veth")
        if side == "go":
            alias = None if differs(go_yardstick, "host-device", "DEL clears the alias") else DEV
            assert (back["up"], back["alias"]) == (False, alias)
        else:
            assert (back["up"], back["alias"]) == (True, None)
            assert saved_files(tmp_path) == []


@pytest.mark.parametrize("version", ["0.2.0", "0.4.0", "1.0.0"])
def test_ipam_result_and_kernel_state_equal_go(host_device, go_hd, go_yardstick, cni_bin,
                                               netns_factory, tmp_path, version):
    """With host-local (ours, for both): addresses, routes and dns as Go's
    result; the same addresses and routes on the pod's device; CHECK passes;
    DEL releases the address and brings the device back."""
    sides = {}
    for side, exe in (("go", go_hd), ("ours", host_device)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        dev = make_device(node)
        c = conf(tmp_path, side, version, ipam=True)
        sides[side] = (exe, node, pod, dev, c, cmd(exe, "ADD", c, node, pod, cni_bin))
    assert masked(as_go(go_yardstick, "host-device", sides["ours"][5]), sides["ours"][2].path) \
        == masked(sides["go"][5], sides["go"][2].path)
    kernel = {}
    for side, (exe, node, pod, _dev, c, result) in sides.items():
        with NetNS.open(pod.path) as p, p.rtnl() as ipr:
            kernel[side] = ([str(a) for a in netlink.addresses(ipr, "eth0", 4)],
                            sorted((str(r["dst"]), str(r["gw"])) for r in netlink.routes(ipr, 4)))
        assert allocated(tmp_path, side) == ["10.71.0.2"]
        if version != "0.2.0":
            assert cmd(exe, "CHECK", dict(c, prevResult=result), node, pod, cni_bin) is None
    assert kernel["ours"] == kernel["go"] == (
        ["10.71.0.2/24"], [("10.71.0.0/24", "None"), ("10.72.0.0/16", "10.71.0.1")])
    for side, (exe, node, pod, dev, c, _) in sides.items():
        assert cmd(exe, "DEL", c, node, pod, cni_bin) is None
        assert allocated(tmp_path, side) == []
        back = state(node, DEV)
        assert back["mac"] == dev.mac and back["up"] == (side == "ours")
        with NetNS.open(node.path) as n, n.rtnl() as ipr:
            assert netlink.addresses(ipr, DEV) == []  # a move leaves no address behind


def test_check_names_what_differs(host_device, cni_bin, node_netns, pod_netns, tmp_path):
    make_device(node_netns)
    c = conf(tmp_path, ipam=True)
    result = cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
    prev = dict(c, prevResult=result)
    with pytest.raises(CNIError, match="Required prevResult missing") as e:
        cmd(host_device, "CHECK", c, node_netns, pod_netns, cni_bin)
    assert e.value.code == 7
    bad_mac = json.loads(json.dumps(prev))
    bad_mac["prevResult"]["interfaces"][0]["mac"] = "02:00:00:00:00:01"
    with pytest.raises(CNIError, match="Interface eth0 Mac 02:00:00:00:00:01 doesn't match "
                                       "container Mac: ") as e:
        cmd(host_device, "CHECK", bad_mac, node_netns, pod_netns, cni_bin)
    elsewhere = json.loads(json.dumps(prev))
    elsewhere["prevResult"]["interfaces"][0]["sandbox"] = "/run/netns/elsewhere"
    with pytest.raises(CNIError, match="Sandbox in prevResult  doesn't match configured netns"):
        cmd(host_device, "CHECK", elsewhere, node_netns, pod_netns, cni_bin)
    with NetNS.open(pod_netns.path) as p, p.rtnl() as ipr:
        netlink.del_address(ipr, "eth0", "10.71.0.2/24")
    with pytest.raises(CNIError, match=r"10\.71\.0\.2/24 not found") as e:
        cmd(host_device, "CHECK", prev, node_netns, pod_netns, cni_bin)
    assert e.value.code == 999
    with NetNS.open(pod_netns.path) as p, p.rtnl() as ipr:
        netlink.link_set(ipr, "eth0", up=False)
        netlink.link_set(ipr, "eth0", ifname="other0")
    with pytest.raises(CNIError, match="Container Interface name in prevResult: eth0 not found"):
        cmd(host_device, "CHECK", prev, node_netns, pod_netns, cni_bin)


@pytest.mark.parametrize("kind", ["veth", "macvlan"])
@pytest.mark.parametrize("up", [True, False])
def test_del_restores_name_mtu_state_and_alias(host_device, cni_bin, node_netns, pod_netns,
                                               tmp_path, kind, up):
    """The pod changes the device's MTU (as tuning would) and takes it down;
    DEL puts back what ADD found: name, MTU, up or down, the alias it had."""
    dev = make_device(node_netns, kind=kind, up=up, alias="uplink to rack 7")
    c = conf(tmp_path)
    cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
    assert state(pod_netns, "eth0")["alias"] == DEV
    assert saved_files(tmp_path) == ["c1_eth0.json"]
    assert oct((tmp_path / "ours" / "state").stat().st_mode & 0o777) == "0o700"
    with NetNS.open(pod_netns.path) as p, p.rtnl() as ipr:
        netlink.link_set(ipr, "eth0", mtu=1300, up=False)
    assert cmd(host_device, "DEL", c, node_netns, pod_netns, cni_bin) is None
    assert state(node_netns, DEV) == {"name": DEV, "mac": dev.mac, "mtu": MTU, "up": up,
                                      "alias": "uplink to rack 7", "kind": kind}
    assert names(pod_netns) == ["lo"] and saved_files(tmp_path) == []


def test_del_twice_and_with_netns_gone(host_device, go_hd, cni_bin, node_netns, netns_factory,
                                       tmp_path):
    """DEL again, DEL with CNI_NETNS gone and with it empty: all succeed and
    release the address (Go 1.1.1 fails each of them). A veth dies with its
    netns (the kernel destroys virtual devices there), so nothing comes back."""
    make_device(node_netns)
    c = conf(tmp_path, ipam=True)
    pod = netns_factory("cnsk-pod")
    cmd(host_device, "ADD", c, node_netns, pod, cni_bin)
    for _ in range(2):
        assert cmd(host_device, "DEL", c, node_netns, pod, cni_bin) is None
    # DEL needs no naming key (Go's loadConf refuses it)
    assert cmd(host_device, "DEL", dict(c, device=""), node_netns, pod, cni_bin) is None
    assert state(node_netns, DEV)["up"] and allocated(tmp_path) == []
    for gone in ("removed", "empty"):
        if state(node_netns, DEV) is None:
            make_device(node_netns)  # the last one died with its pod
        pod = netns_factory("cnsk-pod")
        cmd(host_device, "ADD", c, node_netns, pod, cni_bin, cid=gone)
        path = pod.path
        remove_netns(pod)
        assert wait_gone(node_netns, DEV + "p")  # the veth died with its netns
        run = run_plugin_raw(host_device, "DEL", c, container_id=gone,
                             netns=path if gone == "removed" else "", node=node_netns)
        assert run.exit_code == 0, run.doc
        assert allocated(tmp_path) == [] and saved_files(tmp_path) == []
        go = run_plugin_raw(go_hd, "DEL", conf(tmp_path, "go"), container_id=gone, netns=path,
                            node=node_netns)
        assert go.exit_code == 1 and "failed to open netns" in go.doc["msg"]


@pytest.mark.parametrize("returned_as", ["eth0", "dev77"])
def test_del_finds_a_physical_device_the_kernel_gave_back(host_device, cni_bin, node_netns,
                                                          netns_factory, tmp_path, returned_as):
    """When a pod's netns dies, the kernel sends a physical device back to
    the initial namespace, down, alias kept, under its pod name (or
    dev<ifindex> when that name is taken there). No test may move a real
    NIC: the veth is put into that state by hand, in the node namespace
    standing for the initial one; DEL then finds it by its alias."""
    dev = make_device(node_netns)
    c = conf(tmp_path)
    pod = netns_factory("cnsk-pod")
    cmd(host_device, "ADD", c, node_netns, pod, cni_bin)
    with NetNS.open(pod.path) as p, p.rtnl() as cipr, NetNS.open(node_netns.path) as n:
        netlink.link_set(cipr, "eth0", up=False, mtu=1280)
        if returned_as != "eth0":
            netlink.link_set(cipr, "eth0", ifname=returned_as)
        netlink.move_link(cipr, returned_as, n)
    path = pod.path
    remove_netns(pod)
    assert state(node_netns, returned_as)["alias"] == DEV
    assert run_plugin(host_device, "DEL", c, container_id="c1", netns=path,
                      node=node_netns) is None
    assert state(node_netns, DEV) == {"name": DEV, "mac": dev.mac, "mtu": MTU, "up": True,
                                      "alias": None, "kind": "veth"}
    assert saved_files(tmp_path) == []


def test_failed_add_puts_the_device_back(host_device, go_hd, cni_bin, node_netns, pod_netns,
                                         tmp_path):
    """IPAM failing after the move, and a route failing after IPAM: the
    device is back on the node as it was, the address released, nothing
    saved. (Go 1.1.1 leaves the device in the pod.)"""
    dev = make_device(node_netns, alias="keep me")
    before = state(node_netns, DEV)
    bad_ipam = conf(tmp_path, ipam=True)
    bad_ipam["ipam"]["subnet"] = "10.71.0.0/31"  # nothing to allocate
    bad_route = conf(tmp_path, ipam=True)
    bad_route["ipam"]["routes"] = [{"dst": "10.72.0.0/16", "gw": "10.200.0.1"}]  # not on-link
    for c in (bad_ipam, bad_route):
        with pytest.raises(CNIError):
            cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
        assert state(node_netns, DEV) == before
        assert names(pod_netns) == ["lo"]
        assert allocated(tmp_path) == [] and saved_files(tmp_path) == []
    go_node, go_pod = node_netns, pod_netns
    go_conf = conf(tmp_path, "go", ipam=True)
    go_conf["ipam"]["subnet"] = "10.71.0.0/31"
    run = run_plugin_raw(go_hd, "ADD", go_conf, container_id="c1", netns=go_pod.path, node=go_node,
                         cni_path=cni_bin)
    assert run.exit_code == 1 and state(go_pod, "eth0")["mac"] == dev.mac  # Go's leftover


def test_ifname_taken_in_pod_moves_nothing(host_device, go_hd, go_yardstick, cni_bin,
                                           netns_factory, tmp_path):
    """CNI_IFNAME already a link of the pod: Go 1.1.1's error (code and
    text), but ours moves nothing (Go 1.1.1 moves the device and leaves it
    there; later Go, renaming in a temporary netns, puts it back down and
    words the error its own way)."""
    runs = {}
    for side, exe in (("go", go_hd), ("ours", host_device)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        make_device(node)
        with NetNS.open(pod.path) as p, p.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "eth0", "other0")
        runs[side] = (run_plugin_raw(exe, "ADD", conf(tmp_path, side), container_id="c1",
                                     netns=pod.path, node=node), node, pod)
    (go, go_node, go_pod), (ours, node, pod) = runs["go"], runs["ours"]
    assert (ours.exit_code, ours.doc["code"], ours.doc["msg"]) == \
        (1, 999, 'failed to move link failed to rename device "hdev0" to "eth0": file exists')
    assert state(node, DEV)["up"] and DEV not in names(pod)
    if differs(go_yardstick, "host-device", "ifname taken"):
        assert (go.exit_code, go.doc["code"], go.doc["msg"]) == (1, 999, (
            'failed to move link failed to move "eth0" (host: "hdev0") to container NS: '
            "file exists"))
        assert state(go_node, DEV)["alias"] is None and DEV not in names(go_pod)
    else:
        assert (go.exit_code, go.doc["code"], go.doc["msg"]) == \
            (ours.exit_code, ours.doc["code"], ours.doc["msg"])
        assert state(go_node, DEV) is None and DEV in names(go_pod)
    assert saved_files(tmp_path) == []


# --- naming the device --------------------------------------------------------


def _pci_cases() -> list[str]:
    """The machine's PCI addresses (a few) and one that does not exist: what
    Go and we answer for them must agree, whatever the hardware."""
    try:
        found = sorted(os.listdir("/sys/bus/pci/devices"))[:4]
    except OSError:
        found = []
    return [*found, "0000:99:1f.7"]


CONFIG_ERRORS = [  # ours: code 7 (a bad config), Go: 999; the same text
    {"device": ""},
    {"device": "", "hwaddr": "zz:zz"},
    {"device": "", "hwaddr": "02:00:00:00:00"},
    {"device": "", "kernelpath": "/tmp/sys/devices"},
    {"device": "", "kernelpath": "sys/devices/virtual"},
]
RUNTIME_ERRORS = [  # 999 and the same text from both
    {"device": "nope0"},
    {"device": "", "hwaddr": "02:00:00:00:00:99"},
    {"device": "", "kernelpath": "/sys/devices/nope"},
    {"device": "", "kernelpath": "/sys/devices/system"},
    *({"device": "", "pciBusID": a} for a in _pci_cases()),
    {"device": "", "runtimeConfig": {"deviceID": "0000:99:1f.7"}},
]


def go_text(y: Yardstick, keys: dict, msg: str) -> str:
    """Our error text ``msg`` for the naming ``keys`` as ``y``'s Go words it:
    where Go 1.5.0 reworded host-device's look-ups (the known differences
    of tests/yardsticks.py), the later words."""
    path, net = keys.get("kernelpath", ""), f'{keys.get("kernelpath", "")}/net'
    if path and differs(y, "host-device", "kernelpath without net"):
        msg = msg.replace(f'failed to find network devices at "{net}"',
                          f'failed to read directory {net}: "open {net}: no such file or '
                          'directory"')
    pci = keys.get("pciBusID", "")
    if pci and differs(y, "host-device", "pciBusID without a netdev"):
        net = next(iter(glob.glob(f"/sys/bus/pci/devices/{pci}/virtio*/net")),
                   f"/sys/bus/pci/devices/{pci}/net")
        msg = msg.replace(f"failed to find device name for pci address {pci}",
                          f"failed to find network device in path {net}")
    dev = keys.get("runtimeConfig", {}).get("deviceID", "")
    if dev and differs(y, "host-device", "deviceID not found"):
        return f"runtime config DeviceID {dev} not found or unsupported"
    return msg


@pytest.mark.parametrize("keys", CONFIG_ERRORS + RUNTIME_ERRORS,
                         ids=lambda k: json.dumps(k, separators=(",", ":")))
def test_errors_equal_go(host_device, go_hd, go_yardstick, node_netns, pod_netns, tmp_path,
                         keys):
    make_device(node_netns)
    ours = run_plugin_raw(host_device, "ADD", conf(tmp_path, **keys), container_id="c1",
                          netns=pod_netns.path, node=node_netns)
    assert ours.exit_code == 1 and names(pod_netns) == ["lo"], ours.doc
    go = run_plugin_raw(go_hd, "ADD", conf(tmp_path, "go", **keys), container_id="c1",
                        netns=pod_netns.path, node=node_netns)
    assert go.exit_code == 1 and names(pod_netns) == ["lo"], go.doc
    mine = go_text(go_yardstick, keys, ours.doc["msg"])
    if keys in CONFIG_ERRORS:  # Go wraps its getLink's errors, config ones included
        assert mine == go.doc["msg"].removeprefix("failed to find host device: ")
        assert (ours.doc["code"], go.doc["code"]) == (7, 999)
    else:
        assert mine == go.doc["msg"]
        assert ours.doc["code"] == go.doc["code"] == 999
    assert state(node_netns, DEV)["up"] and saved_files(tmp_path) == []


@pytest.mark.parametrize("keys", [
    {"device": "", "hwaddr": "<MAC>"},
    {"device": "", "hwaddr": "<MAC-DASHES-UPPER>"},
    {"device": "", "hwaddr": "<MAC-DOTS>"},
    {"device": "", "kernelpath": "/sys/devices/virtual"},
    {"hwaddr": "02:00:00:00:00:99", "kernelpath": "/sys/devices/nope"},  # device wins
], ids=["hwaddr", "hwaddr-dashes", "hwaddr-dots", "kernelpath", "several"])
def test_naming_keys_find_the_device_as_go(host_device, go_hd, go_yardstick, cni_bin,
                                           netns_factory, tmp_path, keys):
    """``hwaddr`` in Go's three spellings, ``kernelpath`` through the node's
    own /sys (a veth lives under /sys/devices/virtual/net), and several keys
    at once (the first of device, hwaddr, kernelpath, pciBusID wins)."""
    results = {}
    for side, exe in (("go", go_hd), ("ours", host_device)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        dev = make_device(node)
        hexes = dev.mac.replace(":", "")
        spell = {"<MAC>": dev.mac, "<MAC-DASHES-UPPER>": dev.mac.replace(":", "-").upper(),
                 "<MAC-DOTS>": ".".join(hexes[i:i + 4] for i in (0, 4, 8))}
        c = conf(tmp_path, side, **{k: spell.get(v, v) for k, v in keys.items()})
        result = cmd(exe, "ADD", c, node, pod, cni_bin)
        if side == "ours":
            result = as_go(go_yardstick, "host-device", result)
        results[side] = masked(result, pod.path)
        assert state(pod, "eth0")["mac"] == dev.mac and state(node, DEV) is None
        assert cmd(exe, "DEL", c, node, pod, cni_bin) is None
        assert state(node, DEV)["mac"] == dev.mac
    assert results["ours"] == results["go"]


# --- /sys on a copy: PCI devices, DPDK ------------------------------------------


def _fake_sys(root: pathlib.Path) -> pathlib.Path:
    """A /sys holding PCI devices as the kernel lays them out: bus/pci/devices/<addr>
    -> ../../../devices/pci0000:00/<addr>, a driver symlink, net/<ifname>
    (virtio: virtioN/net/<ifname>)."""
    sys_root = root / "sys"
    devices = sys_root / "devices" / "pci0000:00"
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    devices.mkdir(parents=True)
    for drv in ("virtio-pci", "ixgbe", "vfio-pci"):
        (sys_root / "bus" / "pci" / "drivers" / drv).mkdir(parents=True)
    layout = {"0000:00:09.0": ("virtio-pci", "virtio3/net/hdev0"),
              "0000:00:0a.0": ("ixgbe", "net/hdev1"),
              "0000:00:0b.0": ("vfio-pci", None),
              "0000:00:0c.0": ("ixgbe", "net"),      # its netdev in another netns
              "0000:00:0d.0": ("ixgbe", None),       # no net directory at all
              "0000:00:0e.0": (None, "net/hdev1")}   # no driver bound
    for addr, (driver, net) in layout.items():
        dev = devices / addr
        dev.mkdir()
        (bus / addr).symlink_to(f"../../../devices/pci0000:00/{addr}")
        if driver:
            (dev / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")
        if net:
            (dev / net).mkdir(parents=True)
    (sys_root / "devices" / "platform" / "nic1" / "net" / "hdev1").mkdir(parents=True)
    # an auxiliary-bus device (a Mellanox SF): its netdev under net/, no PCI address
    aux = sys_root / "bus" / "auxiliary" / "devices"
    aux.mkdir(parents=True)
    (devices / "0000:00:0a.0" / "mlx5_core.sf.2" / "net" / "hdev2").mkdir(parents=True)
    (aux / "mlx5_core.sf.2").symlink_to("../../../devices/pci0000:00/0000:00:0a.0/"
                                        "mlx5_core.sf.2")
    (devices / "0000:00:0a.0" / "mlx5_core.sf.3").mkdir()  # one with no netdev
    (aux / "mlx5_core.sf.3").symlink_to("../../../devices/pci0000:00/0000:00:0a.0/"
                                        "mlx5_core.sf.3")
    return sys_root


def test_sysfs_lookups_on_a_copy_of_sys(node_netns, tmp_path):
    sys_root = str(_fake_sys(tmp_path))
    make_device(node_netns, "hdev0")
    make_device(node_netns, "hdev1")
    assert has_dpdk_driver("0000:00:0b.0", sys_root)
    assert not has_dpdk_driver("0000:00:09.0", sys_root)
    with pytest.raises(CNIError, match=r"^error with host device: lstat /sys/devices/"
                                       r"pci0000:00/0000:00:0e\.0/driver: no such file"):
        has_dpdk_driver("0000:00:0e.0", sys_root)
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr:
        def find(**kw):
            return find_device(ipr, sys_root=sys_root, **kw).name
        assert find(pci_addr="0000:00:09.0") == "hdev0"  # virtio3/net
        assert find(pci_addr="0000:00:0a.0") == "hdev1"
        assert find(kernelpath="/sys/devices/platform/nic1") == "hdev1"
        assert find(kernelpath="/sys/devices/pci0000:00/0000:00:09.0/virtio3") == "hdev0"
        for kw, msg in (
                ({"pci_addr": "0000:00:0c.0"}, "failed to find device name for pci address "
                                               "0000:00:0c.0"),
                ({"pci_addr": "0000:00:0d.0"}, "no net directory under pci device 0000:00:0d.0"),
                ({"kernelpath": "/sys/devices/platform/nic2"},
                 'failed to find network devices at "/sys/devices/platform/nic2/net"')):
            with pytest.raises(CNIError) as e:
                find(**kw)
            assert (e.value.code, e.value.msg) == (999, msg)
    assert parse_mac("02-AB-cd-00-00-01") == "02:ab:cd:00:00:01"
    assert parse_mac("02ab.cd00.0001") == "02:ab:cd:00:00:01"
    assert parse_mac("02:00:00:00:00:00:00:01") == "02:00:00:00:00:00:00:01"  # EUI-64
    for bad in ("02:00:00:00:00", "02:00-00:00:00:00", "02ab.cd00", "0g:00:00:00:00:00"):
        with pytest.raises(CNIError) as e:
            parse_mac(bad)
        assert e.value.code == 7


def _dispatch(plugin, node, verb, c, pod, cni_path, cid="c1"):
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": cni_path, "PATH": os.environ["PATH"]}
    with NetNS.open(node.path) as n, n.enter():
        out, code = plugin.dispatch(env, json.dumps(c).encode())
    doc = json.loads(out) if out.strip() else None
    assert code == 0, doc
    return doc


def test_pci_and_dpdk_through_the_plugin(netns_factory, tmp_path):
    """The whole plugin on a copy of /sys (``sys_root``): ``pciBusID`` and
    ``runtimeConfig.deviceID`` (which wins) move the netdev of that PCI
    device, an auxiliary-bus ``deviceID`` its netdev (Go >= 1.5); a device
    bound to vfio-pci (DPDK) has none: nothing moves, only IPAM runs, the
    result names the interface without a MAC (Go >= 1.7)."""
    fake = str(_fake_sys(tmp_path))

    class OnCopy(HostDevice):
        sys_root = fake

    bin_dir = tmp_path / "bin"
    install_plugin(bin_dir, "host-local", "cni_skel_plugins.host_local:HostLocal")
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    make_device(node, "hdev0")
    make_device(node, "hdev1")
    make_device(node, "hdev2")
    for keys, moved in (({"pciBusID": "0000:00:0a.0"}, "hdev1"),
                        ({"pciBusID": "0000:00:0a.0",
                          "runtimeConfig": {"deviceID": "0000:00:09.0"}}, "hdev0"),
                        # Go >= 1.5: an auxiliary-bus deviceID wins over pciBusID too
                        ({"runtimeConfig": {"deviceID": "mlx5_core.sf.2"}}, "hdev2"),
                        ({"pciBusID": "0000:00:0b.0",
                          "runtimeConfig": {"deviceID": "mlx5_core.sf.2"}}, "hdev2")):
        c = conf(tmp_path, device="", **keys)
        result = _dispatch(OnCopy, node, "ADD", c, pod, str(bin_dir))
        assert state(pod, "eth0")["alias"] == moved and result["interfaces"][0]["name"] == "eth0"
        _dispatch(OnCopy, node, "CHECK", dict(c, prevResult=result), pod, str(bin_dir))
        _dispatch(OnCopy, node, "DEL", c, pod, str(bin_dir))
        assert state(node, moved)["up"] and names(pod) == ["lo"]
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir), "PATH": os.environ["PATH"]}
    with NetNS.open(node.path) as n, n.enter():
        out, code = OnCopy.dispatch(env, json.dumps(conf(
            tmp_path, device="", runtimeConfig={"deviceID": "mlx5_core.sf.3"})).encode())
    net = "/sys/bus/auxiliary/devices/mlx5_core.sf.3/net"  # Go's linkFromPath words
    assert code == 1 and json.loads(out)["msg"] == (
        f'failed to find host device: failed to read directory {net}: "open {net}: no such '
        'file or directory"'), out
    # DPDK (Go >= 1.7): nothing moves; the interface is named, without a MAC
    dpdk = conf(tmp_path, device="", pciBusID="0000:00:0b.0")
    assert _dispatch(OnCopy, node, "ADD", dpdk, pod, str(bin_dir)) == {
        "cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": pod.path}]}
    with_ipam = conf(tmp_path, ipam=True, device="", pciBusID="0000:00:0b.0")
    result = _dispatch(OnCopy, node, "ADD", with_ipam, pod, str(bin_dir))
    assert result["ips"] == [{"interface": 0, "address": "10.71.0.2/24", "gateway": "10.71.0.1"}]
    assert result["interfaces"] == [{"name": "eth0", "sandbox": pod.path}]
    assert names(pod) == ["lo"]
    _dispatch(OnCopy, node, "CHECK", dict(with_ipam, prevResult=result), pod, str(bin_dir))
    _dispatch(OnCopy, node, "DEL", with_ipam, pod, str(bin_dir))
    assert allocated(tmp_path) == [] and saved_files(tmp_path) == []
    # DEL goes on when the PCI device has no driver (or is gone) in /sys; Go's fails
    _dispatch(OnCopy, node, "DEL", conf(tmp_path, device="", pciBusID="0000:00:0e.0"), pod,
              str(bin_dir))


# --- GC, STATUS, swapping with Go ------------------------------------------------


def test_gc_and_status_pass_to_ipam(host_device, cni_bin, node_netns, netns_factory, tmp_path):
    """GC: host-local releases what the valid list lacks; our saved state
    of such an attachment stays while its device is in a pod (the DEL that
    moves it back needs it), and once the device is back on the node (a
    physical device whose pod died comes back down, under its pod name, the
    alias kept) GC restores it and drops the file; STATUS asks host-local."""
    c = conf(tmp_path, version="1.1.0", ipam=True)
    pods = {}
    for cid, dev in (("keep", "hdev0"), ("drop", "hdev1")):
        make_device(node_netns, dev)
        pods[cid] = netns_factory("cnsk-pod")
        cmd(host_device, "ADD", dict(c, device=dev), node_netns, pods[cid], cni_bin, cid=cid)
    assert allocated(tmp_path) == ["10.71.0.2", "10.71.0.3"]
    gc = dict(c, **{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]})
    assert run_plugin(host_device, "GC", gc, container_id="", netns="", ifname="",
                      node=node_netns) is None
    assert allocated(tmp_path) == ["10.71.0.2"]
    assert saved_files(tmp_path) == ["drop_eth0.json", "keep_eth0.json"]
    with NetNS.open(pods["drop"].path) as p, p.rtnl() as cipr, NetNS.open(node_netns.path) as n:
        netlink.link_down(cipr, "eth0")
        netlink.move_link(cipr, "eth0", n)
    assert run_plugin(host_device, "GC", gc, container_id="", netns="", ifname="",
                      node=node_netns) is None
    assert saved_files(tmp_path) == ["keep_eth0.json"]
    back = state(node_netns, "hdev1")
    assert back is not None and (back["mtu"], back["up"], back["alias"]) == (MTU, True, None)
    assert run_plugin(host_device, "STATUS", c, container_id="", netns="", ifname="",
                      node=node_netns) is None
    bad = dict(c, ipam=dict(c["ipam"], type="no-such-ipam"))
    run = run_plugin_raw(host_device, "STATUS", bad, container_id="", netns="", ifname="",
                         node=node_netns)
    assert run.exit_code != 0 and "no-such-ipam" in run.doc["msg"]


def test_swapping_with_go_either_way(host_device, go_hd, cni_bin, node_netns, pod_netns,
                                     tmp_path):
    """The alias holds the node name exactly as Go writes it: Go's DEL puts
    back what our ADD moved (down, as Go does), ours what Go's ADD moved
    (down too: Go saved no state; the alias is cleared, as Go 1.9 does)."""
    dev = make_device(node_netns)
    c = conf(tmp_path)
    cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
    assert cmd(go_hd, "DEL", c, node_netns, pod_netns, cni_bin) is None
    assert state(node_netns, DEV)["mac"] == dev.mac and names(pod_netns) == ["lo"]
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr:
        netlink.link_set(ipr, DEV, up=True, ifalias="")
    # another attachment: Go's DEL left c1's saved state (a GC removes it)
    assert saved_files(tmp_path) == ["c1_eth0.json"]
    cmd(go_hd, "ADD", c, node_netns, pod_netns, cni_bin, cid="c2")
    assert cmd(host_device, "DEL", c, node_netns, pod_netns, cni_bin, cid="c2") is None
    assert state(node_netns, DEV) == {"name": DEV, "mac": dev.mac, "mtu": MTU, "up": False,
                                      "alias": None, "kind": "veth"}


def test_hand_over_to_go_drops_our_saved_state(host_device, go_hd, cni_bin, node_netns,
                                               pod_netns, tmp_path):
    make_device(node_netns)
    c = conf(tmp_path)
    cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
    handover = GoHandOver("c1", "eth0", pod_netns.path, run_go=lambda verb: None)
    parsed = HostDeviceConf.model_validate(c)
    assert "would remove" in HostDevice.hand_over_to_go(parsed, handover, dry_run=True)[0]
    assert saved_files(tmp_path) == ["c1_eth0.json"]
    assert "removed" in HostDevice.hand_over_to_go(parsed, handover)[0]
    assert saved_files(tmp_path) == []
    assert cmd(go_hd, "DEL", c, node_netns, pod_netns, cni_bin) is None
    assert state(node_netns, DEV) is not None


def test_root_namespace_untouched(host_device, cni_bin, node_netns, pod_netns, tmp_path):
    with IPRoute() as ipr:
        before = {(m["index"], m.get("IFLA_IFNAME")) for m in ipr.get_links()}
    make_device(node_netns)
    c = conf(tmp_path, ipam=True)
    cmd(host_device, "ADD", c, node_netns, pod_netns, cni_bin)
    cmd(host_device, "DEL", c, node_netns, pod_netns, cni_bin)
    with IPRoute() as ipr:
        assert {(m["index"], m.get("IFLA_IFNAME")) for m in ipr.get_links()} == before
