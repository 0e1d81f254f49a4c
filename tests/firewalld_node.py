"""A throw-away firewalld for the firewall plugin's firewalld backend:
Debian's firewalld (1.3, nftables backend) on a private D-Bus, inside a
network namespace the test made.

- dbus-daemon runs a system-type bus of its own (config written to the
  test's directory: a unix socket there, EXTERNAL authentication, every
  name, call and reply allowed), so nothing touches the machine's bus.
- firewalld runs inside the namespace (its nftables table ``inet
  firewalld`` lands there, never in the machine's root namespace) with
  ``DBUS_SYSTEM_BUS_ADDRESS`` set to that bus, its system configuration
  (``--system-config``: firewalld.conf, zones) in the test's directory, the
  packaged defaults (``/usr/lib/firewalld``) read as they are, its log in
  the test's directory and no pid file (``--nopid``). ``ip netns exec``
  gives it a mount namespace of its own, where a tmpfs over /run takes the
  temporary files firewalld's iptables/ebtables calls write
  (/run/firewalld/temp.*) and their lock.
- Both are in sessions of their own; leaving the context stops firewalld
  (SIGTERM: it removes its table; SIGKILL after `STOP_TIMEOUT`) and then
  the bus, and kills whatever is left in either session.

Clients find the bus through ``DBUS_SYSTEM_BUS_ADDRESS`` (`FirewalldNode.env`):
jeepney (our plugin) and godbus (Go's plugin: godbus v5's ``SystemBus``
reads it, conn_unix.go) both do. From another test module::

    @pytest.fixture(scope="module")
    def fwd_node(tmp_path_factory):
        ns = create_netns("cnsk-fwd")
        with firewalld_in(ns.name, tmp_path_factory.mktemp("firewalld")) as node:
            yield node
        remove_netns(ns)

    def test_add(fwd_node, netns_factory, cni_bin):
        pod = netns_factory("cnsk-pod")
        run_plugin(os.path.join(cni_bin, "firewall"), "ADD", conf, netns=pod.path,
                   node=fwd_node.ns, env=fwd_node.env())
        with Firewalld(fwd_node.bus_address) as fwd:
            assert fwd.query_source("trusted", "10.88.0.5/32")

Not a test module: tests/test_firewalld.py imports it (tests/ is on
sys.path through conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jeepney import DBusAddress, Properties, message_bus, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

from cni_skel.harness import NETNS_DIR, TestNetNS

FIREWALLD = "/usr/sbin/firewalld"
DBUS_DAEMON = "/usr/bin/dbus-daemon"
#: firewalld's packaged zones, services, policies... (read, never written).
DEFAULT_CONFIG = "/usr/lib/firewalld"
#: Debian packages this needs (`make deps` installs them).
PACKAGES = ("firewalld", "dbus-daemon")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
BUS_NAME = "org.fedoraproject.FirewallD1"
MAIN_PATH = "/org/fedoraproject/FirewallD1"
MAIN_INTERFACE = "org.fedoraproject.FirewallD1"
ZONE_INTERFACE = "org.fedoraproject.FirewallD1.zone"
CONFIG_PATH = "/org/fedoraproject/FirewallD1/config"
CONFIG_INTERFACE = "org.fedoraproject.FirewallD1.config"
_MAIN = DBusAddress(MAIN_PATH, bus_name=BUS_NAME, interface=MAIN_INTERFACE)
_SUN_PATH_MAX = 107  # sockaddr_un's sun_path, less its NUL
_BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

_BUS_CONF = """\
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""

# Fixed here rather than copied from the machine's /etc/firewalld, so the
# tests see firewalld's stock behaviour whatever the machine's settings.
_FIREWALLD_CONF = """\
DefaultZone=public
CleanupOnExit=yes
CleanupModulesOnExit=no
Lockdown=no
IPv6_rpfilter=yes
IndividualCalls=no
LogDenied=off
FirewallBackend=nftables
FlushAllOnReload=yes
RFC3964_IPv4=yes
"""

# Run by sh inside `ip netns exec`'s mount namespace (a slave of the
# machine's: nothing mounted here shows outside), then exec'd into firewalld.
_PRIVATE_RUN = 'mount -t tmpfs -o mode=0755,size=16m cnsk-firewalld /run && exec "$@"'


class FirewalldStartError(RuntimeError):
    """dbus-daemon or firewalld did not come up; the message ends with the
    tail of their logs."""


@dataclass
class FirewalldNode:
    """A running firewalld (`firewalld_in`): ``netns`` the namespace's name,
    ``bus_address`` the private bus (``unix:path=...,guid=...``), ``dir``
    the test's directory holding the bus config, ``etc`` (firewalld's
    system config) and the logs."""

    netns: str
    bus_address: str
    dir: pathlib.Path
    dbus: subprocess.Popen
    firewalld: subprocess.Popen

    @property
    def ns(self) -> TestNetNS:
        """The namespace, for `run_plugin`'s ``node``."""
        return TestNetNS(self.netns, os.path.join(NETNS_DIR, self.netns))

    @property
    def log_path(self) -> pathlib.Path:
        return self.dir / "firewalld.log"

    @property
    def system_config(self) -> pathlib.Path:
        return self.dir / "etc"

    def env(self) -> dict[str, str]:
        """What a plugin process (ours or Go's) needs in its environment to
        talk to this firewalld."""
        return {"DBUS_SYSTEM_BUS_ADDRESS": self.bus_address}

    def pids(self) -> list[int]:
        return [self.dbus.pid, self.firewalld.pid]

    def alive(self) -> bool:
        return self.dbus.poll() is None and self.firewalld.poll() is None

    def log_tail(self, chars: int = 6000) -> str:
        """The end of firewalld's log, its stdout/stderr and dbus-daemon's."""
        return "\n".join(f"--- {name}\n{_read(self.dir / name, chars)}"
                         for name in ("firewalld.log", "firewalld.out", "dbus.log"))

    def call(self, method: str, signature: str = "", *args: Any,
             interface: str = MAIN_INTERFACE, path: str = MAIN_PATH) -> tuple:
        """`call` on this firewalld's bus."""
        return call(self.bus_address, method, signature, *args, interface=interface, path=path)

    def active_zones(self) -> dict[str, dict[str, list[str]]]:
        """``getActiveZones``: zone -> {"sources": [...], "interfaces": [...]}
        for every zone with a source or an interface."""
        (zones,) = self.call("getActiveZones", interface=ZONE_INTERFACE)
        return {zone: dict(what) for zone, what in zones.items()}

    def add_permanent_zone(self, name: str, **settings: tuple[str, Any]) -> None:
        """Create zone ``name`` in the permanent config (``config.addZone2``:
        a file in the test's system config); it exists at runtime only after
        `reload`. ``settings``: D-Bus variants, e.g. ``forward=("b", True)``."""
        self.call("addZone2", "sa{sv}", name, settings, interface=CONFIG_INTERFACE,
                  path=CONFIG_PATH)

    def reload(self) -> None:
        """``reload``: what ``firewall-cmd --reload`` does."""
        self.call("reload")


def processes_in_netns(netns_path: str) -> list[int]:
    """Every process whose network namespace is the one at ``netns_path``."""
    st = os.stat(netns_path)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            ns = os.stat(f"/proc/{entry}/ns/net")
            if (ns.st_dev, ns.st_ino) == (st.st_dev, st.st_ino):
                found.append(int(entry))
    return found


def call(address: str, method: str, signature: str = "", *args: Any,
         interface: str = MAIN_INTERFACE, path: str = MAIN_PATH,
         timeout: float = 10.0) -> tuple:
    """Call firewalld's ``method`` on the bus at ``address`` and return the
    reply's body; a D-Bus error raises jeepney's ``DBusErrorResponse``. For
    what the plugin's backend does not do (reload, the permanent config)."""
    msg = new_method_call(DBusAddress(path, bus_name=BUS_NAME, interface=interface),
                          method, signature or None, args)
    with open_dbus_connection(bus=address, auth_timeout=timeout) as conn:
        return unwrap_msg(conn.send_and_get_reply(msg, timeout=timeout))


def firewalld_state(address: str, timeout: float = 2.0) -> str | None:
    """firewalld's ``state`` property (``"INIT"`` while starting, then
    ``"RUNNING"``); None while its name is not on the bus or the bus does
    not answer."""
    try:
        with open_dbus_connection(bus=address, auth_timeout=timeout) as conn:
            unwrap_msg(conn.send_and_get_reply(message_bus.GetNameOwner(BUS_NAME),
                                               timeout=timeout))
            reply = conn.send_and_get_reply(Properties(_MAIN).get("state"), timeout=timeout)
            ((_sig, state),) = unwrap_msg(reply)
            return str(state)
    except (OSError, ValueError, RuntimeError, DBusErrorResponse):
        return None


def zone_xml(short: str = "", target: str = "default", forward: bool = True) -> str:
    """A zone file for ``firewalld_in(zones=...)``: ``target`` ``default``,
    ``ACCEPT``, ``DROP`` or ``%%REJECT%%``; ``forward``: intra-zone
    forwarding (firewalld >= 1.0)."""
    target_attr = "" if target == "default" else f' target="{target}"'
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<zone{target_attr}>\n'
            f"  <short>{short}</short>\n" + ("  <forward/>\n" if forward else "")
            + "</zone>\n")


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, a bounded wait, then SIGKILL; then SIGKILL the rest of its
    session (it is the session's leader: its pid is the group's id)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line ``proc`` prints (dbus-daemon's --print-address)."""
    assert proc.stdout is not None
    fd, buf = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode().strip()


@contextlib.contextmanager
def private_bus(netns: str, tmpdir: str | os.PathLike,
                timeout: float = 10.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """A system-type dbus-daemon of the test's own inside network namespace
    ``netns``, until the context exits: yields its address (``unix:path=...,
    guid=...``) and its process. Its config (``bus.conf``), socket
    (``bus.sock``) and log (``dbus.log``) are in ``tmpdir``, or the socket in
    a short directory under /tmp (removed at exit) when ``tmpdir`` makes
    too long a unix socket path.

    Raises:
        FirewalldStartError: it printed no address within ``timeout`` seconds.
    """
    d = pathlib.Path(tmpdir)
    d.mkdir(parents=True, exist_ok=True)
    short_dir = None
    sock = d / "bus.sock"
    if len(os.fsencode(sock)) > _SUN_PATH_MAX:
        short_dir = tempfile.mkdtemp(prefix="cnsk-fwd-", dir="/tmp")
        sock = pathlib.Path(short_dir) / "bus.sock"
    bus_conf = d / "bus.conf"
    bus_conf.write_text(_BUS_CONF.format(socket=sock))
    proc = None
    try:
        with open(d / "dbus.log", "ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, DBUS_DAEMON, f"--config-file={bus_conf}",
                 "--nofork", "--print-address"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=_BASE_ENV,
                start_new_session=True)
        address = _read_line(proc, timeout)
        if not address.startswith("unix:"):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)  # its exit status, when it is exiting
            raise FirewalldStartError(f"dbus-daemon printed no address ({address!r}, exit "
                                      f"{proc.poll()}):\n{_read(d / 'dbus.log')}")
        yield address, proc
    finally:
        if proc is not None:
            _stop(proc, STOP_TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()
        with contextlib.suppress(OSError):
            sock.unlink()
        if short_dir is not None:
            shutil.rmtree(short_dir, ignore_errors=True)


@contextlib.contextmanager
def firewalld_in(netns: str, tmpdir: str | os.PathLike, *,
                 zones: Mapping[str, str] | None = None, debug: int = 1,
                 timeout: float = START_TIMEOUT) -> Iterator[FirewalldNode]:
    """Run a private bus (`private_bus`) and firewalld inside network
    namespace ``netns`` (a name under /run/netns, made by the test) until
    the context exits.

    ``tmpdir``: the test's directory (created if missing) for the bus,
    firewalld's system config (``etc/``) and the logs (``firewalld.log``,
    ``firewalld.out``, ``dbus.log``). ``zones``: extra zones, name -> zone
    XML (`zone_xml`), written into the system config before firewalld
    starts. ``debug``: firewalld's ``--debug`` level (0: none).

    Yields once firewalld's ``state`` is ``RUNNING`` on the bus.

    Raises:
        FirewalldStartError: the bus, or firewalld, did not come up within
            ``timeout`` seconds (or exited); what was started is stopped
            first.
    """
    d = pathlib.Path(tmpdir)
    etc = d / "etc"
    for sub in ("zones", "services", "icmptypes", "ipsets", "helpers", "policies"):
        (etc / sub).mkdir(parents=True, exist_ok=True)
    (etc / "firewalld.conf").write_text(_FIREWALLD_CONF)
    for name, xml in (zones or {}).items():
        (etc / "zones" / f"{name}.xml").write_text(xml)
    with private_bus(netns, d, min(timeout, 10.0)) as (address, dbus):
        argv = [FIREWALLD, "--nofork", "--nopid", "--system-config", str(etc),
                "--default-config", DEFAULT_CONFIG, "--log-target", "file",
                "--log-file", str(d / "firewalld.log")]
        if debug:
            argv += ["--debug", str(debug)]
        fwd = None
        try:
            with open(d / "firewalld.out", "ab") as out:
                fwd = subprocess.Popen(
                    ["ip", "netns", "exec", netns, "sh", "-c", _PRIVATE_RUN, "firewalld",
                     *argv],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env={**_BASE_ENV, "DBUS_SYSTEM_BUS_ADDRESS": address},
                    start_new_session=True)
            node = FirewalldNode(netns, address, d, dbus, fwd)
            deadline = time.monotonic() + timeout
            while firewalld_state(address) != "RUNNING":
                if not node.alive() or time.monotonic() > deadline:
                    why = (f"exited {fwd.returncode}" if fwd.poll() is not None
                           else f"its bus exited {dbus.returncode}" if dbus.poll() is not None
                           else f"not RUNNING after {timeout:g} s")
                    raise FirewalldStartError(f"firewalld in {netns}: {why}\n{node.log_tail()}")
                time.sleep(0.1)
            yield node
        finally:
            # before the bus goes: firewalld removes its table on SIGTERM
            if fwd is not None:
                _stop(fwd, STOP_TIMEOUT)


def _read(path: pathlib.Path, chars: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


def missing_tools() -> list[str]:
    """What of firewalld and dbus-daemon is not installed (empty: all is)."""
    return [p for p in (FIREWALLD, DBUS_DAEMON) if not os.access(p, os.X_OK)]
