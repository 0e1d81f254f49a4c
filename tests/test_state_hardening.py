"""On-disk state is safe (host-local and tuning, through their real
executables, both modes; the state helpers in-process):

* container IDs of any length round-trip: address files are read whole;
* every directory and file created gets its mode whatever the umask;
* a symlink planted in the state (host-local's network directory, lock,
  an address file, last_reserved_ip.N; tuning's saved file) is an Error
  (code 5, STATUS 50) naming the path, and its target is never touched;
* temp files a killed writer leaves are removed by the next GC, while a
  write in progress keeps its own.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cni_skel_plugins.host_local import HostLocal
from cni_skel_plugins.host_local.config import HostLocalConf
from cni_skel_plugins.host_local.store import INDEX_DIR
from test_host_local import NET, NETNS, addrs, allocated, conf, fails, verb
from test_host_local_index import assert_index_right

from cni_skel import netlink
from cni_skel.env import CmdArgs
from cni_skel.harness import TestNetNS, run_plugin
from cni_skel.netns import NetNS
from cni_skel.state import SYMLINK_REFUSED, TEMP_PREFIX, FileLock, StateDir, atomic_write

SUBNET = {"subnet": "10.91.0.0/24"}
TUNING_NET = "tunehard"
CID = "ctr1"


@pytest.fixture(scope="session")
def hl(cni_bin: str) -> str:
    return os.path.join(cni_bin, "host-local")


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "ipam"


def run(exe: str, cmd: str, c: dict, node: TestNetNS, cid: str = "c1", **kw):
    return run_plugin(exe, cmd, c, container_id=cid, ifname="eth0", netns=NETNS, node=node,
                      **kw)


def gc_conf(c: dict, valid: list[dict]) -> dict:
    return {**c, "cni.dev/valid-attachments": valid}


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def tree(root) -> list[str]:
    """Every path under ``root`` (root included), relative, sorted."""
    out = ["."]
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, n)) for n in dirnames + filenames]
    return sorted(out)


class Outside:
    """A file outside every state directory, as a planted symlink's target."""

    def __init__(self, path) -> None:
        self.path = path
        path.write_bytes(b"precious\n")
        os.chmod(path, 0o644)
        self.before = self._state()

    def _state(self) -> tuple:
        st = os.stat(self.path)
        return self.path.read_bytes(), st.st_ino, st.st_mtime_ns, stat.S_IMODE(st.st_mode)

    def untouched(self) -> bool:
        return self._state() == self.before


def refused(err, path) -> bool:
    """The Error names ``path`` and says it is a symlink."""
    return str(path) in err.msg and SYMLINK_REFUSED in err.msg


# --- 3. container IDs of any length ------------------------------------------------


@pytest.mark.parametrize("length", [1024, 4097, 5000, 100_000])
def test_long_container_ids_round_trip(hl, data_dir, node_netns, length):
    """Through the executable, both modes: the spec sets no length."""
    cid = ("0123456789abcdef" * (length // 16 + 1))[:length]
    c = conf(data_dir, **SUBNET)
    result = run(hl, "ADD", c, node_netns, cid)
    assert addrs(result) == ["10.91.0.2/24"]
    assert allocated(data_dir) == {"10.91.0.2": cid.encode() + b"\r\neth0"}
    assert run(hl, "CHECK", {**c, "prevResult": result}, node_netns, cid) is None
    assert fails(run, hl, "ADD", c, node_netns, cid).code == 4, "a duplicate"
    assert run(hl, "DEL", c, node_netns, cid) is None
    assert allocated(data_dir) == {}
    assert_index_right(data_dir, NET)
    assert addrs(run(hl, "ADD", c, node_netns, "next")) == ["10.91.0.3/24"]


@pytest.mark.parametrize("length", [4095, 5000, 100_000])
def test_ids_of_any_length_round_trip_in_the_verbs(data_dir, length):
    """The verbs in-process, ADD, CHECK, DEL, with the owner index and with
    a forced scan (Go writes such records too: it has no limit)."""
    cid = ("a1b2c3d4" * (length // 8 + 1))[:length]
    c = HostLocalConf.model_validate(conf(data_dir, **SUBNET))
    args = {cmd: CmdArgs(cmd, cid, "/x", "eth0") for cmd in ("ADD", "CHECK", "DEL")}
    hl_plugin = HostLocal()
    for use_index in (True, False):
        result = hl_plugin.add(args["ADD"], c)
        assert [str(ip.address) for ip in result.ips] == ["10.91.0.2/24"]
        assert allocated(data_dir) == {"10.91.0.2": cid.encode() + b"\r\neth0"}
        if not use_index:
            shutil.rmtree(data_dir / NET / INDEX_DIR)
        hl_plugin.check(args["CHECK"], c)
        hl_plugin.delete(args["DEL"], c)
        assert allocated(data_dir) == {}
        assert_index_right(data_dir, NET)
        (data_dir / NET / "last_reserved_ip.0").unlink()  # the next round starts at .2 again


def test_go_records_of_any_length_survive_gc(hl, data_dir, node_netns, go_yardstick):
    go = os.path.join(go_yardstick.dir, "host-local")
    c = conf(data_dir, "1.0.0", **SUBNET)
    ids = {n: ("f00d" * (n // 4 + 1))[:n] for n in (5000, 100_000)}
    for cid in ids.values():
        run(go, "ADD", c, node_netns, cid)
    run(go, "ADD", c, node_netns, "short")
    assert sorted(len(v) for v in allocated(data_dir).values()) == [11, 5006, 100_006]
    c = {**c, "cniVersion": "1.1.0"}
    valid = [{"containerID": cid, "ifname": "eth0"} for cid in ids.values()]
    assert verb(hl, "GC", gc_conf(c, valid), node_netns) is None
    assert sorted(allocated(data_dir).values()) == sorted(
        cid.encode() + b"\r\neth0" for cid in ids.values()), "listed: kept, whole"
    assert verb(hl, "GC", gc_conf(c, []), node_netns) is None
    assert allocated(data_dir) == {}
    assert_index_right(data_dir, NET)


# --- 5. modes whatever the umask ------------------------------------------------------


@pytest.fixture
def umask() -> Iterator:
    """``umask(mask)``: the runtime (this process, whose children the
    plugins are) runs with ``mask`` until the test ends."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o000, 0o077, 0o277], ids=oct)
def test_host_local_modes_whatever_the_umask(hl, tmp_path, node_netns, umask, mask):
    top = tmp_path / "new"       # missing: created with the data dir
    d = top / "ipam"
    c = conf(d, ranges=[[SUBNET], [{"subnet": "fd91::/64"}]])
    umask(mask)
    run(hl, "ADD", c, node_netns, "c1")
    run(hl, "ADD", c, node_netns, "c2")
    assert verb(hl, "STATUS", c, node_netns) is None
    umask(0o022)
    net = d / NET
    want = {".": 0o755, NET: 0o755, f"{NET}/lock": 0o600,
            f"{NET}/last_reserved_ip.0": 0o600, f"{NET}/last_reserved_ip.1": 0o600,
            f"{NET}/10.91.0.2": 0o600, f"{NET}/10.91.0.3": 0o600,
            f"{NET}/fd91::2": 0o600, f"{NET}/fd91::3": 0o600,
            f"{NET}/{INDEX_DIR}": 0o700}
    want.update({f"{NET}/{INDEX_DIR}/{n}": 0o600 for n in os.listdir(net / INDEX_DIR)})
    assert {p: mode(d / p) for p in tree(d)} == want, "no temp file left, each its mode"
    assert mode(top) == 0o755
    # Go's Reserve in the same directory is unaffected by ours (byte-compatible).
    assert (net / "10.91.0.3").read_bytes() == b"c2\r\neth0"


# --- 6. symlinks are refused, never followed -----------------------------------------


@pytest.fixture
def outside(tmp_path) -> Outside:
    return Outside(tmp_path / "outside")


def test_host_local_lock_symlink(hl, data_dir, node_netns, outside, tmp_path):
    c = conf(data_dir, **SUBNET)
    run(hl, "ADD", c, node_netns, "c1")
    lock = data_dir / NET / "lock"
    for target in (outside.path, tmp_path / "nowhere"):   # an existing file, a dangling link
        lock.unlink()
        lock.symlink_to(target)
        for cmd, cfg, code in (("ADD", c, 5), ("DEL", c, 5), ("CHECK", c, 5),
                               ("GC", gc_conf(c, []), 5), ("STATUS", c, 50)):
            if cmd in ("GC", "STATUS"):
                err = fails(verb, hl, cmd, cfg, node_netns)
            else:
                err = fails(run, hl, cmd, cfg, node_netns, "c2" if cmd == "ADD" else "c1")
            assert err.code == code, (cmd, err)
            assert refused(err, lock), (cmd, err.msg)
        assert outside.untouched()
        assert not (tmp_path / "nowhere").exists(), "O_CREAT never goes through the link"
    assert allocated(data_dir) == {"10.91.0.2": b"c1\r\neth0"}


def test_host_local_network_dir_symlink(hl, data_dir, node_netns, tmp_path):
    c = conf(data_dir, **SUBNET)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data_dir.mkdir()
    (data_dir / NET).symlink_to(elsewhere)
    for cmd in ("ADD", "DEL", "CHECK", "GC"):
        if cmd == "GC":
            err = fails(verb, hl, cmd, gc_conf(c, []), node_netns)
        else:
            err = fails(run, hl, cmd, c, node_netns)
        assert err.code == 5, (cmd, err)
        assert refused(err, data_dir / NET), (cmd, err.msg)
    err = fails(verb, hl, "STATUS", c, node_netns)
    assert err.code == 50 and refused(err, data_dir / NET)
    assert os.listdir(elsewhere) == [], "nothing written through the link"


def test_host_local_address_file_symlink(hl, data_dir, node_netns, outside):
    c = conf(data_dir, **SUBNET)
    run(hl, "ADD", c, node_netns, "c1")                    # 10.91.0.2
    planted = data_dir / NET / "10.91.0.3"
    planted.symlink_to(outside.path)
    err = fails(run, hl, "ADD", c, node_netns, "c2")       # the walk reaches .3
    assert err.code == 5 and refused(err, planted), err.msg
    req = conf(data_dir, **SUBNET, top={"runtimeConfig": {"ips": ["10.91.0.3"]}})
    err = fails(run, hl, "ADD", req, node_netns, "c3")     # asked for by the runtime
    assert err.code == 5 and refused(err, planted), err.msg
    err = fails(verb, hl, "GC", gc_conf(c, [{"containerID": "c1", "ifname": "eth0"}]),
                node_netns)
    assert err.code == 5 and str(planted) in err.details and SYMLINK_REFUSED in err.details
    assert run(hl, "DEL", c, node_netns, "c1") is None      # not c1's: DEL goes on
    assert set(allocated(data_dir)) == {"10.91.0.3"}
    assert planted.is_symlink() and outside.untouched()


def test_host_local_last_reserved_symlink(hl, data_dir, node_netns, outside):
    c = conf(data_dir, **SUBNET)
    run(hl, "ADD", c, node_netns, "c1")
    last = data_dir / NET / "last_reserved_ip.0"
    last.unlink()
    last.symlink_to(outside.path)
    err = fails(run, hl, "ADD", c, node_netns, "c2")
    assert err.code == 5 and refused(err, last), err.msg
    assert allocated(data_dir) == {"10.91.0.2": b"c1\r\neth0"}, "nothing allocated"
    assert last.is_symlink() and outside.untouched()
    assert run(hl, "DEL", c, node_netns, "c1") is None      # DEL does not read it


# --- tuning ------------------------------------------------------------------------


@pytest.fixture
def tuning(cni_bin) -> str:
    # Link settings only: no sysctl, so the node's allowlist is never read.
    return os.path.join(cni_bin, "tuning")


class Pod:
    def __init__(self, node: TestNetNS, pod: TestNetNS, data_dir) -> None:
        self.node, self.pod, self.data_dir = node, pod, data_dir
        self.saved = data_dir / f"{CID}_eth0.json"

    def conf(self, **keys) -> dict:
        prev = {"cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:0a",
                                "sandbox": self.pod.path}],
                "ips": [{"address": "10.92.0.5/24", "interface": 0}]}
        return {"cniVersion": "1.1.0", "name": TUNING_NET, "type": "tuning",
                "dataDir": str(self.data_dir), "prevResult": prev, **keys}

    def run(self, exe: str, cmd: str, c: dict):
        if cmd == "GC":
            return run_plugin(exe, cmd, c, container_id="", netns="", ifname="", node=self.node)
        return run_plugin(exe, cmd, c, container_id=CID, netns=self.pod.path, ifname="eth0",
                          node=self.node)

    def fails(self, exe: str, cmd: str, c: dict):
        with pytest.raises(Exception) as ei:
            self.run(exe, cmd, c)
        return ei.value

    def mtu(self) -> int:
        with NetNS.open(self.pod.path) as n, n.iproute() as ipr:
            return ipr.link("get", ifname="eth0")[0].get("IFLA_MTU")


@pytest.fixture
def pod(node_netns, pod_netns, tmp_path) -> Pod:
    with NetNS.open(node_netns.path) as n, NetNS.open(pod_netns.path) as p, \
            n.iproute() as ipr:
        netlink.create_veth_pair(ipr, "vh0", "eth0", p, peer_mac="02:00:00:00:00:0a")
    return Pod(node_netns, pod_netns, tmp_path / "new" / "tuning")


@pytest.mark.parametrize("mask", [0o000, 0o077], ids=oct)
def test_tuning_modes_whatever_the_umask(tuning, pod, umask, mask):
    umask(mask)
    pod.run(tuning, "ADD", pod.conf(mtu=1400))
    umask(0o022)
    assert pod.mtu() == 1400
    assert {p: mode(pod.data_dir / p) for p in tree(pod.data_dir)} == {
        ".": 0o700, pod.saved.name: 0o600}, "no temp file left"
    assert mode(pod.data_dir.parent) == 0o700, "a parent we made too"
    pod.run(tuning, "DEL", pod.conf(mtu=1400))
    assert pod.mtu() == 1500 and not pod.saved.exists()


@pytest.mark.parametrize("length", [234, 5000, 100_000])
def test_tuning_long_container_ids_round_trip(tuning, pod, length):
    """A name over NAME_MAX is hashed: ADD saves, DEL restores, GC keeps it
    while valid and removes it when not; nothing is left."""
    cid = ("c0ffee" * (length // 6 + 1))[:length]
    c = pod.conf(mtu=1400)
    kw = dict(netns=pod.pod.path, ifname="eth0", node=pod.node)
    run_plugin(tuning, "ADD", c, container_id=cid, **kw)
    assert pod.mtu() == 1400
    (saved,) = os.listdir(pod.data_dir)
    assert len(saved.encode()) <= 255 and (length > 240) == saved.startswith("_")
    valid = {**c, "cni.dev/valid-attachments": [{"containerID": cid, "ifname": "eth0"}]}
    pod.run(tuning, "GC", valid)
    assert os.listdir(pod.data_dir) == [saved], "kept while valid"
    run_plugin(tuning, "DEL", c, container_id=cid, **kw)
    assert pod.mtu() == 1500 and os.listdir(pod.data_dir) == []
    run_plugin(tuning, "ADD", c, container_id=cid, **kw)
    pod.run(tuning, "GC", {**c, "cni.dev/valid-attachments": []})
    assert os.listdir(pod.data_dir) == [], "collected when not valid"


def test_tuning_saved_file_symlink(tuning, pod, outside):
    c = pod.conf(mtu=1400)
    pod.data_dir.mkdir(parents=True)
    pod.saved.symlink_to(outside.path)
    for cmd, cfg in (("ADD", c), ("DEL", c),
                     ("GC", {**c, "cni.dev/valid-attachments": []})):
        err = pod.fails(tuning, cmd, cfg)
        assert getattr(err, "code", None) == 5, (cmd, err)
        assert str(pod.saved) in err.msg + err.details and SYMLINK_REFUSED in \
            err.msg + err.details, (cmd, err.msg)
        assert pod.mtu() == 1500, "nothing applied"
    assert pod.saved.is_symlink() and outside.untouched()


# --- 7. temp files of killed writers ------------------------------------------------------

KILLED_WRITER = """
import os, sys
from cni_skel.state import StateDir
def killed(*a, **k):
    os._exit(137)   # SIGKILL between the temp file's write and its rename
os.replace = killed
with StateDir.open(sys.argv[1]) as d:
    d.write(sys.argv[2], b"half")
"""


def killed_writer(directory, name: str) -> str:
    """Run a writer that dies in the middle of an atomic write of ``name``
    in ``directory``; returns the temp file it left."""
    before = set(os.listdir(directory))
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(directory), name],
                          capture_output=True, check=False)
    assert proc.returncode == 137, proc.stderr
    (left,) = set(os.listdir(directory)) - before
    assert left.startswith(TEMP_PREFIX)
    return left


class LiveWriter:
    """A temp file whose writer is alive (holds its flock)."""

    def __init__(self, directory) -> None:
        self.path = directory / f"{TEMP_PREFIX}0123456789ab"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def close(self) -> None:
        os.close(self.fd)


def test_host_local_gc_removes_killed_writers_temp_files(hl, data_dir, node_netns):
    c = conf(data_dir, **SUBNET)
    run(hl, "ADD", c, node_netns, "c1")
    net = data_dir / NET
    stale = killed_writer(net, "10.91.0.9")
    assert verb(hl, "GC", gc_conf(c, [{"containerID": "c1", "ifname": "eth0"}]),
                node_netns) is None
    assert not (net / stale).exists()
    assert allocated(data_dir) == {"10.91.0.2": b"c1\r\neth0"}
    assert not [n for n in os.listdir(net) if n.startswith(TEMP_PREFIX)]


def test_tuning_gc_removes_killed_writers_temp_files(tuning, pod):
    pod.run(tuning, "ADD", pod.conf(mtu=1400))
    stale = killed_writer(pod.data_dir, pod.saved.name)
    live = LiveWriter(pod.data_dir)
    try:
        gc = {**pod.conf(), "cni.dev/valid-attachments": [{"containerID": CID,
                                                            "ifname": "eth0"}]}
        assert pod.run(tuning, "GC", gc) is None
        assert sorted(os.listdir(pod.data_dir)) == sorted([live.path.name, pod.saved.name]), \
            "the killed writer's file is gone, a live writer's stays"
        assert json.loads(pod.saved.read_bytes())["mtu"] == 1500
    finally:
        live.close()
    assert pod.run(tuning, "GC", gc) is None
    assert os.listdir(pod.data_dir) == [pod.saved.name], "its writer is gone now"
    assert stale not in os.listdir(pod.data_dir)


# --- the helpers themselves (in-process) --------------------------------------------------


def test_state_dir_reads_whole_files_and_refuses_links(tmp_path):
    big = os.urandom(3 << 20)
    atomic_write(str(tmp_path / "big"), big)
    (tmp_path / "link").symlink_to(tmp_path / "big")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sublink").symlink_to(tmp_path / "sub")
    with StateDir.open(str(tmp_path)) as d:
        assert d.read("big") == big
        for op in (lambda: d.read("link"), lambda: d.exists("link"),
                   lambda: d.subdir("sublink"), lambda: d.lock("link").acquire()):
            with pytest.raises(OSError) as ei:
                op()
            assert ei.value.strerror == SYMLINK_REFUSED
            assert ei.value.filename == str(tmp_path / "link") or \
                ei.value.filename == str(tmp_path / "sublink")
        with pytest.raises(OSError, match="not a regular file"):
            d.read("sub")
        d.write("link", b"new")            # replaces the link itself
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "big").read_bytes() == big


def test_file_lock_refuses_a_symlink_by_path(tmp_path):
    (tmp_path / "lock").symlink_to(tmp_path / "absent")
    with pytest.raises(OSError) as ei, FileLock(str(tmp_path / "lock")):
        pass
    assert ei.value.strerror == SYMLINK_REFUSED
    assert not (tmp_path / "absent").exists()
