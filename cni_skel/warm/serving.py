"""A serving process of the worker's pool (`WorkerChild`): one call at a time.

Forked by the worker's parent (`cni_skel.warm.pool`), a serving process
answers one connection from a launcher (`cni_skel.warm.client`,
``launcher.c``) at a time and runs the same `cni_skel.skel.dispatch` as a
one-shot executable, as if the runtime had started it; then it puts its own
state back (`ProcessBaseline`) and serves the next. It imports nothing of the
pool: it defines what it tells the parent (its reports, on a datagram socket,
and its exit statuses), which the parent reads. For each call:

* network namespace: the launcher's, received as an fd (SCM_RIGHTS) and
  entered with setns(2); the pod's (CNI_NETNS) comes as an fd too, and
  `cni_skel.env.hand_over_netns` makes the plugin open that fd for the path;
* mount namespace: with ``mount_namespace="caller"`` (a worker on the host)
  the launcher's, entered the same way (``ip netns exec`` gives a node
  namespace its own /sys); ``"own"`` (a worker in a container) keeps the
  worker's, whose mounts must show the CNI bin dir, the plugins' state
  directories and the socket at the host's paths;
* environment, cwd and umask from the request, taken after the capability
  drop (`cni_skel.warm.caller`); fd 0 is /dev/null, fds 1 and 2 are the
  launcher's stderr (as ``skel._main`` points fd 1 at stderr), so
  diagnostics and delegated plugins' stderr stream live; a launcher that
  goes away during the call (a runtime's timeout killed it) is noticed at
  once (`_LauncherHangup`, SIGIO): fds 1, 2 and the received fd become
  /dev/null, so the runtime's stderr pipe reaches EOF, while the call runs
  to its end and its fate is logged (answered, not delivered);
* stdout (one JSON document) and the exit code go back on the connection;
  one log line per request (`_RequestLine`) and, with ``metrics_address``,
  Prometheus metrics (`cni_skel.warm.metrics`, kept by the parent).

Who is served, checked before anything of a request is acted on:

* the caller: root, holding `cni_skel.warm.caller.REQUIRED_CAPS`, and
  served with its own capability sets (`cni_skel.warm.caller`);
* launchers of the protocol versions in `SERVED_VERSIONS` (this one and the
  one before); another gets `ST_VERSION` naming both, and answers code 11;
* plugins: the set given at start (``refs``: the registered plugins and
  ``--preload``) is all that is served; any other ref is answered "unknown
  plugin" (the launcher falls back) and nothing named by a request is ever
  imported. The pythonpath a launcher sends is ignored.

A plugin that delegates (bridge -> host-local) to an executable that is a
launcher for this same worker (`cni_skel.warm.install.launcher_info`: same socket
inode, plugin warm) gets it run in the same child by `InProcessExec`, the
`cni_skel.invoke.Exec` the child passes to ``dispatch``, as the worker would
run it anyway, without a launcher exec and a fork; any other delegate is
exec'd as usual.

A call never sees what the one before it left in its process: after each
call the process restores fds 0-2, its network and mount namespaces, cwd,
umask and ``sys.path``; the next call's environment replaces the last one's
key by key (consecutive calls share most of it); it checks everything else a call could
change (threads, fds, signal handlers and timers, ids, rlimits, capabilities,
every namespace type, memory growth past ``max_growth``). When a check fails,
the call answered error 999, the caller's capabilities were smaller than the
worker's (a dropped capability cannot be taken back), or the process ran
``max_requests`` calls, the process exits after answering ("recycled", one
log line with the reason) and the pool forks a fresh one. What a plugin
keeps in its own module globals is kept across calls, as in any
long-running server: keep per-call state in locals.

Limits: a request frame over ``MAX_REQUEST_BYTES`` (20 MiB) is answered spec
error 5 without being read; a client has ``request_timeout`` (30 s) for its
whole request, then its connection is closed (one child, not the worker).
"""

from __future__ import annotations

import _signal  # noqa: PLC2701 (getsignal without the enum wrapping: see _handlers)
import contextlib
import fcntl
import gc
import io
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import __version__, keeper, linkbatch, netlink, nft, state
from ..env import hand_over_netns
from ..errors import ERR_INTERNAL, ERR_IO_FAILURE, CNIError
from ..invoke import SubprocessExec, plugin_outcome
from ..netns import current_netns, setns
from ..skel import dispatch, error_answer, load_config
from ..types import Interface, IPConfig, Result, Route
from ..version import ALL_VERSIONS
from ._common import LogSink, _log, received_fds
from .caller import _caller_caps, _caps, _caps_within, _drop_caps, _peer_cred, _Refused
from .install import launcher_info
from .keeper import KEEPER_SERVICE
from .protocol import (
    KIND_PING,
    KIND_RUN,
    MAX_REQUEST_BYTES,
    PING_HELD,
    PROTOCOL_VERSION,
    REQUEST_HEADER,
    RUN_FIELDS_BY_VERSION,
    SERVED_VERSIONS,
    SOCKET_ENV,
    ST_BAD,
    ST_DONE,
    ST_PONG,
    ST_REFUSED,
    ST_UNKNOWN,
    ST_VERSION,
    decode_fields,
    encode_reply,
    go_field,
    request_header,
    version_range,
)

__all__ = ["MAX_GROWTH", "MAX_REQUESTS", "InProcessExec", "ProcessBaseline", "WorkerChild"]

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_FIELD_MAX = 256  # characters of a container ID etc. kept for the log

# Serving processes' exit statuses; anything else is a crash the parent answers.
_IDLE_EXIT, _RECYCLED = 102, 103
# A serving process's reports, two per call: the connection it took (its fd
# attached; a run request's fields with it: container ID, verb, plugin ref,
# cniVersion, netns), and idle again (with how the call ended, for metrics:
# `_DONE_FIELDS` fields per call, an in-process delegate's first). "done"
# alone: how a call ended when no idle report follows at once. Each report
# wakes the parent: they are merged where the order allows.
_REPORT_ACCEPTED, _REPORT_DONE, _REPORT_IDLE = b"accepted", b"done", b"idle"
_REQUEST_FIELDS = 5  # cid, verb, ref, cniVersion, netns
_DONE_FIELDS = 5  # plugin, verb, outcome, code, seconds
# The link deletion batches a serving process led (`linkbatch.take_stats`):
# one field each, the links deleted, or "refused".
_REPORT_BATCHES = b"batches"
_BATCHES_MAX = 64  # fields in one report (a process leads a few per call)
#: Requests a serving process answers before it is recycled.
MAX_REQUESTS = 1000
#: Bytes of RSS a serving process may grow by (since its first request)
#: before it is recycled.
MAX_GROWTH = 64 << 20
#: Seconds an idle serving process keeps the nftables contexts of other
#: namespaces than its own (see `WorkerChild._accept`).
RELEASE_AFTER = 1.0


def _report_field(value: str) -> bytes:
    """``value`` as one NUL-separated field of a report to the parent."""
    return value.encode("utf-8", "replace").replace(b"\0", b" ")[:_FIELD_MAX]


class WorkerChild:
    """One serving process of a `Worker`: serves requests one at a time
    until it is recycled, retired or the worker stops.

    It touches the warm code paths once (so the copy-on-write page faults of
    a first run happen before a request, not during it), records the process
    state a request may change (`ProcessBaseline`), then loops: wait on the
    shared listening socket (EPOLLEXCLUSIVE: one idle process wakes per
    connection), accept, read the request, report the connection to the
    parent with the request's fields (passing it a copy, so a crash can
    still be answered), check the caller, enter its context, run
    ``dispatch``, report idle with the call's outcome, answer, put
    everything back.
    A request that leaves something the process cannot put back (threads,
    fds, signal handlers, ids, capabilities, namespaces, memory growth past
    ``max_growth``), answers error 999 or ran with fewer capabilities ends
    the process instead (recycled: the parent forks a fresh one as needed);
    so does the ``max_requests``-th request. `serve` returns the exit status.
    """

    def __init__(self, sock: socket.socket, stop_r: int, info_w: socket.socket,
                 plugins: dict[str, Any], ident: tuple[int, int], path: str, log: LogSink,
                 request_timeout: float, *, mount_namespace: str = "caller",
                 about: dict[str, Any] | None = None, max_requests: int = MAX_REQUESTS,
                 max_growth: int = MAX_GROWTH, report_done: bool = False) -> None:
        self.mount_namespace = mount_namespace
        self.about = about or {}
        self.sock = sock  # the listening socket, shared with the other serving processes
        self.stop_r = stop_r  # EOF when the worker stops: exit when idle
        self.info_w = info_w  # reports to the parent
        self.plugins = plugins
        self.ident = ident  # (st_dev, st_ino) of the worker's socket
        self.path = path
        self.log = log
        self.request_timeout = request_timeout
        self.max_requests = max_requests
        self.max_growth = max_growth
        self.report_done = report_done  # the parent keeps metrics
        self.retire = False  # the parent asked this idle process to go (SIGUSR1)
        self.calls = 0  # plugin calls run (pings and refusals are not counted)
        self.idle_reported = False  # this connection's "idle" report went out
        self.conn: socket.socket | None = None  # the connection being served
        self.accepted_reported = False  # the parent has a copy of it
        self.done: list[bytes] = []  # "done" fields not yet reported
        self.hangup = _LauncherHangup()  # a launcher gone during its call

    def _report_done(self, plugin: str, verb: str, outcome: str, code: str,
                     seconds: float) -> None:
        """Tell the parent how a request ended (for its metrics): with the
        idle report that follows (`_report_idle`), or alone (`_flush_done`)."""
        if not self.report_done:
            return
        self.done.extend(map(_report_field, (plugin, verb, outcome, code, f"{seconds:.6f}")))

    def _flush_done(self) -> None:
        """Send the "done" reports no idle report will carry."""
        while self.done:
            fields, self.done = self.done[:_DONE_FIELDS], self.done[_DONE_FIELDS:]
            with contextlib.suppress(OSError):
                self.info_w.send(b"\0".join([_REPORT_DONE, *fields]))

    def _report_accepted(self, fields: Sequence[bytes] = ()) -> bool:
        """Pass the parent a copy of the connection (it answers the caller
        if this process dies), once per connection, with a run request's
        ``fields``; False when it could not (the connection is closed)."""
        if self.accepted_reported:
            return True
        conn = self.conn
        if conn is None or conn.fileno() < 0:
            return False
        with contextlib.suppress(OSError):
            self.info_w.sendmsg([b"\0".join([_REPORT_ACCEPTED, *fields])],
                                [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  conn.fileno().to_bytes(4, sys.byteorder))])
            self.accepted_reported = True
        return self.accepted_reported

    def _not_served(self, reason: str) -> None:
        self._report_done("-", "-", reason, "", 0.0)

    def serve(self) -> int:
        """Serve connections until told to stop; the exit status for the parent."""
        # Rehearsing moves a request's first-touch costs to idle time; with a
        # connection already waiting (a burst) it would only add CPU to it.
        if not select.select([self.sock], [], [], 0)[0]:
            _rehearse(self.plugins)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGUSR1, self._on_retire)
        poll = select.epoll()
        poll.register(self.sock.fileno(), select.EPOLLIN | select.EPOLLEXCLUSIVE)
        poll.register(self.stop_r, select.EPOLLIN)
        poll.register(wake_r, select.EPOLLIN)
        # Link deletions answered early finish in threads while this process
        # serves on: their ends are reaped (and their batches reported) here.
        self.deletions = netlink.deletions_fd()
        poll.register(self.deletions, select.EPOLLIN)
        self.baseline = baseline = ProcessBaseline(self.max_growth)
        collector = _BetweenCalls()
        while True:
            conn = self._accept(poll, wake_r)
            if conn is None:
                self._finish_deletions()
                return _IDLE_EXIT
            self.idle_reported, self.accepted_reported, self.conn = False, False, conn
            why = self._serve_connection(conn)
            self._report_idle(why)  # when no answer went out (the client left)
            self._flush_done()
            self.conn = None
            collector.collect()
            if why is None:
                finishing = netlink.reap_deletions()
                self._report_batches()
                why = baseline.restore(finishing)
            if why is None and self.calls >= self.max_requests:
                why = f"ran {self.calls} calls"
            if why is not None:
                self._finish_deletions()
                _log(self.log, "", f"recycled after {self.calls} call(s): {why}")
                return _RECYCLED

    def _finish_deletions(self) -> None:
        """Before this process exits (``os._exit``, which would not wait):
        its link deletions' kernel ends, and their batches reported."""
        netlink.wait_deletions()
        self._report_batches()

    def _on_retire(self, signum: int, frame: Any) -> None:
        self.retire = True

    def _report_idle(self, why: str | None) -> None:
        """Tell the parent this process is idle, once per connection, unless
        ``why`` (or the request count) ends it. Sent just before the answer:
        the answer starts the client's next call, and a parent that read that
        call's "accepted" first would count one process busy too many and
        fork a spare for nothing (the pool crept from 10 to 13 processes
        under 8-way churn)."""
        if (self.idle_reported or why is not None or self.calls >= self.max_requests
                or not self._report_accepted()):
            self._flush_done()
            return
        self.idle_reported = True
        fields, self.done = self.done, []
        with contextlib.suppress(OSError):
            self.info_w.send(b"\0".join([_REPORT_IDLE, *fields]))

    def _answer(self, conn: socket.socket, status: int, exit_code: int, out: bytes) -> None:
        """`_reply` for a connection after which this process serves again."""
        self._report_idle(None)
        _reply(conn, status, exit_code, out)

    def _accept(self, poll: select.epoll, wake_r: int) -> socket.socket | None:
        """Wait for a connection (None: the worker is stopping, or retires
        this process). Idle for `RELEASE_AFTER` seconds after a call, it
        drops the nftables contexts and sockets of namespaces other than
        its own (they keep those alive: a node namespace deleted after its
        last call would outlive it in every idle process); calls in a row
        keep reusing them."""
        release = True
        while True:
            if self.retire:
                return None
            events = dict(poll.poll(RELEASE_AFTER if release else None))
            if not events:
                release = False
                nft.release_contexts(keep_netns=self.baseline.ns_fds["net"])
                continue
            if self.stop_r in events:
                return None
            if self.deletions in events:
                netlink.reap_deletions()
                self._report_batches()
            if wake_r in events:
                with contextlib.suppress(OSError):
                    while os.read(wake_r, 64):
                        pass
            if self.sock.fileno() not in events or self.retire:
                continue
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another process took it
            return conn

    def _serve_connection(self, conn: socket.socket) -> str | None:
        """Serve one connection; why this process must not serve another
        (None: it may, once `ProcessBaseline.restore` agrees)."""
        with conn:
            conn.setblocking(True)
            deadline = time.monotonic() + self.request_timeout
            try:
                peer_pid, uid, _ = _peer_cred(conn)
            except OSError:
                peer_pid, uid = 0, -1
            if uid != 0:
                _log(self.log, "", f"refused a client with uid {uid}: only root is served")
                self._not_served("refused")
                self._answer(conn, ST_REFUSED, 0, b"only root may use the cni-skel worker")
                return None
            try:
                version, fields, fds = _read_request(conn, deadline)
            except _OtherVersion as exc:
                text = (f"cni-skel worker {__version__} serves launcher protocol "
                        f"{version_range()}, not {exc}")
                _log(self.log, "", f"refused a request: {text}")
                self._not_served("protocol")
                self._answer(conn, ST_VERSION, 0, text.encode())
                return None
            except _TooLarge as exc:
                _log(self.log, "", f"refused a request of {exc} bytes: over the limit")
                self._not_served("too-large")
                err = CNIError(ERR_IO_FAILURE, f"request of {exc} bytes exceeds the cni-skel "
                               f"worker's limit of {MAX_REQUEST_BYTES} bytes")
                out, code = error_answer(err, None)
                self._answer(conn, ST_DONE, code, out)
                return None
            except (OSError, ValueError) as exc:
                _log(self.log, "", f"bad request: {type(exc).__name__}: {exc}")
                self._not_served("bad-request")
                self._answer(conn, ST_BAD, 0, str(exc).encode())
                return None
            try:
                return self._serve_request(conn, fields, fds, peer_pid, version)
            finally:
                keeper.close_fds(fds)

    def _serve_request(self, conn: socket.socket, fields: list[bytes], fds: list[int],
                       peer_pid: int = 0, version: int = PROTOCOL_VERSION) -> str | None:
        kind = fields[0]
        if kind == KIND_PING:
            # A client that gave up before the answer (a timed-out --check,
            # a slow start) is no failure of this process.
            about = self.about
            if PING_HELD in fields[1:] and keeper.in_worker():  # --check, doctor
                try:
                    held: Any = keeper.call(KEEPER_SERVICE, {"op": "list"}, timeout=2.0)
                except CNIError as exc:
                    held = {"keeper": {"error": exc.msg}}
                about = {**about, "held": held}
            self._answer(conn, ST_PONG, 0, json.dumps(about).encode())
            return None
        try:
            want = RUN_FIELDS_BY_VERSION[version]
            fd_counts = (3,) if version == 1 else (3, 4)
            if kind != KIND_RUN or len(fields) != want or len(fds) not in fd_counts:
                raise ValueError(f"unknown request {kind[:20]!r} with {len(fields)} fields, "
                                 f"{len(fds)} fds (protocol {version})")
            # fields[2], the launcher's pythonpath, is for its own one-shot runs only.
            _, ref_b, _, cwd_b, umask_b, env_b, stdin = fields[:7]
            # "<kind> <fallback>" ("native oneshot"): logged as two facts
            launcher, _, fallback = fields[7].decode("utf-8", "replace")[:64].partition(" ") \
                if version >= 2 else ("protocol 1", "", "")
            ref = ref_b.decode()
            umask = int(umask_b or b"18") & 0o777
        except (ValueError, UnicodeDecodeError) as exc:
            _log(self.log, "", f"bad request: {exc}")
            self._not_served("bad-request")
            self._answer(conn, ST_BAD, 0, str(exc).encode())
            return None
        start = time.monotonic()
        env = dict(item.split(b"=", 1) for item in env_b.split(b"\0") if b"=" in item)

        def field(name: bytes) -> str:
            return env.get(name, b"").decode("utf-8", "replace")[:_FIELD_MAX]

        cid, cmd, netns = field(b"CNI_CONTAINERID"), field(b"CNI_COMMAND"), field(b"CNI_NETNS")
        version_s = _config_version(stdin)
        self._report_accepted([_report_field(v) for v in (cid, cmd, ref, version_s, netns)])
        plugin = self.plugins.get(ref)
        line = _RequestLine(self.log, cid, cmd, getattr(plugin, "name", None) or ref, netns,
                            launcher, start, self._report_done, fallback=fallback)

        # Who is calling decides before anything of the request is acted on.
        try:
            own, peer = self.baseline.caps, _caller_caps(peer_pid, self.baseline.caps)
        except _Refused as exc:
            why = f"{exc}; the launcher falls back by its install (one-shot or code 11)"
            line.write("refused", why)
            self._answer(conn, ST_REFUSED, 0, why.encode())
            return None
        if plugin is None:
            why = (f"plugin {ref[:_FIELD_MAX]!r} is not served by this worker (serving: "
                   f"{', '.join(sorted(self.plugins)) or 'none'}; add it with --preload)")
            line.write("unknown-plugin", why)
            self._answer(conn, ST_UNKNOWN, 0, why.encode())
            return None

        _enter_namespaces(fds, self.mount_namespace)
        target = _caps_within(peer, own)
        dirty = None
        if target != own:
            try:
                _drop_caps(target, own)
            except OSError as exc:  # nothing ran yet: the launcher falls back
                line.write("refused", f"cannot take the launcher's capabilities ({exc})")
                _reply(conn, ST_REFUSED, 0, str(exc).encode())  # no idle report: it ends
                return "could not take the caller's capabilities"
            dirty = "ran with the caller's smaller capability sets"
        if len(fds) > 3 and netns:
            hand_over_netns(netns, fds[3])
        self.calls += 1
        hangup = self.hangup
        try:
            _enter_process_context(fds[2], os.fsdecode(cwd_b), umask, env)
            hangup.arm(conn.fileno(), fds[2])
            out, code = _dispatch(plugin, stdin, InProcessExec(
                self.plugins, self.ident, self.log, cid, self._report_done))
        finally:
            gone = hangup.disarm()  # first: it must not touch the fds put back below
            hand_over_netns(netns, None)
            # The caller's stderr and namespaces go before the answer: a
            # runtime reads the launcher's stderr to EOF once it exits.
            self.baseline.restore_stdio()
            keeper.close_fds(fds)
        if code != 0 and _error_of(out)[0] == ERR_INTERNAL:
            dirty = dirty or "answered error 999"
        line.write("answered", "", out, code)  # before the answer: the log is never behind
        self._report_idle(dirty)
        if gone is not None:  # nobody to answer: its fate, logged instead
            _log(self.log, cid, f"{cmd or '-'} {_fate(out, code)} "
                 f"({(time.monotonic() - start) * 1e3:.0f} ms), but the launcher is gone: it "
                 f"went away {(gone - start) * 1e3:.0f} ms into the call, its stderr was let "
                 f"go then and the call ran to its end; not delivered")
            return dirty
        try:
            conn.sendall(encode_reply(ST_DONE, code, out))
        except OSError as exc:
            _log(self.log, cid, f"{cmd or '-'} answered, but the launcher is gone ({exc})")
        # Links this call deleted are gone from their namespaces; the kernel's
        # own end of their deletion (an RCU barrier, tens of ms) goes on in
        # threads while this process serves the next call (`serve`).
        return dirty

    def _report_batches(self) -> None:
        """Tell the parent about the link deletion batches this process led."""
        batches = linkbatch.take_stats()[-_BATCHES_MAX:]
        if batches and self.report_done:
            fields = [b"refused" if refused else str(links).encode()
                      for links, refused in batches]
            with contextlib.suppress(OSError):
                self.info_w.send(b"\0".join([_REPORT_BATCHES, *fields]))


class _RequestLine:
    """The one log line a request gets (logfmt): time, container ID, verb,
    plugin, netns, launcher (its kind: native, python) and its fallback
    (what it does when the worker can not serve: oneshot, none; the call
    itself was served here), outcome, duration in ms, and the error's code
    and msg when it failed. ``report``: also called with (plugin, verb,
    outcome, code, seconds) for the parent's metrics."""

    def __init__(self, log: LogSink, cid: str, cmd: str, plugin: str, netns: str,
                 launcher: str, start: float, report: Any = None, *,
                 fallback: str = "") -> None:
        self.log, self.start, self.report = log, start, report
        self.plugin, self.verb = plugin, cmd or "-"
        self.fields = [("cid", cid or "-"), ("verb", self.verb), ("plugin", plugin),
                       ("netns", netns or "-"), ("launcher", launcher)]
        if fallback:
            self.fields.append(("fallback", fallback))

    def write(self, outcome: str, note: str = "", out: bytes = b"",
              exit_code: int | None = None) -> None:
        """``outcome``: "answered" (with the plugin's ``exit_code`` and stdout
        ``out``), "crashed" (``out``: the worker's answer), or why nothing
        ran ("refused", "unknown-plugin")."""
        seconds = time.monotonic() - self.start
        parts = [f"{k}={_logfmt(v)}" for k, v in self.fields]
        parts.append(f"exit={exit_code}" if outcome == "answered" else f"outcome={outcome}")
        parts.append(f"ms={seconds * 1e3:.1f}")
        code, msg = _error_of(out)
        if code is not None:
            parts += [f"code={code}", f"msg={_logfmt(msg)}"]
        if note:
            parts.append(f"note={_logfmt(note)}")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.log.write(f"cni-skel worker[{os.getpid()}]: time={stamp} {' '.join(parts)}\n")
        if self.report is not None:
            if outcome == "answered":
                label = str(code) if code is not None else "0" if exit_code == 0 else "none"
                self.report(self.plugin, self.verb, outcome, label, seconds)
            else:
                self.report(self.plugin, self.verb, outcome, "", seconds)


def _fate(out: bytes, exit_code: int) -> str:
    """How a call ended, for a log line: "answered exit=N" and, for an
    Error on stdout, its code and msg."""
    code, msg = _error_of(out)
    if code is None:
        return f"answered exit={exit_code}"
    return f"answered exit={exit_code} code={code} msg={_logfmt(msg)}"


def _logfmt(value: Any) -> str:
    text = str(value)
    if text and all(c.isprintable() and c not in ' "=\\' for c in text):
        return text
    return json.dumps(text)


def _error_of(out: bytes) -> tuple[int | None, str]:
    """(code, msg) of an Error object on stdout; (None, "") for anything else."""
    if not out or b'"code"' not in out:
        return None, ""
    try:
        doc = json.loads(out)
    except ValueError:
        return None, ""
    if isinstance(doc, dict) and isinstance(doc.get("code"), int):
        return doc["code"], str(doc.get("msg", ""))[:1000]
    return None, ""


class InProcessExec(SubprocessExec):
    """The `cni_skel.invoke.Exec` a worker child passes to ``dispatch``: a
    delegate whose executable is a launcher for this very worker (same
    socket inode, plugin served here) runs in this process, through the same
    ``dispatch`` a fresh child would run (minus a launcher exec and a fork),
    and its answer is judged as an exec'd plugin's (`plugin_outcome`); any
    other executable (a Go plugin, another worker's launcher) is exec'd.
    """

    def __init__(self, plugins: dict[str, Any], ident: tuple[int, int], log: LogSink,
                 cid: str, report: Any = None) -> None:
        self.report = report  # (plugin, verb, outcome, code, seconds) for the metrics
        self.plugins = plugins  # ref -> plugin class, what this worker serves
        self.ident = ident  # (st_dev, st_ino) of this worker's socket
        self.log = log
        self.cid = cid  # for the log line

    def run(self, plugin_path: str, command: str, stdin_data: bytes, env: Any, *,
            timeout: float | None = None, stderr: Any = None) -> bytes:
        plugin = self._served_here(plugin_path, env)
        if plugin is None:
            return super().run(plugin_path, command, stdin_data, env, timeout=timeout,
                               stderr=stderr)
        ref, cls = plugin
        child_env = dict(env)
        child_env["CNI_COMMAND"] = command
        captured = io.StringIO()
        start = time.monotonic()
        try:
            out, code = dispatch(cls, child_env, stdin_data, captured, exec=self)
        except BaseException as exc:  # as a crashing delegate process: exit 1, no JSON
            captured.write(f"{ref}: {type(exc).__name__}: {exc}\n")
            out, code = b"", 1
        _RequestLine(self.log, self.cid, command, getattr(cls, "name", None) or ref,
                     env.get("CNI_NETNS", ""), "delegated in-process", start,
                     self.report).write("answered", "", out, code)
        return plugin_outcome(os.path.basename(plugin_path), code, out,
                              captured.getvalue().encode(), stderr)

    def _served_here(self, path: str, env: Any) -> tuple[str, Any] | None:
        info = launcher_info(path)  # one stat when this executable was seen before
        if info is None or info["ref"] not in self.plugins:
            return None
        try:
            st = os.stat(env.get(SOCKET_ENV) or info["socket"])
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != self.ident:
            return None
        return info["ref"], self.plugins[info["ref"]]


_F_SETOWN_EX = getattr(fcntl, "F_SETOWN_EX", 15)  # Linux's; Python 3.11 has no name for it
_F_OWNER_TID = 0


class _LauncherHangup:
    """Notices, while a call runs, that its launcher went away (killed by a
    runtime's timeout, say), and lets go of the caller's stderr at once.

    A runtime that reads a plugin's stderr until EOF (Go's os/exec does,
    unless WaitDelay is set) would otherwise wait for the end of the call:
    the serving process holds that pipe as its fds 1 and 2 and as the fd
    the launcher sent. `arm` (once the call's context is entered) asks the
    kernel for SIGIO on the connection, addressed to this thread (O_ASYNC,
    F_SETOWN_EX): no helper thread, a plugin runs in a single-threaded
    process as before (setns into a mount namespace needs that). The
    handler asks for restarts (SA_RESTART): system calls the kernel
    restarts (reads, writes, recv, flock, waitpid), C ones included
    (libnftables), finish as if no signal came; those it never restarts
    (sleeps, poll, select, socket timeouts) fail with EINTR, which Python
    retries (PEP 475) and C code must handle for any signal anyway.

    When the signal comes and the connection is hung up (POLLHUP: the
    launcher closed it, not mere data or a half-close), the handler points
    the received fd, then fds 1 and 2, at /dev/null: the runtime's pipe
    reaches EOF, nothing else of the process changes, and the call runs on
    to its end (a half-done ADD would leave state behind); its answer is
    logged instead of sent (`WorkerChild._serve_request`). Python runs the
    handler between two bytecodes of the main thread, so a long C call, or
    a syscall the kernel restarts (a flock another call holds), delays the
    release to its end. A connection already hung up when armed is seen at
    once. Delegated plugins the call exec'd before the release keep their
    own copy of stderr until they exit (it cannot reach into another
    process); those exec'd after it get /dev/null.

    `disarm` (first thing after the call, before fds 0-2 are put back)
    clears O_ASYNC and puts the previous SIGIO handler back, so
    `ProcessBaseline` finds the process as it was; it returns when the
    launcher was seen gone (monotonic), or None. Both cost a call ~7 us
    (a sigaction, two fcntl and a poll each way, roughly).
    """

    def __init__(self) -> None:
        self.err = -1  # the received stderr while armed, else -1: the handler does nothing
        self.conn = -1
        self.flags = 0  # the connection's file status flags before `arm`
        self.gone: float | None = None
        self.previous: Any = _signal.SIG_DFL
        self.handler = self._on_sigio  # one bound method: `disarm` knows it again
        self.poll = select.poll()

    def arm(self, conn: int, err: int) -> None:
        """Watch connection ``conn`` for the rest of the call; ``err`` is
        the launcher's stderr as received (fds 1 and 2 are its copies)."""
        self.gone = None
        try:
            self.flags = fcntl.fcntl(conn, fcntl.F_GETFL)
            # _signal's: signal.signal's enum wrapping costs 5 us a call
            self.previous = _signal.signal(signal.SIGIO, self.handler)
        except (OSError, ValueError):
            return  # not watched: the call runs as it did before
        self.conn = conn  # from here `disarm` puts back what was changed
        try:
            _signal.siginterrupt(signal.SIGIO, False)  # SA_RESTART
            fcntl.fcntl(conn, _F_SETOWN_EX, struct.pack("ii", _F_OWNER_TID, os.getpid()))
            fcntl.fcntl(conn, fcntl.F_SETFL, self.flags | os.O_ASYNC)
        except OSError:
            self.disarm()
            return
        self.err = err
        self.poll.register(conn, 0)  # POLLHUP and POLLERR only
        self._on_sigio(signal.SIGIO, None)  # gone already: no signal would come

    def disarm(self) -> float | None:
        conn, self.conn, self.err = self.conn, -1, -1
        if conn < 0:
            return None
        with contextlib.suppress(OSError, KeyError):
            self.poll.unregister(conn)
        with contextlib.suppress(OSError):
            fcntl.fcntl(conn, fcntl.F_SETFL, self.flags)
        # A handler the plugin set instead is left for `ProcessBaseline` to see.
        if _signal.getsignal(signal.SIGIO) is self.handler:
            _signal.signal(signal.SIGIO, _signal.SIG_DFL if self.previous is None
                           else self.previous)
        return self.gone

    def _on_sigio(self, signum: int, frame: Any) -> None:
        # Runs inside the plugin's code: it must never raise into it.
        err = self.err
        if err < 0 or self.gone is not None:
            return
        try:
            if not self.poll.poll(0):
                return  # data or a half-close: the launcher is still there
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, err, inheritable=False)  # first: a copy of it made after is null too
                os.dup2(null, 1)
                os.dup2(null, 2)
            finally:
                os.close(null)
        except Exception:  # a nested poll raises RuntimeError: never into the call
            return
        self.gone = time.monotonic()


def _reply(conn: socket.socket, status: int, exit_code: int, out: bytes) -> None:
    """Answer without waiting long on a client that does not read."""
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(encode_reply(status, exit_code, out))


class _OtherVersion(Exception):
    """A request in a protocol version this worker does not serve."""



class _TooLarge(Exception):
    """A request frame longer than `MAX_REQUEST_BYTES`."""


def _read_request(conn: socket.socket, deadline: float) -> tuple[int, list[bytes], list[int]]:
    """One request: (protocol version, fields, received fds), all of it
    before ``deadline`` (monotonic). Raises `_OtherVersion` (its version)
    for a version outside `SERVED_VERSIONS` and `_TooLarge` (its length)
    past `MAX_REQUEST_BYTES`, both without reading the body;
    ValueError/OSError (TimeoutError) otherwise."""
    fds: list[int] = []

    def recv_some(n: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        conn.settimeout(left)
        return conn.recv(n)

    try:
        conn.settimeout(max(0.001, deadline - time.monotonic()))
        data, anc, _, _ = conn.recvmsg(REQUEST_HEADER, socket.CMSG_SPACE(8 * 4),
                                       socket.MSG_CMSG_CLOEXEC)
        fds.extend(received_fds(anc))
        while len(data) < REQUEST_HEADER:
            more = recv_some(REQUEST_HEADER - len(data))
            if not more:
                raise ValueError("truncated request header")
            data += more
        version, length = request_header(data)
        if version not in SERVED_VERSIONS:
            raise _OtherVersion(version)
        if length > MAX_REQUEST_BYTES:
            raise _TooLarge(length)
        body = bytearray()
        while len(body) < length:
            more = recv_some(min(length - len(body), 1 << 20))
            if not more:
                raise ValueError("truncated request")
            body += more
        fields = decode_fields(bytes(body))
        if not fields:
            raise ValueError("empty request")
    except TimeoutError:
        for fd in fds:
            os.close(fd)
        raise TimeoutError("the request did not arrive in time") from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return version, fields, fds


_NAMESPACES = ("net", "mnt", "uts", "ipc", "pid_for_children", "cgroup", "time_for_children",
               "user")
_RLIMITS = tuple(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))
# The standard signals a handler can be set for (real-time ones are left out: cheaper per call).
_SIGNALS = tuple(sig for sig in signal.valid_signals()
                 if sig < 32 and sig not in (signal.SIGKILL, signal.SIGSTOP))


class ProcessBaseline:
    """The state of a serving process that a request may change, taken
    before its first request; `restore` puts it back after each request, or
    says why it cannot (then the process is recycled, not reused).

    Put back: fds 0-2 (`restore_stdio`) and the ``sys`` streams, network and
    mount namespaces (setns to the process's own), cwd, umask,
    ``sys.path``, and the netns fd hand-over (nftables contexts of other
    namespaces than the process's own go once it idles:
    `WorkerChild._accept`). Checked, never guessed at: threads (setns of
    a mount namespace needs a root and cwd no other thread shares; link
    deletions finishing in the kernel are the one exception), open fds, signal handlers,
    the signal mask and timers, user and group ids, resource limits,
    capability sets and no_new_privs, the identity of every namespace type,
    and memory: RSS grown more than ``max_growth`` bytes
    since the first request.
    """

    def __init__(self, max_growth: int) -> None:
        self.max_growth = max_growth
        self.stdio = [os.dup(fd) for fd in (0, 1, 2)]  # non-inheritable copies
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.ns_fds = {kind: os.open(f"/proc/thread-self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                       for kind in ("net", "mnt")}
        # Kept open: read again after every call (a path look-up in /proc
        # costs more than the read).
        self.ns_dir = os.open("/proc/thread-self/ns", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.status_fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        self.statm_fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.namespaces = self._namespaces()
        self.cwd = os.getcwd()
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.path = list(sys.path)
        self.handlers = self._handlers()
        self.sigmask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.ids = (os.getresuid(), os.getresgid(), sorted(os.getgroups()))
        self.rlimits = [resource.getrlimit(r) for r in _RLIMITS]
        self.caps = _caps("self", self.status_fd)
        self.fds = self._fds()
        self.rss = _rss(self.statm_fd)

    def _namespaces(self) -> dict[str, str]:
        out = {}
        for kind in _NAMESPACES:
            with contextlib.suppress(OSError):  # a kernel without that type
                out[kind] = os.readlink(kind, dir_fd=self.ns_dir)  # "net:[4026531840]"
        return out

    @staticmethod
    def _handlers() -> dict[int, Any]:
        # _signal's: signal.getsignal wraps each answer in an enum (most of
        # this check's time, after every call).
        return {sig: _signal.getsignal(sig) for sig in _SIGNALS}

    @staticmethod
    def _fds() -> set[int]:
        """Open fds but the kept libnftables contexts' sockets (they come and
        go with the LRU, on purpose), in the baseline and in every check."""
        return state.open_fds() - nft.kept_fds()

    def restore_stdio(self) -> None:
        """fds 0-2 and ``sys.stdin/stdout/stderr`` as before the request (the
        request pointed 1 and 2 at the caller's stderr)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdin, sys.stdout, sys.stderr = self.streams
        for fd, saved in enumerate(self.stdio):
            os.dup2(saved, fd)

    def restore(self, deleting: frozenset[int] = frozenset()) -> str | None:
        """Put the process back as it was; None, or why it cannot serve
        another request. ``deleting``: thread ids of link deletions still
        finishing (`netlink.reap_deletions`), the only other threads
        allowed (their fds are allowed too)."""
        others = {int(t) for t in os.listdir("/proc/self/task")} - {os.getpid()} - deleting
        if others:  # first: setns of a mount namespace may fail with EINVAL then
            return f"{len(others)} thread(s) left running"
        try:
            self.restore_stdio()
            for kind, flag in (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET)):
                if os.readlink(kind, dir_fd=self.ns_dir) != self.namespaces[kind]:
                    setns(self.ns_fds[kind], flag)
            os.chdir(self.cwd)
            os.umask(self.umask)
            # The environment stays the last caller's: the next call sets
            # its own (`_set_environ`), and nothing between calls reads it.
            sys.path[:] = self.path
            # nftables sockets of the caller's namespaces would keep them alive
        except Exception as exc:
            return f"cannot put its context back: {type(exc).__name__}: {exc}"
        return self.changed(len(deleting))

    def changed(self, deleting: int = 0) -> str | None:
        """What a request left that `restore` does not put back (None:
        nothing). ``deleting`` link deletions still finishing may hold up
        to `_DELETION_FDS` fds each."""
        if signal.alarm(0) or any(signal.getitimer(t) != (0.0, 0.0) for t in
                                  (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
                                   signal.ITIMER_PROF)):
            return "a timer left set"
        handlers = self._handlers()
        moved = [signal.Signals(s).name for s in handlers if handlers[s] != self.handlers[s]]
        if moved:
            return f"signal handlers changed ({', '.join(moved[:4])})"
        if signal.pthread_sigmask(signal.SIG_BLOCK, []) != self.sigmask:
            return "the signal mask changed"
        if (os.getresuid(), os.getresgid(), sorted(os.getgroups())) != self.ids:
            return "user or group ids changed"
        if [resource.getrlimit(r) for r in _RLIMITS] != self.rlimits:
            return "resource limits changed"
        if _caps("self", self.status_fd) != self.caps:
            return "capabilities changed"
        namespaces = self._namespaces()
        if namespaces != self.namespaces:
            kinds = [k for k in self.namespaces if namespaces.get(k) != self.namespaces[k]]
            return f"namespaces changed ({', '.join(kinds)})"
        fds = self._fds()
        if len(fds - self.fds) > deleting * _DELETION_FDS or self.fds - fds:
            gc.collect()  # a dropped socket or file in a reference cycle
            fds = self._fds()
        if len(fds - self.fds) > deleting * _DELETION_FDS:
            return f"fds left open ({', '.join(map(str, sorted(fds - self.fds)[:8]))})"
        if self.fds - fds:
            return f"fds of the worker closed ({', '.join(map(str, sorted(self.fds - fds)[:8]))})"
        grown = _rss(self.statm_fd) - self.rss
        if grown > self.max_growth:
            return f"memory grew by {grown >> 20} MiB"
        return None


class _BetweenCalls:
    """The cycle collector of a serving process, run after a call's answer
    instead of inside the call: with CPython's default threshold (700) a
    call paid ~0.8 young collections (0.2-0.3 ms each, pyroute2's messages
    are cycles). The automatic threshold is raised to `GC_IN_CALL` (a call
    that allocates that much is still collected) and the young generation
    collected here once it holds `GC_BETWEEN_CALLS` objects; every tenth
    collection takes the middle generation too, every hundredth all of them,
    as CPython's own (10, 10) does."""

    def __init__(self) -> None:
        self.passes = 0
        gc.set_threshold(GC_IN_CALL, *gc.get_threshold()[1:])

    def collect(self) -> None:
        if gc.get_count()[0] < GC_BETWEEN_CALLS:
            return
        self.passes += 1
        gc.collect(2 if self.passes % 100 == 0 else 1 if self.passes % 10 == 0 else 0)


#: Young objects (net allocations) a serving process lets pile up before it
#: collects between calls, and the threshold of the automatic collection.
GC_BETWEEN_CALLS = 5_000
GC_IN_CALL = 100_000

#: What a link deletion finishing in its thread holds open (`netlink.delete_link`):
#: its eventfd and netlink socket, the namespace's two batch lock files.
_DELETION_FDS = 4


def _rss(statm_fd: int) -> int:
    """This process's resident set, in bytes (``statm_fd``: /proc/self/statm)."""
    return int(os.pread(statm_fd, 256, 0).split()[1]) * _PAGE_SIZE


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _rehearse(plugins: dict[str, Any]) -> None:
    """Touch what most requests run (config models, a result in every
    version's shape, netlink reads in the worker's own namespace): in the
    parent before it forks (each serving process then shares that warm-up:
    an idle one owns 4.7 MiB instead of 5.4), and again in each serving
    process while idle, so that its copy-on-write faults come before a
    request. Read-only; failures do not matter."""
    for cls in plugins.values():
        with contextlib.suppress(Exception):
            load_config(cls, {"cniVersion": "1.1.0", "name": "warm", "type": cls.name})
    with contextlib.suppress(Exception):
        sample = Result(interfaces=[Interface(name="eth0", mac="0a:58:0a:00:00:02",
                                              sandbox="/proc/self/ns/net")],
                        ips=[IPConfig(address="10.0.0.2/24", gateway="10.0.0.1", interface=0)],
                        routes=[Route(dst="0.0.0.0/0")])
        for version in ALL_VERSIONS:
            json.dumps(sample.to_version(version))
    with contextlib.suppress(Exception), current_netns() as ns, ns.rtnl() as rtnl:
        netlink.find_link(rtnl, "lo")
        netlink.addresses(rtnl, "lo")
        netlink.routes(rtnl)


def _config_version(stdin: bytes) -> str:
    # The worker has json loaded; the launcher's light parser refuses escapes.
    try:
        v = go_field(json.loads(stdin), "cniVersion")
    except Exception:
        return ""
    return v if v in ALL_VERSIONS else ""


def _enter_namespaces(fds: list[int], mount_namespace: str = "caller") -> None:
    """Enter the launcher's network namespace (``fds[0]``) and, with
    ``mount_namespace`` "caller", its mount namespace (``fds[1]``); "own"
    keeps the worker's (a container's: the pod's namespace then comes as
    ``fds[3]``). Nothing else of the request is touched before the
    capabilities drop."""
    net_fd, mnt_fd = fds[0], fds[1]
    if mount_namespace == "caller" and not _same_file(mnt_fd, "/proc/self/ns/mnt"):
        setns(mnt_fd, CLONE_NEWNS)  # resets cwd and root to the namespace's
    if not _same_file(net_fd, "/proc/self/ns/net"):
        setns(net_fd, CLONE_NEWNET)


def _enter_process_context(err_fd: int, cwd: str, umask: int, env: dict[bytes, bytes]) -> None:
    """Become the launcher's process: cwd, umask, environment; fd 0
    /dev/null, fds 1 and 2 its stderr (``err_fd``)."""
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")
    os.umask(umask)
    _set_environ({key: value for key, value in env.items() if key and b"\0" not in key})
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(err_fd, 1)
    os.dup2(err_fd, 2)


def _set_environ(env: dict[bytes, bytes]) -> None:
    """Make the environment exactly ``env``, touching only what differs
    (``os.environ.clear()`` pops one key at a time, each through a fresh
    iterator: a quarter of the serving process's own time per call)."""
    current = os.environb
    for key in [k for k in current if k not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _dispatch(plugin: Any, stdin: bytes, exec: InProcessExec) -> tuple[bytes, int]:
    try:
        out, code = dispatch(plugin, os.environ, stdin, sys.stderr, exec=exec)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt from plugin code
        out, code = error_answer(CNIError(ERR_INTERNAL, f"{type(exc).__name__}: {exc}"), None)
    sys.stdout.flush()
    sys.stderr.flush()
    return out, code
