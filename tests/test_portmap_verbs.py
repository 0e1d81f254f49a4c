"""portmap through the real executable without traffic: config errors (spec
Error objects, right codes, the key named, nothing applied), GC, STATUS,
spec versions, concurrency, start-up weight. prevResults are written by hand
here (portmap never enters the container's namespace)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
from test_portmap import TABLE, entries, fails, mapping, pm, pm_conf
from yardsticks import printed

from cni_skel.harness import nft_table, run_plugin, run_plugin_raw
from cni_skel.nft import attachment_tag
from cni_skel.warm.install import python_argv

SANDBOX = "/run/netns/cnsk-pm-unused"


@pytest.fixture(scope="session")
def portmap(cni_bin: str) -> str:
    return os.path.join(cni_bin, "portmap")


def prev(ip4: str | None = "10.88.0.5/24", ip6: str | None = None, version: str = "1.0.0",
         ifname: str = "eth0") -> dict:
    ips = []
    for a in (ip4, ip6):
        if a:
            ips.append({"address": a, "interface": 2})
    return {"cniVersion": version,
            "interfaces": [{"name": "cni0", "mac": "0a:58:0a:58:00:01"},
                           {"name": "veth1234", "mac": "0a:58:0a:58:00:02"},
                           {"name": ifname, "mac": "0a:58:0a:58:00:05", "sandbox": SANDBOX}],
            "ips": ips}


def raw(exe, cmd, c, node, cid="c1", ifname="eth0", **kw):
    return run_plugin_raw(exe, cmd, c, container_id=cid, netns=SANDBOX, ifname=ifname,
                          node=node, **kw)


def verb(exe, cmd, c, node, **kw):
    """STATUS/GC: no container, no netns, no ifname."""
    return run_plugin(exe, cmd, c, container_id="", ifname="", netns="", node=node, **kw)


# --- errors ------------------------------------------------------------------------


BAD = [
    ({"backend": "nft"}, 7, "backend"),
    ({"backend": "ipchains"}, 7, "backend"),
    # Go 1.9.1's parseConfig / ensureBackend refusals, in its words
    ({"markMasqBit": 13, "externalSetMarkChain": "KUBE-MARK-MASQ"}, 7,
     "Cannot specify externalSetMarkChain and markMasqBit"),
    ({"markMasqBit": 32}, 7, "MasqMarkBit must be between 0 and 31"),
    ({"markMasqBit": -1, "backend": "iptables"}, 7, "markMasqBit"),
    ({"markMasqBit": "13"}, 7, "markMasqBit"),
    ({"backend": "nftables", "conditionsV4": ["-s", "10.0.0.0/8"]}, 7,
     "nftables backend was requested but configuration contains iptables-specific options "
     "[conditionsV4]"),
    ({"backend": "nftables", "externalSetMarkChain": "KUBE-MARK-MASQ"}, 7,
     "externalSetMarkChain"),
    ({"backend": "iptables", "conditionsV6": ["ip6 saddr fd00::1"]}, 7,
     "iptables backend was requested but configuration contains nftables-specific options "
     "[conditionsV6]"),
    ({"conditionsV4": ["-s", "10.0.0.0/8"], "conditionsV6": ["ip6 saddr fd00::1"]}, 7,
     "conditionsV6"),
    # iptables-restore reads lines: no argument may hold a line break
    ({"backend": "iptables", "conditionsV4": ["-s", "10.0.0.0/8\n-A INPUT -j DROP"]}, 7,
     "conditionsV4: 1: an iptables argument holds a control character"),
    ({"externalSetMarkChain": "BAD CHAIN"}, 7, "externalSetMarkChain"),
    ({"externalSetMarkChain": "-j"}, 7, "externalSetMarkChain"),
    ({"externalSetMarkChain": "X" * 29}, 7, "externalSetMarkChain"),
    ({"conditionsV4": "ip saddr 10.0.0.1"}, 7, "conditionsV4"),
    ({"conditionsV4": [5]}, 7, "conditionsV4.0"),
    ({"snat": "yes"}, 7, "snat"),
    ({"masqAll": 1}, 7, "masqAll"),
    ({"runtimeConfig": {"portMappings": [mapping(0, 80)]}}, 7, "portMappings.0.hostPort"),
    ({"runtimeConfig": {"portMappings": [mapping(8080, 80), mapping(70000, 80)]}}, 7,
     "portMappings.1.hostPort"),
    ({"runtimeConfig": {"portMappings": [mapping(8080, -1)]}}, 7,
     "portMappings.0.containerPort"),
    ({"runtimeConfig": {"portMappings": [{"hostPort": 8080}]}}, 7,
     "portMappings.0.containerPort"),
    ({"runtimeConfig": {"portMappings": [{"hostPort": "8080", "containerPort": 80}]}}, 7,
     "portMappings.0.hostPort"),
    ({"runtimeConfig": {"portMappings": [mapping(8080, 80, "icmp")]}}, 7,
     "portMappings.0.protocol"),
    ({"runtimeConfig": {"portMappings": [mapping(8080, 80, host_ip="10.0.0.300")]}}, 7,
     "portMappings.0.hostIP"),
    ({"runtimeConfig": {"portMappings": [mapping(8080, 80), mapping(8080, 81)]}}, 7,
     "portMappings.1"),
    ({"runtimeConfig": {"portMappings": {"hostPort": 8080}}}, 7, "portMappings"),
]


@pytest.mark.parametrize(("top", "code", "key"), BAD, ids=[str(b[0]) for b in BAD])
def test_config_errors_name_the_key_and_apply_nothing(portmap, node_netns, top, code, key):
    c = pm_conf(prev(), [mapping(8080, 80)], **top)
    run = raw(portmap, "ADD", c, node_netns)
    assert run.exit_code != 0
    assert run.doc["code"] == code, run.doc
    assert run.doc["cniVersion"] == "1.0.0"
    assert key in run.doc["msg"], run.doc
    assert nft_table(node_netns, *TABLE) is None


def test_missing_prev_result_is_an_error(portmap, node_netns):
    run = raw(portmap, "ADD", pm_conf(None, [mapping(8080, 80)]), node_netns)
    assert run.exit_code == 1 and run.doc["code"] == 7 and "prevResult" in run.doc["msg"]
    assert nft_table(node_netns, *TABLE) is None


@pytest.mark.parametrize(("cond", "why"), [
    ("bogus thing", "not an nftables match"),
    ("ip saddr 10.0.0.1; flush ruleset", "no ';'"),
    ("ip saddr 10.0.0.1 accept\nadd rule inet scratch c1 counter", "control characters"),
    ("ip saddr @nope", "not an nftables match"),
    ("limit rate 5/second", "only match expressions"),
    ("counter", "only match expressions"),
    ("ip saddr 10.0.0.1 accept", "not an nftables match"),
    ("meta mark set 1", "only match expressions"),
])
def test_bad_conditions_are_refused_before_anything_is_applied(portmap, node_netns, cond, why):
    c = pm_conf(prev(), [mapping(8080, 80)], conditionsV4=["ip daddr 10.0.0.0/8", cond])
    run = raw(portmap, "ADD", c, node_netns)
    assert run.exit_code == 1 and run.doc["code"] == 7, run.doc
    assert "conditionsV4.1" in run.doc["msg"] and why in run.doc["msg"]
    assert nft_table(node_netns, *TABLE) is None


def test_conflict_within_a_concurrent_race_has_one_winner(portmap, node_netns):
    # fresh node: every ADD also races to create the layout
    def add(i):
        c = pm_conf(prev(f"10.88.0.{10 + i}/24"), [mapping(8080, 80)])
        return raw(portmap, "ADD", c, node_netns, cid=f"r{i}")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        runs = list(pool.map(add, range(6)))
    ok = [r for r in runs if r.exit_code == 0]
    assert len(ok) == 1, [r.doc for r in runs]
    assert all(r.doc["code"] == 7 and "already mapped" in r.doc["msg"]
               for r in runs if r.exit_code != 0)
    claims = [e for e in entries(node_netns) if e[0] == "claims4"]
    assert len(claims) == 1


def test_concurrent_adds_build_the_layout_once(portmap, node_netns):
    def add(i):
        c = pm_conf(prev(f"10.88.0.{10 + i}/24", f"fd00:88::{10 + i}/64"),
                    [mapping(8000 + i, 80), mapping(9000 + i, 53, "udp")])
        return raw(portmap, "ADD", c, node_netns, cid=f"p{i}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(add, range(8)))
    assert [r.exit_code for r in runs] == [0] * 8, [r.doc for r in runs]
    table = nft_table(node_netns, *TABLE)
    assert len(table.chain_rules("prerouting")) == 1
    assert len(table.chain_rules("output")) == 1
    assert len(table.chain_rules("hostports")) == 1
    assert len(table.chain_rules("postrouting")) == 5
    for i in range(8):
        mine = entries(node_netns, f"p{i}")
        assert ("a4", ("tcp", 8000 + i), f"10.88.0.{10 + i}") in mine
        assert ("p6", ("udp", 9000 + i), 53) in mine
    for i in range(8):
        pm(portmap, "DEL", pm_conf(None, None), node_netns, f"p{i}", "")
    assert entries(node_netns) == set()


# --- pass-through and versions -------------------------------------------------------


def test_no_mappings_passes_prev_result_through_untouched(portmap, node_netns):
    p = prev("10.88.0.5/24", "fd00:88::5/64")
    same = printed(p)  # as Go prints it
    for c in (pm_conf(p, None), pm_conf(p, []), pm_conf(p, None, runtimeConfig={})):
        assert pm(portmap, "ADD", c, node_netns, "c1") == same
    # the prevResult's addresses are on another interface: nothing to map (as Go)
    assert pm(portmap, "ADD", pm_conf(p, [mapping(8080, 80)]), node_netns, "c1",
              ifname="net1") == same
    # an IPv6 hostIP for an IPv4-only container: nothing to map either
    p4 = prev("10.88.0.5/24")
    assert pm(portmap, "ADD", pm_conf(p4, [mapping(8080, 80, host_ip="fd00::1")]), node_netns,
              "c1") == printed(p4)
    assert nft_table(node_netns, *TABLE) is None


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_every_chained_version(portmap, node_netns, version):
    p = prev("10.88.0.5/24", "fd00:88::5/64", version="1.0.0")
    if version < "1.0.0":
        for i in p["ips"]:
            i["version"] = "6" if ":" in i["address"] else "4"
    p["cniVersion"] = version
    c = pm_conf(p, [mapping(8080, 80)], version=version)
    out = pm(portmap, "ADD", c, node_netns, "c1")
    assert out["cniVersion"] == version
    assert [i["address"] for i in out["ips"]] == ["10.88.0.5/24", "fd00:88::5/64"]
    assert ("a6", ("tcp", 8080), "fd00:88::5") in entries(node_netns, "c1")
    if version >= "0.4.0":
        pm(portmap, "CHECK", c, node_netns, "c1")
    pm(portmap, "DEL", c, node_netns, "c1")
    assert entries(node_netns) == set()


def test_prev_result_without_interface_index_is_used(portmap, node_netns):
    p = {"cniVersion": "1.0.0", "ips": [{"address": "10.88.0.7/24"}]}
    pm(portmap, "ADD", pm_conf(p, [mapping(8080, 80)]), node_netns, "c1")
    assert ("a4", ("tcp", 8080), "10.88.0.7") in entries(node_netns, "c1")


def test_long_container_ids_use_hashed_tags(portmap, node_netns):
    cid = "a" * 300
    c = pm_conf(prev(), [mapping(8080, 80)])
    pm(portmap, "ADD", c, node_netns, cid)
    assert attachment_tag(cid, "eth0").startswith("sha256:")
    assert entries(node_netns, cid)
    pm(portmap, "DEL", pm_conf(None, None), node_netns, cid, "")
    assert entries(node_netns) == set()


# --- GC ------------------------------------------------------------------------------


def gc_conf(valid, name="pmnet", **top):
    c = {"cniVersion": "1.1.0", "name": name, "type": "portmap",
         "cni.dev/valid-attachments": [{"containerID": cid, "ifname": ifn} for cid, ifn in valid]}
    c.update(top)
    return c


def test_gc_removes_what_is_not_valid_in_its_own_network_only(portmap, node_netns):
    for i, (cid, net) in enumerate([("g1", "pmnet"), ("g2", "pmnet"), ("g3", "other")]):
        pm(portmap, "ADD", pm_conf(prev(f"10.88.0.{20 + i}/24", f"fd00:88::{20 + i}/64"),
                                   [mapping(8000 + i, 80)], name=net), node_netns, cid)
    g3 = entries(node_netns, "g3")
    verb(portmap, "GC", gc_conf([("g1", "eth0")]), node_netns)
    assert entries(node_netns, "g1") and entries(node_netns, "g2") == set()
    assert entries(node_netns, "g3") == g3, "another network's entries are not touched"
    # nothing stale left: GC commits nothing, and an absent table is fine
    verb(portmap, "GC", gc_conf([("g1", "eth0")]), node_netns)
    verb(portmap, "GC", gc_conf([("g3", "eth0")], name="other"), node_netns)
    assert entries(node_netns, "g3") == g3
    # libcni's other key, and null meaning "none"
    verb(portmap, "GC", {**gc_conf([]), "cni.dev/valid-attachments": None}, node_netns)
    assert entries(node_netns, "g1") == set()
    c = gc_conf([], name="other")
    c["cni.dev/attachments"] = c.pop("cni.dev/valid-attachments")
    verb(portmap, "GC", c, node_netns)
    assert entries(node_netns) == set()


def test_gc_without_the_list_removes_nothing(portmap, node_netns):
    pm(portmap, "ADD", pm_conf(prev(), [mapping(8080, 80)]), node_netns, "c1")
    c = gc_conf([])
    del c["cni.dev/valid-attachments"]
    err = fails(verb, portmap, "GC", c, node_netns)
    assert err.code == 7 and "valid-attachments" in err.msg
    assert entries(node_netns, "c1")


def test_gc_drops_a_networks_chain_left_over_by_changed_conditions(portmap, node_netns):
    old = pm_conf(prev(), [mapping(8080, 80)], conditionsV4=["ip saddr 10.0.0.0/8"])
    pm(portmap, "ADD", old, node_netns, "c1")
    new = pm_conf(prev("10.88.0.6/24"), [mapping(8081, 80)], conditionsV4=["ip saddr 10.1.0.0/16"])
    pm(portmap, "ADD", new, node_netns, "c2")
    table = nft_table(node_netns, *TABLE)
    assert len(table.chain_rules("hostports")) == 2
    verb(portmap, "GC", gc_conf([("c2", "eth0")], conditionsV4=["ip saddr 10.1.0.0/16"]),
         node_netns)
    table = nft_table(node_netns, *TABLE)
    (jump,) = table.chain_rules("hostports")
    kept = jump["expr"][0]["jump"]["target"]
    assert sorted(n for n in table.chains if n.startswith("dnat_")) == [kept]
    assert all(n.startswith(kept[len("dnat_"):]) for n in table.maps)
    assert entries(node_netns, "c1") == set() and entries(node_netns, "c2")
    pm(portmap, "CHECK", new, node_netns, "c2")


# --- STATUS, VERSION -------------------------------------------------------------------


def test_status(portmap, node_netns):
    assert verb(portmap, "STATUS", gc_conf([]), node_netns) is None
    # without CAP_NET_ADMIN nftables can not be used: 50
    proc = subprocess.run(
        ["ip", "netns", "exec", node_netns.name, "setpriv", "--inh-caps=-net_admin",
         "--bounding-set=-net_admin", portmap],
        input=json.dumps(gc_conf([])).encode(), capture_output=True, timeout=60,
        env={"PATH": os.environ["PATH"], "CNI_COMMAND": "STATUS",
             "CNI_PATH": os.path.dirname(portmap)})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["code"] == 50, doc


def test_version_stays_light(portmap):
    """podman runs VERSION before every command: no pydantic, pyroute2 or
    libnftables."""
    proc = subprocess.run(python_argv(portmap, ("-X", "importtime")),
                          input=b'{"cniVersion": "1.0.0"}', capture_output=True, check=False,
                          env={"PATH": os.environ["PATH"], "CNI_COMMAND": "VERSION"})
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert not {m for m in imported
                if m.split(".")[0] in ("pydantic", "pyroute2", "nftables", "ctypes")}


def test_add_without_udp_does_not_load_pyroute2(portmap, node_netns):
    code = """
import sys, json
from cni_skel_plugins.portmap import PortMap
env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
       "CNI_NETNS": "/x", "CNI_PATH": "/x"}
out, rc = PortMap.dispatch(env, sys.argv[1].encode())
assert rc == 0, out
after_add = sorted(m for m in sys.modules if m.startswith("pyroute2"))
env["CNI_COMMAND"] = "DEL"
assert PortMap.dispatch(env, sys.argv[1].encode())[1] == 0
print(json.dumps([after_add, sorted(m for m in sys.modules if m.startswith("pyroute2"))]))
"""
    c = json.dumps(pm_conf(prev(), [mapping(8080, 80)], snat=False))
    out = subprocess.run(["ip", "netns", "exec", node_netns.name, sys.executable, "-I", "-c",
                          code, c], capture_output=True, text=True, check=True).stdout
    after_add, after_del = json.loads(out)
    # ADD: libnftables only (pyroute2 is for the UDP conntrack flush). DEL
    # reads the attachment's record with pyroute2's nf_tables messages.
    assert after_add == []
    assert "pyroute2.netlink.nfnetlink.nftsocket" in after_del


def test_conntrack_delete_entries(node_netns):
    """cni_skel.conntrack: only entries of the family, protocol, port and
    address asked for go."""
    code = """
import json, socket
from cni_skel.nft import Nft
from cni_skel.conntrack import delete_entries
# a rule matching on conntrack state turns tracking on in this namespace
T = {"family": "inet", "table": "t"}
Nft().run([{"add": {"table": {"family": "inet", "name": "t"}}},
           {"add": {"chain": {**T, "name": "c", "type": "filter", "hook": "output",
                              "prio": 0, "policy": "accept"}}},
           {"add": {"rule": {**T, "chain": "c", "expr": [
               {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}},
               {"counter": None}]}}}])
for host, port in (("127.0.0.1", 5001), ("127.0.0.2", 5001), ("127.0.0.1", 5002), ("::1", 5001)):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", (host, port))
out = [delete_entries(4, 17, dport=5001, daddr="127.0.0.2"), delete_entries(6, 17, dport=5001),
       delete_entries(4, 6, dport=5001), delete_entries(4, 17, dport=5001),
       delete_entries(4, 17, dport=5001), delete_entries(4, 17, dport=5002),
       delete_entries(6, 17, dport=5001)]
print(json.dumps(out))
"""
    subprocess.run(["ip", "-n", node_netns.name, "link", "set", "lo", "up"], check=True)
    proc = subprocess.run(["ip", "netns", "exec", node_netns.name, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # IPv6 entries are asked for as IPv6 (nfgen_family): found and deleted
    assert json.loads(proc.stdout) == [1, 1, 0, 1, 0, 1, 0]
