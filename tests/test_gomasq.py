"""``ipMasqBackend`` and Go's masquerade state (issue 49): bridge and ptp
against each Go yardstick (tests/yardsticks.py).

* ``"iptables"``: ours writes exactly Go's layout: side by side (same
  network, container ID and config, each in its own node namespace) ``iptables
  -t nat -S`` and ``ip6tables -t nat -S`` are equal line for line; Go's DEL
  removes our pods, ours removes Go's (also with the netns gone, which Go
  cannot); CHECK passes on either's pod and fails once a rule is gone; a
  failed ADD leaves nothing.
* Go 1.9.1's ``"nftables"`` (table ``inet cni_plugins_masquerade``): CHECK of
  ours passes on Go's pods, DEL and GC of ours remove exactly the
  attachment's rules.
* absent: ours (`cni_skel.masq`, the project's one deliberate difference).

What the kernel holds is read with ``iptables -S`` (the layout Go's
go-iptables writes and compares) and libnftables JSON.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time

import pytest
import yardsticks

from cni_skel import CNIError, gomasq, gorules, netlink
from cni_skel.harness import nft_table, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS

NET = "gmnet"
SUBNET4, SUBNET6 = "10.62.0.0/24", "fd00:62::/64"
PLUGINS = ("ptp", "bridge")
GO = yardsticks.LATEST


def conf(plugin: str, data_dir, **top) -> dict:
    c = {"cniVersion": "1.0.0", "name": NET, "type": plugin, "ipMasq": True,
         "ipam": {"type": "host-local", "dataDir": str(data_dir),
                  "ranges": [[{"subnet": SUBNET4}], [{"subnet": SUBNET6}]]}}
    if plugin == "bridge":
        c |= {"bridge": "gmbr0", "isGateway": True}
    return c | top


def run(exe, verb, c, node, pod, cid="gm-c1", *, cni_bin, **kw):
    """``verb`` as a runtime runs it in ``node``; IPAM: our host-local (for Go too)."""
    return run_plugin(exe, verb, c, netns=pod.path if pod else "", node=node, container_id=cid,
                      cni_path=cni_bin, **kw)


def nat(node, variant: str = "") -> dict[int, list[str]]:
    """``iptables -t nat -S`` and ``ip6tables -t nat -S`` in ``node``
    (``variant`` "legacy": ``iptables-legacy``, whatever the node's is)."""
    out = {}
    suffix = f"-{variant}" if variant else ""
    for version, tool in ((4, f"iptables{suffix}"), (6, f"ip6tables{suffix}")):
        proc = subprocess.run(["ip", "netns", "exec", node.name, tool, "-w", "5", "-t", "nat",
                               "-S"], capture_output=True, text=True, timeout=30, check=True)
        out[version] = proc.stdout.splitlines()
    return out


def go_state(node, cid: str | None = None) -> list[str]:
    """What of Go's masquerade ``node`` holds (of container ``cid``, or
    any): iptables rules whose comment names a container of the network,
    user chains in nat, rules in ``masq_checks``."""
    with NetNS.open(node.path) as n:
        rules = n.run(gorules.list_rules, None, ("ip", "ip6"), ("nat",))
    out = [f"{r.family} {r.chain} {r.comment}" for r in rules
           if (owner := gorules.parse_owner(r.comment)) and (cid is None or owner[2] == cid)]
    for family in ("ip", "ip6"):
        table = nft_table(node, family, "nat")
        out += [f"{family} chain {c}" for c in (table.chains if table else ())
                if c.startswith("CNI-") and (cid is None
                                             or c == gorules.chain_name(NET, cid))]
    table = nft_table(node, "inet", gomasq.NFT_TABLE)
    if table is not None:
        out += [f"inet masq_checks {r.get('comment')}" for r in table.chain_rules("masq_checks")
                if cid is None or f"id: {cid}" in (r.get("comment") or "")]
    return out


def ours_state(node) -> list[str]:
    """Our own masquerade elements in ``node`` (any table of ours)."""
    out = []
    for name in ("cni_skel_masq", "cni_skel_bridge"):
        table = nft_table(node, "inet", name)
        if table is not None:
            out += [f"{name} {s}" for s in table.sets if list(table.elements(s))]
    return out


@pytest.fixture(scope="session")
def go191() -> yardsticks.Yardstick:
    if not GO.has("bridge"):
        pytest.fail(f"Go v{GO.version} is missing in {GO.dir}: run `make go-latest`")
    return GO


@pytest.mark.parametrize("plugin", PLUGINS)
def test_iptables_layout_equals_go(plugin, cni_bin, go_yardstick, netns_factory, tmp_path):
    """Dual stack, ``ipMasqBackend: "iptables"``: the nat tables of ours
    and of Go equal line for line (Go 1.1.1 has no key and always writes
    this layout); CHECK passes; DEL leaves nat as it was before the ADD."""
    seen = {}
    for who, exe in (("ours", os.path.join(cni_bin, plugin)), ("go", go_yardstick.exe(plugin))):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(plugin, tmp_path / who, ipMasqBackend="iptables")
        result = run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
        seen[who] = nat(node)
        run(exe, "CHECK", {**c, "prevResult": result}, node, pod, cni_bin=cni_bin)
        run(exe, "DEL", c, node, pod, cni_bin=cni_bin)
        assert go_state(node) == [], who
    chain = gorules.chain_name(NET, "gm-c1")
    assert seen["ours"] == seen["go"]
    assert f"-N {chain}" in seen["ours"][4] and f"-N {chain}" in seen["ours"][6]
    assert len([ln for ln in seen["ours"][4] + seen["ours"][6] if chain in ln]) == 8
    assert ours_state(node) == []


@pytest.mark.parametrize("plugin", PLUGINS)
def test_go_deletes_ours_and_ours_deletes_gos(plugin, cni_bin, go_yardstick, netns_factory,
                                              tmp_path):
    """One node, one network: a pod Go made (iptables) and one ours made
    (``ipMasqBackend: "iptables"``): each implementation's CHECK passes on
    the other's pod, each DEL removes the other's rules and leaves the
    other pod's alone."""
    node = netns_factory("cnsk-node")
    go_pod, our_pod = netns_factory("cnsk-pod"), netns_factory("cnsk-pod")
    ours, go = os.path.join(cni_bin, plugin), go_yardstick.exe(plugin)
    c = conf(plugin, tmp_path, ipMasqBackend="iptables")
    r_go = run(go, "ADD", c, node, go_pod, "gm-go", cni_bin=cni_bin)
    r_ours = run(ours, "ADD", c, node, our_pod, "gm-ours", cni_bin=cni_bin)
    run(ours, "CHECK", {**c, "prevResult": r_go}, node, go_pod, "gm-go", cni_bin=cni_bin)
    run(go, "CHECK", {**c, "prevResult": r_ours}, node, our_pod, "gm-ours", cni_bin=cni_bin)
    run(ours, "DEL", c, node, go_pod, "gm-go", cni_bin=cni_bin)
    assert go_state(node, "gm-go") == [] and go_state(node, "gm-ours")
    run(go, "DEL", c, node, our_pod, "gm-ours", cni_bin=cni_bin)
    assert go_state(node) == []


@pytest.mark.parametrize("plugin", PLUGINS)
def test_del_with_the_netns_gone_removes_the_chain(plugin, cni_bin, go_yardstick,
                                                   netns_factory, tmp_path):
    """A Go pod (iptables) whose namespace is gone: Go's own DEL leaves its
    chain (it learns the addresses from the pod); ours removes it, with
    CNI_NETNS empty too, and again."""
    for who, exe in (("go", go_yardstick.exe(plugin)), ("ours", os.path.join(cni_bin, plugin))):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        c = conf(plugin, tmp_path / who, ipMasqBackend="iptables")
        run(go_yardstick.exe(plugin), "ADD", c, node, pod, cni_bin=cni_bin)
        subprocess.run(["ip", "netns", "delete", pod.name], check=True, timeout=30)
        run(exe, "DEL", c, node, pod, cni_bin=cni_bin)
        run(exe, "DEL", c, node, None, cni_bin=cni_bin)
        if who == "go":
            assert go_state(node, "gm-c1")
        else:
            assert go_state(node) == []


def test_go_nftables_pods_check_gc_and_del(cni_bin, go191, netns_factory, tmp_path):
    """Go 1.9.1's ptp and bridge with ``ipMasqBackend: "nftables"``: CHECK
    of ours passes on Go's pods; GC of ours with one attachment left out
    removes only its ``masq_checks`` rules (Go's GC does the same); DEL of
    ours with the netns gone removes the other's."""
    for plugin in PLUGINS:
        node = netns_factory("cnsk-node")
        pods = [netns_factory("cnsk-pod") for _ in range(2)]
        c = conf(plugin, tmp_path / plugin, ipMasqBackend="nftables")
        results = [run(go191.exe(plugin), "ADD", c, node, p, f"gm-{i}", cni_bin=cni_bin)
                   for i, p in enumerate(pods)]
        assert len(go_state(node)) == 4  # one rule per address
        ours = os.path.join(cni_bin, plugin)
        for i, p in enumerate(pods):
            run(ours, "CHECK", {**c, "prevResult": results[i]}, node, p, f"gm-{i}",
                cni_bin=cni_bin)
        keep = {"cni.dev/valid-attachments": [{"containerID": "gm-1", "ifname": "eth0"}]}
        run_plugin(ours, "GC", {**c, "cniVersion": "1.1.0", **keep}, node=node,
                   cni_path=cni_bin)
        assert go_state(node, "gm-0") == [] and len(go_state(node, "gm-1")) == 2
        run(ours, "DEL", c, node, None, "gm-1", cni_bin=cni_bin)
        assert go_state(node) == []
        # Go's table and chains stay, as Go's own DEL leaves them
        assert nft_table(node, "inet", gomasq.NFT_TABLE) is not None


@pytest.mark.parametrize("plugin", PLUGINS)
def test_gc_removes_chains_of_attachments_left_out(plugin, cni_bin, netns_factory, tmp_path):
    """``ipMasqBackend: "iptables"``: GC removes the chains of the
    network's containers not among the valid attachments (Go collects
    none), and keeps the others and another network's."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    exe = os.path.join(cni_bin, plugin)
    c = conf(plugin, tmp_path, ipMasqBackend="iptables")
    results = [run(exe, "ADD", c, node, p, f"gm-{i}", cni_bin=cni_bin)
               for i, p in enumerate(pods)]
    with NetNS.open(node.path) as n:  # another network's chain, by Go's layout
        n.run(gomasq.setup_iptables, "othernet", "gm-0",
              [ipaddress.ip_interface("10.63.0.2/24")])
    keep = {"cni.dev/valid-attachments": [{"containerID": "gm-1", "ifname": "eth0"}]}
    run_plugin(exe, "GC", {**c, "cniVersion": "1.1.0", **keep}, node=node, cni_path=cni_bin)
    other = gorules.owner_comment("othernet", "gm-0")
    left = go_state(node, "gm-0")
    assert len(left) == 3 and all(line.endswith(other) for line in left), left
    assert go_state(node, "gm-1")
    run(exe, "CHECK", {**c, "prevResult": results[1]}, node, pods[1], "gm-1", cni_bin=cni_bin)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_check_names_the_missing_rule(plugin, cni_bin, netns_factory, tmp_path):
    """CHECK of an ``ipMasqBackend: "iptables"`` pod whose POSTROUTING jump
    was removed: 999 naming the rule."""
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    exe = os.path.join(cni_bin, plugin)
    c = conf(plugin, tmp_path, ipMasqBackend="iptables")
    result = run(exe, "ADD", c, node, pod, cni_bin=cni_bin)
    jump = next(ln for ln in nat(node)[4] if ln.startswith("-A POSTROUTING"))
    subprocess.run(["ip", "netns", "exec", node.name, "sh", "-c",
                    f"iptables -t nat {jump.replace('-A ', '-D ', 1)}"], check=True, timeout=30)
    with pytest.raises(CNIError) as e:
        run(exe, "CHECK", {**c, "prevResult": result}, node, pod, cni_bin=cni_bin)
    assert e.value.code == 999 and "-A POSTROUTING -s 10.62.0.2/32" in e.value.msg
    run(exe, "DEL", c, node, pod, cni_bin=cni_bin)
    assert go_state(node) == []


@pytest.mark.parametrize("plugin", PLUGINS)
def test_failed_add_leaves_nothing(plugin, cni_bin, netns_factory, tmp_path):
    """ip6 nat owned by another process (an nftables table with ``flags
    owner``): the IPv6 rules are refused after the IPv4 ones went in; the
    ADD fails with 999 naming ip6tables-restore, and nothing stays: no
    chain, no veth, no address allocated."""
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    owner = subprocess.Popen(["ip", "netns", "exec", node.name, "nft", "-i"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        owner.stdin.write("add table ip6 nat { flags owner; }\n")
        owner.stdin.flush()
        with NetNS.open(node.path) as n:  # (libnftables 1.0.6 cannot list an owned table)
            for _ in range(50):
                if n.run(gorules.present, [("ip6", "nat", None)]):
                    break
                time.sleep(0.1)
        c = conf(plugin, tmp_path, ipMasqBackend="iptables")
        run_ = run_plugin_raw(os.path.join(cni_bin, plugin), "ADD", c, netns=pod.path,
                              node=node, container_id="gm-c1", cni_path=cni_bin)
    finally:
        owner.stdin.close()
        owner.wait(timeout=30)
    assert run_.exit_code != 0 and run_.doc["code"] == 999, run_.doc
    assert "ip6tables-restore" in run_.doc["msg"]
    assert go_state(node) == []
    with NetNS.open(node.path) as n, n.rtnl() as ipr:
        assert [lk.name for lk in netlink.links(ipr) if lk.kind == "veth"] == []
    assert not any(p.name[0].isdigit() for p in (tmp_path / NET).iterdir())


@pytest.mark.parametrize("plugin", PLUGINS)
def test_unknown_backend_is_code_7(plugin, cni_bin, node_netns, pod_netns, tmp_path):
    """A backend Go does not know either: code 7 naming ipMasqBackend, nothing made."""
    run_ = run_plugin_raw(os.path.join(cni_bin, plugin), "ADD",
                          conf(plugin, tmp_path, ipMasqBackend="xtables"), netns=pod_netns.path,
                          node=node_netns, container_id="gm-c1", cni_path=cni_bin)
    assert run_.exit_code != 0 and run_.doc["code"] == 7
    assert "ipMasqBackend" in run_.doc["msg"] + run_.doc.get("details", "")
