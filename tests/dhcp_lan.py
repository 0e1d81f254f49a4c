"""A DHCP server on a LAN, and Go's DHCP IPAM daemon, for the tests of the
``dhcp`` IPAM plugin.

Not a test module: test files import it (tests/ is on sys.path through
conftest.py). Everything runs inside network namespaces the test made; every
file a process writes goes under the directory the test gives (``tmp_path``).

* `DhcpServer`: dnsmasq (Debian's ``dnsmasq-base``, ``/usr/sbin/dnsmasq``)
  serving DHCPv4 on one interface of a namespace, in the foreground, with no
  DNS, its leases (`DhcpServer.leases`) and its log (`DhcpServer.log`,
  `DhcpServer.wait_for`) readable by the test.
* `make_dhcp_lan`: the node/LAN pair of `podlink_common.make_lan` (the node's
  ``eth0`` joined by a veth to ``lan0`` in the LAN, ``10.56.0.1/24``) with a
  `DhcpServer` on ``lan0``: a pod's macvlan on the node's ``eth0`` gets its
  lease from it.
* `GoDhcpDaemon`: Debian's Go ``dhcp`` IPAM daemon (``/usr/lib/cni/dhcp
  daemon``, containernetworking-plugins 1.1.1) run in the node namespace, as
  a node would run it for Go's ``dhcp`` plugin (``ipam.daemonSocketPath``).

Both process classes are context managers; a process still running when the
interpreter exits is stopped then (a safety net, not a substitute for
``with``: a namespace removed at teardown lives on while a process is in it).

Recipes:

* A server that never answers: ``DhcpServer(..., ignore_all=True)``; the
  log still shows every request, marked ``ignored``. Or `DhcpServer.stop`
  it mid-test.
* A NAK (dnsmasq runs ``--dhcp-authoritative``, so it NAKs a DHCPREQUEST it
  will not honour instead of keeping quiet): after a client holds an
  address, ``server.nak_address(ip)`` reserves ``ip`` for another MAC and
  every later REQUEST for it (a renewal at T1, a rebind, a reboot) gets
  ``DHCPNAK(lan0) <ip> <mac> address reserved``. Stopping the server and
  starting one with a disjoint range on the same interface (a fresh lease
  file: another ``tmp_dir`` or ``name``) does too (``address not
  available``). Pinning the client to another address
  (``set_hosts([f"{mac},10.56.0.150"])``: ``static lease available``) NAKs
  only a renewal without a server identifier (busybox udhcpc's), not Go's:
  dnsmasq takes a REQUEST carrying options 50 and 54 for SELECTING, where
  that check is skipped.
* Go's daemon renews at T1 (option 58), so ``t1=5, t2=8`` (and the minimum
  lease, 120 s) gives a renewal every 5 s; busybox udhcpc ignores T1 and
  renews at half the lease (or on SIGUSR1).
* dnsmasq sends an option only when the client lists it in option 55
  (parameter request list), except for the lease time and T1/T2 (always
  sent) and in answers to requests without option 55 (Go's renewals, which
  so get DNS and domain options its first ACK did not).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from podlink_common import make_lan

from cni_skel.harness import TestNetNS

#: Debian's dnsmasq-base.
DNSMASQ = "/usr/sbin/dnsmasq"
#: Debian's Go dhcp IPAM plugin and daemon (containernetworking-plugins 1.1.1).
GO_DHCP = "/usr/lib/cni/dhcp"

#: `make_dhcp_lan`'s LAN: the server's address on ``lan0``, its pool and options.
LAN_ADDRESS = "10.56.0.1/24"
LAN_SUBNET = "10.56.0.0/24"
RANGE_START = "10.56.0.100"
RANGE_END = "10.56.0.199"
ROUTER = "10.56.0.1"
DNS_SERVER = "10.56.0.53"
DOMAIN = "lan.test"

#: The longest path a unix socket can be bound to (sun_path less its NUL).
_SUN_PATH_MAX = 107
_DHCP_SERVER_PORT = 67

#: Processes started here and not yet stopped: stopped at exit if still so.
_running: set[_Process] = set()


def _ns_name(netns: TestNetNS | str) -> str:
    """The name ``ip netns exec`` takes: a `TestNetNS`'s ``.name``; a str is a
    name or a ``/run/netns/<name>`` path."""
    if isinstance(netns, str):
        return os.path.basename(netns) if "/" in netns else netns
    return netns.name


def _udp_port_bound(pid: int, port: int) -> bool:
    """Whether a UDP socket of the namespace process ``pid`` is in is bound
    to ``port`` (``/proc/<pid>/net/udp`` lists that namespace's sockets)."""
    try:
        with open(f"/proc/{pid}/net/udp") as fp:
            next(fp)  # the header
            return any(line.split()[1].endswith(f":{port:04X}") for line in fp)
    except (OSError, StopIteration, IndexError):
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


class _Process:
    """A child process started in a namespace with ``ip netns exec`` (which
    execs it: `pid` is the program's own) and its output in a file."""

    proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, netns: TestNetNS | str, argv: list[str], output: Path) -> None:
        with open(output, "ab") as out:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", _ns_name(netns), *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        _running.add(self)

    @property
    def pid(self) -> int:
        """The process ID (the program's: ``ip netns exec`` execs it)."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    def running(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def _terminate(self, timeout: float = 5.0) -> None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL and wait; idempotent."""
        _running.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def stop(self) -> None:
        self._terminate()

    def _wait_ready(self, ready: Callable[[], bool], timeout: float, what: str,
                    not_ready: str, output: Callable[[], str]) -> None:
        """Poll ``ready()`` while running, up to ``timeout`` s; otherwise stop
        and raise RuntimeError naming ``what``, why and its ``output()``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            if ready():
                return
            time.sleep(0.02)
        alive = self.running()
        self.stop()
        raise RuntimeError(f"{what} {not_ready if alive else 'exited'}: {output()}")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@atexit.register
def _stop_leftovers() -> None:
    for p in list(_running):
        with contextlib.suppress(Exception):
            p.stop()


@dataclass(frozen=True)
class Lease:
    """One line of dnsmasq's lease file: ``expiry`` (Unix time; 0 for an
    infinite lease), the client's ``mac`` (lower case), ``ip``, ``hostname``
    (None when the client sent none) and ``client_id`` (option 61 as dnsmasq
    writes it, colon-separated hex bytes such as ``00:63:31:2f...``; None
    when the client sent none)."""

    expiry: int
    mac: str
    ip: str
    hostname: str | None
    client_id: str | None

    @property
    def client_id_bytes(self) -> bytes | None:
        """``client_id`` as bytes."""
        return None if self.client_id is None else bytes.fromhex(self.client_id.replace(":", ""))


def client_id_hex(container_id: str, net_name: str, ifname: str) -> str:
    """The client identifier Go's dhcp plugin sends (option 61: type 0, then
    ``<containerID>/<netName>/<ifName>``), written as dnsmasq writes client
    IDs (in `Lease.client_id`, and in ``id:`` of `DhcpServer.set_hosts`)."""
    raw = b"\0" + f"{container_id}/{net_name}/{ifname}".encode()
    return ":".join(f"{b:02x}" for b in raw)


class DhcpServer(_Process):
    """dnsmasq serving DHCPv4 on ``ifname`` of ``netns`` (a `TestNetNS`, or a
    namespace name or ``/run/netns`` path), started by the constructor and
    waited for until it has bound the DHCP port (``start_timeout`` seconds at
    most, else RuntimeError with its output).

    The pool: ``range_start``..``range_end`` with ``netmask`` (the range must
    lie in the subnet of an address of ``ifname``) leased for
    ``lease_seconds`` (dnsmasq's minimum is 120; None: infinite). Options
    sent: ``t1``/``t2`` (58/59, seconds; default: dnsmasq's own, half and
    7/8 of the lease), ``router`` (3), ``dns`` (6), ``domain`` (15),
    ``classless_routes`` (121: ``(destination CIDR, gateway)`` pairs) and
    ``options``, raw ``--dhcp-option`` values (``"option:mtu,1400"``,
    ``"26,1400"``). No ``router`` / no ``dns`` means no option 3 / 6 at all
    (dnsmasq would otherwise offer its own address for both).

    ``ignore_all``: answer no one (every request is logged as ``ignored``).
    ``hosts``: initial ``--dhcp-hostsfile`` lines (`set_hosts`).

    Its files in ``tmp_dir``: ``<name>.leases`` (`leases`), ``<name>.log``
    (`log`: ``--log-dhcp`` detail, every option sent), ``<name>.out`` (its
    stdout/stderr: startup errors), ``<name>.pid``, ``<name>.hosts``.
    """

    def __init__(self, netns: TestNetNS | str, ifname: str, tmp_dir: str | os.PathLike[str], *,
                 range_start: str, range_end: str, netmask: str = "255.255.255.0",
                 lease_seconds: int | None = 120, t1: int | None = None,
                 t2: int | None = None, router: str | None = None, dns: Sequence[str] = (),
                 domain: str | None = None,
                 classless_routes: Sequence[tuple[str, str]] = (),
                 options: Sequence[str] = (), ignore_all: bool = False,
                 hosts: Sequence[str] = (), name: str = "dnsmasq",
                 start_timeout: float = 10.0) -> None:
        if lease_seconds is not None and lease_seconds < 120:
            raise ValueError(f"dnsmasq leases last 120 s at least, not {lease_seconds}")
        self.netns = netns
        self.ifname = ifname
        base = Path(tmp_dir)
        base.mkdir(parents=True, exist_ok=True)
        self.lease_file = base / f"{name}.leases"
        self.log_file = base / f"{name}.log"
        self.out_file = base / f"{name}.out"
        self.pid_file = base / f"{name}.pid"
        self.hosts_file = base / f"{name}.hosts"
        self.hosts: list[str] = list(hosts)
        self.hosts_file.write_text("".join(f"{h}\n" for h in self.hosts))
        lease = "infinite" if lease_seconds is None else str(lease_seconds)
        self.argv = [
            DNSMASQ,
            "--keep-in-foreground",       # no fork: our child is dnsmasq itself
            "--conf-file=/dev/null",      # not /etc/dnsmasq.conf
            "--port=0",                   # no DNS
            "--user=root", "--group=root",  # it rereads hosts under tmp_path (0700)
            "--bind-interfaces", f"--interface={ifname}",
            "--except-interface=lo",
            "--dhcp-authoritative",       # NAK requests it cannot honour, no waiting
            "--no-ping",                  # offer at once (no ICMP probe of the address)
            f"--dhcp-leasefile={self.lease_file}",
            f"--dhcp-hostsfile={self.hosts_file}",
            "--log-dhcp",
            f"--log-facility={self.log_file}",
            f"--pid-file={self.pid_file}",
            f"--dhcp-range={range_start},{range_end},{netmask},{lease}",
        ]
        opts: list[str] = []
        if t1 is not None:
            opts.append(f"option:T1,{t1}")
        if t2 is not None:
            opts.append(f"option:T2,{t2}")
        opts.append(f"option:router,{router}" if router else "3")
        opts.append("option:dns-server," + ",".join(dns) if dns else "6")
        if domain:
            opts.append(f"option:domain-name,{domain}")
        if classless_routes:
            opts.append("option:classless-static-route,"
                        + ",".join(f"{dst},{gw}" for dst, gw in classless_routes))
        opts.extend(options)
        self.argv += [f"--dhcp-option={o}" for o in opts]
        if ignore_all:
            self.argv.append("--dhcp-ignore=tag:!known")  # known: has a dhcp-host line
        self._spawn(netns, self.argv, self.out_file)
        self._wait_ready(
            lambda: _udp_port_bound(self.pid, _DHCP_SERVER_PORT) and "DHCP, " in self.log(),
            start_timeout, "dnsmasq", "did not bind in time",
            lambda: _read(self.out_file) + self.log())

    def leases(self) -> list[Lease]:
        """The leases in dnsmasq's lease file now (it rewrites the file after
        every change; DHCPv6 lines are left out)."""
        out = []
        for line in _read(self.lease_file).splitlines():
            f = line.split()
            if len(f) < 5 or f[0] == "duid" or ":" in f[2]:
                continue
            out.append(Lease(int(f[0]), f[1].lower(), f[2], None if f[3] == "*" else f[3],
                             None if f[4] == "*" else f[4]))
        return out

    def log(self) -> str:
        """Everything dnsmasq has logged so far."""
        return _read(self.log_file)

    def mark(self) -> int:
        """Where the log ends now: ``wait_for(..., since=mark)`` looks only
        at what comes after."""
        return len(self.log())

    def wait_for(self, pattern: str, timeout: float = 10.0, *, since: int = 0) -> str:
        """The first log line (after offset ``since``) matching the regex
        ``pattern``, polling the log for up to ``timeout`` s; TimeoutError
        (with the log) otherwise, and at once if dnsmasq has exited."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log()[since:].splitlines():
                if rx.search(line):
                    return line
            if time.monotonic() >= deadline or not self.running():
                raise TimeoutError(f"no log line matching {pattern!r} in {timeout} s "
                                   f"(dnsmasq running: {self.running()}):\n{self.log()}")
            time.sleep(0.05)

    def set_hosts(self, lines: Iterable[str]) -> None:
        """Replace the ``--dhcp-hostsfile`` lines (`hosts`; ``dhcp-host``
        syntax without the key: ``<mac>,<ip>``, ``id:<client-id>,<ip>``
        (`client_id_hex`), ``<mac>,ignore``) and make dnsmasq reread them
        (SIGHUP); returns once it has logged the reread. A host with a line
        is ``known``: answered even with ``ignore_all``."""
        assert self.proc is not None and self.running(), "dnsmasq is not running"
        self.hosts = list(lines)
        self.hosts_file.write_text("".join(f"{h}\n" for h in self.hosts))
        since = self.mark()
        self.proc.send_signal(signal.SIGHUP)
        self.wait_for(re.escape(f"read {self.hosts_file}"), 5.0, since=since)

    def nak_address(self, ip: str, mac: str = "02:00:00:00:00:01") -> None:
        """Reserve ``ip`` for ``mac`` (a host that never asks): from now on
        every REQUEST for ``ip`` from anyone else is NAK'd (``address
        reserved``), renewals included."""
        self.set_hosts([*self.hosts, f"{mac},{ip}"])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; idempotent. Its files stay."""
        self._terminate()


@dataclass
class DhcpLan:
    """`make_dhcp_lan`'s pieces: the ``node`` namespace (``master`` in it, up,
    no address: pods' macvlans go on it), the ``lan`` namespace (``lan0``,
    `LAN_ADDRESS`) and the ``server`` on ``lan0``. A context manager that
    stops the server."""

    node: TestNetNS
    lan: TestNetNS
    server: DhcpServer
    master: str = "eth0"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.server.stop()


def make_dhcp_lan(netns_factory: Any, tmp_path: str | os.PathLike[str],
                  **server_kwargs: Any) -> DhcpLan:
    """A node and a LAN (`podlink_common.make_lan`: ``eth0`` in the node,
    ``lan0`` with `LAN_ADDRESS` in the LAN) and a `DhcpServer` on ``lan0``
    leasing `RANGE_START`..`RANGE_END` for 120 s with router `ROUTER`, DNS
    `DNS_SERVER` and domain `DOMAIN`. ``server_kwargs`` override or add to
    these (any `DhcpServer` keyword: ``t1=5, ignore_all=True, ...``). Its
    files go in ``tmp_path``. Use it in ``with`` (or ``.server.stop()``)."""
    lan = make_lan(netns_factory, master="eth0", lan_ips=(LAN_ADDRESS,))
    kw: dict[str, Any] = {"range_start": RANGE_START, "range_end": RANGE_END,
                          "router": ROUTER, "dns": (DNS_SERVER,), "domain": DOMAIN,
                          **server_kwargs}
    server = DhcpServer(lan.lan, "lan0", tmp_path, **kw)
    return DhcpLan(lan.node, lan.lan, server, lan.master)


class GoDhcpDaemon(_Process):
    """Debian's Go dhcp daemon (``/usr/lib/cni/dhcp daemon``, 1.1.1) run in
    ``netns`` (the node's), listening on ``socket_path`` (default
    ``<tmp_dir>/dhcp.sock``; a path too long for a unix socket is replaced
    by one in a fresh short directory under /tmp, removed by `stop`),
    started by the constructor and waited for until the socket accepts
    connections (``start_timeout`` s at most, else RuntimeError).

    ``binary``: another build's dhcp (Go 1.9.1's takes the same flags).
    Its 1.1.1 flags: ``timeout`` (one DHCP exchange, Go's default 10 s),
    ``resendmax`` (the most it backs off between resends, default 62 s),
    ``broadcast`` (ask for broadcast replies), ``hostprefix`` (a prefix
    before the CNI_NETNS paths it opens). Durations in seconds. Its output
    (Go's log) is ``<tmp_dir>/dhcp-daemon.log`` (`log`).

    Go's plugin finds it through ``ipam.daemonSocketPath``: `ipam` gives
    that section.
    """

    def __init__(self, netns: TestNetNS | str, tmp_dir: str | os.PathLike[str], *,
                 socket_path: str | os.PathLike[str] | None = None,
                 timeout: float | None = None, resendmax: float | None = None,
                 broadcast: bool = False, hostprefix: str | None = None,
                 start_timeout: float = 10.0, binary: str = GO_DHCP) -> None:
        base = Path(tmp_dir)
        base.mkdir(parents=True, exist_ok=True)
        self._short_dir: str | None = None
        sock = str(socket_path) if socket_path is not None else str(base / "dhcp.sock")
        if len(os.fsencode(sock)) > _SUN_PATH_MAX:
            self._short_dir = tempfile.mkdtemp(prefix="cnsk-dhcpd-")
            sock = os.path.join(self._short_dir, "dhcp.sock")
        self.socket_path = sock
        self.log_file = base / "dhcp-daemon.log"
        self.pid_file = base / "dhcp-daemon.pid"
        self.argv = [binary, "daemon", "-socketpath", sock, "-pidfile", str(self.pid_file)]
        if timeout is not None:
            self.argv += ["-timeout", f"{timeout}s"]
        if resendmax is not None:
            self.argv += ["-resendmax", f"{resendmax}s"]
        if broadcast:
            self.argv.append("-broadcast")
        if hostprefix is not None:
            self.argv += ["-hostprefix", hostprefix]
        self._spawn(netns, self.argv, self.log_file)
        self._wait_ready(self._accepts, start_timeout, "Go's dhcp daemon",
                         "did not listen in time", self.log)

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(self.socket_path)
            except OSError:
                return False
            return True

    def ipam(self, **extra: Any) -> dict[str, Any]:
        """An ``ipam`` section for Go's dhcp plugin using this daemon."""
        return {"type": "dhcp", "daemonSocketPath": self.socket_path, **extra}

    def log(self) -> str:
        """Its output so far (Go's log: one line per lease event or error)."""
        return _read(self.log_file)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; its socket (and the short
        directory, if one was made) removed; idempotent. It releases no
        lease on the way out."""
        self._terminate()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None
