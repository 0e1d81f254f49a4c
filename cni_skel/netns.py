"""Network namespace handles: open, validate, enter (per thread), bind netlink to.

The Go SDK's ``pkg/ns`` equivalent. A :class:`NetNS` keeps an open file
descriptor on a namespace file (a bind mount under ``/var/run/netns``, or
``/proc/<pid>/ns/net``), so the namespace stays valid for as long as the handle
is open even if its mount is removed meanwhile.

Namespace switching is per *thread* (``setns(2)`` changes the calling thread
only): :meth:`NetNS.enter` moves the current thread in and always moves it back.
Code that runs in another thread while the block is active is not affected.

``ctypes`` stands in for ``os.setns`` on Pythons before 3.12.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pyroute2 import IPRoute

from cni_skel.env import handed_netns_fd
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETNS,
    ERR_UNKNOWN_CONTAINER,
    CNIError,
)
from cni_skel.rtnl import Rtnl

T = TypeVar("T")

__all__ = [
    "CLONE_NEWNET",
    "NS_GET_NSTYPE",
    "NetNS",
    "NetNSNotFound",
    "current_netns",
    "open_netns",
    "thread_netns_path",
]

#: ``setns(2)`` / ``unshare(2)`` flag selecting the network namespace type.
CLONE_NEWNET = 0x40000000
#: ``ioctl(2)`` on an nsfs file returning its CLONE_NEW* type (Linux 4.11+).
NS_GET_NSTYPE = 0xB703

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_PROCESS_NS = "/proc/self/ns/net"
_THREAD_SELF_NS = "/proc/thread-self/ns/net"
# Netlink socket buffer sizes, as pyroute2 sets them on sockets it creates.
_NL_BUFSIZE = 1 << 20


class NetNSNotFound(CNIError):
    """The namespace path does not exist (CNI code 3, unknown container).

    DEL treats this as "already gone" (see :func:`open_netns` ``missing_ok``).
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            ERR_UNKNOWN_CONTAINER,
            f'failed to open netns "{path}": no such file or directory',
        )
        self.path = path


_have_thread_self: bool | None = None


def thread_netns_path() -> str:
    """Path naming the calling thread's network namespace.

    ``/proc/thread-self/ns/net`` (Linux 3.17+), else the ``/proc/self/task``
    form. Note that this path resolves per thread and per call.
    """
    global _have_thread_self
    if _have_thread_self is None:
        _have_thread_self = os.path.exists(_THREAD_SELF_NS)
    if _have_thread_self:
        return _THREAD_SELF_NS
    return f"/proc/self/task/{threading.get_native_id()}/ns/net"


# --------------------------------------------------------------------------
# setns(2), unshare(2)

_libc_calls: dict[str, Any] = {}  # ctypes functions, loaded on first use (Python < 3.12)

#: ``unshare(2)`` flag: the calling thread's own root, cwd and umask.
CLONE_FS = 0x00000200


def _libc_int_call(name: str, *args: int) -> None:
    """Call libc's ``name(int, ...)``; raises OSError for -1."""
    func = _libc_calls.get(name)
    if func is None:
        try:
            func = getattr(ctypes.CDLL(None, use_errno=True), name)
        except (OSError, AttributeError):
            func = getattr(ctypes.CDLL("libc.so.6", use_errno=True), name)
        func.argtypes = (ctypes.c_int,) * len(args)
        func.restype = ctypes.c_int
        _libc_calls[name] = func
    if func(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def setns(fd: int, nstype: int) -> None:
    """``setns(fd, nstype)`` for the calling thread; raises OSError."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, nstype)
        return
    _libc_int_call("setns", fd, nstype)


def unshare(flags: int) -> None:
    """``unshare(flags)`` for the calling thread; raises OSError."""
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    _libc_int_call("unshare", flags)


# --------------------------------------------------------------------------


class NetNS:
    """An open handle on a network namespace file.

    Build with :meth:`NetNS.open` (or :func:`open_netns`, :func:`current_netns`).
    Holds one file descriptor (``O_RDONLY | O_CLOEXEC``) until :meth:`close`;
    usable as a context manager that closes it.

    Attributes:
        path: the path it was opened from (as given).
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: str, fd: int) -> None:
        """Wrap an already validated fd; prefer :meth:`open`."""
        self.path = path
        self._fd: int | None = fd

    # -- construction -------------------------------------------------------

    @classmethod
    def open(cls, path: str) -> NetNS:
        """Open and validate a network namespace file.

        A path a launcher handed over as an fd (`cni_skel.env.hand_over_netns`)
        is opened from that fd.

        Raises:
            NetNSNotFound: (code 3) the path does not exist (also for "").
            CNIError: code 8 (invalid netns) when the path exists but is not a
                network namespace: not an nsfs file (regular file, directory,
                device, mount of something else) or a namespace of another type
                (mnt, pid, ...); also when it can not be opened (EACCES, ...).
        """
        path = os.fspath(path)
        handed = handed_netns_fd(path)
        try:
            if handed is not None:  # a launcher passed it: the path may not resolve here
                fd = fcntl.fcntl(handed, fcntl.F_DUPFD_CLOEXEC, 3)
            else:
                fd = cls._open_path(path)
        except FileNotFoundError:
            raise NetNSNotFound(path) from None
        except OSError as e:
            raise CNIError(
                ERR_INVALID_NETNS,
                f'failed to open netns "{path}": {_strerror(e)}',
            ) from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _not_netns(path)
            try:
                nstype = fcntl.ioctl(fd, NS_GET_NSTYPE)
            except OSError as e:
                if e.errno in (errno.ENOTTY, errno.EINVAL):
                    raise _not_netns(path) from None
                raise CNIError(
                    ERR_INVALID_NETNS,
                    f'failed to inspect netns "{path}": {_strerror(e)}',
                ) from e
            if nstype != CLONE_NEWNET:
                raise _not_netns(path)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @staticmethod
    def _open_path(path: str) -> int:
        """An fd on ``path`` when it is a regular file (nsfs inodes are):
        FIFOs, devices and directories are never opened (or ioctl'd).
        Raises OSError, or CNIError (code 8) for another kind of file."""
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise _not_netns(path)
        return os.open(path, _OPEN_FLAGS)

    # -- basic handle -------------------------------------------------------

    @property
    def fd(self) -> int:
        """The open namespace fd (for IFLA_NET_NS_FD, setns...).

        Raises ValueError once closed.
        """
        if self._fd is None:
            raise ValueError(f"NetNS {self.path!r} is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        """Close the fd; idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> NetNS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd is None else f"fd={self._fd}"
        return f"NetNS({self.path!r}, {state})"

    def identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the namespace: equal iff same namespace."""
        st = os.fstat(self.fd)
        return (st.st_dev, st.st_ino)

    def same_as(self, other: NetNS) -> bool:
        """True when both handles refer to the same namespace."""
        return self.identity() == other.identity()

    def same_as_current(self, *, thread: bool = True) -> bool:
        """Is this the namespace the caller is in?

        With ``thread=True`` (default; what Go's ``ns.GetCurrentNS`` compares
        against) the calling thread's namespace is used, so inside
        :meth:`enter` this is True. ``thread=False`` compares with the
        process's (main thread's) ``/proc/self/ns/net``.
        """
        st = os.stat(thread_netns_path() if thread else _PROCESS_NS)
        return self.identity() == (st.st_dev, st.st_ino)

    # -- switching ----------------------------------------------------------

    @contextlib.contextmanager
    def enter(self) -> Iterator[NetNS]:
        """Move the *current thread* into this namespace for the ``with`` block.

        The thread's original namespace is saved (opened) first and always
        restored on exit, exception or not. Nestable, and entering the
        namespace the thread is already in is fine. Other threads are not
        moved, but threads *started* inside the block begin in this namespace
        (clone(2) copies the creating thread's namespaces).

        Raises:
            CNIError: code 999 when setns fails (e.g. EPERM without
                CAP_SYS_ADMIN), or, very unlikely, when switching back fails
                (the thread is then left in this namespace).
            ValueError: the handle is closed.
        """
        target = self.fd
        try:
            orig = os.open(thread_netns_path(), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise CNIError(
                ERR_INTERNAL, f"failed to open current netns: {_strerror(e)}"
            ) from e
        try:
            try:
                setns(target, CLONE_NEWNET)
            except OSError as e:
                raise CNIError(
                    ERR_INTERNAL,
                    f'failed to enter netns "{self.path}": {_strerror(e)}',
                ) from e
            try:
                yield self
            finally:
                try:
                    setns(orig, CLONE_NEWNET)
                except OSError as e:
                    raise CNIError(
                        ERR_INTERNAL,
                        f'failed to switch back from netns "{self.path}": '
                        f"{_strerror(e)}",
                    ) from e
        finally:
            os.close(orig)

    def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` inside the namespace; return its value.

        The Go SDK's ``ns.Do``. Exceptions from ``fn`` propagate (after the
        thread has been switched back); errors are as for :meth:`enter`.
        """
        with self.enter():
            return fn(*args, **kwargs)

    def rtnl(self) -> Rtnl:
        """A synchronous rtnetlink socket (`cni_skel.rtnl.Rtnl`) living in
        this namespace: what `cni_skel.netlink` helpers run on fastest (about
        half the CPU of an ``IPRoute`` per request, and ~20 us to open
        instead of ~0.5 ms). The caller closes it (context manager).

        Created while inside :meth:`enter`, so it stays bound to this
        namespace whichever thread uses it later (one request at a time);
        no helper process. For pyroute2's own API (``ipr.link(...)``,
        ``get_links()``...) use :meth:`iproute`.

        Raises:
            CNIError: as :meth:`enter`; code 999 when the socket can not be
                created.
        """
        with self.enter():
            try:
                return Rtnl()
            except OSError as e:
                raise CNIError(
                    ERR_INTERNAL,
                    f'failed to open netlink socket in netns "{self.path}": {_strerror(e)}',
                ) from e

    def iproute(self) -> IPRoute:
        """A pyroute2 ``IPRoute`` whose netlink socket lives in this namespace.

        A netlink socket belongs to the namespace it was created in, so the
        rtnetlink socket is created while inside :meth:`enter` and handed to
        ``IPRoute(use_socket=...)``; no helper process is forked (unlike
        ``IPRoute(netns=...)``). The caller closes it (context manager).

        Use it from the creating thread only: pyroute2 0.9 keeps one socket
        per thread, and with ``use_socket`` a call from another thread raises
        RuntimeError instead of silently opening a socket in that thread's
        namespace. Requests pyroute2 services in-process (tun/tap creation)
        act in the calling thread's namespace, not the socket's: wrap those in
        :meth:`enter` as well.

        Raises:
            CNIError: as :meth:`enter`; code 999 when the socket can not be
                created.
        """
        with self.enter():
            try:
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)  # NETLINK_ROUTE
            except OSError as e:
                raise CNIError(
                    ERR_INTERNAL,
                    f'failed to open netlink socket in netns "{self.path}": {_strerror(e)}',
                ) from e
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _NL_BUFSIZE)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _NL_BUFSIZE)
            return IPRoute(use_socket=sock)
        except BaseException:
            sock.close()
            raise


def _strerror(e: OSError) -> str:
    """Lower-case strerror, as Go formats syscall errors."""
    msg = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
    return msg[:1].lower() + msg[1:]


def _not_netns(path: str) -> CNIError:
    return CNIError(ERR_INVALID_NETNS, f'path "{path}" is not a network namespace')


def open_netns(path: str, *, missing_ok: bool = False) -> NetNS | None:
    """Open ``path`` as a network namespace (see :meth:`NetNS.open`).

    With ``missing_ok`` an empty or non-existent path returns None instead of
    raising :class:`NetNSNotFound` (the DEL rule: a missing netns is done).
    Any other problem (not a namespace, code 8) still raises.
    """
    if missing_ok and not path:
        return None
    try:
        return NetNS.open(path)
    except NetNSNotFound:
        if missing_ok:
            return None
        raise


def current_netns() -> NetNS:
    """A handle on the calling thread's namespace (``/proc/thread-self/ns/net``).

    The fd pins the namespace the thread was in at call time; ``.path`` is the
    per-thread proc path and resolves differently elsewhere.
    """
    return NetNS.open(thread_netns_path())
