"""Warm worker mode: a pool of processes that run CNI plugins with the imports done.

``cni-skel worker`` imports the registered plugins and their heavy modules
(pyroute2, pydantic, the config and result models) once, listens on a unix
socket (its own, or the one systemd passes: `systemd_socket`), and keeps a
pool of forked serving processes (`Worker`, the parent; `WorkerChild`, each
process). A serving process answers one connection from a launcher
(`cni_skel.warm.client`, ``launcher.c``) at a time and runs the same
`cni_skel.skel.dispatch` as a one-shot executable, as if the runtime had
started it; then it puts its own state back (`ProcessBaseline`) and serves
the next. For each call:

* network namespace: the launcher's, received as an fd (SCM_RIGHTS) and
  entered with setns(2); the pod's (CNI_NETNS) comes as an fd too, and
  `cni_skel.env.hand_over_netns` makes the plugin open that fd for the path;
* mount namespace: with ``mount_namespace="caller"`` (a worker on the host)
  the launcher's, entered the same way (``ip netns exec`` gives a node
  namespace its own /sys); ``"own"`` (a worker in a container) keeps the
  worker's, whose mounts must show the CNI bin dir, the plugins' state
  directories and the socket at the host's paths;
* environment, cwd and umask from the request, taken after the capability
  drop below; fd 0 is /dev/null, fds 1 and 2 are the launcher's stderr (as
  ``skel._main`` points fd 1 at stderr), so diagnostics and delegated
  plugins' stderr stream live;
* stdout (one JSON document) and the exit code go back on the connection;
  one log line per request (`_RequestLine`) and, with ``metrics_address``,
  Prometheus metrics (`cni_skel.warm.metrics`).

Who is served, checked before anything of a request is acted on:

* root peers only (SO_PEERCRED); the socket is mode 0600;
* launchers of the protocol versions in `SERVED_VERSIONS` (this one and the
  one before); another gets `ST_VERSION` naming both, and answers code 11;
* holding CAP_NET_ADMIN and CAP_SYS_ADMIN (`REQUIRED_CAPS`, read from
  /proc/<peer pid>/status: a worker in a container needs the host's PID
  namespace), as the worker itself must; otherwise the worker does nothing
  and answers "refused" with the reason, and the launcher falls back as
  installed (one-shot in its own process with the caller's privileges: the
  same answer as without a worker; or code 11);
* capabilities: the child drops to the caller's sets within the worker's
  own (the ceiling an operator set: the unit's CapabilityBoundingSet, the
  DaemonSet's capabilities) right after entering its namespaces, before it
  reads anything from the caller's mount namespace: bounding, permitted,
  effective, inheritable and ambient sets, and no_new_privs;
* plugins: the set given at start (``refs``: the registered plugins and
  ``--preload``) is all that is served; any other ref is answered "unknown
  plugin" (the launcher falls back) and nothing named by a request is ever
  imported. The pythonpath a launcher sends is ignored.

Same machine, same user namespace, same PID namespace and same root as the
runtime are assumed; cgroups, rlimits, securebits and seccomp are the
worker's.

A plugin that delegates (bridge -> host-local) to an executable that is a
launcher for this same worker (`cni_skel.warm.install.launcher_info`: same socket
inode, plugin warm) gets it run in the same child by `InProcessExec`, the
`cni_skel.invoke.Exec` the child passes to ``dispatch``, as the worker would
run it anyway, without a launcher exec and a fork; any other delegate is
exec'd as usual.

Processes run calls in parallel, one call each at a time; host-local's lock
file works across them as across processes. The pool is elastic: ``spares``
idle processes are kept ready, one more is forked when a call takes one, up
to ``max_processes`` (three per CPU, at least 6: more would add memory, not
speed; further connections wait for a free process, and only calls that
stall the whole pool for `STALL` seconds grow it past that), and idle
processes beyond ``spares`` exit after ``linger`` seconds. A call
never sees what the one before it left in its process: after each call the
process restores fds 0-2, its network and mount namespaces, cwd, umask,
environment and ``sys.path``, and checks everything else a call could change
(threads, fds, signal handlers and timers, ids, rlimits, capabilities, every
namespace type, memory growth past ``max_growth``). When a check fails, the
call answered error 999, the caller's capabilities were smaller than the
worker's (a dropped capability cannot be taken back), or the process ran
``max_requests`` calls, the process exits after answering ("recycled", one
log line with the reason) and the pool forks a fresh one. What a plugin
keeps in its own module globals is kept across calls, as in any
long-running server: keep per-call state in locals.

Limits and faults (nothing a client or a child sends ends the parent):

* a request frame over ``MAX_REQUEST_BYTES`` (20 MiB) is answered spec
  error 5 without being read; a client has ``request_timeout`` (30 s) for
  its whole request, then its connection is closed (one child, not the
  worker); at most `MAX_CHILDREN` children exist, further connections wait;
* a serving process that ends without answering (signal, ``os._exit``, a
  crash) or is killed after ``run_timeout`` (600 s, when the launcher gives
  up too) costs only its own request: the worker answers it spec error 11 (try
  again later: it may be partly done, and the runtime's DEL cleans up); a
  worker that vanishes after taking a request leaves the launcher to answer
  11 too;
* the parent reads only bounded reports from children, with the sender's
  pid from the kernel (SCM_CREDENTIALS); a malformed one is logged and
  dropped.

Restart and upgrade: a new worker binds a temporary name and renames it over
the socket path; the old one, on SIGTERM, stops accepting (serving what is
already queued), unlinks the path only if it is still its own (never
systemd's), and waits up to ``drain_timeout`` for its children, which hold
their own connections. Socket-activated, the socket stays with systemd
across restarts and idle exits (``idle_exit``): connections queue there
until the next worker takes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import io
import json
import os
import pkgutil
import resource
import select
import selectors
import signal
import socket
import struct
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

from .. import __version__, linkbatch, netlink, nft, state
from ..env import hand_over_netns
from ..errors import ERR_INTERNAL, ERR_IO_FAILURE, ERR_TRY_AGAIN_LATER, CNIError
from ..invoke import SubprocessExec, plugin_outcome
from ..netns import current_netns, setns
from ..skel import dispatch, error_answer, load_config, resolve_ref
from ..types import Interface, IPConfig, Result, Route
from ..version import ALL_VERSIONS
from .client import ping
from .install import launcher_info
from .metrics import Metrics
from .protocol import (
    DEFAULT_SOCKET,
    KIND_PING,
    KIND_RUN,
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    REPLY_TIMEOUT,
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

__all__ = ["DEFAULT_SOCKET", "MOUNT_NAMESPACES", "ChildState", "InProcessExec", "LogSink", "Worker",
           "WorkerChild", "check", "default_max_processes", "describe", "serve", "systemd_socket",
           "writable_proc_sys"]

#: Seconds a connected client has to send its whole request (one deadline
#: for the whole request, not per read).
REQUEST_TIMEOUT = 30.0
#: Seconds a request may run before its child is killed (answered 11); the
#: launcher stops waiting at the same time.
RUN_TIMEOUT = REPLY_TIMEOUT
#: Children at most (idle and busy); past it connections wait in the backlog.
MAX_CHILDREN = 256
#: Capabilities a caller must hold (effective) to be served: CAP_NET_ADMIN
#: and CAP_SYS_ADMIN (setns), without which no CNI plugin can do its work.
REQUIRED_CAPS = {12: "CAP_NET_ADMIN", 21: "CAP_SYS_ADMIN"}
_TICK = 0.25  # seconds between the parent's checks of deadlines and idle processes
_INFO_MAX = 4096  # a child's report to the parent; children bound their fields
_FIELD_MAX = 256  # characters of a container ID etc. kept for the log
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
# Serving processes' exit statuses; anything else is a crash the parent answers.
_IDLE_EXIT, _RECYCLED = 102, 103
# A serving process's reports: the connection it took (its fd attached), the
# request's fields, how a request ended (for metrics), and idle again.
_REPORT_ACCEPTED, _REPORT_REQUEST, _REPORT_DONE, _REPORT_IDLE = (b"accepted", b"request",
                                                                 b"done", b"idle")
# The link deletion batches a serving process led (`linkbatch.take_stats`):
# one field each, the links deleted, or "refused".
_REPORT_BATCHES = b"batches"
_BATCHES_MAX = 64  # fields in one report (a process leads a few per call)
#: Requests a serving process answers before it is recycled.
MAX_REQUESTS = 1000
#: Bytes of RSS a serving process may grow by (since its first request)
#: before it is recycled.
MAX_GROWTH = 64 << 20
#: Seconds an idle serving process beyond ``spares`` lingers before it is retired.
LINGER = 30.0
#: Seconds without a freed process, while connections wait and the pool is at
#: ``max_processes``, before it forks one more: a pool of stuck or slow calls
#: (a delegate that calls back into this worker, a DHCP lease) keeps moving.
STALL = 1.0
#: ``Worker(mount_namespace=)``: enter the launcher's, or keep the worker's own.
MOUNT_NAMESPACES = ("caller", "own")
#: sd_listen_fds(3): the first passed fd.
SD_LISTEN_FDS_START = 3
#: Modules every plugin run needs sooner or later; imported before forking.
WARM_MODULES = ("pydantic", "pyroute2", "cni_skel.config", "cni_skel.types", "cni_skel.args",
                "cni_skel.netns", "cni_skel.netlink", "cni_skel.invoke", "cni_skel.ipam",
                "cni_skel.nft", "cni_skel.sysctl", "cni_skel.state", "cni_skel.conntrack",
                "nftables")


def default_max_processes() -> int:
    """Serving processes the pool grows to under load before connections
    wait: three per CPU this process may run on, at least 6. More than the
    CPUs, as a call can wait on the kernel as long as it runs (a veth's
    deletion waits ~20 ms for RCU grace periods); not one per client, as
    each costs ~10 MiB of copy-on-write pages. Measured on 2 CPUs under
    8-way churn: 4 processes lost ~7 % of the pods/s that 6, 8 and 256 gave,
    which did not differ."""
    return max(6, 3 * len(os.sched_getaffinity(0)))


class LogSink:
    """Where the worker's lines go: a copy of its stderr (the journal) and,
    with ``--log-file``, a file opened for appending; ``fds`` as opened."""

    def __init__(self, fds: tuple[int, ...]) -> None:
        self.fds = fds

    def write(self, line: str) -> None:
        data = line.encode("utf-8", "replace")
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.write(fd, data)


def _log(log: LogSink, cid: str, text: str) -> None:
    # One line each, the container ID first ("-" outside a request).
    log.write(f"cni-skel worker[{os.getpid()}]: {cid or '-'} {text}\n")


def _warm(refs: list[str], log: LogSink) -> dict[str, Any]:
    """Import ``refs`` (and their config models and package submodules) and
    WARM_MODULES; returns ref -> plugin class for those that import."""
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:
            _log(log, "", f"warm-up: cannot import {name}: {exc}")
    plugins: dict[str, Any] = {}
    for ref in refs:
        # A plugin using a deprecated name of cni_skel says so while it loads
        # (a `verbs` class): log it, since Python hides DeprecationWarnings.
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", DeprecationWarning)
            try:
                cls = resolve_ref(ref)
                for attr in ("config_model", "args_model"):
                    if isinstance(getattr(cls, attr, None), str):
                        resolve_ref(getattr(cls, attr))
                pkg = sys.modules[cls.__module__]
                for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
                    importlib.import_module(f"{pkg.__name__}.{info.name}")
            except Exception as exc:
                _log(log, "", f"warm-up: cannot load plugin {ref}: {exc}")
                continue
        for w in seen:
            if issubclass(w.category, DeprecationWarning):
                _log(log, "", f"warm-up: {ref}: {w.filename}:{w.lineno}: "
                              f"{w.category.__name__}: {w.message}")
        plugins[ref] = cls
    return plugins


def systemd_socket() -> socket.socket | None:
    """The listening unix stream socket systemd passed (sd_listen_fds
    semantics: ``LISTEN_PID`` is this process, ``LISTEN_FDS`` >= 1, the
    socket is fd 3); the variables are removed so children and plugins do
    not see them. None when not socket-activated.

    Raises:
        OSError: fd 3 is not a listening unix stream socket.
    """
    pid, count = os.environ.get("LISTEN_PID", ""), os.environ.get("LISTEN_FDS", "")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if not pid.isdigit() or int(pid) != os.getpid() or not count.isdigit() or int(count) < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM \
            or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise OSError(f"fd {SD_LISTEN_FDS_START} from systemd is not a listening unix stream "
                      "socket (the .socket unit needs ListenStream=<path>)")
    sock.set_inheritable(False)
    return sock


_MS_REMOUNT, _MS_BIND = 32, 4096


def writable_proc_sys(log: LogSink) -> None:
    """Make /proc/sys writable in this (a container's) mount namespace when
    it is not: runtimes mount it read-only in unprivileged containers, and
    bridge, tuning and portmap write sysctls of the node and pod
    namespaces. Needs CAP_SYS_ADMIN; a failure is logged (sysctl writes will
    then fail with EROFS)."""
    if os.access("/proc/sys/net", os.W_OK):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p)
    if libc.mount(None, b"/proc/sys", None, _MS_REMOUNT | _MS_BIND, None) != 0:
        err = ctypes.get_errno()
        _log(log, "", f"/proc/sys is read-only and stays so ({os.strerror(err)}): sysctl "
                      "writes will fail")
    else:
        _log(log, "", "/proc/sys was read-only: remounted read-write in this mount namespace")


def _bind(path: str) -> socket.socket:
    """Listen on ``path``: bind a temporary name, mode 0600, rename over
    ``path`` (replacing a stale file or a running worker's socket)."""
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
        os.chmod(parent, 0o755)  # whatever the umask
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        sock.listen(128)
        os.replace(tmp, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return sock


def _peer_cred(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


# --------------------------------------------------------------------------
# capabilities: the child drops to the launcher's

_CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 24, 38, 47
_PR_CAP_AMBIENT_RAISE, _PR_CAP_AMBIENT_CLEAR_ALL = 2, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _caps(pid: int | str) -> dict[str, int]:
    """The capability sets (bit masks) and no_new_privs of process ``pid``
    (``"self"``), from /proc/<pid>/status."""
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.read(fd, 65536)  # one read: the kernel renders it whole (~1.5 KiB)
    finally:
        os.close(fd)
    out: dict[str, int] = {}
    for key in _CAP_FIELDS:
        start = text.find(b"\n" + key.encode() + b":")
        if start < 0:
            raise OSError(f"/proc/{pid}/status lacks {key}")
        start += len(key) + 2
        end = text.find(b"\n", start)
        out[key] = int(text[start:end if end >= 0 else None], 16 if key[:3] == "Cap" else 10)
    return out


def _caps_within(peer: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    """The sets a child runs a request with: the caller's, within the
    worker's own (each set ANDed; no_new_privs when either has it). The
    worker's sets are the ceiling an operator chose (a systemd
    CapabilityBoundingSet, the DaemonSet's capabilities)."""
    out = {key: peer[key] & own[key] for key in _CAP_FIELDS[:5]}
    out["NoNewPrivs"] = int(bool(peer["NoNewPrivs"] or own["NoNewPrivs"]))
    return out


def _drop_caps(peer: dict[str, int], own: dict[str, int]) -> None:
    """Make this process's capability sets ``peer``'s (a subset of ``own``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong)
    prctl.restype = ctypes.c_int

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    # The bounding set first: dropping from it needs CAP_SETPCAP, which capset may remove.
    for cap in range(64):
        if own["CapBnd"] >> cap & 1 and not peer["CapBnd"] >> cap & 1:
            check(prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} "
                                                         "from the bounding set")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    for i in range(2):
        shift = 32 * i
        data[i].effective = peer["CapEff"] >> shift & 0xFFFFFFFF
        data[i].permitted = peer["CapPrm"] >> shift & 0xFFFFFFFF
        data[i].inheritable = peer["CapInh"] >> shift & 0xFFFFFFFF
    header = Header(_LINUX_CAPABILITY_VERSION_3, 0)
    check(libc.capset(ctypes.byref(header), data), "capset")
    if own["CapAmb"] or peer["CapAmb"]:
        check(prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient")
        for cap in range(64):
            if peer["CapAmb"] >> cap & 1:
                check(prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap, 0, 0),
                      f"raising ambient capability {cap}")
    if peer["NoNewPrivs"] and not own["NoNewPrivs"]:
        check(prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {sig} ({name})"
    return f"exited with status {os.waitstatus_to_exitcode(status)} without answering"


class _TooLarge(Exception):
    """A request frame longer than `MAX_REQUEST_BYTES`."""


@dataclass
class ChildState:
    """What the parent knows of one serving process (`Worker.children`):
    idle until it reports the connection it accepted, busy until it reports
    idle again; the request fields come from its "request" report, for the
    log and a crash answer."""

    conn: socket.socket | None = None  # the parent's copy of its connection
    since: float = 0.0  # monotonic time it accepted
    cid: str = ""
    cmd: str = ""
    ref: str = ""
    version: str = ""  # the config's cniVersion, when it is one we know
    netns: str = ""
    overdue: bool = False  # killed at the run deadline
    idle_since: float = 0.0  # monotonic time it last reported idle (or was forked)
    retiring: bool = False  # asked to exit when idle (SIGUSR1)

    @property
    def busy(self) -> bool:
        return self.conn is not None


class Worker:
    """The parent of the pool of serving processes. ``Worker(path).serve()``
    runs until SIGTERM/SIGINT.

    ``spares`` serving processes are kept forked and idle (each a
    `WorkerChild`, serving calls one at a time), and while calls run as
    many idle as busy ones: the parent forks ahead as soon as a spare is
    taken, so a burst finds the pool doubled at each step rather than one
    fork behind each call, up to ``max_processes`` (then connections wait
    in the listen backlog for the next free process; after `STALL` seconds
    with connections waiting and no process freed it forks one more anyway),
    retires idle ones beyond ``spares`` after ``linger`` seconds, reaps
    them, kills those past ``run_timeout`` and answers for one that ended
    without answering (spec error 11).

    The parent reads nothing from clients; from children it reads bounded
    datagrams whose sender the kernel vouches for (SCM_CREDENTIALS), and a
    malformed one is logged and dropped. So neither a client nor a child can
    end or wedge it; a child that dies, is killed or outlives ``run_timeout``
    costs its own request.

    Args:
        socket_path: unix socket to listen on (created 0600, parent dir made).
        refs: plugin refs (``"module:Class"``) to serve: imported at start,
            and the only plugins served (anything else is answered "unknown
            plugin", never imported).
        drain_timeout: seconds to wait for running children after SIGTERM.
        spares: idle serving processes kept ready (>= 1).
        log_fd: where log lines go (default: stderr, i.e. the journal); a
            copy is kept, as children point fd 2 at the launcher's stderr.
        request_timeout: seconds a client has to send its whole request.
        run_timeout: seconds a request may run before its process is killed.
        mount_namespace: "caller" (enter the launcher's mount namespace: a
            worker on the host) or "own" (stay in the worker's: a worker in a
            container, which gets the pod's network namespace as an fd, and
            makes a read-only /proc/sys writable, `writable_proc_sys`).
        idle_exit: exit after this many seconds without a request (None:
            never); for socket activation, where the next call starts it.
        log_file: also append every log line to this file.
        metrics_address: serve Prometheus metrics on ``HOST:PORT``
            (`cni_skel.warm.metrics`); None: no metrics.
        max_requests: plugin calls a serving process runs before it is
            recycled (1: a fresh process per call).
        max_growth: bytes of RSS a serving process may grow by before it is
            recycled.
        linger: seconds an idle serving process beyond ``spares`` stays.
        max_processes: serving processes (busy and idle) the pool grows to
            before connections wait (None: `default_max_processes`); a soft
            bound, see above.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, refs: list[str] | None = None,
                 *, drain_timeout: float = 30.0, spares: int = 2, log_fd: int = 2,
                 request_timeout: float = REQUEST_TIMEOUT,
                 run_timeout: float = RUN_TIMEOUT, mount_namespace: str = "caller",
                 idle_exit: float | None = None, log_file: str | None = None,
                 metrics_address: str | None = None, max_requests: int = MAX_REQUESTS,
                 max_growth: int = MAX_GROWTH, linger: float = LINGER,
                 max_processes: int | None = None) -> None:
        if mount_namespace not in MOUNT_NAMESPACES:
            raise ValueError(f"mount_namespace {mount_namespace!r}: one of "
                             f"{', '.join(MOUNT_NAMESPACES)}")
        self.mount_namespace = mount_namespace
        self.idle_exit = idle_exit
        self.max_requests = max(1, max_requests)
        self.max_growth = max_growth
        self.linger = linger
        self.metrics_address = metrics_address
        self.metrics: Metrics | None = None
        self.activated = False  # the listening socket came from systemd
        self.last_active = time.monotonic()
        self.started = time.time()
        self.pid = os.getpid()
        self.description: dict[str, Any] = {}
        self.path = os.path.abspath(socket_path)
        self.refs = list(refs or [])
        self.drain_timeout = drain_timeout
        self.max_processes = max(1, max_processes or default_max_processes())
        self.spares = min(max(1, spares), self.max_processes)
        self.request_timeout = request_timeout
        self.run_timeout = run_timeout
        # fd 2 becomes the launcher's stderr in children: log to a copy of it.
        fds = [os.dup(log_fd)]
        if log_file:
            fds.append(os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o640))
        self.log = LogSink(tuple(fds))
        self.plugins: dict[str, Any] = {}
        self.children: dict[int, ChildState] = {}
        self.stopping = False
        self.sock: socket.socket | None = None
        self.ident: tuple[int, int] | None = None
        self.respawn_at = 0.0
        self.at_cap = False
        self.freed_at = 0.0  # monotonic time a serving process last became free

    def serve(self) -> int:
        """Import, listen, serve until asked to stop; returns an exit status."""
        self.pid = os.getpid()
        if self.mount_namespace == "own":
            writable_proc_sys(self.log)
        self.plugins = _warm(self.refs, self.log)
        # Warmed here, before any fork, what every process would otherwise
        # warm for itself (pyroute2's compiled attribute tables, pydantic's
        # and the interpreter's first-run work): shared, not copied.
        _rehearse(self.plugins)
        gc.collect()
        gc.freeze()  # children inherit the heap; keep the GC off those pages
        activated = systemd_socket()
        if activated is not None:
            self.sock, self.activated = activated, True
            name = self.sock.getsockname()
            if isinstance(name, str) and name and os.path.abspath(name) != self.path:
                _log(self.log, "", f"systemd's socket is {name}, not {self.path}: serving it")
                self.path = os.path.abspath(name)
        else:
            self.sock = _bind(self.path)
        st = os.stat(self.path)
        self.ident = (st.st_dev, st.st_ino)
        self.description = self.about()  # fixed from here on; every child answers pings with it
        if self.metrics_address:
            self.metrics = Metrics(self.path)
            self.metrics.start(self.metrics_address)
        self.sock.setblocking(False)  # shared by the spares: one wins, the others retry
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC)  # closed on stop: idle spares exit
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        self.info_r, self.info_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.info_r.setblocking(False)
        # The kernel attaches each report's sender: a child cannot speak for another.
        self.info_r.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

        def stop(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.sel.register(self.info_r, selectors.EVENT_READ)
        _log(self.log, "", f"cni-skel {__version__} (protocol {version_range()}) listening "
                           f"on {self.path}{' (systemd socket)' if self.activated else ''}, "
                           f"mount namespace {self.mount_namespace}; "
                           f"{len(self.plugins)} plugins warm: "
                           f"{', '.join(sorted(self.plugins))}"
                           + (f"; exits after {self.idle_exit:g} s idle"
                                 if self.idle_exit else ""))
        self.deadline = self.housekeeping_at = 0.0
        while True:
            try:
                if self._step():
                    break
            except Exception as exc:  # last line of defence: the parent keeps serving
                _log(self.log, "", f"internal error in the worker's parent, going on: "
                                   f"{type(exc).__name__}: {exc}")
                time.sleep(0.1)
        self._read_info()
        for pid, child in self.children.items():
            _log(self.log, child.cid,
                 f"left running: pid {pid} ({child.cmd or ('busy' if child.busy else 'idle')})")
        _log(self.log, "", "stopped")
        return 0

    def _step(self) -> bool:
        """One turn of the parent's loop; True when it is time to exit."""
        self._spawn_spares()
        signaled = False
        for key, _ in self.sel.select(timeout=self._timeout()):
            if key.fileobj is self.info_r:
                self._read_info()
            else:
                signaled = True
                with contextlib.suppress(OSError):
                    while os.read(self.wake_r, 512):
                        pass
        # Reports come several per call: the rest waits for a signal or a tick.
        now = time.monotonic()
        if signaled or now >= self.housekeeping_at:
            self._reap()
        if now >= self.housekeeping_at:
            self.housekeeping_at = now + _TICK
            self._kill_overdue()
            self._retire_extra()
        if self.metrics is not None:
            busy = sum(c.busy for c in self.children.values())
            self.metrics.set_children(len(self.children) - busy, busy)
        if self._idle_too_long():
            _log(self.log, "", f"idle for {self.idle_exit:g} s: exiting"
                               + ("; systemd starts the worker again on the next call"
                                  if self.activated else ""))
            self.stopping = True
        if self.stopping and self.sock is not None:
            self._close_listener()
            self.deadline = time.monotonic() + self.drain_timeout
            busy = sum(c.busy for c in self.children.values())
            _log(self.log, "", f"stopping: {busy} request(s) in flight")
        return self.stopping and (not self.children or time.monotonic() > self.deadline)

    def _idle_too_long(self) -> bool:
        if not self.idle_exit or self.stopping:
            return False
        if any(c.busy for c in self.children.values()):
            self.last_active = time.monotonic()
            return False
        return time.monotonic() - self.last_active >= self.idle_exit

    def _timeout(self) -> float | None:
        """How long the parent may sleep: until the next run deadline or idle
        exit, or a short tick while stopping or waiting to respawn."""
        waits = [0.5] if self.stopping or self.respawn_at or self.at_cap else []
        if self._saturated():
            waits.append(max(0.05, self.freed_at + STALL - time.monotonic()))
        idle = [c.idle_since for c in self.children.values() if not c.busy and not c.retiring]
        if len(idle) > self.spares:
            waits.append(max(0.05, min(idle) + self.linger - time.monotonic()))
        if self.idle_exit and not self.stopping:
            waits.append(max(0.05, self.last_active + self.idle_exit - time.monotonic()))
        busy = [c.since for c in self.children.values() if c.busy]
        if busy:
            waits.append(max(0.05, min(busy) + self.run_timeout - time.monotonic()))
        return min(waits) if waits else None

    def _spawn_spares(self) -> None:
        if self.stopping or time.monotonic() < self.respawn_at:
            return
        self.respawn_at = 0.0
        idle = sum(not c.busy and not c.retiring for c in self.children.values())
        busy = sum(c.busy for c in self.children.values())
        hard = MAX_CHILDREN - len(self.children)
        # Fork ahead of a burst: as many idle as busy (the pool doubles while
        # calls keep coming, instead of one fork per call taken).
        want = min(max(self.spares, busy) - idle, hard, self.max_processes - len(self.children))
        if want <= 0 and hard > 0 and self._stalled():
            _log(self.log, "", f"no serving process freed for {STALL:g} s and calls wait: "
                               f"one more than --max-processes ({self.max_processes})")
            self.freed_at, want = time.monotonic(), 1
        if hard < self.spares - idle and not self.at_cap:
            _log(self.log, "", f"{len(self.children)} children: at the limit "
                               f"({MAX_CHILDREN}); new connections wait")
        self.at_cap = hard < self.spares - idle
        for _ in range(want):
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    code = self._become_child().serve()
                except BaseException as exc:
                    _log(self.log, "", f"child failed: {type(exc).__name__}: {exc}")
                finally:
                    os._exit(code)
            self.children[pid] = ChildState(idle_since=time.monotonic())

    def _saturated(self) -> bool:
        """At ``max_processes`` with none of them free."""
        return (len(self.children) >= self.max_processes
                and all(c.busy or c.retiring for c in self.children.values()))

    def _stalled(self) -> bool:
        """Saturated, connections waiting in the backlog, and no process freed
        for `STALL` seconds."""
        assert self.sock is not None
        return (self._saturated() and time.monotonic() - self.freed_at >= STALL
                and bool(select.select([self.sock], [], [], 0)[0]))

    def _retire_extra(self) -> None:
        """Ask idle processes beyond ``spares`` that idled ``linger`` seconds
        to exit (SIGUSR1: one that just took a connection serves it first)."""
        idle = [(c.idle_since, pid) for pid, c in self.children.items()
                if not c.busy and not c.retiring]
        now = time.monotonic()
        for since, pid in sorted(idle)[:max(0, len(idle) - self.spares)]:
            if now - since < self.linger:
                break
            self.children[pid].retiring = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)

    def _become_child(self) -> WorkerChild:
        """In a fresh fork: drop what only the parent uses (signal handlers,
        its ends of the pipes, other children's connections) and return the
        child's server."""
        assert self.sock is not None and self.ident is not None
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if self.metrics is not None:
            self.metrics.close_in_child()
        self.sel.close()
        os.close(self.wake_r)
        os.close(self.stop_w)
        self.info_r.close()
        for other in self.children.values():
            if other.conn is not None:
                other.conn.close()
        return WorkerChild(self.sock, self.stop_r, self.info_w, self.plugins, self.ident,
                           self.path, self.log, self.request_timeout,
                           mount_namespace=self.mount_namespace, about=self.description,
                           max_requests=self.max_requests, max_growth=self.max_growth,
                           report_done=self.metrics is not None)

    def about(self) -> dict[str, Any]:
        """What a ping answers (JSON): version, protocol versions served, pid,
        start time (unix), socket, socket activation, mount namespace mode,
        idle exit, ``max_processes``, plugins served."""
        return {"version": __version__, "protocol": list(SERVED_VERSIONS), "pid": self.pid,
                "started": round(self.started, 3), "socket": self.path,
                "systemdSocket": self.activated, "mountNamespace": self.mount_namespace,
                "idleExit": self.idle_exit, "maxProcesses": self.max_processes,
                "plugins": sorted(self.plugins)}

    def _close_listener(self) -> None:
        assert self.sock is not None
        # Idle spares see EOF on the stop pipe; one that already accepted a
        # connection serves it. Connections still queued are reset, which the
        # launcher reads as "not run" and runs one-shot.
        os.close(self.stop_w)
        self.sock.close()
        self.sock = None
        if self.activated:  # systemd's socket: it stays, and starts the next worker
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self.ident:  # not a successor's socket
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _read_info(self) -> None:
        """Take the children's queued reports; a malformed one is logged and
        dropped (with any fds it carried), never raised."""
        while True:
            try:
                msg, anc, flags, _ = self.info_r.recvmsg(
                    _INFO_MAX, socket.CMSG_SPACE(struct.calcsize("3i")) + socket.CMSG_SPACE(64),
                    socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                _log(self.log, "", f"reading a child's report failed: {exc}")
                return
            fds: list[int] = []
            pid = 0
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(int.from_bytes(data[i:i + 4], sys.byteorder)
                               for i in range(0, len(data) - len(data) % 4, 4))
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", data[:struct.calcsize("3i")])[0]
            try:
                fds = self._take_report(pid, msg, flags, fds)
            except Exception as exc:
                _log(self.log, "", f"dropped a malformed report from child {pid}: "
                                   f"{type(exc).__name__}: {exc}")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _take_report(self, pid: int, msg: bytes, flags: int, fds: list[int]) -> list[int]:
        """Apply one report of child ``pid``; returns the fds it did not keep.
        Raises ValueError for a report that is not one of ours."""
        child = self.children.get(pid)
        if child is None:
            return fds
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("report truncated")
        kind, *fields = msg.split(b"\0")
        if kind == _REPORT_ACCEPTED and not fields and len(fds) == 1 and child.conn is None:
            child.conn = socket.socket(fileno=fds[0])
            child.since = self.last_active = time.monotonic()
            return []
        if kind == _REPORT_IDLE and not fields and not fds and child.conn is not None:
            child.conn.close()
            self.children[pid] = ChildState(idle_since=time.monotonic(), retiring=child.retiring)
            self.last_active = self.freed_at = time.monotonic()
            return []
        if kind == _REPORT_REQUEST and len(fields) == 5 and not fds:
            child.cid, child.cmd, child.ref, child.version, child.netns = (
                f.decode("utf-8", "replace")[:_FIELD_MAX] for f in fields)
            return []
        if kind == _REPORT_BATCHES and 0 < len(fields) <= _BATCHES_MAX and not fds:
            sizes = [int(f) for f in fields if f != b"refused"]  # ValueError: not ours
            if self.metrics is not None:
                self.metrics.link_batches(sizes, len(fields) - len(sizes))
            return []
        if kind == _REPORT_DONE and len(fields) == 5 and not fds:
            if self.metrics is not None:
                plugin, verb, outcome, code, seconds = (f.decode("utf-8", "replace")
                                                        for f in fields)
                self.metrics.observe(plugin, verb, outcome, code, float(seconds))
            return []
        raise ValueError(f"unexpected report {msg[:40]!r} with {len(fds)} fds")

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._read_info()  # a child's messages are queued before its exit
            child = self.children.pop(pid, None)
            if child is None:
                continue
            self.freed_at = time.monotonic()
            ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) in (_IDLE_EXIT, _RECYCLED)
            if ok and os.WEXITSTATUS(status) == _RECYCLED and self.metrics is not None:
                self.metrics.recycled()
            if not ok and child.conn is not None:
                self._answer_crash(child, pid, status)
            elif not ok:
                _log(self.log, "", f"idle child {pid} {_describe_status(status)}")
                if self.metrics is not None:
                    self.metrics.idle_death()
                self.respawn_at = time.monotonic() + 1.0  # no fork loop if spares keep dying
            if child.conn is not None:
                child.conn.close()

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for pid, child in self.children.items():
            if child.busy and not child.overdue and now - child.since > self.run_timeout:
                child.overdue = True
                _log(self.log, child.cid, f"{child.cmd or '?'} {child.ref or '?'} child "
                     f"{pid}: still running after {self.run_timeout:.0f} s, killed")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _answer_crash(self, child: ChildState, pid: int, status: int) -> None:
        """Answer the request of a child that ended without answering: spec
        error 11 (try again later), as its work may be partly done."""
        assert child.conn is not None
        what = _describe_status(status)
        if child.overdue:
            what += f" after running {self.run_timeout:.0f} s"
        ref = child.ref or "?"
        err = CNIError(ERR_TRY_AGAIN_LATER,
                       f"plugin {ref} ended without answering in the cni-skel worker: {what}",
                       "the operation may be partially done: retry it (a DEL cleans up); "
                       "the worker's log has the details")
        out, code = error_answer(err, child.version or None)
        cls = self.plugins.get(ref)
        name = getattr(cls, "name", None) or ref
        _RequestLine(self.log, child.cid, child.cmd, name, child.netns, "-", child.since).write(
            "crashed", f"child {pid} {what}", out)
        if self.metrics is not None:
            self.metrics.crashed(name, child.cmd or "-", time.monotonic() - child.since)
        # Never block on a client: what does not fit now is its loss (it sees
        # a cut answer and says 11 itself).
        with contextlib.suppress(OSError):
            child.conn.send(encode_reply(ST_DONE, code, out), socket.MSG_DONTWAIT)


class WorkerChild:
    """One serving process of a `Worker`: serves requests one at a time
    until it is recycled, retired or the worker stops.

    It touches the warm code paths once (so the copy-on-write page faults of
    a first run happen before a request, not during it), records the process
    state a request may change (`ProcessBaseline`), then loops: wait on the
    shared listening socket (EPOLLEXCLUSIVE: one idle process wakes per
    connection), accept, report the connection to the parent (passing it a
    copy, so a crash can still be answered), check the caller, enter its
    context, run ``dispatch``, answer, put everything back and report idle.
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

    def _report_done(self, plugin: str, verb: str, outcome: str, code: str,
                     seconds: float) -> None:
        """Tell the parent how a request ended (for its metrics)."""
        if not self.report_done:
            return
        fields = [_REPORT_DONE, *(v.encode("utf-8", "replace").replace(b"\0", b" ")[:_FIELD_MAX]
                                  for v in (plugin, verb, outcome, code, f"{seconds:.6f}"))]
        with contextlib.suppress(OSError):
            self.info_w.send(b"\0".join(fields))

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
        self.baseline = baseline = ProcessBaseline(self.max_growth)
        while True:
            conn = self._accept(poll, wake_r)
            if conn is None:
                return _IDLE_EXIT
            self.idle_reported = False
            why = self._serve_connection(conn)
            self._report_idle(why)  # when no answer went out (the client left)
            if why is None:
                why = baseline.restore()
            if why is None and self.calls >= self.max_requests:
                why = f"ran {self.calls} calls"
            if why is not None:
                _log(self.log, "", f"recycled after {self.calls} call(s): {why}")
                return _RECYCLED

    def _on_retire(self, signum: int, frame: Any) -> None:
        self.retire = True

    def _report_idle(self, why: str | None) -> None:
        """Tell the parent this process is idle, once per connection, unless
        ``why`` (or the request count) ends it. Sent just before the answer:
        the answer starts the client's next call, and a parent that read that
        call's "accepted" first would count one process busy too many and
        fork a spare for nothing (the pool crept from 10 to 13 processes
        under 8-way churn)."""
        if self.idle_reported or why is not None or self.calls >= self.max_requests:
            return
        self.idle_reported = True
        with contextlib.suppress(OSError):
            self.info_w.send(_REPORT_IDLE)

    def _answer(self, conn: socket.socket, status: int, exit_code: int, out: bytes) -> None:
        """`_reply` for a connection after which this process serves again."""
        self._report_idle(None)
        _reply(conn, status, exit_code, out)

    def _accept(self, poll: select.epoll, wake_r: int) -> socket.socket | None:
        """Wait for a connection (None: the worker is stopping, or retires
        this process)."""
        while True:
            if self.retire:
                return None
            events = dict(poll.poll())
            if self.stop_r in events:
                return None
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
            with contextlib.suppress(OSError):
                self.info_w.sendmsg([_REPORT_ACCEPTED],
                                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      conn.fileno().to_bytes(4, sys.byteorder))])
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
                _close_all(fds)

    def _serve_request(self, conn: socket.socket, fields: list[bytes], fds: list[int],
                       peer_pid: int = 0, version: int = PROTOCOL_VERSION) -> str | None:
        kind = fields[0]
        if kind == KIND_PING:
            # A client that gave up before the answer (a timed-out --check,
            # a slow start) is no failure of this process.
            self._answer(conn, ST_PONG, 0, json.dumps(self.about).encode())
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
        with contextlib.suppress(OSError):
            self.info_w.send(b"\0".join([_REPORT_REQUEST, *(
                v.encode("utf-8", "replace").replace(b"\0", b" ")[:_FIELD_MAX]
                for v in (cid, cmd, ref, version_s, netns))]))
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
        try:
            _enter_process_context(fds[2], os.fsdecode(cwd_b), umask, env)
            out, code = _dispatch(plugin, stdin, InProcessExec(
                self.plugins, self.ident, self.log, cid, self._report_done))
        finally:
            hand_over_netns(netns, None)
            # The caller's stderr and namespaces go before the answer: a
            # runtime reads the launcher's stderr to EOF once it exits.
            self.baseline.restore_stdio()
            _close_all(fds)
        if code != 0 and _error_of(out)[0] == ERR_INTERNAL:
            dirty = dirty or "answered error 999"
        line.write("answered", "", out, code)  # before the answer: the log is never behind
        finishing = netlink.finishing_deletions()
        if not finishing:
            self._report_idle(dirty)
        try:
            conn.sendall(encode_reply(ST_DONE, code, out))
        except OSError as exc:
            _log(self.log, cid, f"{cmd or '-'} answered, but the launcher is gone ({exc})")
        if finishing:
            # The links are gone from their namespaces; the kernel's own end
            # of their deletion (an RCU barrier) is waited for after the
            # answer, and this process is busy until then.
            netlink.wait_deletions()
            self._report_batches()
            self._report_idle(dirty)
        else:
            self._report_batches()
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


class _Refused(Exception):
    """The caller is not served by the worker (the message says why)."""


def _caller_caps(peer_pid: int, own: dict[str, int]) -> dict[str, int]:
    """The caller's capability sets (``peer_pid``: root by SO_PEERCRED),
    when it may be served by a process holding ``own``. Raises `_Refused`
    when we cannot read its sets (no shared PID namespace: a DaemonSet needs
    hostPID), or it or the worker lacks `REQUIRED_CAPS`."""
    try:
        peer = _caps(peer_pid)
    except (OSError, ValueError) as exc:
        raise _Refused(f"cannot read the caller's capabilities (pid {peer_pid}): {exc}") \
            from None
    missing = [name for bit, name in REQUIRED_CAPS.items() if not peer["CapEff"] >> bit & 1]
    if missing:
        raise _Refused(f"the caller (pid {peer_pid}) lacks {' and '.join(missing)}")
    missing = [name for bit, name in REQUIRED_CAPS.items() if not own["CapEff"] >> bit & 1]
    if missing:
        raise _Refused(f"this worker lacks {' and '.join(missing)}")
    return peer


def _reply(conn: socket.socket, status: int, exit_code: int, out: bytes) -> None:
    """Answer without waiting long on a client that does not read."""
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(encode_reply(status, exit_code, out))


class _OtherVersion(Exception):
    """A request in a protocol version this worker does not serve."""


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
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(int.from_bytes(payload[i:i + 4], sys.byteorder)
                           for i in range(0, len(payload) - len(payload) % 4, 4))
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
    mount namespaces (setns to the process's own), cwd, umask, environment,
    ``sys.path``, and the netns fd hand-over; nftables contexts of other
    namespaces than the process's own are dropped (they would keep those
    alive). Checked, never guessed at:
    threads (setns of a mount namespace needs a single thread), open fds,
    signal handlers, the signal mask and timers, user and group ids,
    resource limits, capability sets and no_new_privs, the identity of every
    namespace type, and memory: RSS grown more than ``max_growth`` bytes
    since the first request.
    """

    def __init__(self, max_growth: int) -> None:
        self.max_growth = max_growth
        self.stdio = [os.dup(fd) for fd in (0, 1, 2)]  # non-inheritable copies
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.ns_fds = {kind: os.open(f"/proc/thread-self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                       for kind in ("net", "mnt")}
        self.namespaces = self._namespaces()
        self.cwd = os.getcwd()
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.environ = dict(os.environb)
        self.path = list(sys.path)
        self.handlers = self._handlers()
        self.sigmask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.ids = (os.getresuid(), os.getresgid(), sorted(os.getgroups()))
        self.rlimits = [resource.getrlimit(r) for r in _RLIMITS]
        self.caps = _caps("self")
        self.fds = self._fds()
        self.rss = _rss()

    @staticmethod
    def _namespaces() -> dict[str, tuple[int, int]]:
        out = {}
        for kind in _NAMESPACES:
            with contextlib.suppress(OSError):  # a kernel without that type
                st = os.stat(f"/proc/thread-self/ns/{kind}")
                out[kind] = (st.st_dev, st.st_ino)
        return out

    @staticmethod
    def _handlers() -> dict[int, Any]:
        return {sig: signal.getsignal(sig) for sig in _SIGNALS}

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

    def restore(self) -> str | None:
        """Put the process back as it was; None, or why it cannot serve
        another request."""
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:  # first: setns of a mount namespace fails with EINVAL then
            return f"{threads - 1} thread(s) left running"
        try:
            self.restore_stdio()
            for kind, flag in (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET)):
                if not _same_file(self.ns_fds[kind], f"/proc/thread-self/ns/{kind}"):
                    setns(self.ns_fds[kind], flag)
            os.chdir(self.cwd)
            os.umask(self.umask)
            _set_environ(self.environ)
            sys.path[:] = self.path
            # nftables sockets of the caller's namespaces would keep them alive
            nft.release_contexts(keep_netns=self.ns_fds["net"])
        except Exception as exc:
            return f"cannot put its context back: {type(exc).__name__}: {exc}"
        return self.changed()

    def changed(self) -> str | None:
        """What a request left that `restore` does not put back (None: nothing)."""
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
        if _caps("self") != self.caps:
            return "capabilities changed"
        namespaces = self._namespaces()
        if namespaces != self.namespaces:
            kinds = [k for k in self.namespaces if namespaces.get(k) != self.namespaces[k]]
            return f"namespaces changed ({', '.join(kinds)})"
        fds = self._fds()
        if fds != self.fds:
            gc.collect()  # a dropped socket or file in a reference cycle
            fds = self._fds()
        if fds - self.fds:
            return f"fds left open ({', '.join(map(str, sorted(fds - self.fds)[:8]))})"
        if self.fds - fds:
            return f"fds of the worker closed ({', '.join(map(str, sorted(self.fds - fds)[:8]))})"
        grown = _rss() - self.rss
        if grown > self.max_growth:
            return f"memory grew by {grown >> 20} MiB"
        return None


def _rss() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/statm", "rb") as fp:
        return int(fp.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _close_all(fds: list[int]) -> None:
    """Close and forget ``fds`` (emptied: a second call closes nothing)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


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


def serve(socket_path: str = DEFAULT_SOCKET, refs: list[str] | None = None,
          **options: Any) -> int:
    """Run a `Worker` in this process (``options``: its keyword arguments,
    see there); returns an exit status."""
    return Worker(socket_path, refs, **options).serve()


def check(socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> tuple[bool, str]:
    """Does a worker answer on ``socket_path``? ``(True, its description)``
    or ``(False, why not)``."""
    ok, text = ping(socket_path, timeout)
    return ok, describe(text) if ok else text


def describe(pong: str) -> str:
    """A worker's ping answer (`Worker.about`, JSON) in one line."""
    try:
        about = json.loads(pong)
        up = max(0, int(time.time() - about["started"]))
        versions = about["protocol"]
        return (f"cni-skel {about['version']}, pid {about['pid']}, up {up // 3600}h"
                f"{up // 60 % 60:02d}m{up % 60:02d}s, protocol {versions[0]}-{versions[-1]}, "
                f"{'systemd socket, ' if about['systemdSocket'] else ''}"
                f"mount namespace {about['mountNamespace']}"
                + (f", up to {about['maxProcesses']} serving processes"
                   if about.get("maxProcesses") else "")
                + "; plugins: "
                + ", ".join(ref.rpartition(":")[2] for ref in about["plugins"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return pong
