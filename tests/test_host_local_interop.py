"""host-local interop with each Go yardstick's host-local (Debian's 1.1.1,
cniVersion up to 1.0.0, and upstream 1.9.1 when built: tests/yardsticks.py)
on one shared dataDir: each releases, checks and collects what the
other allocated, both see each other's reservations, and the round-robin
position (last_reserved_ip.N) carries over between them. Our owner index
(.cni-skel-index/) is left alone by Go and follows whatever Go changes."""

from __future__ import annotations

import os
import random

import pytest
from test_host_local import NET, NETNS, addrs, allocated, conf, fails, verb
from test_host_local_index import assert_index_right

from cni_skel.harness import run_plugin


@pytest.fixture(scope="session")
def impls(cni_bin, go_yardstick) -> dict[str, str]:
    return {"ours": os.path.join(cni_bin, "host-local"),
            "go": go_yardstick.exe("host-local")}


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "ipam"


DUAL = {"ranges": [[{"subnet": "10.80.0.0/24"}], [{"subnet": "fd80::/64"}]]}


def run(exe, cmd, c, node, cid, ifname="eth0", **kw):
    return run_plugin(exe, cmd, c, container_id=cid, ifname=ifname, netns=NETNS, node=node, **kw)


@pytest.mark.parametrize("first,second", [("ours", "go"), ("go", "ours")])
def test_allocate_with_one_release_with_the_other(impls, data_dir, node_netns, first, second):
    c = conf(data_dir, "1.0.0", **DUAL)
    result = run(impls[first], "ADD", c, node_netns, "x1")
    assert addrs(result) == ["10.80.0.2/24", "fd80::2/64"]
    assert allocated(data_dir) == {"10.80.0.2": b"x1\r\neth0", "fd80::2": b"x1\r\neth0"}
    run(impls[second], "CHECK", {**c, "prevResult": result}, node_netns, "x1")
    # The other implementation sees the reservation: same container again is a
    # duplicate, another container gets the next address.
    fails(run, impls[second], "ADD", c, node_netns, "x1")
    assert addrs(run(impls[second], "ADD", c, node_netns, "x2")) == ["10.80.0.3/24",
                                                                     "fd80::3/64"]
    run(impls[second], "DEL", c, node_netns, "x1")
    run(impls[first], "DEL", c, node_netns, "x2")
    assert allocated(data_dir) == {}


def test_identical_bytes_on_disk(impls, tmp_path, node_netns):
    trees = {}
    for impl, exe in impls.items():
        d = tmp_path / impl
        c = conf(d, "1.0.0", **DUAL)
        for cid in ("b1", "b2"):
            run(exe, "ADD", c, node_netns, cid, ifname="net3")
        trees[impl] = {p.name: p.read_bytes() for p in (d / NET).iterdir()
                       if p.name not in ("lock", ".cni-skel-index")}
    assert trees["ours"] == trees["go"]
    assert (tmp_path / "ours" / NET / ".cni-skel-index").is_dir(), "ours adds only its index"
    assert not (tmp_path / "go" / NET / ".cni-skel-index").exists()


def test_check_and_gc_with_ours_on_go_allocations(impls, data_dir, node_netns):
    c = conf(data_dir, "1.0.0", **DUAL)
    for cid in ("g1", "g2", "g3"):
        run(impls["go"], "ADD", c, node_netns, cid)
    run(impls["ours"], "CHECK", c, node_netns, "g2")
    assert fails(run, impls["ours"], "CHECK", c, node_netns, "g9").code == 3
    gc = {**conf(data_dir, "1.1.0", **DUAL),
          "cni.dev/valid-attachments": [{"containerID": "g2", "ifname": "eth0"}]}
    assert verb(impls["ours"], "GC", gc, node_netns) is None
    assert allocated(data_dir) == {"10.80.0.3": b"g2\r\neth0", "fd80::3": b"g2\r\neth0"}
    run(impls["go"], "DEL", c, node_netns, "g2")
    assert allocated(data_dir) == {}


def test_round_robin_continues_across_implementations(impls, data_dir, node_netns):
    c = conf(data_dir, "1.0.0", subnet="10.81.0.0/29")  # .2 ... .6
    seq = ["go", "ours", "go", "ours", "go"]
    got = [addrs(run(impls[impl], "ADD", c, node_netns, f"r{i}"))[0]
           for i, impl in enumerate(seq)]
    assert got == [f"10.81.0.{n}/29" for n in range(2, 7)]
    assert (data_dir / NET / "last_reserved_ip.0").read_bytes() == b"10.81.0.6"
    run(impls["go"], "DEL", c, node_netns, "r1")
    run(impls["ours"], "DEL", c, node_netns, "r3")
    # Both wrap around to the first free address after .6: .3, then .5.
    assert addrs(run(impls["ours"], "ADD", c, node_netns, "r5")) == ["10.81.0.3/29"]
    assert addrs(run(impls["go"], "ADD", c, node_netns, "r6")) == ["10.81.0.5/29"]
    assert fails(run, impls["ours"], "ADD", c, node_netns, "r7").code == 50
    err = fails(run, impls["go"], "ADD", c, node_netns, "r7")
    assert "no IP addresses available in range set: 10.81.0.1-10.81.0.6" in err.msg


def test_old_id_only_files_are_released_by_both(impls, data_dir, node_netns):
    """An old Go file (ID only) is released by either implementation."""
    c = conf(data_dir, "1.0.0", subnet="10.82.0.0/24")
    (data_dir / NET).mkdir(parents=True)
    for impl, ip in (("ours", "10.82.0.7"), ("go", "10.82.0.8")):
        (data_dir / NET / ip).write_bytes(f"old-{impl}".encode())
        run(impls[impl], "DEL", c, node_netns, f"old-{impl}", ifname="whatever")
    assert allocated(data_dir) == {}


def test_go_leaves_our_index_alone_and_ours_follows_go(impls, data_dir, node_netns):
    c = conf(data_dir, "1.0.0", **DUAL)
    for cid in ("x1", "x2"):
        run(impls["ours"], "ADD", c, node_netns, cid)
    idx = data_dir / NET / ".cni-skel-index"
    before = {p.name: p.read_bytes() for p in idx.iterdir()}
    assert "stamp" in before and len(before) >= 2
    # Go walks the whole directory, our index included, for CHECK, ADD and DEL.
    run(impls["go"], "CHECK", c, node_netns, "x1")
    fails(run, impls["go"], "CHECK", c, node_netns, "nobody")
    fails(run, impls["go"], "ADD", c, node_netns, "x2")
    assert addrs(run(impls["go"], "ADD", c, node_netns, "g1")) == ["10.80.0.4/24", "fd80::4/64"]
    run(impls["go"], "DEL", c, node_netns, "x1")
    run(impls["go"], "DEL", c, node_netns, "nobody")
    assert {p.name: p.read_bytes() for p in idx.iterdir()} == before, "Go changed none of it"
    # Ours, next, sees what Go did.
    assert fails(run, impls["ours"], "CHECK", c, node_netns, "x1").code == 3
    run(impls["ours"], "CHECK", c, node_netns, "g1")
    assert fails(run, impls["ours"], "ADD", c, node_netns, "g1").code == 4
    assert addrs(run(impls["ours"], "ADD", c, node_netns, "x1")) == ["10.80.0.5/24",
                                                                     "fd80::5/64"]
    assert_index_right(data_dir, NET)
    run(impls["ours"], "DEL", c, node_netns, "g1")
    for cid in ("x1", "x2"):
        run(impls["go"], "DEL", c, node_netns, cid)
    assert allocated(data_dir) == {}


def test_interleaved_with_go_both_ways(impls, data_dir, node_netns):
    """40 random steps, each by ours or Go, checked against a model: every
    verb of each sees exactly what the other left."""
    rnd = random.Random(7)  # every (implementation, verb, outcome) at least twice
    c = conf(data_dir, "1.0.0", subnet="10.83.0.0/28")  # .2 - .14: 13 addresses
    live: dict[str, str] = {}
    known = [f"k{i}" for i in range(16)]
    for _ in range(40):
        impl = rnd.choice(("ours", "go"))
        cid = rnd.choice(known)
        cmd = rnd.choice(("ADD", "ADD", "DEL", "CHECK"))
        where = f"{impl} {cmd} {cid} with {sorted(live.items())}"
        if cmd == "ADD" and cid not in live and len(live) < 13:
            ip = addrs(run(impls[impl], "ADD", c, node_netns, cid))[0].split("/")[0]
            assert ip not in live.values(), where
            live[cid] = ip
        elif cmd == "ADD":
            fails(run, impls[impl], "ADD", c, node_netns, cid)
        elif cmd == "DEL":
            run(impls[impl], "DEL", c, node_netns, cid)
            live.pop(cid, None)
        elif cid in live:
            run(impls[impl], "CHECK", c, node_netns, cid)
        else:
            fails(run, impls[impl], "CHECK", c, node_netns, cid)
        assert allocated(data_dir) == {ip: f"{k}\r\neth0".encode() for k, ip in live.items()}, \
            where
    run(impls["ours"], "DEL", c, node_netns, "nobody")
    assert_index_right(data_dir, NET)
