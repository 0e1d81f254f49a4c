"""Concurrent link deletions share one kernel request (issue 36).

`cni_skel.netlink.delete_link` of a link in the namespace its process runs
in (a node's host ends of veths) goes through `cni_skel.linkbatch`: the
link joins the open batch (a link group), the first deleter to hold the
commit lock deletes the whole group in one RTM_DELLINK. Deleters here are
processes of their own in a test "node" namespace, as the worker's serving
processes are; the test holds a namespace's commit lock itself to make a
batch form deterministically, and reads the links' groups and the kernel's
notifications to see what was deleted together.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import RTM_DELLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from cni_skel import linkbatch, netlink
from cni_skel.netns import NetNS
from cni_skel.veth import delete_veth

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces)")

# One deleter: enters the node namespace (the process's own from then on),
# deletes the link named on the command line, says what it got.
_DELETER = """
import os, sys
from cni_skel import linkbatch, netlink
from cni_skel.netns import CLONE_NEWNET, setns
from cni_skel.rtnl import Rtnl
fd = os.open(sys.argv[1], os.O_RDONLY)
setns(fd, CLONE_NEWNET)
print("ready", flush=True)
with Rtnl() as ipr:
    deleted = netlink.delete_link(ipr, int(sys.argv[2]))
netlink.wait_deletions()
print(deleted, linkbatch.take_stats(), flush=True)
"""


def _deleter(node, index: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _DELETER, node.path, str(index)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def _finished(proc: subprocess.Popen) -> str:
    """What the deleter's `delete_link` answered ("True", "False")."""
    return _outcome(proc)[0]


def _outcome(proc: subprocess.Popen) -> tuple[str, list]:
    """What the deleter's `delete_link` answered, and the batches it led
    (`linkbatch.take_stats`)."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    answer, stats = out.strip().split(" ", 1)
    return answer, ast.literal_eval(stats)


@contextlib.contextmanager
def _commit_held(node):
    """Hold ``node``'s commit lock (as a batch in flight would)."""
    os.makedirs(linkbatch.LOCK_DIR, mode=0o700, exist_ok=True)
    path = os.path.join(linkbatch.LOCK_DIR, f"{os.stat(node.path).st_ino}.commit")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _groups(ipr, indexes) -> list[int | None]:
    return [linkbatch._link_group(ipr, i) for i in indexes]


def _wait_for(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


def _pairs(ipr, pods, prefix: str = "cnsk-h") -> list[int]:
    """A veth pair per pod: host ends in ``ipr``'s namespace; their indexes."""
    hosts = []
    for i, pod in enumerate(pods):
        with NetNS.open(pod.path) as ns, ns.rtnl() as pipr:
            host, _ = netlink.create_veth_pair(ipr, f"{prefix}{i}", "eth0", peer_netns=ns,
                                               peer_ipr=pipr)
        hosts.append(host.index)
    return hosts


def _deleted_notices(watch: socket.socket) -> set[int]:
    marshal = Marshal()
    marshal.msg_map = {RTM_DELLINK: ifinfmsg}
    got: set[int] = set()
    watch.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            got |= {m["index"] for m in marshal.parse(watch.recv(65536))
                    if m["header"]["type"] == RTM_DELLINK}
    return got


def test_deletions_waiting_on_a_batch_go_as_one(netns_factory):
    """Five deleters arriving while a batch is in flight (the test holds
    the commit lock) all mark their host ends with one group; once the
    lock is free one of them deletes that group and every pod's veth goes,
    the other links of the node untouched (one in a foreign group, one in
    none)."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod") for _ in range(5)]
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr:
        hosts = _pairs(ipr, pods)
        netlink.create_veth_pair(ipr, "cnsk-keep0", "cnsk-keep1")
        keep = netlink.find_link(ipr, "cnsk-keep0").index
        linkbatch._set_group(ipr, keep, 7)  # an operator's group: never ours
        with ns.run(socket.socket, socket.AF_NETLINK, socket.SOCK_RAW,
                    socket.NETLINK_ROUTE) as watch:
            watch.bind((0, 1))
            with _commit_held(node):
                procs = [_deleter(node, h) for h in hosts]
                groups = _wait_for(lambda: (g := _groups(ipr, hosts)) and all(
                    linkbatch._ours(x) for x in g) and g)
                assert len(set(groups)) == 1, groups  # one open batch
                assert all(p.poll() is None for p in procs)  # waiting for the lock
            outcomes = [_outcome(p) for p in procs]
            assert [answer for answer, _ in outcomes] == ["True"] * 5
            # one of them led the batch: one request deleted the five
            assert sorted(stats for _, stats in outcomes) == [[]] * 4 + [[(5, False)]]
            assert _groups(ipr, hosts) == [None] * 5
            assert set(hosts) <= _deleted_notices(watch)
        for pod in pods:
            with NetNS.open(pod.path) as pns, pns.rtnl() as pipr:
                assert netlink.find_link(pipr, "eth0") is None
        assert _groups(ipr, [keep]) == [7]
        assert netlink.find_link(ipr, "cnsk-keep1").index


def test_a_lone_deletion_goes_at_once(netns_factory):
    """With no batch in flight the first deleter leads at once: its link
    is gone when the call answers (no waiting for others)."""
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr:
        (host,) = _pairs(ipr, [pod])
        assert _finished(_deleter(node, host)) == "True"
        assert _groups(ipr, [host]) == [None]
        assert _finished(_deleter(node, host)) == "False"  # DEL again: already gone


def test_a_group_the_kernel_refuses_falls_back_to_one_request_per_link(netns_factory):
    """A batch whose group request fails (here ``lo`` was put into the
    batch's group: the kernel deletes no group holding a link it can not
    delete, EOPNOTSUPP) ends with every deleter deleting its own link;
    ``lo`` stays."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod") for _ in range(3)]
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr:
        hosts = _pairs(ipr, pods)
        lo = netlink.find_link(ipr, "lo").index
        with _commit_held(node):
            procs = [_deleter(node, h) for h in hosts]
            (group,) = _wait_for(lambda: (g := set(_groups(ipr, hosts))) and all(
                linkbatch._ours(x) for x in g) and g)
            linkbatch._set_group(ipr, lo, group)
        outcomes = [_outcome(p) for p in procs]
        assert [answer for answer, _ in outcomes] == ["True"] * 3
        # each found its link still there and asked for the group first
        assert [stats for _, stats in outcomes] == [[(0, True)]] * 3
        assert _groups(ipr, hosts) == [None] * 3
        assert _groups(ipr, [lo]) == [group]


def test_a_deleter_killed_in_a_batch_loses_nothing(netns_factory):
    """A deleter SIGKILLed after marking its link (waiting for the commit
    lock) leaves the link in the open batch: the next deleter's batch takes
    it, and the runtime's retried DEL finds it gone. A leader killed while
    holding the lock gives it up with its life."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr:
        first, second = _pairs(ipr, pods)
        with _commit_held(node):
            killed = _deleter(node, first)
            _wait_for(lambda: linkbatch._ours(_groups(ipr, [first])[0]))
            killed.send_signal(signal.SIGKILL)
            killed.wait(timeout=30)
        assert _finished(_deleter(node, second)) == "True"
        assert _groups(ipr, [first, second]) == [None, None]
        assert _finished(_deleter(node, first)) == "False"


@pytest.mark.parametrize("batch", ["none in flight", "in flight"])
def test_delete_veth_goes_by_the_host_end_only_when_it_is_the_peer(netns_factory, monkeypatch,
                                                                   batch):
    """`veth.delete_veth` deletes a pod's veth in the pod when no batch is
    in flight in the node, else by its host end there (joining the batch);
    either way a pod link whose peer lives in a third namespace is deleted
    in the pod (never a node link of the same index), and a pod without
    the link answers False."""
    if batch == "in flight":
        monkeypatch.setattr(linkbatch, "alone", lambda sock: contextlib.nullcontext(False))
    node, other = netns_factory("cnsk-node"), netns_factory("cnsk-other")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr, \
            NetNS.open(other.path) as ons, ons.rtnl() as oipr, \
            NetNS.open(pods[0].path) as p0, p0.rtnl() as p0ipr, \
            NetNS.open(pods[1].path) as p1, p1.rtnl() as p1ipr:
        (host,) = _pairs(ipr, pods[:1])
        # pod 1's eth0 pairs with a link in "other"; the node has a link at
        # that peer's index too, to tempt a wrong deletion
        oh, _ = netlink.create_veth_pair(oipr, "cnsk-o0", "eth0", peer_netns=p1,
                                         peer_ipr=p1ipr)
        for i in range(64):
            if netlink.find_link(ipr, oh.index) is not None:
                break
            netlink.create_veth_pair(ipr, f"cnsk-d{i}", f"cnsk-e{i}")
        tempt = netlink.find_link(ipr, oh.index)
        assert tempt is not None

        def delete_in_node(peer_ipr):
            return delete_veth(ipr, peer_ipr, "eth0")

        assert ns.run(delete_in_node, p1ipr) is True
        assert netlink.find_link(p1ipr, "eth0") is None
        assert netlink.find_link(oipr, "cnsk-o0") is None
        assert netlink.find_link(ipr, tempt.index).name == tempt.name
        assert ns.run(delete_in_node, p0ipr) is True
        assert netlink.find_link(ipr, host) is None
        assert netlink.find_link(p0ipr, "eth0") is None
        assert ns.run(delete_in_node, p0ipr) is False


def test_a_lone_veth_deletion_holds_off_the_next_ones(netns_factory):
    """While a lone `veth.delete_veth` runs (by the pod's end) it holds the
    node's commit lock: a deleter arriving meanwhile marks its link and
    waits, then leads a batch of its own; both veths go."""
    node = netns_factory("cnsk-node")
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    with NetNS.open(node.path) as ns, ns.rtnl() as ipr, \
            NetNS.open(pods[0].path) as p0, p0.rtnl() as p0ipr:
        first, second = _pairs(ipr, pods)
        with linkbatch.alone(ipr) as alone:
            assert alone
            with linkbatch.alone(ipr) as again:
                assert not again  # the lock is held: a second comes in behind
            waiting = _deleter(node, second)
            _wait_for(lambda: linkbatch._ours(_groups(ipr, [second])[0]))
            assert waiting.poll() is None
            assert netlink.delete_link(p0ipr, "eth0") is True
        assert _outcome(waiting) == ("True", [(1, False)])
        assert _groups(ipr, [first, second]) == [None, None]
