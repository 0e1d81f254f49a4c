"""A synchronous netlink socket on pyroute2's message layer.

pyroute2 0.9's sockets (``IPRoute``, ``Conntrack``, its nf_tables socket)
run every request through an asyncio event loop, which costs more CPU than
the request itself. `NetlinkSocket` keeps what is pyroute2's (message
classes, encoding, the `Marshal` parsers, ``NetlinkError``) and replaces
only the transport: a plain blocking ``AF_NETLINK`` socket this module
owns, one ``send`` per request (or per batch) and ``recv`` until the answer
is complete. `cni_skel.rtnl.Rtnl` is the rtnetlink one; `cni_skel.nft` and
`cni_skel.conntrack` use it for nfnetlink.

A socket belongs to the network namespace of the thread that created it,
for its whole life: create it inside `cni_skel.netns.NetNS.enter` (or use
`cni_skel.netns.NetNS.rtnl`) to act elsewhere. It may be used from any
thread (one request at a time: a lock serialises them). Nothing is cached
here: each socket is the caller's, closed by the caller.

Answers: a request's reply messages (pyroute2 ``nlmsg`` objects, decoded
lazily as pyroute2 does), without the ACK. Failures: the kernel's error
answer raised as pyroute2's ``NetlinkError(errno)`` (what pyroute2's own
sockets raise); a dump the kernel marked inconsistent (NLM_F_DUMP_INTR) as
``NetlinkDumpInterrupted`` once the dump is read to its end; a socket error
(ENOBUFS, no answer within the timeout: ETIMEDOUT) as ``NetlinkError``
too.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
from collections.abc import Container, Sequence
from typing import Any, Self

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_MULTI,
    NLMSG_DONE,
    NLMSG_ERROR,
    nlmsgerr,
)
from pyroute2.netlink.exceptions import NetlinkDumpInterrupted, NetlinkError
from pyroute2.netlink.marshal import Marshal

__all__ = ["DEFAULT_TIMEOUT", "NetlinkSocket", "Request"]

#: Seconds to wait for the kernel's next answer before giving up (ETIMEDOUT).
DEFAULT_TIMEOUT = 30.0
# Socket buffers as pyroute2 sizes them; answers are read as they come.
_BUFSIZE = 1 << 20
# Kernel dump datagrams stay under 32 KiB; a larger one is peeked first.
_RECV = 1 << 16

#: One request of a batch: (pyroute2 message, message type, NLM_F_* flags).
Request = tuple[Any, int, int]


class NetlinkSocket:
    """A blocking netlink socket of ``protocol`` (NETLINK_ROUTE = 0,
    NETLINK_NETFILTER = 12, ...) whose answers ``marshal`` (a pyroute2
    `Marshal`, e.g. ``MarshalRtnl()``) parses, opened in the calling
    thread's network namespace (or wrapping ``sock``, an unbound netlink
    socket of that protocol, which it then owns).

    ``timeout``: seconds to wait for each datagram of an answer.

    Raises:
        OSError: the socket can not be created (EPROTONOSUPPORT when the
            kernel lacks the protocol, EMFILE...).
    """

    def __init__(self, protocol: int, marshal: Marshal, *, sock: socket.socket | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if sock is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                 protocol)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFSIZE)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFSIZE)
            # A kernel-side receive timeout: a blocking recv, no poll() per answer.
            secs = int(timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                            struct.pack("ll", secs, int((timeout - secs) * 1e6)))
            sock.bind((0, 0))  # the kernel picks our port id
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.protocol = protocol
        self.port: int = sock.getsockname()[0]
        self.timeout = timeout
        self.marshal = marshal
        self._seq = 0
        self._buf = bytearray(_RECV)
        self._pending: list[Any] = []  # parsed, not yet consumed (a datagram's rest)
        self._lock = threading.Lock()

    # -- handle --------------------------------------------------------------

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() == -1

    def close(self) -> None:
        """Close the socket; idempotent."""
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"port={self.port}"
        return f"{type(self).__name__}(protocol={self.protocol}, {state})"

    # -- requests ------------------------------------------------------------

    def request(self, msg: Any, msg_type: int, flags: int, *,
                marshal: Marshal | None = None) -> list[Any]:
        """Send one request and return its answer: the messages the kernel
        sent back for it (none for a plain ACK; with NLM_F_ECHO the echoed
        object comes first). ``msg``: a pyroute2 message with its fields and
        ``attrs`` set (the header is filled here). ``flags``: NLM_F_REQUEST
        plus NLM_F_DUMP for a dump (read until NLMSG_DONE), NLM_F_ACK for a
        change (read until the ACK); a GET without either ends with its one
        answer (a GET answered by a lone message marked NLM_F_MULTI, as
        ctnetlink's statistics, needs NLM_F_ACK to end). A change sent
        without NLM_F_ACK would wait for nothing: always ask for the ACK.
        ``marshal``: parses this answer instead of the socket's (message
        classes that decode less).

        Raises:
            NetlinkError: the kernel's error answer (its errno as ``code``);
                ETIMEDOUT when no answer came within the timeout.
            NetlinkDumpInterrupted: the dump was inconsistent (retry it).
            ValueError, TypeError: pyroute2 could not encode ``msg``.
        """
        [(answer, err)] = self.batch([(msg, msg_type, flags)], marshal=marshal)
        if err:
            raise NetlinkError(err)
        return answer

    def batch(self, requests: Sequence[Request], *, tolerate: Container[int] | None = None,
              chunk: int = 64, marshal: Marshal | None = None) -> list[tuple[list[Any], int]]:
        """Send several requests, ``chunk`` per datagram (the kernel handles
        them one after the other, as if sent one by one), and return, in
        order, each one's ``(answer messages, 0)`` or ``([], errno)``.

        ``tolerate``: errnos after which the remaining answers are still
        awaited; after any other error the batch stops there and the list
        is shorter (nfnetlink answers a datagram it refuses as a whole,
        EPERM without CAP_NET_ADMIN, once). None (default): every errno
        (rtnetlink answers each request of a datagram). ``marshal``: as in
        `request`.

        Raises:
            NetlinkError: as `request`, for the socket's own failures.
            NetlinkDumpInterrupted: a dump of the batch was inconsistent.
        """
        out: list[tuple[list[Any], int]] = []
        with self._lock:
            for start in range(0, len(requests), max(1, chunk)):
                part = requests[start:start + chunk]
                seqs = []
                data = bytearray()
                for msg, msg_type, flags in part:
                    self._seq = self._seq % 0x7FFFFFFF + 1
                    seqs.append((self._seq, flags))
                    msg["header"]["type"] = msg_type
                    msg["header"]["flags"] = flags
                    msg["header"]["sequence_number"] = self._seq
                    msg["header"]["pid"] = self.port
                    msg.reset()
                    msg.encode()
                    data += msg.data
                self._transmit(data)
                for seq, flags in seqs:
                    answer, err = self._answer(seq, flags, marshal or self.marshal)
                    out.append((answer, err))
                    if err and tolerate is not None and err not in tolerate:
                        return out
        return out

    # -- transport -----------------------------------------------------------

    def _transmit(self, data: bytes | bytearray) -> None:
        try:
            self._sock.send(data)
        except OSError as e:
            raise NetlinkError(e.errno or errno.EIO, f"netlink send: {e.strerror}") from e

    def _recv(self) -> bytes:
        """The next datagram (grown to fit when larger than the buffer)."""
        try:
            n = self._sock.recv_into(self._buf, len(self._buf), socket.MSG_PEEK | socket.MSG_TRUNC)
            if n > len(self._buf):
                self._buf = bytearray(n)
            n = self._sock.recv_into(self._buf, len(self._buf))
        except BlockingIOError as e:  # SO_RCVTIMEO ran out
            raise NetlinkError(errno.ETIMEDOUT,
                               f"no netlink answer within {self.timeout:g} s") from e
        except OSError as e:
            raise NetlinkError(e.errno or errno.EIO, f"netlink receive: {e.strerror}") from e
        return bytes(memoryview(self._buf)[:n])

    def _answer(self, seq: int, flags: int, marshal: Marshal) -> tuple[list[Any], int]:
        """Read the answer of request ``seq`` (messages of other sequence
        numbers, left over from an abandoned request, are skipped; what
        follows the answer's end in its datagram is kept for the next)."""
        dump, ack = flags & NLM_F_DUMP, flags & NLM_F_ACK
        out: list[Any] = []
        interrupted = False
        while True:
            msgs = self._pending or list(marshal.parse(self._recv()))
            self._pending = []
            for i, msg in enumerate(msgs):
                hdr = msg["header"]
                if hdr["sequence_number"] != seq:
                    continue
                mtype = hdr["type"]
                end: tuple[list[Any], int] | None = None
                if mtype == NLMSG_ERROR:
                    error = hdr.get("error")
                    code = 0 if error is None else (  # None: the ACK
                        getattr(error, "code", None) or getattr(error, "errno", None) or errno.EIO)
                    end = (out if not code else [], code)
                elif mtype == NLMSG_DONE:
                    code = _done_error(msg)
                    end = (out if not code else [], code)
                else:
                    interrupted = interrupted or bool(hdr["flags"] & NLM_F_DUMP_INTR)
                    out.append(msg)
                    if not dump and not ack and not hdr["flags"] & NLM_F_MULTI:
                        end = (out, 0)  # a GET's one answer
                if end is not None:
                    self._pending = msgs[i + 1:]
                    if interrupted and not end[1]:
                        raise NetlinkDumpInterrupted()
                    return end


def _done_error(msg: Any) -> int:
    """The errno a dump's NLMSG_DONE carries (its payload is an int: 0, or
    minus an errno when the dump failed part way)."""
    if isinstance(msg, nlmsgerr):
        return abs(msg["error"] or 0)
    if msg["header"]["length"] < 20:
        return 0
    done = nlmsgerr(msg.data, offset=msg.offset)
    done.decode()
    return abs(done["error"] or 0)

