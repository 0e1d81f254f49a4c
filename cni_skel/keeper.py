"""Work that outlives a plugin call: services held by the worker's keeper.

Some plugins hold something between calls that needs a running process:
the ``dhcp`` IPAM plugin holds a lease for each pod and renews it until the
pod's DEL. Go's plugins run a daemon of their own for that (``dhcp daemon``,
its unit, its socket). With cni-skel the worker is that process: a plugin
class names a `Service` in its ``service`` attribute, and the worker (its
parent, `cni_skel.warm.pool`) forks one **keeper** process that hosts the
services of every plugin it serves, next to the serving processes. A call
reaches its plugin's service with `call`; the keeper answers from its own
threads, so a call waiting on a DHCP server never holds up another.

Shape of a call: ``call(service, request, fds=...)``: ``request`` is a JSON
object (at most `MAX_MESSAGE` bytes encoded), ``fds`` open file descriptors
passed along (SCM_RIGHTS: a pod's network namespace, say, which the keeper
could not reach by path from its own mount namespace); the answer is the
JSON object `Service.handle` returns, or the `CNIError` it raised, raised
again in the caller with its code, message and details.

Outside a worker (a plugin run one-shot, no keeper to hold anything) `call`
raises `CNIError` 11 (try again later) naming the worker's socket, as Go's
dhcp plugin fails without its daemon.

Lifetime: the keeper starts with the worker (`Service.start` reloads what
a service kept on disk), runs until the worker stops (`Service.stop`: keep
the state, a successor takes it over), and the worker's parent starts a new
one if it dies (the services reload their state again). While a service
holds something (`Service.held`), the worker does not exit on
``--idle-exit``.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from .errors import ERR_INTERNAL, ERR_TRY_AGAIN_LATER, CNIError

__all__ = ["CALL_TIMEOUT", "MAX_FDS", "MAX_MESSAGE", "Service", "call", "close_fds",
           "in_worker", "not_in_worker"]

#: Bytes of one request or answer, JSON-encoded.
MAX_MESSAGE = 1 << 20
#: File descriptors one request may pass.
MAX_FDS = 4
#: Seconds `call` waits for an answer unless told otherwise.
CALL_TIMEOUT = 60.0

# The serving process's end of the keeper's channel (set by the worker in
# each serving process it forks); None outside a worker.
_channel: socket.socket | None = None


class Service:
    """What a plugin keeps running in the worker's keeper; subclass it and
    name the subclass in the plugin class's ``service`` attribute.

    One instance per keeper process, made with the worker's log function
    (``log(text)``: one line in the worker's log) and its own state
    directory (``state_dir``: ``<the worker socket's directory>/<name>``,
    e.g. /run/cni-skel/dhcp; not created: make it, 0700, when writing). `handle` runs in a thread
    of its own per call, so several calls run at once: guard shared state
    with a lock. Nothing here may block the keeper for long but `handle`.

    Attributes:
        name: the name calls use (`call`'s ``service``); unique per worker.
    """

    name: ClassVar[str] = ""

    def __init__(self, log: Callable[[str], None], state_dir: str) -> None:
        self.log = log
        self.state_dir = state_dir

    def start(self) -> None:
        """Called once when the keeper starts, before any call: take over
        what a previous keeper left on disk. Default: nothing."""

    def handle(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Answer one `call`. ``fds`` are the caller's descriptors, owned by
        the service (close them, or keep them for as long as needed); the
        keeper closes none of them.

        Returns:
            a JSON object for the caller.

        Raises:
            CNIError: raised again in the caller as it is.
            Exception: anything else becomes code 999 naming the service.
        """
        raise CNIError(ERR_INTERNAL, f"service {self.name!r} answers no calls")

    def held(self) -> int:
        """How many things the service holds for pods now (the worker stays
        up while this is above 0). Default: 0."""
        return 0

    def listing(self) -> list[dict[str, Any]]:
        """What it holds, one JSON object each, for ``cni-skel worker
        --check`` and ``cni-skel doctor``. Default: none."""
        return []

    def events(self) -> dict[str, int]:
        """Counts of what happened since start, by event name (the dhcp
        service: renewals, failures by reason), exported as the metric
        ``cni_skel_keeper_events_total{service,event}``. Default: none."""
        return {}

    def stop(self) -> None:
        """The worker is stopping (restart, upgrade): stop running, keep on
        disk what a successor needs to take over. Default: nothing."""


def in_worker() -> bool:
    """True in a serving process of a worker whose keeper runs services."""
    return _channel is not None


def _attach(channel: socket.socket | None) -> None:
    """Set by the worker in each serving process it forks."""
    global _channel
    _channel = channel


def not_in_worker(service: str) -> CNIError:
    """The error of a call outside a worker: 11 (try again later), naming
    the worker's socket (the launcher's, else the default) and how to start it."""
    from .warm.protocol import (  # noqa: PLC0415 (cold path)
        DEFAULT_SOCKET,
        FALLBACK_FROM_ENV,
        SOCKET_ENV,
    )

    sock = (os.environ.get(FALLBACK_FROM_ENV) or os.environ.get(SOCKET_ENV)
            or DEFAULT_SOCKET)
    return CNIError(ERR_TRY_AGAIN_LATER,
                    f"{service}: needs the cni-skel worker, which holds its state between "
                    f"calls, and the plugin ran without it",
                    f"start the worker on {sock} (cni-skel install sets it up "
                    f"socket-activated), then retry")


def call(service: str, request: dict[str, Any], *, fds: Sequence[int] = (),
         timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
    """Ask the keeper's `Service` named ``service``; returns its answer.

    Args:
        service: `Service.name`.
        request: a JSON object.
        fds: descriptors to pass (at most `MAX_FDS`); the caller keeps its own.
        timeout: seconds to wait for the whole answer.

    Raises:
        CNIError: the service's own; 11 when not in a worker (`in_worker`),
            when the keeper is not running (it is being restarted) or does
            not answer within ``timeout``; 999 for an answer that is not one.
    """
    if _channel is None:
        raise not_in_worker(service)
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} fds per call")
    data = json.dumps({"service": service, "request": request}).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"request over {MAX_MESSAGE} bytes")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        try:
            with theirs:
                # The keeper takes the connection's other end, with the fds.
                _channel.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", [theirs.fileno(), *fds]))],
                                 socket.MSG_DONTWAIT)
        except OSError as exc:
            raise CNIError(ERR_TRY_AGAIN_LATER, f"{service}: the worker's keeper is not "
                           f"reachable: {exc.strerror or exc}", "retry") from None
        ours.sendall(data)
        ours.shutdown(socket.SHUT_WR)
        answer = _read_answer(ours, service, time.monotonic() + timeout)
    if "error" in answer:
        err = answer["error"]
        raise CNIError(int(err.get("code", ERR_INTERNAL)), str(err.get("msg", "")),
                       str(err.get("details", "")))
    return answer.get("ok") or {}


def _read_answer(sock: socket.socket, service: str, deadline: float) -> dict[str, Any]:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CNIError(ERR_TRY_AGAIN_LATER, f"{service}: no answer from the worker's keeper "
                           "in time", "the operation may be partly done: retry it")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_MESSAGE:
            raise CNIError(ERR_INTERNAL, f"{service}: the keeper's answer is too large")
        chunks.append(chunk)
    if not chunks:  # the keeper ended (restart) before answering
        raise CNIError(ERR_TRY_AGAIN_LATER, f"{service}: the worker's keeper ended before "
                       "answering", "the operation may be partly done: retry it")
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise CNIError(ERR_INTERNAL, f"{service}: the keeper's answer is not a JSON object")
    return answer


def close_fds(fds: list[int]) -> None:
    """Close ``fds`` and empty the list (a second call closes nothing);
    an fd already closed is passed over. For a `Service.handle` that
    refuses a request: the fds it was given are its own to close."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())
