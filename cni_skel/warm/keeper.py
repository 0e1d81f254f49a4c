"""The worker's keeper process: it runs the plugins' services
(`cni_skel.keeper.Service`) for as long as the worker runs.

Forked by the worker's parent (`cni_skel.warm.pool`) after it warmed the
plugins, when any plugin it serves names a ``service``; forked again (one
second later) if it dies. Serving processes reach it through a datagram
socket they all inherit: each call sends one end of a fresh socketpair
(SCM_RIGHTS, with the call's own fds after it), and the keeper answers on
that connection from a thread of its own (`cni_skel.keeper.call` is the
client). It reports how much its services hold to the parent (a ``held``
report on the parent's report socket), which keeps the worker from its idle
exit while anything is held. It ends when the parent closes the stop pipe
(the worker stops) or dies: `Service.stop` first, so what is on disk stays
for the next keeper.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import threading
import time
from typing import Any

from ..errors import ERR_DECODING_FAILURE, ERR_INTERNAL, CNIError
from ..keeper import MAX_FDS, MAX_MESSAGE, Service, close_fds
from ..skel import resolve_ref
from ._common import LogSink, _log, received_fds

__all__ = ["KEEPER_SERVICE", "PROCESS_NAME", "Keeper", "keeper_report", "service_classes"]

#: The keeper's report to the parent: b"keeper\0" and a JSON object,
#: ``{"held": {service: n}, "events": {service: {event: count}}}``.
_REPORT_KEEPER = b"keeper"
#: The keeper's own name in a call: ``{"op": "list"}`` answers every
#: service's `Service.listing`.
KEEPER_SERVICE = "keeper"
_REPORT_MAX = 4000  # bytes of a report (the parent reads 4096)
_READ_TIMEOUT = 30.0  # seconds a caller has to send its whole request
_HELD_EVERY = 1.0  # seconds between the keeper's checks of what is held
#: The keeper's process name (/proc/<pid>/comm, what ps and top show).
PROCESS_NAME = "cni-skel-keeper"
_PR_SET_NAME = 15


def _name_process(name: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()),
                                                0, 0, 0)


class Keeper:
    """The keeper: ``Keeper(services, channel, stop_r, info_w, log).serve()``
    in the forked process; returns its exit status.

    Args:
        services: the `Service` subclasses to run (one instance each).
        channel: the datagram socket connections arrive on.
        stop_r: the parent's stop pipe (EOF: stop).
        info_w: the parent's report socket.
        log: the worker's log.
        state_root: the worker socket's directory; each service's state
            directory is ``<state_root>/<name>``.
    """

    def __init__(self, services: list[type[Service]], channel: socket.socket, stop_r: int,
                 info_w: socket.socket, log: LogSink, state_root: str) -> None:
        self.channel = channel
        self.stop_r = stop_r
        self.info_w = info_w
        self.logsink = log
        self.services: dict[str, Service] = {}
        for cls in services:
            self.services[cls.name] = cls(self._logger(cls.name),
                                          os.path.join(state_root, cls.name))
        self.reported: dict[str, Any] = {}

    def _logger(self, name: str) -> Any:
        def log(text: str) -> None:
            _log(self.logsink, "", f"keeper: {name}: {text}")
        return log

    def serve(self) -> int:
        _name_process(PROCESS_NAME)
        # A stop (systemd signals the whole unit, ^C the process group) ends
        # the keeper through the parent: its stop pipe, then Service.stop.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name, service in list(self.services.items()):
            try:
                service.start()
            except Exception as exc:  # a service that cannot start must not stop the others
                _log(self.logsink, "", f"keeper: {name}: start failed: "
                                       f"{type(exc).__name__}: {exc}")
        _log(self.logsink, "", f"keeper running: {', '.join(sorted(self.services))}")
        sel = selectors.DefaultSelector()
        sel.register(self.channel, selectors.EVENT_READ)
        sel.register(self.stop_r, selectors.EVENT_READ)
        self.channel.setblocking(False)
        stopping = False
        next_report = 0.0
        while not stopping:
            for key, _ in sel.select(timeout=_HELD_EVERY):
                if key.fileobj == self.stop_r:
                    stopping = True
                else:
                    self._take_connections()
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + _HELD_EVERY
                self.report_held()
        for name, service in self.services.items():
            try:
                service.stop()
            except Exception as exc:
                _log(self.logsink, "", f"keeper: {name}: stop failed: "
                                       f"{type(exc).__name__}: {exc}")
        _log(self.logsink, "", "keeper stopped")
        return 0

    def report_held(self) -> None:
        """Tell the parent what the services hold and count, when it changed."""
        report: dict[str, Any] = {"held": {}, "events": {}}
        for name, service in self.services.items():
            try:
                report["held"][name] = int(service.held())
                report["events"][name] = {str(k): int(v) for k, v in service.events().items()}
            except Exception:
                report["held"][name] = 0
        if report == self.reported:
            return
        data = json.dumps(report).encode()
        if len(data) > _REPORT_MAX:
            return
        with contextlib.suppress(OSError):
            self.info_w.send(_REPORT_KEEPER + b"\0" + data)
            self.reported = report

    def _take_connections(self) -> None:
        while True:
            try:
                _, anc, _, _ = self.channel.recvmsg(
                    16, socket.CMSG_SPACE((MAX_FDS + 1) * 4), socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            fds = received_fds(anc)
            if not fds:
                continue
            try:
                conn = socket.socket(fileno=fds[0])
            except OSError:
                close_fds(fds)
                continue
            threading.Thread(target=self._answer, args=(conn, fds[1:]), daemon=True,
                             name="keeper-call").start()

    def _answer(self, conn: socket.socket, fds: list[int]) -> None:
        owned = True  # the fds are the service's once it got them
        with conn:
            try:
                service, request = self._read(conn)
                owned = False
                if service is None:
                    close_fds(fds)
                    answer = {"ok": self._listing()}
                else:
                    answer = {"ok": service.handle(request, fds)}
            except CNIError as exc:
                answer = {"error": {"code": exc.code, "msg": exc.msg, "details": exc.details}}
            except Exception as exc:
                answer = {"error": {"code": ERR_INTERNAL,
                                    "msg": f"keeper: {type(exc).__name__}: {exc}"}}
            finally:
                if owned:
                    close_fds(fds)
            with contextlib.suppress(OSError):
                conn.settimeout(_READ_TIMEOUT)
                conn.sendall(json.dumps(answer).encode())
        self.report_held()

    def _listing(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, service in self.services.items():
            try:
                out[name] = service.listing()
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out

    def _read(self, conn: socket.socket) -> tuple[Service | None, dict[str, Any]]:
        conn.settimeout(_READ_TIMEOUT)
        chunks, size = [], 0
        while chunk := conn.recv(65536):
            size += len(chunk)
            if size > MAX_MESSAGE:
                raise CNIError(ERR_DECODING_FAILURE, "keeper: request too large")
            chunks.append(chunk)
        try:
            msg = json.loads(b"".join(chunks))
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("request"), dict):
            raise CNIError(ERR_DECODING_FAILURE, "keeper: not a request")
        if msg.get("service") == KEEPER_SERVICE and msg["request"].get("op") == "list":
            return None, msg["request"]
        service = self.services.get(str(msg.get("service")))
        if service is None:
            raise CNIError(ERR_INTERNAL, f"keeper: no service {msg.get('service')!r} here")
        return service, msg["request"]


def service_classes(plugins: dict[str, Any], log: LogSink) -> list[type[Service]]:
    """The services the plugins name (`cni_skel.skel.Plugin.service`), one
    per name; one that does not resolve or clashes is logged and left out."""
    found: dict[str, type[Service]] = {}
    for ref, cls in sorted(plugins.items()):
        spec = getattr(cls, "service", None)
        if spec is None:
            continue
        try:
            svc = resolve_ref(spec)
        except (ImportError, AttributeError) as exc:
            _log(log, "", f"{ref}: service {spec!r} not loaded: {exc}")
            continue
        if not (isinstance(svc, type) and issubclass(svc, Service) and svc.name):
            _log(log, "", f"{ref}: service {spec!r} is no named cni_skel.keeper.Service")
            continue
        if found.get(svc.name, svc) is not svc:
            _log(log, "", f"{ref}: a service named {svc.name!r} is already run: not run twice")
            continue
        found[svc.name] = svc
    return list(found.values())


def keeper_report(data: bytes) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """A keeper report's JSON as ``(held, events)``; ValueError if malformed."""
    report = json.loads(data)
    held, events = report["held"], report["events"]
    if not (isinstance(held, dict) and isinstance(events, dict)):
        raise ValueError("keeper report")
    return ({str(k): int(v) for k, v in held.items()},
            {str(k): {str(e): int(n) for e, n in v.items()} for k, v in events.items()})
