"""The worker's parent: the arbiter that keeps its pool of serving processes.

`Worker` imports the plugins it serves and warms them up before it forks
(what every serving process then shares), listens on its unix socket (its
own, bound 0600, or the one systemd passes: `systemd_socket`), and forks,
reaps and retires the serving processes (`cni_skel.warm.serving.WorkerChild`)
that take the connections; it runs no call itself. From them it takes
bounded reports (the connection taken, the request, how it ended, idle
again, link deletion batches), for its log, its metrics
(`cni_skel.warm.metrics`) and the answer of a process that ends without
answering.

Processes run calls in parallel, one call each at a time; host-local's lock
file works across them as across processes. The pool is elastic: ``spares``
idle processes are kept ready, and while calls run as many idle as busy
ones (forked ahead as calls take them: a burst finds the pool doubled), up
to ``max_processes`` (three per CPU, at least 6: more would add memory, not
speed; further connections wait for a free process, and only calls that
stall the whole pool for `STALL` seconds grow it past that), and idle
processes beyond ``spares`` exit after ``linger`` seconds. A serving process
that cannot be reused after a call (`cni_skel.warm.serving`) exits after
answering ("recycled") and the pool forks a fresh one.

Limits and faults (nothing a client or a child sends ends the parent):

* at most `MAX_CHILDREN` children exist, further connections wait;
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
import os
import pkgutil
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

from .. import __version__
from ..errors import ERR_TRY_AGAIN_LATER, CNIError
from ..keeper import _attach, close_fds
from ..skel import error_answer, resolve_ref
from ._common import LogSink, _log, received_fds
from .keeper import _REPORT_KEEPER, Keeper, keeper_report, service_classes
from .metrics import Metrics
from .protocol import (
    DEFAULT_SOCKET,
    REPLY_TIMEOUT,
    SERVED_VERSIONS,
    ST_DONE,
    encode_reply,
    version_range,
)
from .serving import (
    _BATCHES_MAX,
    _DONE_FIELDS,
    _FIELD_MAX,
    _IDLE_EXIT,
    _RECYCLED,
    _REPORT_ACCEPTED,
    _REPORT_BATCHES,
    _REPORT_DONE,
    _REPORT_IDLE,
    _REQUEST_FIELDS,
    MAX_GROWTH,
    MAX_REQUESTS,
    WorkerChild,
    _rehearse,
    _RequestLine,
)

__all__ = ["LINGER", "MAX_CHILDREN", "MOUNT_NAMESPACES", "REQUEST_TIMEOUT", "RUN_TIMEOUT", "STALL",
           "ChildState", "Worker", "default_max_processes", "systemd_socket", "writable_proc_sys"]

#: Seconds a connected client has to send its whole request (one deadline
#: for the whole request, not per read).
REQUEST_TIMEOUT = 30.0
#: Seconds a request may run before its child is killed (answered 11); the
#: launcher stops waiting at the same time.
RUN_TIMEOUT = REPLY_TIMEOUT
#: Children at most (idle and busy); past it connections wait in the backlog.
MAX_CHILDREN = 256
_TICK = 0.25  # seconds between the parent's checks of deadlines and idle processes
_INFO_MAX = 4096  # a child's report to the parent; children bound their fields
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


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {sig} ({name})"
    return f"exited with status {os.waitstatus_to_exitcode(status)} without answering"


@dataclass
class ChildState:
    """What the parent knows of one serving process (`Worker.children`):
    idle until it reports the connection it accepted, busy until it reports
    idle again; the request fields come with the connection, for the log and
    a crash answer."""

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
        # The keeper (`cni_skel.warm.keeper`): its pid (0: none running), when
        # it may be forked (again), what its services hold, its channel.
        self.services: list[Any] = []
        self.keeper_pid = 0
        self.keeper_at = 0.0
        self.keeper_held: dict[str, int] = {}
        self.keeper_r: socket.socket | None = None
        self.keeper_w: socket.socket | None = None

    def serve(self) -> int:
        """Import, listen, serve until asked to stop; returns an exit status."""
        self.pid = os.getpid()
        if self.mount_namespace == "own":
            writable_proc_sys(self.log)
        self.plugins = _warm(self.refs, self.log)
        self.services = service_classes(self.plugins, self.log)
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
        if self.services:
            # Every serving process inherits keeper_w; each call sends one
            # end of a socketpair on it (`cni_skel.keeper.call`).
            self.keeper_r, self.keeper_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

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
        self._spawn_keeper()
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
        return self.stopping and ((not self.children and not self.keeper_pid)
                                  or time.monotonic() > self.deadline)

    def _idle_too_long(self) -> bool:
        if not self.idle_exit or self.stopping:
            return False
        if any(c.busy for c in self.children.values()) or any(self.keeper_held.values()):
            self.last_active = time.monotonic()
            return False
        return time.monotonic() - self.last_active >= self.idle_exit

    def _timeout(self) -> float | None:
        """How long the parent may sleep: until the next run deadline or idle
        exit, or a short tick while stopping or waiting to respawn."""
        waits = ([0.5] if self.stopping or self.respawn_at or self.at_cap
                 or (self.services and not self.keeper_pid) else [])
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
            pid = self._fork(lambda: self._become_child().serve(), "child")
            self.children[pid] = ChildState(idle_since=time.monotonic())

    def _fork(self, run: Any, what: str) -> int:
        """Fork; the child runs ``run()`` and exits with its status (70 when
        it raised, logged as "<what> failed"). Returns the child's pid."""
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = run()
            except BaseException as exc:
                _log(self.log, "", f"{what} failed: {type(exc).__name__}: {exc}")
            finally:
                os._exit(code)
        return pid

    def _spawn_keeper(self) -> None:
        """Fork the keeper when the plugins name services and none runs."""
        if (not self.services or self.keeper_pid or self.stopping
                or time.monotonic() < self.keeper_at):
            return
        self.keeper_pid = self._fork(lambda: self._become_keeper().serve(), "keeper")

    def _become_keeper(self) -> Keeper:
        """In the keeper's fresh fork: drop what only the parent and the
        serving processes use."""
        assert self.keeper_r is not None and self.keeper_w is not None
        self._drop_parent_state()
        assert self.sock is not None
        self.sock.close()
        self.keeper_w.close()
        return Keeper(self.services, self.keeper_r, self.stop_r, self.info_w, self.log,
                      os.path.dirname(self.path))

    def _drop_parent_state(self) -> None:
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
        self._drop_parent_state()
        if self.keeper_r is not None:
            self.keeper_r.close()
        _attach(self.keeper_w)
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
                "plugins": sorted(self.plugins),
                "services": sorted(svc.name for svc in self.services)}

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
            fds = received_fds(anc)
            pid = 0
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", data[:struct.calcsize("3i")])[0]
            try:
                fds = self._take_report(pid, msg, flags, fds)
            except Exception as exc:
                _log(self.log, "", f"dropped a malformed report from child {pid}: "
                                   f"{type(exc).__name__}: {exc}")
            close_fds(fds)

    def _take_report(self, pid: int, msg: bytes, flags: int, fds: list[int]) -> list[int]:
        """Apply one report of child ``pid``; returns the fds it did not keep.
        Raises ValueError for a report that is not one of ours."""
        child = self.children.get(pid)
        if pid and pid == self.keeper_pid:
            kind, _, data = msg.partition(b"\0")
            if kind != _REPORT_KEEPER or fds:
                raise ValueError(f"unexpected report {msg[:40]!r} from the keeper")
            self.keeper_held, events = keeper_report(data)
            if self.metrics is not None:
                self.metrics.keeper(self.keeper_held, events)
            return fds
        if child is None:
            return fds
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("report truncated")
        kind, *fields = msg.split(b"\0")
        if (kind == _REPORT_ACCEPTED and len(fields) in (0, _REQUEST_FIELDS) and len(fds) == 1
                and child.conn is None):
            child.conn = socket.socket(fileno=fds[0])
            child.since = self.last_active = time.monotonic()
            if fields:
                child.cid, child.cmd, child.ref, child.version, child.netns = (
                    f.decode("utf-8", "replace")[:_FIELD_MAX] for f in fields)
            return []
        if (kind == _REPORT_IDLE and len(fields) % _DONE_FIELDS == 0 and not fds
                and child.conn is not None):
            child.conn.close()
            self.children[pid] = ChildState(idle_since=time.monotonic(), retiring=child.retiring)
            self.last_active = self.freed_at = time.monotonic()
            for i in range(0, len(fields), _DONE_FIELDS):
                self._observe(fields[i:i + _DONE_FIELDS])
            return []
        if kind == _REPORT_BATCHES and 0 < len(fields) <= _BATCHES_MAX and not fds:
            sizes = [int(f) for f in fields if f != b"refused"]  # ValueError: not ours
            if self.metrics is not None:
                self.metrics.link_batches(sizes, len(fields) - len(sizes))
            return []
        if kind == _REPORT_DONE and len(fields) == _DONE_FIELDS and not fds:
            self._observe(fields)
            return []
        raise ValueError(f"unexpected report {msg[:40]!r} with {len(fds)} fds")

    def _observe(self, fields: list[bytes]) -> None:
        """One call's "done" fields into the metrics (ValueError: not ours)."""
        if self.metrics is not None:
            plugin, verb, outcome, code, seconds = (f.decode("utf-8", "replace") for f in fields)
            self.metrics.observe(plugin, verb, outcome, code, float(seconds))

    def _reap(self) -> None:
        while self.children or self.keeper_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._read_info()  # a child's messages are queued before its exit
            if pid == self.keeper_pid:
                self.keeper_pid = 0
                if not (self.stopping and os.WIFEXITED(status) and not os.WEXITSTATUS(status)):
                    _log(self.log, "", f"keeper {pid} {_describe_status(status)}"
                                       + ("" if self.stopping else ": forked again in 1 s"))
                    self.keeper_at = time.monotonic() + 1.0
                    if self.metrics is not None:
                        self.metrics.keeper_death()
                continue
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
