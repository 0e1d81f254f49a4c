"""Warm worker mode: a fork-server that runs CNI plugins with the imports done.

``cni-skel worker`` imports the registered plugins and their heavy modules
(pyroute2, pydantic, the config and result models) once, listens on a unix
socket, and keeps pre-forked children ready (`Worker`); each accepts one
connection from the thin launcher (`cni_skel.launcher`) and runs the same
`cni_skel.skel.dispatch` as a one-shot executable, as if the runtime had
started it:

* network and mount namespace: the launcher's, received as fds (SCM_RIGHTS)
  and entered with setns(2) (``ip netns exec`` gives a node namespace its own
  /sys, so the mount namespace matters too);
* environment, cwd, umask and ``pythonpath`` from the request; fd 0 is
  /dev/null, fds 1 and 2 are the launcher's stderr (as ``skel._main`` points
  fd 1 at stderr), so diagnostics and delegated plugins' stderr stream live;
* stdout (one JSON document) and the exit code go back on the connection.

* capabilities: the launcher's (read from /proc/<peer pid>/status), dropped
  to after entering its namespaces: bounding, permitted, effective,
  inheritable and ambient sets, and no_new_privs. A caller running with
  fewer capabilities (``setpriv``, a confined runtime) gets no more through
  the worker than it has; a caller holding capabilities the worker lacks is
  refused, and its launcher runs the plugin one-shot with its own.

Same machine, same user namespace, same PID namespace and same root as the
runtime are assumed; cgroups, rlimits, securebits and seccomp are the
worker's.

A plugin that delegates (bridge -> host-local) to an executable that is a
launcher for this same worker (`cni_skel.install.launcher_info`: same socket
inode, plugin warm) gets it run in the same child through
`cni_skel.invoke.set_in_process_runner`, as the worker would run it anyway,
without a launcher exec and a fork; any other delegate is exec'd as usual.

Children isolate requests (setns, crashes, memory) and run in parallel;
host-local's lock file works across them as across processes. Only root
peers are served (SO_PEERCRED); the socket is mode 0600.

Faults: a child that dies without answering (signal, ``os._exit``) is
answered by the worker with code 999 (a plugin crash, as a crashing one-shot
plugin); a worker that vanishes after taking a request leaves the launcher
to answer 11 (try again later). A plugin ref the worker cannot import is
answered "unknown plugin" and the launcher runs it one-shot.

Restart and upgrade: a new worker binds a temporary name and renames it over
the socket path; the old one, on SIGTERM, stops accepting (serving what is
already queued), unlinks the path only if it is still its own, and waits up
to ``drain_timeout`` for its children, which hold their own connections and
finish even if it exits (systemd: ``KillMode=process``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any

from . import launcher as proto

__all__ = ["DEFAULT_SOCKET", "Worker", "check", "serve"]

DEFAULT_SOCKET = proto.DEFAULT_SOCKET
#: Seconds a connected client has to send its whole request.
REQUEST_TIMEOUT = 30.0
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
# Child exit statuses; anything else is a crash the parent answers.
_ANSWERED, _CLIENT_GONE, _IDLE_EXIT = 100, 101, 102
#: Modules every plugin run needs sooner or later; imported before forking.
WARM_MODULES = ("pydantic", "pyroute2", "cni_skel.config", "cni_skel.types", "cni_skel.args",
                "cni_skel.netns", "cni_skel.netlink", "cni_skel.invoke", "cni_skel.ipam",
                "cni_skel.nft", "cni_skel.sysctl", "cni_skel.state", "cni_skel.conntrack",
                "nftables")


def _log(fd: int, cid: str, text: str) -> None:
    # One line each, the container ID first ("-" outside a request).
    with contextlib.suppress(OSError):
        os.write(fd, f"cni-skel worker[{os.getpid()}]: {cid or '-'} {text}\n".encode(
            "utf-8", "replace"))


def _warm(refs: list[str], log_fd: int) -> dict[str, Any]:
    """Import ``refs`` (and their config models and package submodules) and
    WARM_MODULES; returns ref -> plugin class for those that import."""
    import importlib
    import pkgutil

    from .skel import _resolve

    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:
            _log(log_fd, "", f"warm-up: cannot import {name}: {exc}")
    plugins: dict[str, Any] = {}
    for ref in refs:
        try:
            cls = _resolve(ref)
            for attr in ("config_model", "args_model"):
                if isinstance(getattr(cls, attr, None), str):
                    _resolve(getattr(cls, attr))
            pkg = sys.modules[cls.__module__]
            for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
                importlib.import_module(f"{pkg.__name__}.{info.name}")
        except Exception as exc:
            _log(log_fd, "", f"warm-up: cannot load plugin {ref}: {exc}")
            continue
        plugins[ref] = cls
    return plugins


def _bind(path: str) -> socket.socket:
    """Listen on ``path``: bind a temporary name, mode 0600, rename over
    ``path`` (replacing a stale file or a running worker's socket)."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
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
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fp:
        for line in fp:
            key, _, value = line.partition(":")
            if key in _CAP_FIELDS:
                out[key] = int(value.strip(), 16 if key.startswith("Cap") else 10)
    missing = [k for k in _CAP_FIELDS if k not in out]
    if missing:
        raise OSError(f"/proc/{pid}/status lacks {', '.join(missing)}")
    return out


def _caps_beyond(peer: dict[str, int], own: dict[str, int]) -> str:
    """What ``peer`` holds that ``own`` does not (empty: we can drop to it)."""
    extra = [f"{key} {peer[key] & ~own[key]:#x}" for key in _CAP_FIELDS[:5]
             if peer[key] & ~own[key]]
    if own["NoNewPrivs"] and not peer["NoNewPrivs"]:
        extra.append("no_new_privs unset")
    return ", ".join(extra)


def _drop_caps(peer: dict[str, int], own: dict[str, int]) -> None:
    """Make this process's capability sets ``peer``'s (a subset of ``own``)."""
    import ctypes

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


class Worker:
    """The pre-forking server. ``Worker(path).serve()`` runs until SIGTERM/SIGINT.

    ``spares`` children are kept forked and idle; each touches the warm code
    paths once (so the copy-on-write page faults of a first run happen before
    a request, not during it), waits on the listening socket, accepts one
    connection, tells the parent (passing it a copy of the connection, so a
    crash can still be answered), serves that one request and exits. The
    parent forks a replacement as soon as a spare is taken.

    Args:
        socket_path: unix socket to listen on (created 0600, parent dir made).
        refs: plugin refs (``"module:Class"``) to import before serving;
            others are imported per request in the child.
        drain_timeout: seconds to wait for running children after SIGTERM.
        spares: idle children kept ready (>= 1).
        log_fd: where request lines go (default: stderr, i.e. the journal).
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, refs: list[str] | None = None,
                 *, drain_timeout: float = 30.0, spares: int = 2, log_fd: int = 2) -> None:
        self.path = os.path.abspath(socket_path)
        self.refs = list(refs or [])
        self.drain_timeout = drain_timeout
        self.spares = max(1, spares)
        self.log_fd = os.dup(log_fd)  # fd 2 becomes the launcher's stderr in children
        self.plugins: dict[str, Any] = {}
        self.children: dict[int, dict[str, Any]] = {}  # pid -> state, conn, request info
        self.stopping = False
        self.sock: socket.socket | None = None
        self.ident: tuple[int, int] | None = None
        self.respawn_at = 0.0

    # -- parent ------------------------------------------------------------

    def serve(self) -> int:
        """Import, listen, serve until asked to stop; returns an exit status."""
        self.plugins = _warm(self.refs, self.log_fd)
        gc.collect()
        gc.freeze()  # children inherit the heap; keep the GC off those pages
        self.sock = _bind(self.path)
        st = os.stat(self.path)
        self.ident = (st.st_dev, st.st_ino)
        self.sock.setblocking(False)  # shared by the spares: one wins, the others retry
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC)  # closed on stop: idle spares exit
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        self.info_r, self.info_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.info_r.setblocking(False)

        def stop(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.sel.register(self.info_r, selectors.EVENT_READ)
        _log(self.log_fd, "", f"listening on {self.path} ({len(self.plugins)} plugins warm: "
                              f"{', '.join(sorted(self.plugins))})")
        deadline = 0.0
        while True:
            self._spawn_spares()
            timeout = 0.5 if self.stopping or self.respawn_at else None
            for key, _ in self.sel.select(timeout=timeout):
                if key.fileobj is self.info_r:
                    self._read_info()
                else:
                    with contextlib.suppress(OSError):
                        while os.read(self.wake_r, 512):
                            pass
            self._reap()
            if self.stopping and self.sock is not None:
                self._close_listener()
                deadline = time.monotonic() + self.drain_timeout
                busy = sum(c["state"] == "busy" for c in self.children.values())
                _log(self.log_fd, "", f"stopping: {busy} request(s) in flight")
            if self.stopping and (not self.children or time.monotonic() > deadline):
                break
        self._read_info()
        for pid, child in self.children.items():
            _log(self.log_fd, child.get("cid", ""),
                 f"left running: pid {pid} ({child.get('cmd', child['state'])})")
        _log(self.log_fd, "", "stopped")
        return 0

    def _spawn_spares(self) -> None:
        if self.stopping or time.monotonic() < self.respawn_at:
            return
        self.respawn_at = 0.0
        idle = sum(c["state"] == "idle" for c in self.children.values())
        for _ in range(self.spares - idle):
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    code = self._child()
                except BaseException as exc:
                    _log(self.log_fd, "", f"child failed: {type(exc).__name__}: {exc}")
                finally:
                    os._exit(code)
            self.children[pid] = {"state": "idle", "conn": None}

    def _close_listener(self) -> None:
        assert self.sock is not None
        # Idle spares see EOF on the stop pipe; one that already accepted a
        # connection serves it. Connections still queued are reset, which the
        # launcher reads as "not run" and runs one-shot.
        os.close(self.stop_w)
        self.sock.close()
        self.sock = None
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self.ident:  # not a successor's socket
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _read_info(self) -> None:
        while True:
            try:
                msg, anc, _, _ = self.info_r.recvmsg(4096, socket.CMSG_SPACE(4))
            except (BlockingIOError, InterruptedError):
                return
            fields = msg.decode("utf-8", "replace").split("\0")
            child = self.children.get(int(fields[1]))
            fds = [int.from_bytes(p[:4], sys.byteorder) for lvl, kind, p in anc
                   if lvl == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS]
            if child is None:
                for fd in fds:
                    os.close(fd)
                continue
            if fields[0] == "accepted":
                child["state"] = "busy"
                if fds:
                    child["conn"] = socket.socket(fileno=fds[0])
            elif fields[0] == "request":
                child.update(cid=fields[2], cmd=fields[3], ref=fields[4], version=fields[5])

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
            ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) in (_ANSWERED, _CLIENT_GONE,
                                                                     _IDLE_EXIT)
            if not ok and child["conn"] is not None:
                self._answer_crash(child, pid, status)
            elif not ok:
                _log(self.log_fd, "", f"idle child {pid} {_describe_status(status)}")
                self.respawn_at = time.monotonic() + 1.0  # no fork loop if spares keep dying
            if child["conn"] is not None:
                child["conn"].close()

    def _answer_crash(self, child: dict[str, Any], pid: int, status: int) -> None:
        from .errors import ERR_INTERNAL, CNIError
        from .skel import _error

        what = _describe_status(status)
        ref = child.get("ref", "?")
        err = CNIError(ERR_INTERNAL, f"plugin {ref} crashed in the cni-skel worker: {what}",
                       "the operation may be partially done; the worker's log has the details")
        out, code = _error(err, child.get("version") or None)
        _log(self.log_fd, child.get("cid", ""),
             f"{child.get('cmd', '?')} {ref} child {pid} {what}: answered code 999")
        with contextlib.suppress(OSError):
            child["conn"].settimeout(1.0)
            child["conn"].sendall(proto.encode_reply(proto.ST_DONE, code, out))

    # -- child -------------------------------------------------------------

    def _child(self) -> int:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        self.sel.close()
        os.close(self.wake_r)
        os.close(self.stop_w)
        self.info_r.close()
        for other in self.children.values():
            if other["conn"] is not None:
                other["conn"].close()
        # Rehearsing moves a request's first-touch costs to idle time; with a
        # connection already waiting (a burst) it would only add CPU to it.
        if not select.select([self.sock], [], [], 0)[0]:
            _rehearse(self.plugins)
        conn = self._accept()
        if conn is None:
            return _IDLE_EXIT
        conn.setblocking(True)
        with contextlib.suppress(OSError):
            self.info_w.sendmsg([f"accepted\0{os.getpid()}".encode()],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                 conn.fileno().to_bytes(4, sys.byteorder))])
        try:
            peer_pid, uid, _ = _peer_cred(conn)
        except OSError:
            peer_pid, uid = 0, -1
        if uid != 0:
            _log(self.log_fd, "", f"refused a client with uid {uid}: only root is served")
            with contextlib.suppress(OSError):
                conn.settimeout(1.0)
                conn.sendall(proto.encode_reply(proto.ST_REFUSED, 0,
                                                b"only root may use the cni-skel worker"))
            return _ANSWERED
        conn.settimeout(REQUEST_TIMEOUT)
        try:
            fields, fds = _read_request(conn)
        except (OSError, ValueError) as exc:
            _log(self.log_fd, "", f"bad request: {exc}")
            with contextlib.suppress(OSError):
                conn.sendall(proto.encode_reply(proto.ST_BAD, 0, str(exc).encode()))
            return _ANSWERED
        try:
            return self._serve_request(conn, fields, fds, peer_pid)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _accept(self) -> socket.socket | None:
        """Wait for a connection (None: the worker is stopping)."""
        assert self.sock is not None
        while True:
            ready, _, _ = select.select([self.sock, self.stop_r], [], [])
            if self.stop_r in ready:
                return None
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another spare took it
            return conn

    def _serve_request(self, conn: socket.socket, fields: list[bytes], fds: list[int],
                       peer_pid: int = 0) -> int:
        kind = fields[0]
        if kind == b"ping":
            from . import __version__

            text = (f"cni-skel worker {__version__} pid {os.getppid()} on {self.path}; "
                    f"warm plugins: {', '.join(sorted(self.plugins)) or 'none'}")
            conn.sendall(proto.encode_reply(proto.ST_PONG, 0, text.encode()))
            return _ANSWERED
        if kind != b"run" or len(fields) != 7 or len(fds) != 3:
            raise_bad = f"unknown request {kind[:20]!r} with {len(fields)} fields, {len(fds)} fds"
            conn.sendall(proto.encode_reply(proto.ST_BAD, 0, raise_bad.encode()))
            return _ANSWERED
        start = time.monotonic()
        _, ref_b, pp_b, cwd_b, umask_b, env_b, stdin = fields
        ref = ref_b.decode()
        env = dict(item.split(b"=", 1) for item in env_b.split(b"\0") if b"=" in item)
        cid = env.get(b"CNI_CONTAINERID", b"").decode("utf-8", "replace")
        cmd = env.get(b"CNI_COMMAND", b"").decode("utf-8", "replace")
        with contextlib.suppress(OSError):
            self.info_w.send("\0".join(("request", str(os.getpid()), cid, cmd, ref,
                                        _config_version(stdin))).encode())

        plugin = self.plugins.get(ref)
        if plugin is None:
            plugin = _import_plugin(ref, [os.fsdecode(p) for p in pp_b.split(b"\0") if p])
            if isinstance(plugin, str):
                _log(self.log_fd, cid, f"{cmd} {ref}: unknown plugin ({plugin}); "
                                       "the launcher runs it one-shot")
                conn.sendall(proto.encode_reply(proto.ST_UNKNOWN, 0, plugin.encode()))
                return _ANSWERED

        # The launcher's capabilities: read now (its /proc, before setns), dropped to
        # after entering its namespaces (setns needs CAP_SYS_ADMIN).
        try:
            own, peer = _caps("self"), _caps(peer_pid)
        except (OSError, ValueError) as exc:
            own = peer = None
            why = f"cannot read the launcher's capabilities (pid {peer_pid}): {exc}"
        else:
            why = _caps_beyond(peer, own)
            if why:
                why = f"the launcher holds capabilities this worker lacks ({why})"
        if why:
            _log(self.log_fd, cid, f"{cmd} {ref}: refused, {why}; the launcher runs it one-shot")
            conn.sendall(proto.encode_reply(proto.ST_REFUSED, 0, why.encode()))
            return _ANSWERED

        _enter_context(fds, os.fsdecode(cwd_b), int(umask_b or b"18"), env)
        if peer != own:
            try:
                _drop_caps(peer, own)
            except OSError as exc:  # nothing ran yet: the launcher runs it itself
                _log(self.log_fd, cid, f"{cmd} {ref}: refused, cannot take the launcher's "
                                       f"capabilities ({exc}); the launcher runs it one-shot")
                conn.sendall(proto.encode_reply(proto.ST_REFUSED, 0, str(exc).encode()))
                return _ANSWERED
        from .invoke import set_in_process_runner

        set_in_process_runner(lambda *call: self._delegate_here(cid, *call))
        out, code = _dispatch(plugin, stdin)
        try:
            conn.sendall(proto.encode_reply(proto.ST_DONE, code, out))
        except OSError as exc:
            _log(self.log_fd, cid, f"{cmd} {ref}: exit {code}, but the launcher is gone ({exc})")
            return _CLIENT_GONE
        _log(self.log_fd, cid, f"{cmd} {ref} exit {code}{_error_code(out, code)} "
                               f"{(time.monotonic() - start) * 1e3:.1f} ms")
        return _ANSWERED

    def _delegate_here(self, cid: str, path: str, env: Any, stdin: bytes,
                       stderr: Any) -> tuple[bytes, int] | None:
        """Run a delegated plugin (IPAM) in this child when ``path`` is a
        launcher that would send the call to this very worker (same socket
        inode, plugin warm here): the same dispatch as a fresh child, minus a
        launcher exec and a fork. None: exec it as usual."""
        from .install import launcher_info
        from .launcher import SOCKET_ENV
        from .skel import dispatch

        info = launcher_info(path)
        if info is None or info["ref"] not in self.plugins:
            return None
        try:
            st = os.stat(env.get(SOCKET_ENV) or info["socket"])
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != self.ident:
            return None
        start = time.monotonic()
        cmd = env.get("CNI_COMMAND", "")
        try:
            out, code = dispatch(self.plugins[info["ref"]], env, stdin, stderr)
        except BaseException as exc:  # as a crashing delegate process: exit 1, no JSON
            stderr.write(f"{info['ref']}: {type(exc).__name__}: {exc}\n")
            out, code = b"", 1
        _log(self.log_fd, cid, f"{cmd} {info['ref']} exit {code}{_error_code(out, code)} "
                               f"{(time.monotonic() - start) * 1e3:.1f} ms (delegated, in-process)")
        return out, code


def _read_request(conn: socket.socket) -> tuple[list[bytes], list[int]]:
    """One request: (fields, received fds). Raises ValueError/OSError."""
    fds: list[int] = []
    fd_size = 4
    data, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(8 * fd_size),
                                   socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % fd_size
            fds.extend(int.from_bytes(payload[i:i + fd_size], sys.byteorder)
                       for i in range(0, usable, fd_size))
    try:
        while len(data) < 8:
            more = conn.recv(8 - len(data))
            if not more:
                raise ValueError("truncated request header")
            data += more
        if data[:4] != proto.REQUEST_MAGIC:
            raise ValueError(f"not a cni-skel request: {data[:4]!r}")
        total = 8 + int.from_bytes(data[4:8], "big")
        chunks, have = [data], len(data)
        while have < total:
            more = conn.recv(min(total - have, 1 << 20))
            if not more:
                raise ValueError("truncated request")
            chunks.append(more)
            have += len(more)
        fields = proto.decode_fields(b"".join(chunks)[8:total])
        if not fields:
            raise ValueError("empty request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fields, fds


def _rehearse(plugins: dict[str, Any]) -> None:
    """Touch what most requests run (config models, netlink reads in the
    worker's own namespace), so that its copy-on-write faults are taken
    while idle. Read-only; failures do not matter."""
    for cls in plugins.values():
        with contextlib.suppress(Exception):
            from .skel import _load_config

            _load_config(cls, {"cniVersion": "1.1.0", "name": "warm", "type": cls.name})
    with contextlib.suppress(Exception):
        from . import netlink
        from .netns import current_netns

        with current_netns() as ns, ns.iproute() as ipr:
            netlink.find_link(ipr, "lo")
            netlink.addresses(ipr, "lo")
            netlink.routes(ipr)


def _config_version(stdin: bytes) -> str:
    from .version import ALL_VERSIONS

    try:
        v = proto.loads_light(stdin).get("cniVersion")
    except Exception:
        return ""
    return v if v in ALL_VERSIONS else ""


def _import_plugin(ref: str, pythonpath: list[str]) -> Any:
    """The class for ``ref``, or a str saying why it cannot be imported."""
    from .skel import _resolve

    if pythonpath:
        sys.path[:0] = pythonpath
    try:
        return _resolve(ref)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _enter_context(fds: list[int], cwd: str, umask: int, env: dict[bytes, bytes]) -> None:
    """Become the launcher: its mount and network namespace, cwd, umask,
    environment; fd 0 /dev/null, fds 1 and 2 its stderr."""
    from .netns import _setns

    net_fd, mnt_fd, err_fd = fds
    if not _same_file(mnt_fd, "/proc/self/ns/mnt"):
        _setns(mnt_fd, CLONE_NEWNS)  # resets cwd and root to the namespace's
    if not _same_file(net_fd, "/proc/self/ns/net"):
        _setns(net_fd, CLONE_NEWNET)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")
    os.umask(umask)
    os.environ.clear()
    for key, value in env.items():
        if key and b"\0" not in key:
            os.environb[key] = value
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(err_fd, 1)
    os.dup2(err_fd, 2)


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _dispatch(plugin: Any, stdin: bytes) -> tuple[bytes, int]:
    from .errors import ERR_INTERNAL, CNIError
    from .skel import _error, dispatch

    try:
        out, code = dispatch(plugin, os.environ, stdin, sys.stderr)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt from plugin code
        out, code = _error(CNIError(ERR_INTERNAL, f"{type(exc).__name__}: {exc}"), None)
    sys.stdout.flush()
    sys.stderr.flush()
    return out, code


def _error_code(out: bytes, code: int) -> str:
    if code == 0 or not out:
        return ""
    import json

    try:
        return f" (code {json.loads(out).get('code')})"
    except Exception:
        return ""


def serve(socket_path: str = DEFAULT_SOCKET, refs: list[str] | None = None, *,
          drain_timeout: float = 30.0, spares: int = 2) -> int:
    """Run a `Worker` in this process (see there); returns an exit status."""
    return Worker(socket_path, refs, drain_timeout=drain_timeout, spares=spares).serve()


def check(socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> tuple[bool, str]:
    """Does a worker answer on ``socket_path``? ``(True, its description)``
    or ``(False, why not)``."""
    return proto.ping(socket_path, timeout)
