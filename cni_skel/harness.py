"""Run plugin executables the way a runtime does, in named network namespaces.

No pytest here: `cni_skel.testing` builds its fixtures on this, and
``cni-skel demo`` (`cni_skel.demo`) uses it directly: namespaces, plugin
executables, the traffic checks (`tcp_echo`, `icmp_ping`), and the worker's
systemd units run as systemd runs them (`SocketActivation`). Needs root
(namespaces, raw sockets) and iproute2 (``ip netns exec`` gives the plugin
the node namespace's own /sys).
"""

from __future__ import annotations

import builtins
import contextlib
import ipaddress
import itertools
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyroute2 import netns as ip_netns

from .errors import CNIError
from .netns import NetNS
from .nft import Nft, Table
from .warm.install import (
    SERVICE_UNIT,
    SOCKET_UNIT,
    systemd_units,
    write_executable,
    write_units,
)
from .warm.protocol import REQUIRED_ENV, WARNINGS_ENV

__all__ = [
    "PluginRun",
    "SocketActivation",
    "TestNetNS",
    "create_netns",
    "icmp_ping",
    "install_plugin",
    "nft_table",
    "remove_netns",
    "run_plugin",
    "run_plugin_raw",
    "tcp_echo",
    "unit_values",
]

NETNS_DIR = "/run/netns"
#: In every name `create_netns` makes: a token of this process, so that two
#: suites on one machine (even in PID namespaces of their own that share
#: /run/netns) never take each other's names.
SUITE_TAG = secrets.token_hex(3)
_counter = itertools.count()


@dataclass(frozen=True)
class TestNetNS:
    """A named network namespace made for a test: ``path`` is what CNI_NETNS gets."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    name: str
    path: str


def create_netns(prefix: str = "cnsk") -> TestNetNS:
    """Create a network namespace named ``<prefix>-<pid>-<SUITE_TAG>-<n>``
    (``pid``: this process, ``SUITE_TAG``: 6 random hex digits per process,
    ``n``: a counter), e.g. ``cnsk-node-4242-a1b2c3-0``, with only ``lo``,
    down; its ``path`` is ``/run/netns/<name>``. ``prefix`` is yours to pick
    (a file name: no ``/``) so that ``ip netns list`` tells your suite's
    namespaces apart. Nothing removes it but `remove_netns` (the
    ``netns_factory`` fixture of `cni_skel.testing` calls it at teardown).

    Raises:
        OSError: the namespace cannot be made (not root; the name taken).
    """
    name = f"{prefix}-{os.getpid()}-{SUITE_TAG}-{next(_counter)}"
    ip_netns.create(name)
    return TestNetNS(name, os.path.join(NETNS_DIR, name))


def remove_netns(ns: TestNetNS) -> None:
    """Remove a namespace made by `create_netns`; missing is fine."""
    if os.path.exists(ns.path):
        ip_netns.remove(ns.name)


def install_plugin(bin_dir: str | os.PathLike, name: str, ref: str, *,
                   python: str | None = None, pythonpath: list[str] | None = None,
                   worker_socket: str | None = None) -> str:
    """Write an executable ``bin_dir/name`` that runs plugin class ``ref``
    (``"module:Class"``), as ``cni-skel install`` does; returns its path.
    ``pythonpath``: extra import directories (a plugin not installed as a
    package, such as one in your tests folder).

    ``worker_socket``: None (default) writes a plain one-shot script
    (``install --one-shot``): every call runs the code of this checkout,
    whatever worker the machine runs. A path makes the executable a launcher
    that hands each call to ``cni-skel worker`` there (one your test started,
    to test warm mode) and runs the plugin itself when none answers;
    ``cni_skel.warm.protocol.DEFAULT_SOCKET`` is the node's own worker, as
    ``cni-skel install`` writes it (the test then runs whatever code that
    worker has loaded)."""
    return write_executable(os.fspath(bin_dir), name, ref, python=python, force=True,
                            pythonpath=pythonpath, worker_socket=worker_socket)


def nft_table(ns: TestNetNS | str, family: str, name: str) -> Table | None:
    """List nftables table ``family name`` inside namespace ``ns`` (a
    `TestNetNS` or a netns path) as a `cni_skel.nft.Table`; None when absent.
    For asserting on what the kernel really holds."""
    with NetNS.open(_ns_path(ns)) as target:
        return target.run(lambda: Nft().table(family, name))


def _ns_path(ns: TestNetNS | str) -> str:
    return ns.path if isinstance(ns, TestNetNS) else ns


def tcp_echo(server_ns: TestNetNS | str, server_ip: str, client_ns: TestNetNS | str,
             dest_ip: str | None = None, port: int = 7777, payload: bytes = b"cni-skel",
             timeout: float = 5.0, dest_port: int | None = None) -> tuple[bytes, str]:
    """One TCP round trip between two namespaces, in-process (no tools needed).

    A listener bound to ``server_ip``:``port`` is created inside
    ``server_ns`` (a socket belongs to the namespace it was created in); a
    client created inside ``client_ns`` connects to ``dest_ip``:``dest_port``
    (default ``server_ip``:``port``; another address or port when a NAT rule,
    such as a port mapping, should redirect), sends ``payload`` and reads
    the echo. Everything is bounded by ``timeout``
    seconds.

    Returns:
        ``(echoed bytes, client address as the server saw it)``.

    Raises:
        OSError: connection refused / timed out (no route, dropped frames).
    """
    family = socket.AF_INET6 if ipaddress.ip_address(server_ip).version == 6 else socket.AF_INET
    with NetNS.open(_ns_path(server_ns)) as sns, sns.enter():
        listener = socket.socket(family, socket.SOCK_STREAM)
    seen: list[str] = []
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((server_ip, port))
        listener.listen(1)
        listener.settimeout(timeout)

        def serve() -> None:
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(timeout)
                seen.append(peer[0])
                data = conn.recv(65536)
                conn.sendall(data)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with NetNS.open(_ns_path(client_ns)) as cns, cns.enter():
                client = socket.socket(family, socket.SOCK_STREAM)
            with client:
                client.settimeout(timeout)
                client.connect((dest_ip or server_ip, dest_port or port))
                client.sendall(payload)
                echoed = client.recv(65536)
        finally:
            # An accept still waiting keeps the port bound after close():
            # wake it first, so the next call can bind the same port.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            thread.join(timeout)
    finally:
        listener.close()
    return echoed, (seen[0] if seen else "")


def icmp_ping(src_ns: TestNetNS | str, dst: str, count: int = 3, timeout: float = 1.0,
              interval: float = 0.2) -> list[float]:
    """ICMP echo (IPv4) from inside ``src_ns`` to ``dst``, in-process (a raw
    socket created in that namespace: root; no ping binary needed).

    Sends ``count`` echo requests, ``interval`` seconds apart, and waits up
    to ``timeout`` seconds for each reply.

    Returns:
        the round-trip times (ms) of the replies received; empty when none
        came back.
    """
    with NetNS.open(_ns_path(src_ns)) as ns, ns.enter():
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    payload = b"cni-skel ping"
    rtts = []
    with sock:
        for seq in range(1, count + 1):
            header = struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0, 0, ident, seq)
            packet = struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0,
                                 _inet_checksum(header + payload), ident, seq) + payload
            sent = time.monotonic()
            sock.sendto(packet, (dst, 0))
            deadline = sent + timeout
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    break
                data, addr = sock.recvfrom(2048)
                ihl = (data[0] & 0x0F) * 4        # a raw socket gets the IP header too
                rtype, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
                if addr[0] == dst and rtype == _ICMP_ECHO_REPLY and (rid, rseq) == (ident, seq):
                    rtts.append((time.monotonic() - sent) * 1000)
                    break
            if seq < count:
                time.sleep(interval)
    return rtts


_ICMP_ECHO_REQUEST = 8
_ICMP_ECHO_REPLY = 0


def _inet_checksum(data: bytes) -> int:
    # RFC 1071: one's complement of the one's complement sum of 16-bit words.
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


@dataclass
class PluginRun:
    """One raw invocation: exit code, stdout bytes, its decoded JSON (None
    when empty), stderr text."""

    exit_code: int
    stdout: bytes
    doc: Any
    stderr: str


def run_plugin_raw(executable: str, command: str, config: Mapping[str, Any] | bytes | str = b"",
                   *, container_id: str = "cnsk-ctr", netns: str = "", ifname: str = "eth0",
                   cni_args: str = "", cni_path: str | None = None,
                   node: TestNetNS | None = None, env: Mapping[str, str] | None = None,
                   replace_env: bool = False, timeout: float = 60.0) -> PluginRun:
    """Run ``executable`` like a runtime: CNI_* env, config on stdin.

    ``node``: run it inside that namespace (through ``ip netns exec``, which
    also gives it the namespace's own /sys); default the current one.
    ``cni_path`` defaults to the executable's directory. ``env`` adds
    variables (``replace_env=True``: use exactly ``env``, no CNI_* added).
    As a runtime passes its own environment on, ``CNI_SKEL_WORKER_REQUIRED``
    (launchers must be served by the worker, see `cni_skel.warm.client`) is
    passed through from this process's environment when set (not with
    ``replace_env``).

    Warnings the plugin raised (its DeprecationWarnings included) are raised
    again here, with the plugin's file, line and module, so pytest lists
    them and ``-W error::DeprecationWarning`` fails the test: for a one-shot
    executable (`install_plugin`'s default; not with ``replace_env``, nor
    for calls a worker serves).

    Asserts the protocol's output rule: stdout is empty or exactly one JSON
    document, and never a Python traceback.
    """
    if isinstance(config, Mapping):
        stdin = json.dumps(config).encode()
    elif isinstance(config, str):
        stdin = config.encode()
    else:
        stdin = config
    if replace_env:
        child_env = dict(env or {})
    else:
        child_env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_ARGS": cni_args,
            "CNI_PATH": cni_path if cni_path is not None else os.path.dirname(executable),
        }
        if os.environ.get(REQUIRED_ENV):
            child_env[REQUIRED_ENV] = os.environ[REQUIRED_ENV]
        child_env.update(env or {})
    argv = [executable]
    if node is not None:
        argv = ["ip", "netns", "exec", node.name, executable]
    with tempfile.TemporaryDirectory(prefix="cnsk-warnings-") as tmp:
        if not replace_env and WARNINGS_ENV not in child_env:
            child_env[WARNINGS_ENV] = os.path.join(tmp, "warnings.jsonl")
        proc = subprocess.run(argv, input=stdin, env=child_env, capture_output=True,
                              timeout=timeout, check=False)
        _raise_again(child_env.get(WARNINGS_ENV, ""), tmp)
    out = proc.stdout
    assert b"Traceback (most recent call last)" not in out, out.decode(errors="replace")
    doc = None
    if out.strip():
        try:
            doc = json.loads(out)
        except ValueError as exc:
            raise AssertionError(f"stdout is not one JSON document: {out[:500]!r}") from exc
    return PluginRun(proc.returncode, out, doc, proc.stderr.decode("utf-8", "replace"))


def _raise_again(path: str, tmp: str) -> None:
    """Raise here the warnings a plugin process recorded in ``path``
    (`cni_skel.skel.run_plugin_main`), when it is ours (in ``tmp``)."""
    if os.path.dirname(path) != tmp or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as fp:
        entries = [json.loads(line) for line in fp if line.strip()]
    for entry in entries:
        category = getattr(builtins, entry["category"], None)
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn_explicit(entry["message"], category, entry["filename"], entry["lineno"],
                               module=entry["module"] or None)


def run_plugin(executable: str, command: str, config: Mapping[str, Any] | bytes | str,
               **kwargs: Any) -> Any:
    """`run_plugin_raw`, then: exit 0 -> the decoded stdout (None when empty);
    non-zero -> raise `CNIError` with the plugin's code, msg and details
    (``.stderr`` holds its stderr)."""
    run = run_plugin_raw(executable, command, config, **kwargs)
    if run.exit_code == 0:
        return run.doc
    if isinstance(run.doc, dict) and "code" in run.doc:
        raise CNIError.from_dict(run.doc, stderr=run.stderr)
    raise CNIError(999, f"plugin exited {run.exit_code} without an Error object",
                   run.stderr[-2000:], stderr=run.stderr)


def unit_values(path: str, key: str) -> list[str]:
    """Every value of ``key=`` in a unit file (no continuation lines in ours)."""
    with open(path) as fp:
        return [line.split("=", 1)[1].strip() for line in fp
                if line.startswith(f"{key}=")]


class SocketActivation:
    """Run ``<unit_dir>/cni-skel-worker.{socket,service}`` (what ``cni-skel
    install`` writes) as systemd would, where systemd is not PID 1: listen
    on the socket unit's ``ListenStream`` (mode 0600, its directory 0755)
    and keep that socket for the whole life of this object; on the first
    connection Debian's ``systemd-socket-activate`` execs the service's own
    ``ExecStart`` with the socket as fd 3 (``LISTEN_FDS``/``LISTEN_PID``),
    and after that process exits (``--idle-exit``) the next connection
    starts a new one.

    ``extra_args``: appended to ExecStart (the suite's preloads); ``env``:
    the service's environment; its output goes to ``log_path``. `procs` are
    the worker processes started so far (the last one is current).
    """

    def __init__(self, unit_dir: str, log_path: str, *, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        if shutil.which("systemd-socket-activate") is None:
            raise RuntimeError("systemd-socket-activate is missing: `make test` installs "
                               "Debian's systemd package")
        (self.path,) = unit_values(os.path.join(unit_dir, SOCKET_UNIT), "ListenStream")
        (exec_start,) = unit_values(os.path.join(unit_dir, SERVICE_UNIT), "ExecStart")
        self.argv = [*shlex.split(exec_start), *extra_args]
        self.env = env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        self.listener.listen(128)
        self.procs: list[subprocess.Popen] = []
        self._stopping = threading.Event()
        self._spawned = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="socket-activation",
                                        daemon=True)
        self._thread.start()
        self._spawned.wait(10)

    @classmethod
    def install(cls, unit_dir: str, socket_path: str, log_path: str,
                **options: Any) -> SocketActivation:
        """Write the units ``cni-skel install`` writes for ``socket_path`` (this
        interpreter, no idle exit) into ``unit_dir`` and run them
        (``options``: see the class)."""
        write_units(unit_dir, systemd_units(sys.executable, socket_path, None))
        return cls(unit_dir, log_path, **options)

    def _spawn(self) -> subprocess.Popen:
        # The socket as fd 3 and LISTEN_PID the activator's own pid (it execs
        # in place): set up in a small Python, as dash cannot move fd >= 10.
        setup = ("import os, sys; fd = int(sys.argv[1])\n"
                 "if fd != 3: os.dup2(fd, 3); os.close(fd)\n"
                 "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
                 "os.execvp(sys.argv[2], sys.argv[2:])")
        fd = self.listener.fileno()
        # It passes on only the variables named with -E (as a unit's Environment=).
        keep = [f"--setenv={k}" for k in self.env if not k.startswith("LISTEN_")]
        return subprocess.Popen([sys.executable, "-I", "-c", setup, str(fd),
                                 "systemd-socket-activate", *keep, *self.argv], pass_fds=(fd,),
                                stdin=subprocess.DEVNULL, stdout=self._log,
                                stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            proc = self._spawn()
            self.procs.append(proc)
            self._spawned.set()
            while proc.poll() is None and not self._stopping.is_set():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
            if proc.poll() is not None and proc.returncode != 0:
                time.sleep(1)  # as RestartSec=1 after a failure

    @property
    def proc(self) -> subprocess.Popen:
        """The current (last started) activator/worker process."""
        return self.procs[-1]

    def log(self, offset: int = 0) -> str:
        with open(self.log_path, "rb") as fp:
            fp.seek(offset)
            return fp.read().decode("utf-8", "replace")

    def stop(self) -> int | None:
        """Stop as ``systemctl stop`` would: SIGTERM the current worker, wait
        for its drain, SIGKILL what is left; close and remove the socket.
        Returns the last worker's exit status (None: killed)."""
        self._stopping.set()
        self._thread.join(10)
        status = None
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = proc.wait(20)
            else:
                status = proc.returncode
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait(10)
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._log.close()
        return status
