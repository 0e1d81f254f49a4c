"""host-local's owner index (`store.py`), in-process: it always agrees with
Go's files, whoever changed them and however fast after our last write; a
missing, damaged, lying or unusable index changes no answer; GC and STATUS
keep it right. Through Go's real binary: test_host_local_interop.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import time

import pytest
from cni_skel_plugins.host_local import HostLocal
from cni_skel_plugins.host_local import store as store_mod
from cni_skel_plugins.host_local.store import INDEX_DIR, INDEX_MAGIC, Store

NET = "idxnet"
DUAL = {"ranges": [[{"subnet": "10.84.0.0/24"}], [{"subnet": "fd84::/64"}]]}


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "ipam"


def conf(data_dir, version="1.1.0", **ipam) -> dict:
    return {"cniVersion": version, "name": NET, "type": "bridge",
            "ipam": {"type": "host-local", "dataDir": str(data_dir), **(ipam or DUAL)}}


def call(cmd: str, c: dict, cid: str = "", ifname: str = "eth0") -> tuple[int, dict | None]:
    """One in-process invocation: (exit code, output document)."""
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
           "CNI_NETNS": "/run/netns/unused", "CNI_PATH": "/nonexistent"}
    if cmd in ("GC", "STATUS"):
        env = {"CNI_COMMAND": cmd, "CNI_PATH": "/nonexistent"}
    out, rc = HostLocal.dispatch(env, json.dumps(c).encode(), io.StringIO())
    return rc, json.loads(out) if out.strip() else None


def ok(cmd: str, c: dict, cid: str = "", ifname: str = "eth0") -> dict | None:
    rc, doc = call(cmd, c, cid, ifname)
    assert rc == 0, doc
    return doc


def code(cmd: str, c: dict, cid: str = "", ifname: str = "eth0") -> int:
    rc, doc = call(cmd, c, cid, ifname)
    assert rc == 1, doc
    return doc["code"]


def addrs(doc) -> list[str]:
    return [ip["address"].split("/")[0] for ip in doc["ips"]]


def files(data_dir) -> dict[str, bytes]:
    """Go's address files: name -> content."""
    d = data_dir / NET
    return {p.name: p.read_bytes() for p in d.iterdir()
            if p.name[0].isalnum() and p.name not in ("lock",)
            and not p.name.startswith("last_reserved_ip.") and p.is_file()}


def go_write(data_dir, ip: str, cid: str, ifname: str | None = "eth0") -> None:
    """What Go's Reserve leaves (O_EXCL create): our index is not told."""
    record = cid if ifname is None else f"{cid}\r\n{ifname}"
    fd = os.open(data_dir / NET / ip, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, record.encode())
    os.close(fd)


def scan_entries(data_dir, net: str = NET) -> set[tuple[str, str]]:
    """(key, ip) of every address file, as the index should list them."""
    st = Store(str(data_dir), net)
    out = set()
    for ip, o in st.scan().owners.items():
        if o is not None:
            cid = store_mod._esc(o.container_id)
            out.add((cid if o.ifname is None else f"{cid}/{store_mod._esc(o.ifname)}", str(ip)))
    return out


def index_entries(data_dir, net: str = NET) -> set[tuple[str, str]] | None:
    """Every (key, ip) line of the index when its stamp matches the
    directory (the index is trusted), else None."""
    st = Store(str(data_dir), net)
    with st.lock():
        idx = st._load_index()
        if idx is None:
            return None
        lines = [line for b in range(store_mod._BUCKETS)
                 for line in st._bucket(idx, b).splitlines()[1:]]
    entries = {tuple(line.split("\t")) for line in lines}
    assert len(entries) == len(lines), "no line twice"
    return entries


def assert_index_right(data_dir, net: str = NET) -> None:
    assert index_entries(data_dir, net) == scan_entries(data_dir, net)


# --- the index is kept and trusted ---------------------------------------------------------


def test_index_is_written_and_sealed(data_dir):
    c = conf(data_dir)
    for cid in ("a", "b", "c"):
        ok("ADD", c, cid)
    ok("ADD", c, "a", "net1")
    idx_dir = data_dir / NET / INDEX_DIR
    stamp = (idx_dir / "stamp").read_text()
    assert stamp.startswith(INDEX_MAGIC + " ") and stamp.endswith("\n")
    st = os.stat(data_dir / NET)
    _, dev, ino, mtime, _, _ = stamp.split()
    assert (int(dev), int(ino), int(mtime)) == (st.st_dev, st.st_ino, st.st_mtime_ns)
    assert int(mtime) % 2 == 1, "odd: no coarse-clock stamp of a later change can equal it"
    assert int(mtime) < time.clock_gettime_ns(store_mod._COARSE_CLOCK)
    assert_index_right(data_dir)
    assert len(index_entries(data_dir)) == 8
    # Every file of ours starts with "#": never equal to a Go key after TrimSpace.
    for p in idx_dir.iterdir():
        assert p.read_bytes().startswith(b"#"), p


def test_flat_verbs_read_no_address_file_but_their_own(data_dir, monkeypatch):
    c = conf(data_dir, subnet="10.85.0.0/16")
    ok("ADD", c, "first")
    for i in range(300):  # Go's files, then one call of ours rebuilds the index once
        go_write(data_dir, f"10.85.{1 + i // 250}.{i % 250 + 2}", f"fill-{i}")
    ok("DEL", c, "nobody")
    assert_index_right(data_dir)
    reads = []
    real = Store._read_record
    monkeypatch.setattr(Store, "_read_record",
                        lambda self, name: reads.append(name) or real(self, name))
    monkeypatch.setattr(Store, "scan", lambda self: pytest.fail("scanned"))
    ip = addrs(ok("ADD", c, "x"))[0]
    ok("CHECK", c, "x")
    ok("DEL", c, "x")
    ok("DEL", c, "unknown")
    ok("CHECK", c, "fill-7")
    assert reads == [ip, ip, "10.85.1.9"], "only the container's own files are read"


def test_changes_right_after_our_seal_are_seen(data_dir):
    """A foreign write within the same clock tick as our seal (Go waiting on
    the lock) still moves the directory's mtime away from the stamp."""
    c = conf(data_dir, subnet="10.86.0.0/16")
    for i in range(40):
        ok("ADD", c, f"ours-{i}")
        go_write(data_dir, f"10.86.9.{i + 2}", f"go-{i}")   # at once: same tick, mostly
        ok("CHECK", c, f"go-{i}")
        assert code("ADD", c, f"go-{i}") == 4, "a duplicate: the index saw Go's file"
        ok("ADD", c, f"gone-{i}")
        ip = next(n for n, b in files(data_dir).items() if b == f"gone-{i}\r\neth0".encode())
        os.unlink(data_dir / NET / ip)                      # Go's DEL, at once
        assert code("CHECK", c, f"gone-{i}") == 3
        ok("DEL", c, f"go-{i}")
        assert f"10.86.9.{i + 2}" not in files(data_dir)
    assert_index_right(data_dir)


def test_old_id_only_files_and_odd_owners(data_dir):
    c = conf(data_dir, subnet="10.87.0.0/24")
    d = data_dir / NET
    ok("ADD", c, "cA")                                 # 10.87.0.2
    assert code("ADD", c, "cA", "e%41") == 4           # ours refuses a "%" ifname; Go's took it:
    (d / "10.87.0.3").write_bytes(b"cA\r\ne%41")       # the ifname escapes: not eA
    (d / "10.87.0.50").write_bytes(b"cA")              # old Go: ID only, same container
    (d / "10.87.0.51").write_bytes(b"c%41\r\neth0")    # a foreign file: cid "c%41" != "cA"
    (d / "10.87.0.52").write_bytes(b"cA\tx\r\neth0")   # tab in a foreign ID
    (d / "10.87.0.53").write_bytes(b"\xff\xfe\r\n\x00")
    (d / "10.87.0.54").write_bytes(b"cA\r\neth0\r\nmore")  # ifname "eth0\r\nmore"
    (d / "10.87.0.55").write_bytes(b"")                # names nobody
    ok("DEL", c, "nobody")
    assert_index_right(data_dir)
    assert ("%FF%FE/%00", "10.87.0.53") in index_entries(data_dir)
    assert code("CHECK", c, "eA") == 3
    assert code("CHECK", c, "cA", "e%41") == 4
    ok("DEL", c, "cA")          # Go: the new-format file of (cA, eth0) only
    assert "10.87.0.2" not in files(data_dir) and "10.87.0.50" in files(data_dir)
    ok("DEL", c, "cA")          # now none is left: the ID-only one goes
    assert "10.87.0.50" not in files(data_dir)
    assert sorted(files(data_dir)) == ["10.87.0.3", "10.87.0.51", "10.87.0.52", "10.87.0.53",
                                        "10.87.0.54", "10.87.0.55"]
    ok("DEL", c, "cA", "e%41")  # a DEL still releases what Go made for a "%" ifname
    assert "10.87.0.3" not in files(data_dir)
    assert_index_right(data_dir)


# --- damaged, missing, lying or unusable index ---------------------------------------------


def _damage(data_dir, how: str, tmp_path) -> None:
    idx = data_dir / NET / INDEX_DIR
    buckets = sorted(p for p in idx.iterdir() if p.name.startswith("b"))
    if how == "no index":
        shutil.rmtree(idx)
    elif how == "no stamp":
        (idx / "stamp").unlink()
    elif how == "garbage stamp":
        (idx / "stamp").write_bytes(b"\x00garbage")
    elif how == "stamp with a tail":   # a crash between pwrite and ftruncate
        with open(idx / "stamp", "ab") as fp:
            fp.write(b"1:0\n")
    elif how == "stamp edited":        # its own CRC no longer matches
        magic, dev, ino, mtime, sums, crc = (idx / "stamp").read_text().split()
        first, rest = sums.split(",", 1)
        sums = ("1:0," if first != "1:0" else "2:0,") + rest
        (idx / "stamp").write_text(" ".join((magic, dev, ino, mtime, sums, crc)) + "\n")
    elif how == "truncated bucket":
        for p in buckets:
            p.write_bytes(p.read_bytes()[:-3])
    elif how == "bucket rewritten":    # same length, other bytes (power loss)
        for p in buckets:
            p.write_bytes(p.read_bytes().replace(b".2\n", b".9\n"))
    elif how == "bucket removed":
        buckets[0].unlink()
    elif how == "bucket is a directory":
        buckets[0].unlink()
        buckets[0].mkdir()
    elif how == "index is a file":
        shutil.rmtree(idx)
        idx.write_bytes(b"#not a directory")
    elif how == "index is a symlink":
        shutil.rmtree(idx)
        (tmp_path / "elsewhere").mkdir()
        idx.symlink_to(tmp_path / "elsewhere")
    else:
        raise AssertionError(how)


DAMAGE = ["no index", "no stamp", "garbage stamp", "stamp with a tail", "stamp edited",
          "truncated bucket", "bucket rewritten", "bucket removed", "bucket is a directory",
          "index is a file", "index is a symlink"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_index_changes_no_answer(data_dir, tmp_path, how):
    c = conf(data_dir)
    for cid in ("a", "b", "c"):
        ok("ADD", c, cid)
    _damage(data_dir, how, tmp_path)
    with pytest.raises((store_mod._Stale, OSError, AssertionError)):
        assert index_entries(data_dir) is not None, "distrusted"
    ok("CHECK", c, "a")
    assert code("ADD", c, "a") == 4
    ok("DEL", c, "b")
    assert code("CHECK", c, "b") == 3
    ok("DEL", c, "unknown")
    assert addrs(ok("ADD", c, "d")) == ["10.84.0.5", "fd84::5"]
    assert sorted(files(data_dir).values()) == [b"a\r\neth0"] * 2 + [b"c\r\neth0"] * 2 + \
        [b"d\r\neth0"] * 2
    if how == "index is a file":
        assert (data_dir / NET / INDEX_DIR).read_bytes() == b"#not a directory"
        assert index_entries(data_dir) is None, "unusable: every call scans"
    elif how == "index is a symlink":
        assert list((tmp_path / "elsewhere").iterdir()) == [], "never written through"
        assert index_entries(data_dir) is None
    else:
        assert_index_right(data_dir)


def test_a_lying_index_is_caught_by_the_files(data_dir):
    """An index with a valid stamp that names another container's address
    (only a bug could write one): the address files decide."""
    c = conf(data_dir, subnet="10.88.0.0/24")
    ok("ADD", c, "a")   # 10.88.0.2
    ok("ADD", c, "b")   # 10.88.0.3
    st = Store(str(data_dir), NET)
    with st.lock():
        idx = st._load_index()
        b = store_mod._bucket_of("a")
        text = st._bucket(idx, b).replace("a/eth0\t10.88.0.2\n", "a/eth0\t10.88.0.3\n")
        dfd = st._index_dir()
        try:
            store_mod._put_bucket(dfd, b, text)
            idx.sums[b] = store_mod._summary(text)
            st._seal(dfd, idx)
        finally:
            os.close(dfd)
    assert index_entries(data_dir) != scan_entries(data_dir)
    ok("DEL", c, "a")
    assert files(data_dir) == {"10.88.0.3": b"b\r\neth0"}, "b's address kept, a's released"
    ok("CHECK", c, "b")
    assert_index_right(data_dir)


def test_file_rewritten_in_place_is_caught_for_its_old_owner(data_dir):
    """Go never rewrites an address file (O_EXCL), a hand might: that does not
    move the directory's mtime, but the old owner's lookup reads the file."""
    c = conf(data_dir, subnet="10.88.0.0/24")
    ok("ADD", c, "a")
    (data_dir / NET / "10.88.0.2").write_bytes(b"z\r\neth0")
    assert code("CHECK", c, "a") == 3
    ok("CHECK", c, "z")   # rebuilt by the failed check above
    assert_index_right(data_dir)


def rounding_utime(real):
    def utime(path, *a, ns=None, **kw):
        if ns is not None:  # a filesystem keeping whole seconds
            ns = tuple(t // 10**9 * 10**9 for t in ns)
        return real(path, *a, ns=ns, **kw)
    return utime


def refusing_utime(path, *a, **kw):
    raise PermissionError(1, "Operation not permitted", str(path))


@pytest.mark.parametrize("utime", ["rounding", "refused"])
def test_unsealable_directory_falls_back_to_scanning(data_dir, monkeypatch, utime):
    monkeypatch.setattr(os, "utime", rounding_utime(os.utime) if utime == "rounding"
                        else refusing_utime)
    c = conf(data_dir, subnet="10.84.0.0/24")
    for cid in ("a", "b"):
        ok("ADD", c, cid)
    ok("CHECK", c, "a")
    assert code("ADD", c, "a") == 4
    go_write(data_dir, "10.84.0.77", "g")
    ok("CHECK", c, "g")
    ok("DEL", c, "a")
    assert code("CHECK", c, "a") == 3
    assert not (data_dir / NET / INDEX_DIR / "stamp").exists()
    assert index_entries(data_dir) is None
    monkeypatch.undo()
    ok("DEL", c, "nobody")
    assert_index_right(data_dir)


def test_failed_index_write_leaves_it_stale_not_wrong(data_dir, monkeypatch):
    c = conf(data_dir)
    ok("ADD", c, "a")
    monkeypatch.setattr(store_mod, "_put_bucket", refusing_utime)
    ok("ADD", c, "b")         # the allocation stands; the index could not follow
    ok("DEL", c, "a")
    assert index_entries(data_dir) is None, "stamp no longer matches"
    monkeypatch.undo()
    ok("CHECK", c, "b")
    assert code("CHECK", c, "a") == 3
    assert_index_right(data_dir)


# --- GC and STATUS ------------------------------------------------------------------------


def test_gc_leaves_a_right_index(data_dir):
    c = conf(data_dir)
    for cid, ifname in [("a", "eth0"), ("a", "net1"), ("b", "eth0"), ("c", "eth0")]:
        ok("ADD", c, cid, ifname)
    go_write(data_dir, "10.84.0.100", "go1")
    go_write(data_dir, "10.84.0.101", "go2")
    go_write(data_dir, "10.84.0.102", "old", ifname=None)
    gc = {**c, "cni.dev/valid-attachments": [
        {"containerID": "a", "ifname": "net1"}, {"containerID": "go1", "ifname": "eth0"},
        {"containerID": "old", "ifname": "eth5"}]}
    assert call("GC", gc) == (0, None)
    assert sorted(files(data_dir).values()) == [b"a\r\nnet1"] * 2 + [b"go1\r\neth0", b"old"]
    assert_index_right(data_dir)
    assert code("CHECK", c, "b") == 3
    ok("CHECK", c, "a", "net1")
    ok("DEL", c, "go1")
    ok("DEL", c, "old", "eth5")
    assert sorted(files(data_dir).values()) == [b"a\r\nnet1"] * 2
    assert_index_right(data_dir)


def test_status_keeps_the_index_fresh(data_dir):
    c = conf(data_dir)
    ok("ADD", c, "a")
    before = index_entries(data_dir)
    assert before is not None
    assert call("STATUS", c) == (0, None)
    assert index_entries(data_dir) == before, "the probe file did not make it stale"


def test_escaping_is_one_to_one():
    names = ["a", "a/b", "a%2Fb", "a%b", "a b", "a\tb", "a\nb", "é", "\udcff", "", "%", "#x"]
    escaped = [store_mod._esc(n) for n in names]
    assert len(set(escaped)) == len(names)
    assert all(e.isascii() and e.isprintable() and not set(e) & set(" /\t\n") for e in escaped)
    assert store_mod._esc("0123456789abcdef" * 4 + "_.-") == "0123456789abcdef" * 4 + "_.-"
