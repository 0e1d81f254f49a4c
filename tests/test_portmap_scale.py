"""portmap DEL and CHECK by point reads: the attachment's record (the
``records`` set), what DEL removes with and without it, stale and unreadable
records, tables made before records, and that neither verb lists the table
nor commits more than one transaction (counted with the kernel's nftables
generation). Other pods' mappings are filled in-process (the same code,
faster); the verb under test runs through the real executable."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from cni_skel_plugins.portmap import PortMap
from cni_skel_plugins.portmap import layout as L
from test_portmap import TABLE, entries, fails, mapping, pm, pm_conf
from test_portmap_verbs import prev

from cni_skel.harness import nft_table
from cni_skel.netns import NetNS
from cni_skel.nft import Nft, attachment_tag, generation

T = {"family": "inet", "table": "cni_portmap"}


@pytest.fixture(scope="session")
def portmap(cni_bin: str) -> str:
    return os.path.join(cni_bin, "portmap")


def in_node(node: Any, fn: Any, *args: Any) -> Any:
    with NetNS.open(node.path) as n:
        return n.run(fn, *args)


def gen(node: Any) -> int:
    return in_node(node, generation)


def nft_run(node: Any, cmds: list[dict]) -> None:
    in_node(node, lambda: Nft().run(cmds))


def put(node: Any, name: str, key: Any, comment: str, data: Any = None) -> None:
    """Replace the element ``key`` of ``name`` by hand (one transaction)."""
    elem = {"elem": {"val": key, "comment": comment}}
    nft_run(node, [*L.delete_cmds([(name, key)]), {"add": {"element": {
        **T, "name": name, "elem": [elem if data is None else [elem, data]]}}}])


def inproc(node: Any, cmd: str, c: dict, cid: str, ifname: str = "eth0") -> Any:
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
           "CNI_NETNS": "/run/netns/none", "CNI_PATH": "/nonexistent"}
    out, rc = in_node(node, PortMap.dispatch, env, json.dumps(c).encode())
    assert rc == 0, out
    return out


def fill(node: Any, n: int) -> None:
    """``n`` other pods, one TCP and one UDP mapping each, dual-stack."""
    for j in range(n):
        c = pm_conf(prev(f"10.88.{j // 200}.{j % 200 + 20}/16", f"fd00:88::{j + 20:x}/64"),
                    [mapping(20000 + j, 80), mapping(30000 + j, 53, "udp")])
        inproc(node, "ADD", c, f"other{j}")


def records(node: Any) -> dict[str, str]:
    """The record elements of the table: key -> comment."""
    table = nft_table(node, *TABLE)
    return {} if table is None else {k: c for k, _d, c in table.entries(L.RECORDS)}


def record_of(node: Any, cid: str, ifname: str = "eth0") -> list[str]:
    """The comments of one attachment's record chunks, in order."""
    mine = L.records_by_prefix((k, None, c) for k, c in records(node).items())
    return [c for _i, _k, c in mine.get(L.tag_prefix(attachment_tag(cid, ifname)), [])]


def others(node: Any, cid: str) -> set[tuple]:
    """Every element of the table but those of ``cid`` and its record."""
    mine = set(entries(node, cid))
    keys = {L.record_key(attachment_tag(cid, "eth0"), i) for i in range(8)}
    return {e for e in entries(node) - mine if not (e[0] == L.RECORDS and e[1] in keys)}


def group(node: Any) -> str:
    table = nft_table(node, *TABLE)
    return next(n for n in table.maps if n.endswith("_a4"))[:-3]


C1 = [mapping(8080, 80), mapping(5353, 53, "udp"), mapping(9090, 90, host_ip="10.99.0.1")]


def add_c1(portmap: str, node: Any, cid: str = "c1") -> dict:
    c = pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), C1)
    pm(portmap, "ADD", c, node, cid)
    return c


# --- DEL --------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["full", "prevResult only", "bare"])
def test_del_by_record_removes_exactly_its_entries_in_one_transaction(portmap, node_netns,
                                                                      form):
    fill(node_netns, 20)
    c = add_c1(portmap, node_netns)
    assert entries(node_netns, "c1") and record_of(node_netns, "c1")
    kept = others(node_netns, "c1")
    # containerd's first DEL (everything), ctr after exit (prevResult, no
    # runtimeConfig), containerd's second DEL (nothing, no netns)
    dconf = {"full": c, "prevResult only": pm_conf(c["prevResult"], None),
             "bare": pm_conf(None, None)}[form]
    before = gen(node_netns)
    pm(portmap, "DEL", dconf, node_netns, "c1", "" if form == "bare" else "/run/netns/none")
    assert gen(node_netns) == before + 1, "one transaction"
    assert entries(node_netns, "c1") == set()
    assert record_of(node_netns, "c1") == []
    assert entries(node_netns) == kept, "other pods' entries and records untouched"
    # again, in every form: nothing to do, nothing committed
    for again in (c, pm_conf(c["prevResult"], None), pm_conf(None, None)):
        pm(portmap, "DEL", again, node_netns, "c1", "")
    assert gen(node_netns) == before + 1
    assert entries(node_netns) == kept


def test_del_of_nothing_commits_nothing(portmap, node_netns):
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")  # no table at all
    assert nft_table(node_netns, *TABLE) is None
    fill(node_netns, 3)
    before = gen(node_netns)
    c = pm_conf(prev(), [mapping(8080, 80)])
    pm(portmap, "DEL", c, node_netns, "never-added")
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "never-added", "")
    # another attachment's keys (other0's port): read back, not ours, left alone
    pm(portmap, "DEL", pm_conf(prev("10.88.0.20/16"), [mapping(20000, 80)]), node_netns,
       "intruder")
    assert gen(node_netns) == before
    assert len(entries(node_netns, "other0")) > 0


def test_del_and_check_do_not_list_the_table(node_netns, monkeypatch):
    fill(node_netns, 5)
    c = pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), C1)
    inproc(node_netns, "ADD", c, "c1")

    def no_listing(*a, **k):
        raise AssertionError("the table was listed")

    monkeypatch.setattr(Nft, "table", no_listing)
    inproc(node_netns, "CHECK", c, "c1")
    inproc(node_netns, "DEL", pm_conf(None, None), "c1")
    inproc(node_netns, "DEL", pm_conf(None, None), "c1")
    monkeypatch.undo()
    assert entries(node_netns, "c1") == set() and record_of(node_netns, "c1") == []


def test_readd_with_other_mappings_then_bare_del_removes_both(portmap, node_netns):
    pm(portmap, "ADD", pm_conf(prev(), [mapping(8080, 80)]), node_netns, "c1")
    pm(portmap, "ADD", pm_conf(prev(), [mapping(9090, 90, "udp")]), node_netns, "c1")
    mine = entries(node_netns, "c1")
    assert ("p4", ("tcp", 8080), 80) in mine and ("p4", ("udp", 9090), 90) in mine
    (rec,) = record_of(node_netns, "c1")
    assert "tcp/8080" in rec.split() and "udp/9090" in rec.split()
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert entries(node_netns) == set()


def test_stale_record_removes_only_what_is_still_its_own(portmap, node_netns):
    fill(node_netns, 3)
    add_c1(portmap, node_netns)
    gid = group(node_netns)
    # c1's TCP 8080 goes behind its back (GC, an admin), then c2, with the
    # same container address (c1's sandbox is gone, its address reused),
    # maps 8080 and takes over the shared masquerade entries of that address
    nft_run(node_netns, L.delete_cmds([(f"{gid}_a4", {"concat": ["tcp", 8080]}),
                                       (f"{gid}_p4", {"concat": ["tcp", 8080]}),
                                       ("claims4", {"concat": ["0.0.0.0", "tcp", 8080]})]))
    pm(portmap, "ADD", pm_conf(prev("10.88.0.5/24"), [mapping(8080, 8000)]), node_netns, "c2")
    c2 = entries(node_netns, "c2")
    assert ("hairpin4", ("10.88.0.5", "10.88.0.5"), None) in c2
    assert ("a4", ("tcp", 8080), "10.88.0.5") in c2
    kept = others(node_netns, "c1")
    before = gen(node_netns)
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert gen(node_netns) == before + 1
    assert entries(node_netns, "c1") == set() and record_of(node_netns, "c1") == []
    assert entries(node_netns, "c2") == c2
    assert entries(node_netns) == kept


def test_record_of_entries_all_gone_is_removed_alone(portmap, node_netns):
    add_c1(portmap, node_netns)
    table = nft_table(node_netns, *TABLE)
    tag = attachment_tag("c1", "eth0")
    nft_run(node_netns, L.delete_cmds(
        [(name, key) for name in [*table.sets, *table.maps] if name != L.RECORDS
         for key, _d, comment in table.entries(name) if comment == tag]))
    assert entries(node_netns, "c1") == set() and record_of(node_netns, "c1")
    before = gen(node_netns)
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert gen(node_netns) == before + 1 and records(node_netns) == {}
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert gen(node_netns) == before + 1


def test_unreadable_record_falls_back_to_listing(portmap, node_netns):
    fill(node_netns, 3)
    add_c1(portmap, node_netns)
    key = L.record_key(attachment_tag("c1", "eth0"))
    put(node_netns, L.RECORDS, key, "r9 what is this")
    kept = others(node_netns, "c1")
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert entries(node_netns, "c1") == set() and record_of(node_netns, "c1") == []
    assert entries(node_netns) == kept


def test_table_made_before_records(portmap, node_netns):
    """An older version's table (no records set): DEL lists it; the first
    ADD that lists it adds the set with a record for every attachment."""
    fill(node_netns, 3)
    add_c1(portmap, node_netns)
    pm(portmap, "ADD", pm_conf(prev("10.88.0.6/24"), [mapping(7070, 70)]), node_netns, "c2")
    nft_run(node_netns, [{"delete": {"set": {**T, "name": L.RECORDS}}}])
    assert L.RECORDS not in nft_table(node_netns, *TABLE).sets
    kept = others(node_netns, "c1")
    before = gen(node_netns)
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")  # no record: listing
    assert gen(node_netns) == before + 1
    assert entries(node_netns, "c1") == set() and entries(node_netns) == kept
    # a new ADD (its fast path fails: no records set) brings the set, and a
    # record for each attachment found, in its one transaction
    before = gen(node_netns)
    pm(portmap, "ADD", pm_conf(prev("10.88.0.7/24"), [mapping(6060, 60)]), node_netns, "c3")
    assert gen(node_netns) == before + 1
    (rec,) = record_of(node_netns, "c2")
    assert set(rec.split()[2:]) == {f"g:{group(node_netns)}", "4:10.88.0.6", "tcp/7070"}
    for j in range(3):
        assert record_of(node_netns, f"other{j}")
    c2 = entries(node_netns, "c2")
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c2", "")
    assert entries(node_netns, "c2") == set() and record_of(node_netns, "c2") == []
    assert c2 and entries(node_netns, "c3")


def test_big_record_is_chunked(portmap, node_netns):
    maps = [mapping(10000 + i, 80, "udp" if i % 3 else "tcp") for i in range(40)]
    maps += [mapping(11000 + i, 80, host_ip=f"fd00:99::{i + 1:x}") for i in range(20)]
    maps += [mapping(12000 + i, 80, host_ip=f"10.99.0.{i + 1}") for i in range(20)]
    pm(portmap, "ADD", pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), maps), node_netns, "c1")
    chunks = record_of(node_netns, "c1")
    assert len(chunks) > 3 and all(len(c.encode()) <= 250 for c in chunks)
    assert L.Record.parse(chunks).ports == {(m["protocol"], m["hostPort"], m["hostIP"] or None)
                                            for m in maps}
    pm(portmap, "CHECK", pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), maps), node_netns, "c1")
    before = gen(node_netns)
    pm(portmap, "DEL", pm_conf(None, None), node_netns, "c1", "")
    assert gen(node_netns) == before + 1
    assert entries(node_netns) == set()


# --- CHECK ------------------------------------------------------------------------


def test_check_by_point_reads(portmap, node_netns):
    c = pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), C1)
    err = fails(pm, portmap, "CHECK", c, node_netns, "c1")
    assert err.code == 999 and "is missing" in err.msg  # no table yet
    fill(node_netns, 10)
    pm(portmap, "ADD", c, node_netns, "c1")
    before = gen(node_netns)
    pm(portmap, "CHECK", c, node_netns, "c1")
    gid = group(node_netns)
    # other data under our tag
    key = {"concat": ["tcp", 8080]}
    put(node_netns, f"{gid}_p4", key, "c1/eth0", 81)
    err = fails(pm, portmap, "CHECK", c, node_netns, "c1")
    assert err.code == 999 and "holds 81, not 80" in err.msg
    # another attachment's entry under our key
    put(node_netns, f"{gid}_p4", key, "x/eth0", 80)
    err = fails(pm, portmap, "CHECK", c, node_netns, "c1")
    assert err.code == 999 and "belongs to x/eth0" in err.msg
    # a missing element and a missing chain
    nft_run(node_netns, L.delete_cmds([(f"{gid}_p4", key)]))
    err = fails(pm, portmap, "CHECK", c, node_netns, "c1")
    assert "missing from" in err.msg
    cond = pm_conf(prev("10.88.0.5/24", "fd00:88::5/64"), C1, conditionsV4=["ip saddr 1.2.3.4"])
    err = fails(pm, portmap, "CHECK", cond, node_netns, "c1")
    assert "chain dnat_" in err.msg and "is missing" in err.msg
    assert gen(node_netns) == before + 3, "CHECK commits nothing (3 hand edits)"


# --- GC ---------------------------------------------------------------------------


def test_gc_removes_the_records_of_its_own_stale_attachments(portmap, node_netns):
    for i, (cid, net) in enumerate([("g1", "pmnet"), ("g2", "pmnet"), ("g3", "other")]):
        pm(portmap, "ADD", pm_conf(prev(f"10.88.0.{20 + i}/24"), [mapping(8000 + i, 80)],
                                   name=net), node_netns, cid)
    c = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap",
         "cni.dev/valid-attachments": [{"containerID": "g1", "ifname": "eth0"}]}
    pm(portmap, "GC", c, node_netns, "", "", "")
    assert record_of(node_netns, "g1") and record_of(node_netns, "g3")
    assert record_of(node_netns, "g2") == [] and entries(node_netns, "g2") == set()
    # a record alone (its entries gone by hand) is removed by GC too
    gid = group(node_netns)
    nft_run(node_netns, L.delete_cmds([(f"{gid}_a4", {"concat": ["tcp", 8000]}),
                                       (f"{gid}_p4", {"concat": ["tcp", 8000]}),
                                       ("claims4", {"concat": ["0.0.0.0", "tcp", 8000]})]))
    assert ("hairpin4", ("10.88.0.20", "10.88.0.20"), None) in entries(node_netns, "g1")
    c["cni.dev/valid-attachments"] = []
    pm(portmap, "GC", c, node_netns, "", "", "")
    # its masquerade entries too: the record says whose network they were
    assert record_of(node_netns, "g1") == [] and entries(node_netns, "g1") == set()
    assert record_of(node_netns, "g3") and entries(node_netns, "g3")
