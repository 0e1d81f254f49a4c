"""bridge's ``vlan`` and ``vlanTrunk`` keys, read back from the kernel's bridge
VLAN table (VLAN filtering: in the kernel VM when the host's kernel lacks it),
side by side with Debian's Go bridge 1.1.1, each in a node namespace of its own.

Where the two differ, ours follows upstream's newer rules (v1.8.0):

* ``vlan``: both turn VLAN filtering on and give the pod's port the VLAN as
  PVID, untagged; with ``isGateway`` both put the gateway on a veth
  ``<bridge>.<vlan>`` whose peer is a port in that VLAN. Go 1.1.1 leaves the
  bridge's default VLAN 1 on those ports (egress untagged, no longer PVID);
  ours removes it unless ``preserveDefaultVlan`` (upstream's default since
  v1.8.0; v1.3.0-v1.7 kept it). With ``preserveDefaultVlan: true`` ours gives
  exactly Go 1.1.1's table.
* ``vlanTrunk`` (upstream v1.3.0): Go 1.1.1 ignores the key (no filtering, the
  port keeps VLAN 1 as without it); ours tags the trunk's VLANs on the port,
  with the ``vlan`` as native VLAN, or VLAN 1 when there is none (v1.8.0).
"""

from __future__ import annotations

import os
import re

import pytest
from yardsticks import as_go, differs

from cni_skel.harness import run_plugin
from cni_skel.netlink import bridge_vlans, find_link
from cni_skel.netns import NetNS

pytestmark = [pytest.mark.root, pytest.mark.kernel("bridge_vlan_filtering")]

BRIDGE = "cnskvbr0"
TRUNK = [{"id": 101}, {"minID": 200, "maxID": 202}]
#: A VLAN table entry: (vid, pvid, untagged).
DEFAULT = (1, True, True)  # the bridge's default VLAN, as a new port gets it
KEPT_DEFAULT = (1, False, True)  # ... once another VLAN took the PVID
ACCESS = (100, True, True)
TAGGED = [(101, False, False), (200, False, False), (201, False, False), (202, False, False)]


@pytest.fixture(scope="session")
def bridge(cni_bin: str) -> str:
    return os.path.join(cni_bin, "bridge")


def conf(data_dir, **top) -> dict:
    c = {"cniVersion": "1.0.0", "name": "vlannet", "type": "bridge", "bridge": BRIDGE,
         "ipam": {"type": "host-local", "subnet": "10.88.0.0/24", "dataDir": str(data_dir)}}
    c.update(top)
    return c


def masked(name: str) -> str:
    return re.sub(r"^veth[0-9a-f]{8}$", "veth*", name)


def vlan_state(node, pod_port: str | None = None) -> dict:
    """What the kernel holds in ``node``: its links (random veth names
    masked), whether the bridge filters VLANs, and the VLAN table of the
    bridge itself and of each of its ports, named ``pod port`` (the host end
    of the pod's veth) or ``port to <its veth peer here>``."""
    with NetNS.open(node.path) as ns, ns.iproute() as ipr:
        links = ipr.get_links()
        names = {m["index"]: m.get("IFLA_IFNAME") for m in links}
        state: dict = {"links": sorted(masked(n) for n in names.values() if n != "lo")}
        br = find_link(ipr, BRIDGE)
        if br is None:
            return state
        (msg,) = ipr.link("get", index=br.index)
        state["vlan_filtering"] = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA",
                                                 "IFLA_BR_VLAN_FILTERING")
        state["bridge"] = bridge_vlans(ipr, br)
        for m in links:
            if m.get("IFLA_MASTER") != br.index:
                continue
            name = m.get("IFLA_IFNAME")
            label = "pod port" if name == pod_port else f"port to {names.get(m.get('IFLA_LINK'))}"
            state[label] = bridge_vlans(ipr, m["index"])
        return state


def without_default_vlan(state: dict) -> dict:
    """``state`` with VLAN 1 taken off its ports (what Go 1.1.1 leaves there)."""
    return {k: [v for v in vals if v[0] != 1] if k.startswith(("pod port", "port to")) else vals
            for k, vals in state.items()}


def masked_result(result: dict, pod) -> dict:
    ifaces = [{k: ("<mac>" if k == "mac" else "<pod>" if v == pod.path else masked(v))
               for k, v in i.items()} for i in result["interfaces"]]
    return dict(result, interfaces=ifaces)


def attach(exe, c, node, pod, cni_path=None) -> tuple[dict, dict]:
    """ADD, and the node's VLAN state after it."""
    r = run_plugin(exe, "ADD", c, container_id="c1", netns=pod.path, node=node,
                   cni_path=cni_path)
    return r, vlan_state(node, r["interfaces"][1]["name"])


def detach(exe, c, node, pod, data_dir, cni_path=None) -> dict:
    """DEL: the pod's interface and address gone; the node's VLAN state after it."""
    run_plugin(exe, "DEL", c, container_id="c1", netns=pod.path, node=node, cni_path=cni_path)
    with NetNS.open(pod.path) as ns, ns.iproute() as ipr:
        assert [m.get("IFLA_IFNAME") for m in ipr.get_links()] == ["lo"]
    assert [p.name for p in (data_dir / "vlannet").iterdir()
            if p.name[0].isdigit()] == []
    return vlan_state(node)


@pytest.fixture
def sides(netns_factory, go_yardstick, bridge, tmp_path):
    """Ours and Go's, each with its node and pod namespaces and IPAM dir."""
    return {"ours": (bridge, netns_factory("cnsk-node"), netns_factory("cnsk-pod"),
                     tmp_path / "ours", None),
            "go": (os.path.join(go_yardstick.dir, "bridge"), netns_factory("cnsk-gonode"),
                   netns_factory("cnsk-gopod"), tmp_path / "go", go_yardstick.dir)}


@pytest.mark.parametrize("gateway", [False, True], ids=["l2", "gateway"])
@pytest.mark.parametrize("preserve", [False, True], ids=["default", "preserveDefaultVlan"])
def test_vlan_as_go(sides, go_yardstick, gateway, preserve):
    top = {"vlan": 100}
    if gateway:
        top["isGateway"] = True
    if preserve:
        top["preserveDefaultVlan"] = True
    got, results, after = {}, {}, {}
    for side, (exe, node, pod, data_dir, path) in sides.items():
        results[side], got[side] = attach(exe, conf(data_dir, **top), node, pod, path)

    port = [KEPT_DEFAULT, ACCESS] if preserve else [ACCESS]
    want = {"links": sorted([BRIDGE, "veth*"] + ([f"{BRIDGE}.100", "veth*"] if gateway else [])),
            "vlan_filtering": 1, "bridge": [DEFAULT], "pod port": port}
    if gateway:
        want[f"port to {BRIDGE}.100"] = port
    assert got["ours"] == want
    # Go 1.1.1 keeps VLAN 1 on the ports; ours does too with preserveDefaultVlan.
    assert got["ours"] == (got["go"] if preserve else without_default_vlan(got["go"]))
    assert masked_result(as_go(go_yardstick, "bridge", results["ours"]), sides["ours"][2]) == \
        masked_result(results["go"], sides["go"][2])

    for side, (exe, node, pod, data_dir, path) in sides.items():
        after[side] = detach(exe, conf(data_dir, **top), node, pod, data_dir, path)
    # The pod's port and its VLANs are gone; the bridge (and the gateway's
    # veth) stay, as Go's.
    assert after["ours"] == {k: v for k, v in want.items() if k != "pod port"} | {
        "links": sorted([BRIDGE] + ([f"{BRIDGE}.100", "veth*"] if gateway else []))}
    assert after["ours"] == (after["go"] if preserve else without_default_vlan(after["go"]))


@pytest.mark.parametrize("vlan", [0, 100], ids=["trunk", "trunk+vlan"])
def test_vlan_trunk(sides, go_yardstick, vlan):
    y = go_yardstick
    top = {"vlanTrunk": TRUNK, **({"vlan": vlan} if vlan else {})}
    got, after = {}, {}
    for side, (exe, node, pod, data_dir, path) in sides.items():
        _, got[side] = attach(exe, conf(data_dir, **top), node, pod, path)
    native = ACCESS if vlan else DEFAULT
    assert got["ours"] == {"links": [BRIDGE, "veth*"], "vlan_filtering": 1,
                           "bridge": [DEFAULT], "pod port": sorted([native, *TAGGED])}
    trunks = differs(y, "bridge", "vlanTrunk")
    if trunks:  # as ours
        assert got["go"] == got["ours"]
    else:  # Go 1.1.1 predates vlanTrunk: it reads the config as without it.
        assert got["go"] == {"links": [BRIDGE, "veth*"], "vlan_filtering": 1 if vlan else 0,
                             "bridge": [DEFAULT],
                             "pod port": [KEPT_DEFAULT, ACCESS] if vlan else [DEFAULT]}

    for side, (exe, node, pod, data_dir, path) in sides.items():
        after[side] = detach(exe, conf(data_dir, **top), node, pod, data_dir, path)
    assert after["ours"] == {"links": [BRIDGE], "vlan_filtering": 1, "bridge": [DEFAULT]}
    assert after["go"] == dict(after["ours"], vlan_filtering=1 if vlan or trunks else 0)
