"""Group commit of link deletions: concurrent DELs share one kernel wait.

Deleting a link makes the kernel wait for RCU grace periods under the RTNL
lock (``unregister_netdevice_many``), ~10-20 ms on a quiet node, and
concurrent deletions queue for it: eight DELs at once take about as long as
eight one after the other. One RTM_DELLINK naming a link group (IFLA_GROUP)
deletes every link of that group in the namespace with one such wait.

So deletions in a namespace run as a database commits its log
(leader/follower): a deleter puts its link into the batch that is open
(its group, read and set under a short lock) and then waits for the commit
lock. The first to hold it closes the batch (a fresh group for the next
one) and deletes the whole group in one request; the others find their
link gone when they get the lock and return. A lone deletion goes at once:
two uncontended file locks and one RTM_SETLINK more than before. DELs that
arrive while a batch is being deleted form the next batch: the leader's
process lets the commit lock go once its own link is out of the namespace
(`unlisted`, called by `cni_skel.netlink`'s wait for the link's
RTM_DELLINK notice, ~1 ms in), while the request still waits for the
kernel's RCU barrier.

Safety (the link groups are ours alone):

- a group is a random number in ``GROUPS`` (2^30 values, far from the
  small numbers ``ip link set group`` users pick); a link enters one only
  on behalf of the deletion that names it, so a batch deletes only links
  some deletion named;
- a deleter killed after marking its link leaves it in a closed group
  (deleted with its batch, or left for the runtime's retried DEL, which
  marks it anew); the locks are ``flock`` locks, gone with their holder;
- when the group request fails (EOPNOTSUPP: a link of the group whose kind
  can not be deleted, an old kernel), each deleter deletes its own link.

The two lock files of a namespace (``LOCK_DIR/<netns inode>.open`` and
``.commit``) live on tmpfs; a namespace inode is reused by the kernel, so
they do not pile up. Where they can not be opened, `delete` answers None
and the caller deletes the link alone.

Internal (``cni_skel.netlink.delete_link`` uses it for the links of the
namespace its process runs in: the node's host ends of veth pairs, ifbs);
not part of the public API.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
from collections.abc import Iterator

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_SETLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from cni_skel.rtnl import SIOCGSKNS, PartialIfinfmsg, Rtnl, link_marshal

__all__ = ["GROUPS", "LOCK_DIR", "alone", "delete", "take_stats", "unlisted"]

#: Where the namespaces' lock files live (the worker's socket directory).
LOCK_DIR = "/run/cni-skel/link-batches"
#: The link groups batches use: ``range(GROUPS[0], GROUPS[1])``.
GROUPS = (0x40000000, 0x80000000)
_REQ = NLM_F_REQUEST | NLM_F_ACK
# The .open file: the open batch's group, and how many links joined it.
_OPEN = struct.Struct("=II")


class _ifinfmsg_group(PartialIfinfmsg):
    """A link's index and IFLA_GROUP, nothing else decoded."""

    _KEEP = ("IFLA_GROUP",)


_GROUP_OF = link_marshal(_ifinfmsg_group)
# The batches this process leads, by the leader's own link: its commit
# lock's fd, until `unlisted` lets it go or the request ends.
_leading: dict[int, int] = {}
_leading_lock = threading.Lock()


def _fresh_group() -> int:
    return GROUPS[0] + int.from_bytes(os.urandom(4), "little") % (GROUPS[1] - GROUPS[0])


def _ours(group: int | None) -> bool:
    return group is not None and GROUPS[0] <= group < GROUPS[1]


def _lock_file(inode: int, suffix: str) -> int:
    """An fd of the lock file ``suffix`` (".open", ".commit") of the
    namespace with ``inode``, made if missing. Raises OSError."""
    os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
    return os.open(os.path.join(LOCK_DIR, f"{inode}{suffix}"),
                   os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


class _Locks:
    """The two lock files of one namespace, opened for one deletion."""

    def __init__(self, inode: int) -> None:
        self.open = _lock_file(inode, ".open")
        try:
            self.commit = _lock_file(inode, ".commit")
        except OSError:
            os.close(self.open)
            raise

    def close(self) -> None:
        os.close(self.open)  # releases any flock of this deletion's
        os.close(self.commit)

    def _read(self) -> tuple[int | None, int]:
        data = os.pread(self.open, _OPEN.size, 0)
        group, joined = _OPEN.unpack(data) if len(data) == _OPEN.size else (None, 0)
        return (group, joined) if _ours(group) else (None, 0)

    def join(self) -> int:
        """The open batch's group, counting one more link in it (holding
        ``open``'s lock); a fresh group when there is none."""
        group, joined = self._read()
        if group is None:
            group, joined = _fresh_group(), 0
        os.pwrite(self.open, _OPEN.pack(group, joined + 1), 0)
        return group

    def close_batch(self, group: int) -> int:
        """Close batch ``group`` when it is still the open one (holding
        ``open``'s lock): the next joiner gets a fresh group. How many
        links joined it (0 when it was not the open one)."""
        now, joined = self._read()
        if now != group:
            return 0
        os.pwrite(self.open, _OPEN.pack(_fresh_group(), 0), 0)
        return joined


def _link_group(sock: Rtnl, index: int) -> int | None:
    """The link's IFLA_GROUP; None when there is no link ``index``."""
    msg = ifinfmsg()
    msg["index"] = index
    try:
        [link] = sock.request(msg, RTM_GETLINK, NLM_F_REQUEST, marshal=_GROUP_OF)
    except NetlinkError as e:
        if e.code == errno.ENODEV:
            return None
        raise
    return link.get_attr("IFLA_GROUP") or 0


def _set_group(sock: Rtnl, index: int, group: int) -> None:
    msg = ifinfmsg()
    msg["index"] = index
    msg["attrs"].append(["IFLA_GROUP", group])
    sock.request(msg, RTM_SETLINK, _REQ)


def _delete_group(sock: Rtnl, group: int, index: int, commit: int) -> int:
    """Delete every link of ``group`` in one RTM_DELLINK; the kernel does
    the whole deletion inside the request (its RCU barrier, ~15-30 ms,
    after it lets RTNL go). The ``commit`` lock goes as soon as the caller
    sees link ``index`` out of the namespace (`unlisted`), else when the
    request ends. 0, or the errno of the request's refusal."""
    with _leading_lock:
        _leading[index] = commit
    try:
        msg = ifinfmsg()
        msg["attrs"].append(["IFLA_GROUP", group])
        sock.request(msg, RTM_DELLINK, _REQ)
    except NetlinkError as e:
        return e.code or errno.EIO
    finally:
        with _leading_lock:
            _leading.pop(index, None)
    return 0


def unlisted(index: int) -> None:
    """Link ``index`` of this process's namespace is out of it (its
    RTM_DELLINK notice was seen): when this process leads the batch that
    deletes it, the namespace's next batch may go now (its commit lock is
    let go) while this one's request waits on for the kernel. Safe from
    any thread; nothing when no such batch is in flight."""
    with _leading_lock:
        commit = _leading.pop(index, None)
        if commit is not None:
            fcntl.flock(commit, fcntl.LOCK_UN)


# What this process's batches were since `take_stats`: (links, refused);
# recorded by deleting threads, taken by the process's main one.
_stats: list[tuple[int, bool]] = []
_stats_lock = threading.Lock()


def _record(links: int, refused: bool) -> None:
    with _stats_lock:
        _stats.append((links, refused))
        del _stats[:-1024]  # a process nobody asks keeps the last ones only


def take_stats() -> list[tuple[int, bool]]:
    """The batches this process led since the last call, oldest first: per
    batch, how many links its one request deleted (the links that joined
    it; 0 when the kernel refused it) and whether it was refused (each
    deleter then deleted its own). The worker's serving processes report
    them for the metrics."""
    with _stats_lock:
        out = list(_stats)
        _stats.clear()
    return out


def _delete_index(sock: Rtnl, index: int) -> bool:
    msg = ifinfmsg()
    msg["index"] = index
    try:
        sock.request(msg, RTM_DELLINK, _REQ)
    except NetlinkError as e:
        if e.code == errno.ENODEV:
            return False
        raise
    return True


@contextlib.contextmanager
def alone(sock: Rtnl) -> Iterator[bool]:
    """Is no deletion batch in flight in ``sock``'s namespace? While the
    block runs (True) this caller holds the namespace's commit lock, so
    deletions arriving meanwhile batch behind it: a lone DEL deletes its
    link its own cheapest way (a pod's veth by the pod's end: one request,
    no marking) and lets go once that deletion has answered. False: join
    the batch (`delete`); also when the lock files can not be had."""
    try:
        ns = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    except OSError:
        yield False
        return
    try:
        commit = _lock_file(os.fstat(ns).st_ino, ".commit")
    except OSError:
        yield False
        return
    finally:
        os.close(ns)
    try:
        try:
            fcntl.flock(commit, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(commit)


def delete(sock: Rtnl, index: int) -> bool | None:
    """Delete link ``index`` of ``sock``'s namespace together with the
    deletions running concurrently there (any process, this SDK's). The
    calling thread must be in that namespace (its lock files are keyed by
    ``/proc/thread-self/ns/net``).

    Returns:
        True once the link is gone (deleted by this call's batch, or by the
        batch before it); False when there was no such link; None when the
        lock files can not be had: nothing was done, delete it alone.

    Raises:
        NetlinkError: the kernel refused the deletion of this link alone
            (EOPNOTSUPP for ``lo``) or its marking (other than ENODEV).
    """
    try:
        locks = _Locks(os.stat("/proc/thread-self/ns/net").st_ino)
    except OSError:
        return None
    try:
        fcntl.flock(locks.open, fcntl.LOCK_EX)
        try:
            group = locks.join()
            try:
                _set_group(sock, index, group)
            except NetlinkError as e:
                if e.code == errno.ENODEV:
                    return False
                raise
        finally:
            fcntl.flock(locks.open, fcntl.LOCK_UN)
        try:
            fcntl.flock(locks.commit, fcntl.LOCK_EX | fcntl.LOCK_NB)
            now: int | None = group  # nothing ran since the mark: ours is there
        except BlockingIOError:
            fcntl.flock(locks.commit, fcntl.LOCK_EX)  # the batch before ours ends first
            now = _link_group(sock, index)
        if now is None or not _ours(now):
            # gone with the batch before (a link at this index again: not ours)
            return True
        # Leader: close the batch, delete it whole.
        fcntl.flock(locks.open, fcntl.LOCK_EX)
        try:
            joined = locks.close_batch(now)
        finally:
            fcntl.flock(locks.open, fcntl.LOCK_UN)
        err = _delete_group(sock, now, index, locks.commit)
        _record(0 if err else max(joined, 1), err != 0)
        if err:
            # one request per link from here on: each deleter its own
            _delete_index(sock, index)
        return True
    finally:
        locks.close()
