"""A live node moving between Go's plugins (each yardstick: Debian's 1.1.1,
upstream 1.9.1 when built, tests/yardsticks.py) and ours, both ways, with
pods running (issue 21).

Topology made by each test (as in test_portmap.py): a node namespace, a
client namespace linked to it by a veth (node 10.99.0.1, client .2), pods on
a bridge in the node. Go's bridge (ipMasq) and portmap (iptables backend:
iptables-nft, so nftables tables ``ip nat``) make the Go pods; ours the
others. Host-port traffic goes from the client to the node's address, to an
echo server in the pod. What the kernel holds is read with libnftables JSON
and the rules' comments from the kernel (`cni_skel.gorules.list_rules`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yardsticks
from cni_skel_plugins.portmap import goiptables
from test_portmap import CLIENT4, NODE4, Echo, ip, sysctls, talk, unreachable

from cni_skel import gomasq, gorules
from cni_skel.errors import CNIError
from cni_skel.harness import nft_table, run_plugin
from cni_skel.netns import NetNS
from cni_skel.nft import attachment_tag
from cni_skel.runtime import Runtime, RuntimeConf, load_file

NET = "mignet"
BRIDGE = "migbr0"
SUBNET = "10.89.0.0/24"
PORT = 8080


@pytest.fixture
def node(node_netns):
    """The node."""
    return node_netns


@pytest.fixture
def client(node_netns, netns_factory):
    """A client namespace beside the node, linked to it by a veth."""
    client = netns_factory("cnsk-migcl")
    for ns in (node_netns, client):
        ip(ns, "link", "set", "lo", "up")
    sysctls(node_netns, {"net/ipv4/ip_forward": "1"})
    ip(node_netns, "link", "add", "migcl0", "type", "veth", "peer", "name", "eth0", "netns",
       client.name)
    ip(node_netns, "addr", "add", f"{NODE4}/24", "dev", "migcl0")
    ip(node_netns, "link", "set", "migcl0", "up")
    ip(client, "addr", "add", f"{CLIENT4}/24", "dev", "eth0")
    ip(client, "link", "set", "eth0", "up")
    ip(client, "route", "add", "default", "via", NODE4)
    return client


def bridge_conf(tmp_path, version: str = "1.0.0") -> dict:
    return {"cniVersion": version, "name": NET, "type": "bridge", "bridge": BRIDGE,
            "isGateway": True, "isDefaultGateway": True, "ipMasq": True, "hairpinMode": True,
            "ipam": {"type": "host-local", "subnet": SUBNET, "dataDir": str(tmp_path / "ipam")}}


def pm_conf(prev: dict | None, port: int = PORT, version: str = "1.0.0") -> dict:
    c = {"cniVersion": version, "name": NET, "type": "portmap", "snat": True,
         "runtimeConfig": {"portMappings": [{"hostPort": port, "containerPort": 80,
                                             "protocol": "tcp"}]}}
    if prev is not None:
        c["prevResult"] = prev
    return c


def pod_ns(netns_factory):
    ns = netns_factory("cnsk-migpod")
    ip(ns, "link", "set", "lo", "up")
    return ns


def go_rules(node, cid: str) -> list[gorules.GoRule]:
    """Rules in the node whose comment names container ``cid``."""
    with NetNS.open(node.path) as n:
        rules = n.run(gorules.list_rules)
    return [r for r in rules if r.comment and cid in r.comment]


def go_chains(node) -> set[str]:
    table = nft_table(node, "ip", "nat")
    return set(table.chains) if table is not None else set()


def go_masq_nft(node, cid: str) -> list[gorules.GoRule]:
    """Go 1.9.1 bridge's nftables masquerade rules of ``cid``'s eth0."""
    with NetNS.open(node.path) as n:
        return n.run(gomasq.nft_rules, NET, cid, "eth0")


def go_portmap_nft(node, cid: str) -> list[gorules.GoRule]:
    """Go 1.9.1 portmap's nftables rules (``cni_hostport``) of ``cid``."""
    with NetNS.open(node.path) as n:
        return n.run(goiptables.nft_rules, cid)


def ours_tagged(node, cid: str) -> list[str]:
    """Elements of our tables tagged with ``cid``'s attachment."""
    tag = attachment_tag(cid, "eth0")
    out = []
    for family, name in (("inet", "cni_portmap"), ("inet", "cni_skel_bridge"),
                         ("bridge", "cni_skel_bridge")):
        table = nft_table(node, family, name)
        if table is None:
            continue
        out += [f"{family} {name} {s}" for s in [*table.sets, *table.maps]
                if any(c == tag for _k, _d, c in table.entries(s))]
    return out


def test_go_pod_then_ours(cni_bin, go_yardstick, node, client, netns_factory, tmp_path):
    """A Go pod with a host port keeps it when ours are installed: CHECK of
    ours passes for it, our portmap refuses its port to a new pod (naming
    port and holder), our DEL removes Go's chains and rules of it, and
    then the port goes to the new pod."""
    go_pod, our_pod = pod_ns(netns_factory), pod_ns(netns_factory)
    go = {n: os.path.join(go_yardstick.dir, n) for n in ("bridge", "portmap")}
    ours = {n: os.path.join(cni_bin, n) for n in ("bridge", "portmap")}
    bc = bridge_conf(tmp_path)
    kw = {"netns": go_pod.path, "node": node}
    r = run_plugin(go["bridge"], "ADD", bc, container_id="go-pod-1", cni_path=go_yardstick.dir,
                   **kw)
    run_plugin(go["portmap"], "ADD", pm_conf(r), container_id="go-pod-1",
               cni_path=go_yardstick.dir, **kw)
    masq_chain = gorules.chain_name(NET, "go-pod-1")
    dn_chain = gorules.chain_name(NET, "go-pod-1", "CNI-DN-", 21)
    assert {masq_chain, dn_chain} <= go_chains(node)
    with Echo(go_pod, 80):
        assert talk(client, NODE4, PORT) == CLIENT4

        # CHECK of ours passes for the pod Go made (Go's entries are checked)
        run_plugin(ours["bridge"], "CHECK", dict(bc, prevResult=r), container_id="go-pod-1",
                   **kw)
        run_plugin(ours["portmap"], "CHECK", pm_conf(r), container_id="go-pod-1", **kw)

        # a new pod of ours may not take the Go pod's host port
        o = run_plugin(ours["bridge"], "ADD", bc, container_id="ours-1", netns=our_pod.path,
                       node=node)
        with pytest.raises(CNIError) as ei:
            run_plugin(ours["portmap"], "ADD", pm_conf(o), container_id="ours-1",
                       netns=our_pod.path, node=node)
        assert ei.value.code == 7
        assert f"tcp port {PORT}" in ei.value.msg and "go-pod-1" in ei.value.msg \
            and NET in ei.value.msg, ei.value.msg
        assert not [x for x in ours_tagged(node, "ours-1") if "portmap" in x]
        assert talk(client, NODE4, PORT) == CLIENT4  # still the Go pod's

    # our DEL of the Go pod removes what Go made for it, nothing else
    run_plugin(ours["portmap"], "DEL", pm_conf(r), container_id="go-pod-1", **kw)
    run_plugin(ours["bridge"], "DEL", bc, container_id="go-pod-1", **kw)
    assert go_rules(node, "go-pod-1") == []
    chains = go_chains(node)
    assert masq_chain not in chains and dn_chain not in chains
    assert "CNI-HOSTPORT-DNAT" in chains  # shared: Go's other pods may use it
    assert unreachable(client, NODE4, PORT)
    # DEL again: nothing left to remove, still fine
    run_plugin(ours["bridge"], "DEL", bc, container_id="go-pod-1", **kw)

    # now the port is free for ours
    run_plugin(ours["portmap"], "ADD", pm_conf(o), container_id="ours-1",
               netns=our_pod.path, node=node)
    with Echo(our_pod, 80):
        assert talk(client, NODE4, PORT) == CLIENT4
    for exe, c in ((ours["portmap"], pm_conf(o)), (ours["bridge"], bc)):
        run_plugin(exe, "DEL", c, container_id="ours-1", netns=our_pod.path, node=node)
    assert ours_tagged(node, "ours-1") == []


def test_go_nftables_pod_then_ours(cni_bin, node, client, netns_factory, tmp_path):
    """Go 1.9.1 with both nftables backends (``ipMasqBackend`` and portmap
    ``backend``: tables ``inet cni_plugins_masquerade``, ``ip``/``ip6
    cni_hostport``): once ours are installed the pod's host port keeps
    answering, CHECK of ours passes for it (the same config: to ours the
    key means our own nftables backend), our DEL removes Go's rules of it
    and nothing of another Go pod."""
    go = yardsticks.LATEST
    if not go.has("portmap"):
        pytest.fail(f"Go v{go.version} is missing in {go.dir}: run `make go-latest`")
    bc = bridge_conf(tmp_path) | {"ipMasqBackend": "nftables"}
    pods = {cid: pod_ns(netns_factory) for cid in ("go-nft-1", "go-nft-2")}
    results = {}
    for i, (cid, ns) in enumerate(pods.items()):
        kw = {"container_id": cid, "netns": ns.path, "node": node, "cni_path": go.dir}
        results[cid] = r = run_plugin(go.exe("bridge"), "ADD", bc, **kw)
        run_plugin(go.exe("portmap"), "ADD", pm_conf(r, PORT + i) | {"backend": "nftables"},
                   **kw)
    assert go_masq_nft(node, "go-nft-1") and go_portmap_nft(node, "go-nft-1")
    assert gorules.chain_name(NET, "go-nft-1") not in go_chains(node)  # no iptables of Go's
    ours = {n: os.path.join(cni_bin, n) for n in ("bridge", "portmap")}
    r = results["go-nft-1"]
    kw = {"container_id": "go-nft-1", "netns": pods["go-nft-1"].path, "node": node}
    pmc = pm_conf(r) | {"backend": "nftables"}
    with Echo(pods["go-nft-1"], 80):
        assert talk(client, NODE4, PORT) == CLIENT4
        run_plugin(ours["bridge"], "CHECK", bc | {"prevResult": r}, **kw)
        run_plugin(ours["portmap"], "CHECK", pmc, **kw)
        assert talk(client, NODE4, PORT) == CLIENT4
    run_plugin(ours["portmap"], "DEL", pmc, **kw)
    run_plugin(ours["bridge"], "DEL", bc, **kw)
    run_plugin(ours["bridge"], "DEL", bc, **kw)  # again: nothing left, no error
    assert go_masq_nft(node, "go-nft-1") == [] and go_portmap_nft(node, "go-nft-1") == []
    assert go_masq_nft(node, "go-nft-2") and go_portmap_nft(node, "go-nft-2")
    assert unreachable(client, NODE4, PORT)
    # Go's DEL of the other pod after ours ran: still clean
    kw2 = {"container_id": "go-nft-2", "netns": pods["go-nft-2"].path, "node": node,
           "cni_path": go.dir}
    run_plugin(go.exe("portmap"), "DEL", pm_conf(results["go-nft-2"], PORT + 1)
               | {"backend": "nftables"}, **kw2)
    run_plugin(go.exe("bridge"), "DEL", bc, **kw2)
    assert go_masq_nft(node, "go-nft-2") == [] and go_portmap_nft(node, "go-nft-2") == []


def test_doctor_names_what_go_left(cni_bin, node, netns_factory, tmp_path):
    """`cni-skel doctor` run in the node lists Go 1.9.1's state: a pod of
    its iptables defaults (a masquerade chain, a DNAT chain) and one of its
    nftables backends (rules in both tables); nothing of Go's, no section."""
    go = yardsticks.LATEST
    if not go.has("portmap"):
        pytest.fail(f"Go v{go.version} is missing in {go.dir}: run `make go-latest`")
    doctor = [os.path.join(os.path.dirname(sys.executable), "cni-skel"), "doctor",
              "--bin-dir", cni_bin]

    def report() -> str:
        return subprocess.run(["ip", "netns", "exec", node.name, *doctor], capture_output=True,
                              text=True, timeout=60, check=False).stdout

    assert "the Go plugins' state" not in report()
    for i, (cid, backend) in enumerate((("go-ipt", None), ("go-nft", "nftables"))):
        keys = {"ipMasqBackend": backend} if backend else {}
        pm_keys = {"backend": backend} if backend else {}
        kw = {"container_id": cid, "netns": pod_ns(netns_factory).path, "node": node,
              "cni_path": go.dir}
        r = run_plugin(go.exe("bridge"), "ADD", bridge_conf(tmp_path) | keys, **kw)
        run_plugin(go.exe("portmap"), "ADD", pm_conf(r, PORT + i) | pm_keys, **kw)
    out = report()
    assert "iptables nat: 1 masquerade chain(s)" in out, out
    assert "iptables nat: 1 portmap DNAT chain(s)" in out, out
    assert "nftables inet cni_plugins_masquerade: 1 masquerade rules" in out, out
    assert "nftables ip cni_hostport: 3 host-port rules" in out, out


def test_gc_removes_go_entries_of_stale_pods(cni_bin, go_yardstick, node, netns_factory,
                                             tmp_path):
    """GC of ours removes the Go entries of this network's containers that
    are not valid, and keeps those of valid ones."""
    pods = {cid: pod_ns(netns_factory) for cid in ("go-a", "go-b")}
    bc = bridge_conf(tmp_path)
    for i, (cid, ns) in enumerate(pods.items()):
        r = run_plugin(os.path.join(go_yardstick.dir, "bridge"), "ADD", bc, container_id=cid,
                       netns=ns.path, node=node, cni_path=go_yardstick.dir)
        run_plugin(os.path.join(go_yardstick.dir, "portmap"), "ADD", pm_conf(r, PORT + i),
                   container_id=cid, netns=ns.path, node=node, cni_path=go_yardstick.dir)
    valid = {"cni.dev/valid-attachments": [{"containerID": "go-b", "ifname": "eth0"}]}
    for name, c in (("portmap", pm_conf(None, version="1.1.0")),
                    ("bridge", bridge_conf(tmp_path, "1.1.0"))):
        run_plugin(os.path.join(cni_bin, name), "GC", dict(c, **valid), node=node)
    assert go_rules(node, "go-a") == []
    assert {r.comment for r in go_rules(node, "go-b")} == {
        gorules.owner_comment(NET, "go-b"), gorules.owner_comment(NET, "go-b", "dnat")}
    assert gorules.chain_name(NET, "go-a") not in go_chains(node)


@pytest.mark.parametrize("backend", [None, "iptables", "nftables"])
def test_migrate_to_go(backend, cni_bin, go_yardstick, node, client, netns_factory, tmp_path):
    """The way back: pods of ours (through the runtime, so libcni's cache
    knows them), `cni-skel migrate --to-go`, traffic to the host port goes
    on (now through Go's rules), nothing of ours stays, and Go's DEL of the
    pod succeeds and leaves nothing. ``backend``: the conflist's
    ``ipMasqBackend`` and portmap ``backend`` (1.1.1 reads neither key and
    writes iptables; 1.9.1's portmap ADD then writes its nftables rules)."""
    conf_dir, cache = tmp_path / "net.d", tmp_path / "cache"
    conf_dir.mkdir()
    keys = {"ipMasqBackend": backend} if backend else {}
    pm_keys = {"backend": backend} if backend else {}
    conflist = {"cniVersion": "1.0.0", "name": NET, "plugins": [
        {k: v for k, v in bridge_conf(tmp_path).items() if k not in ("cniVersion", "name")}
        | keys,
        {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}} | pm_keys]}
    (conf_dir / "mig.conflist").write_text(json.dumps(conflist))
    netlist = load_file(str(conf_dir / "mig.conflist"))
    cni = Runtime(str(conf_dir), [cni_bin], str(cache), plugin_netns=node.path)
    pod = pod_ns(netns_factory)
    rt = RuntimeConf("ours-mig", pod.path, "eth0", capability_args={
        "portMappings": [{"hostPort": PORT, "containerPort": 80, "protocol": "tcp"}]})
    result = cni.add(netlist, rt).to_version("1.0.0")
    with Echo(pod, 80):
        assert talk(client, NODE4, PORT) == CLIENT4
        cli = [os.path.join(os.path.dirname(sys.executable), "cni-skel"), "migrate", "--to-go",
               "--cache-dir", str(cache), "--go-path", go_yardstick.dir]
        dry = subprocess.run(["ip", "netns", "exec", node.name, *cli, "--dry-run"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert dry.returncode == 0, dry.stderr
        assert "would make Go's masquerade rule: iptables -t nat -A POSTROUTING" in dry.stdout
        # a dry run changes nothing (with "iptables" ours wrote Go's layout: no entries)
        assert bool(ours_tagged(node, "ours-mig")) == (backend != "iptables")
        done = subprocess.run(["ip", "netns", "exec", node.name, *cli],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        # nothing of ours stays; Go's rules carry the pod now
        for family, name in (("inet", "cni_portmap"), ("inet", "cni_skel_bridge")):
            assert nft_table(node, family, name) is None, done.stdout
        go_nft = backend == "nftables" and go_yardstick.version != "1.1.1"
        want = {gorules.owner_comment(NET, "ours-mig")}
        if not go_nft:
            want.add(gorules.owner_comment(NET, "ours-mig", "dnat"))
        assert {r.comment for r in go_rules(node, "ours-mig")} >= want
        assert bool(go_portmap_nft(node, "ours-mig")) == go_nft
        assert talk(client, NODE4, PORT) == CLIENT4

    # Go's DEL of the pod we created succeeds and leaves nothing
    kw = {"container_id": "ours-mig", "netns": pod.path, "node": node,
          "cni_path": go_yardstick.dir}
    run_plugin(os.path.join(go_yardstick.dir, "portmap"), "DEL", pm_conf(result) | pm_keys,
               **kw)
    run_plugin(os.path.join(go_yardstick.dir, "bridge"), "DEL", bridge_conf(tmp_path) | keys,
               **kw)
    assert go_rules(node, "ours-mig") == [] and go_portmap_nft(node, "ours-mig") == []
    assert gorules.chain_name(NET, "ours-mig") not in go_chains(node)
    assert unreachable(client, NODE4, PORT)
    assert not [p for p in (tmp_path / "ipam" / NET).iterdir()
                if not p.name.startswith(("lock", "last_", "."))]


def test_migrate_ptp_to_go(cni_bin, go_yardstick, node, netns_factory, tmp_path):
    """ptp with ``ipMasq``: `cni-skel migrate --to-go` makes Go's
    masquerade chain for the cached pod and removes our entries; Go's DEL
    of the pod then succeeds (without the chain Go 1.1.1's fails) and
    leaves nothing of either."""
    conf_dir, cache = tmp_path / "net.d", tmp_path / "cache"
    conf_dir.mkdir()
    ptp = {"cniVersion": "1.0.0", "name": NET, "type": "ptp", "ipMasq": True,
           "ipam": {"type": "host-local", "subnet": SUBNET, "dataDir": str(tmp_path / "ipam")}}
    (conf_dir / "ptp.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": NET, "plugins": [
            {k: v for k, v in ptp.items() if k not in ("cniVersion", "name")}]}))
    netlist = load_file(str(conf_dir / "ptp.conflist"))
    cni = Runtime(str(conf_dir), [cni_bin], str(cache), plugin_netns=node.path)
    pod = pod_ns(netns_factory)
    cni.add(netlist, RuntimeConf("ours-ptp", pod.path, "eth0"))
    cli = [os.path.join(os.path.dirname(sys.executable), "cni-skel"), "migrate", "--to-go",
           "--cache-dir", str(cache), "--go-path", go_yardstick.dir]
    done = subprocess.run(["ip", "netns", "exec", node.name, *cli], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "made Go's masquerade rule: iptables -t nat -A POSTROUTING" in done.stdout
    chain = gorules.chain_name(NET, "ours-ptp")
    assert chain in go_chains(node)
    masq = nft_table(node, "inet", "cni_skel_masq")
    assert masq is None or not any(list(masq.elements(s)) for s in masq.sets)
    run_plugin(os.path.join(go_yardstick.dir, "ptp"), "DEL", ptp, container_id="ours-ptp",
               netns=pod.path, node=node, cni_path=go_yardstick.dir)
    assert chain not in go_chains(node) and go_rules(node, "ours-ptp") == []

