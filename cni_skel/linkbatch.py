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
arrive while a batch is being deleted form the next batch.

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
import select
import socket
import struct
import threading
from collections.abc import Iterator

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_SETLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from cni_skel.rtnl import RTMGRP_LINK, SIOCGSKNS, PartialIfinfmsg, Rtnl, link_marshal

__all__ = ["GROUPS", "LOCK_DIR", "alone", "delete", "take_stats"]

#: Where the namespaces' lock files live (the worker's socket directory).
LOCK_DIR = "/run/cni-skel/link-batches"
#: The link groups batches use: ``range(GROUPS[0], GROUPS[1])``.
GROUPS = (0x40000000, 0x80000000)
_REQ = NLM_F_REQUEST | NLM_F_ACK
_GROUP = struct.Struct("=I")


class _ifinfmsg_group(PartialIfinfmsg):
    """A deletion notice's index and IFLA_GROUP, nothing else decoded."""

    _KEEP = ("IFLA_GROUP",)


_NOTICES = link_marshal(_ifinfmsg_group, RTM_DELLINK)
_GROUP_OF = link_marshal(_ifinfmsg_group)
_ANSWERS = Marshal()


def _fresh_group() -> int:
    return GROUPS[0] + int.from_bytes(os.urandom(4), "little") % (GROUPS[1] - GROUPS[0])


def _ours(group: int | None) -> bool:
    return group is not None and GROUPS[0] <= group < GROUPS[1]


class _Locks:
    """The two lock files of one namespace, opened for one deletion."""

    def __init__(self, inode: int) -> None:
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        base = os.path.join(LOCK_DIR, str(inode))
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self.open = os.open(base + ".open", flags, 0o600)
        try:
            self.commit = os.open(base + ".commit", flags, 0o600)
        except OSError:
            os.close(self.open)
            raise

    def close(self) -> None:
        os.close(self.open)  # releases any flock of this deletion's
        os.close(self.commit)

    def open_group(self, *, renew: bool = False) -> int:
        """The open batch's group (holding ``open``'s lock); with ``renew``
        a fresh one is stored and the old returned."""
        data = os.pread(self.open, _GROUP.size, 0)
        group = _GROUP.unpack(data)[0] if len(data) == _GROUP.size else None
        if renew or not _ours(group):
            fresh = _fresh_group()
            os.pwrite(self.open, _GROUP.pack(fresh), 0)
            if not _ours(group):
                group = fresh
        assert group is not None
        return group


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


def _delete_group(group: int, index: int, commit: int) -> int:
    """Delete every link of ``group`` (one RTM_DELLINK, sent by a thread:
    the kernel does the whole deletion inside the send), letting go of the
    ``commit`` lock once link ``index`` is out of the namespace (its
    RTM_DELLINK notification, ~1 ms in): the next batch's request may go
    then, while this one's RCU barrier (~15-30 ms, outside RTNL) runs on.
    0, or the errno of the request's refusal."""
    answer: dict[str, int] = {}
    done = os.eventfd(0, os.EFD_CLOEXEC)
    watch = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                          socket.NETLINK_ROUTE)

    def send() -> None:
        try:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                               socket.NETLINK_ROUTE) as req:
                msg = ifinfmsg()
                msg["header"]["type"] = RTM_DELLINK
                msg["header"]["flags"] = _REQ
                msg["header"]["sequence_number"] = 1
                msg["attrs"].append(["IFLA_GROUP", group])
                msg.encode()
                req.send(msg.data)
                answer["errno"] = _acked(req.recv(65536))
        except OSError as e:
            answer["errno"] = e.errno or errno.EIO
        finally:
            os.eventfd_write(done, 1)

    seen: set[int] = set()  # indexes of the group's links deleted, from their notices
    try:
        try:
            watch.bind((0, RTMGRP_LINK))
        except OSError:  # no notifications: the lock waits for the answer
            watch.close()
        sender = threading.Thread(target=send, name="cni-skel delete link group")
        try:
            sender.start()
        except RuntimeError:
            send()
        else:
            while watch.fileno() >= 0 and index not in seen:
                ready, _, _ = select.select([watch, done], [], [])
                if watch in ready:
                    _read_notices(watch, group, seen)
                    if index in seen:
                        fcntl.flock(commit, fcntl.LOCK_UN)
                if done in ready:
                    break
            sender.join()
        err = answer.get("errno", errno.EIO)
        if watch.fileno() >= 0:
            watch.setblocking(False)  # the rest of the batch's notices came before the ACK
            while _read_notices(watch, group, seen):
                pass
        _record(len(seen) if not err else 0, err != 0)
        return err
    finally:
        watch.close()
        os.close(done)


def _read_notices(watch: socket.socket, group: int, seen: set[int]) -> bool:
    """Add to ``seen`` the indexes of the RTM_DELLINK notices of ``group``'s
    links in one datagram of ``watch``; False when none was there (or lost:
    ENOBUFS, the answer decides)."""
    try:
        data = watch.recv(65536)
    except OSError:
        return False
    seen.update(m["index"] for m in _NOTICES.parse(data)
                if m["header"]["type"] == RTM_DELLINK and m.get_attr("IFLA_GROUP") == group)
    return True


# What this process's batches were since `take_stats`: (links, refused)
_stats: list[tuple[int, bool]] = []


def _record(links: int, refused: bool) -> None:
    _stats.append((links, refused))
    del _stats[:-1024]  # a process nobody asks keeps the last ones only


def take_stats() -> list[tuple[int, bool]]:
    """The batches this process led since the last call, oldest first: per
    batch, how many links its one request deleted (counted from the
    kernel's notices; 0 when the kernel refused it) and whether it was
    refused (each deleter then deleted its own). The worker's serving
    processes report them for the metrics."""
    out = list(_stats)
    _stats.clear()
    return out


def _acked(data: bytes) -> int:
    """The errno of the NLMSG_ERROR in ``data`` (0: the ACK)."""
    for m in _ANSWERS.parse(data):
        if m["header"]["type"] == NLMSG_ERROR:
            error = m["header"].get("error")
            return 0 if error is None else getattr(error, "code", None) or errno.EIO
    return errno.EIO


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
        locks = _Locks(os.fstat(ns).st_ino)
    except OSError:
        yield False
        return
    finally:
        os.close(ns)
    try:
        try:
            fcntl.flock(locks.commit, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        locks.close()


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
            group = locks.open_group()
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
            if locks.open_group() == now:
                locks.open_group(renew=True)
        finally:
            fcntl.flock(locks.open, fcntl.LOCK_UN)
        if _delete_group(now, index, locks.commit):
            # one request per link from here on: each deleter its own
            _delete_index(sock, index)
        return True
    finally:
        locks.close()
