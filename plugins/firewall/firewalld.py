"""The firewalld backend: a pod's addresses as sources of a firewalld zone,
set over D-Bus (Go 1.1.1's ``fwdBackend``).

A source (``"10.1.0.5/32"``, ``"fd00::5/128"``: Go's ``ipString``, a host
prefix) bound to a zone puts the packets *from* that address under the
zone's rules: with firewalld 1.3's nftables backend, its INPUT and FORWARD
decisions (``filter_INPUT_ZONES`` / ``filter_FORWARD_ZONES`` match the source
address before any interface), so a pod in ``trusted`` (target ACCEPT) may
reach the node and be forwarded anywhere, its replies coming back as
established connections; a new connection *to* it is judged by the zone of
its sender (the default zone, public, rejects it). firewalld binds a
source to one zone at most (another zone's ``addSource`` is
``ZONE_CONFLICT``), keeps sources in its runtime configuration only (a
``firewall-cmd --reload`` or a restart drops them; interfaces survive a
reload, sources do not), and records no owner for one.

Each call is one method call on the bus with a deadline (``timeout``,
default `CALL_TIMEOUT`): a hung firewalld gives CNI error 999 naming the
deadline instead of hanging the CNI call. Calls carry D-Bus's NO_AUTO_START
flag unless ``auto_start=True``: a stopped firewalld is not started by a
CNI call through bus activation (Go's calls allow activation; Debian's
firewalld ships no activation file, so there both fail alike).

Source: containernetworking/plugins 1.1.1 plugins/meta/firewall/firewalld.go;
firewalld's D-Bus API (interface ``org.fedoraproject.FirewallD1.zone`` at
``/org/fedoraproject/FirewallD1``: ``addSource``, ``removeSource``,
``querySource``, ``getSources``, ``getZoneOfSource``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from jeepney import DBusAddress, MessageFlag, message_bus, new_method_call
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

from cni_skel import CNIError
from cni_skel.errors import ERR_INTERNAL

__all__ = [
    "BUS_NAME",
    "CALL_TIMEOUT",
    "OBJECT_PATH",
    "RUNNING_TIMEOUT",
    "SYSTEM_BUS_DEFAULT",
    "ZONE_INTERFACE",
    "Firewalld",
    "firewalld_running",
    "system_bus_address",
]

#: firewalld's well-known name on the system bus.
BUS_NAME = "org.fedoraproject.FirewallD1"
#: The object that carries the zone interface.
OBJECT_PATH = "/org/fedoraproject/FirewallD1"
#: The interface of the runtime zone methods.
ZONE_INTERFACE = "org.fedoraproject.FirewallD1.zone"
#: Seconds for connecting (with authentication), and for each call.
CALL_TIMEOUT = 10.0
#: Seconds `Firewalld.running` waits: the bus daemon answers it, not firewalld.
RUNNING_TIMEOUT = 2.0
#: The system bus when ``DBUS_SYSTEM_BUS_ADDRESS`` is unset or empty (the
#: D-Bus specification's default, also godbus's and jeepney's).
SYSTEM_BUS_DEFAULT = "unix:path=/var/run/dbus/system_bus_socket"

_ZONE_ALREADY_SET = "ZONE_ALREADY_SET"
_ZONES = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=ZONE_INTERFACE)
# What a broken transport raises in jeepney: OSError (TimeoutError included,
# no socket, refused, reset), ValueError (a malformed address, a failed
# authentication, an oversized message), RuntimeError (a transport other
# than unix).
_TRANSPORT_ERRORS = (OSError, ValueError, RuntimeError)


def system_bus_address(environ: Mapping[str, str] | None = None) -> str:
    """The system bus's address as godbus and jeepney pick it:
    ``DBUS_SYSTEM_BUS_ADDRESS`` when set and not empty, else
    `SYSTEM_BUS_DEFAULT`. ``environ`` defaults to ``os.environ``."""
    env = os.environ if environ is None else environ
    return env.get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS_DEFAULT


def _error_text(err: DBusErrorResponse) -> str:
    """A D-Bus error as godbus's ``Error.Error()`` prints it: the first body
    value when it is a string (firewalld's ``"ZONE_ALREADY_SET: ..."``), else
    the error's name."""
    if err.data and isinstance(err.data[0], str):
        return err.data[0]
    return str(err.name)


class Firewalld:
    """A connection to firewalld over the system bus (Go's ``fwdBackend``,
    whose ``Add``/``Del``/``Check`` call the methods here once per pod
    address).

    ``address``: a D-Bus address (``"unix:path=/run/x/bus"``); None is the
    system bus (`system_bus_address`). ``timeout``: seconds for connecting
    and for each call (`CALL_TIMEOUT`). ``auto_start``: let the bus start
    firewalld by activation (off: see the module's docstring).

    Use it as a context manager, or `close` it: a worker serves many calls
    in one process, so a connection must not outlive its call.

    Raises:
        CNIError: 999 naming the bus when it cannot be reached or refuses
            the connection (no socket, refused, authentication failed,
            timed out).
    """

    def __init__(self, address: str | None = None, *, timeout: float = CALL_TIMEOUT,
                 auto_start: bool = False) -> None:
        self.address = address or system_bus_address()
        self.timeout = timeout
        self._flags = MessageFlag(0) if auto_start else MessageFlag.no_auto_start
        self._conn: DBusConnection | None = None
        try:
            # auth_timeout bounds connect and authentication; the Hello that
            # follows is answered by the bus daemon itself, never by firewalld.
            self._conn = open_dbus_connection(bus=self.address, auth_timeout=timeout)
        except (*_TRANSPORT_ERRORS, DBusErrorResponse) as e:
            raise CNIError(ERR_INTERNAL,
                           f"cannot connect to the D-Bus system bus at {self.address}: {e}"
                           ) from e

    @classmethod
    def running(cls, address: str | None = None, *,
                timeout: float = RUNNING_TIMEOUT) -> bool:
        """Whether firewalld holds its name on the bus (Go's
        ``isFirewalldRunning``: ``org.freedesktop.DBus.GetNameOwner`` of
        `BUS_NAME` succeeds). A bus that cannot be reached, or does not
        answer within ``timeout`` seconds, is False; never raises. True
        already while firewalld is still starting (Go's test, too)."""
        try:
            with cls(address, timeout=timeout) as fwd:
                fwd._call(message_bus.GetNameOwner(BUS_NAME), "GetNameOwner")
        except Exception:  # whatever went wrong, Go's answer is the same: no
            return False
        return True

    def close(self) -> None:
        """Close the connection; again is a no-op."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> Firewalld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<Firewalld {self.address} {state}>"

    def _call(self, msg: Any, what: str) -> tuple:
        """Send ``msg`` and return the reply's body.

        Raises:
            DBusErrorResponse: the reply is a D-Bus error (firewalld's
                refusal, or the bus's: ServiceUnknown when firewalld is not
                there); for the caller to word or ignore.
            CNIError: 999 when the connection is closed or lost, or no reply
                came within ``timeout`` seconds.
        """
        if self._conn is None:
            raise CNIError(ERR_INTERNAL, f"firewalld {what}: the D-Bus connection is closed")
        msg.header.flags |= self._flags
        try:
            reply = self._conn.send_and_get_reply(msg, timeout=self.timeout)
        except TimeoutError as e:
            raise CNIError(ERR_INTERNAL, f"firewalld did not answer {what} within "
                           f"{self.timeout:g} s (bus {self.address})") from e
        except _TRANSPORT_ERRORS as e:
            raise CNIError(ERR_INTERNAL, f"lost the D-Bus connection to firewalld "
                           f"during {what} (bus {self.address}): {e}") from e
        return unwrap_msg(reply)

    def _zone_call(self, method: str, signature: str, *args: str) -> tuple:
        return self._call(new_method_call(_ZONES, method, signature, args), method)

    def add_source(self, zone: str, source: str) -> None:
        """Bind ``source`` (``"10.1.0.5/32"``) to ``zone`` (``addSource``;
        ``""`` is firewalld's default zone). Already bound to this zone
        (firewalld's ``ZONE_ALREADY_SET``) is success, as in Go.

        Raises:
            CNIError: 999 ``failed to add the address <source> to <zone>
                zone: <firewalld's error>`` (Go's words) for any other
                refusal: ``INVALID_ZONE``, ``INVALID_ADDR``,
                ``ZONE_CONFLICT`` (bound to another zone), firewalld not on
                the bus; 999 for a lost connection or a timeout.
        """
        try:
            self._zone_call("addSource", "ss", zone, source)
        except DBusErrorResponse as e:
            text = _error_text(e)
            if _ZONE_ALREADY_SET in text or _ZONE_ALREADY_SET in str(e.name):
                return
            raise CNIError(ERR_INTERNAL, f"failed to add the address {source} to "
                           f"{zone} zone: {text}") from e

    def remove_source(self, zone: str, source: str) -> None:
        """Unbind ``source`` from ``zone`` (``removeSource``). Every D-Bus
        error is ignored, as Go's ``Del`` does: ``UNKNOWN_SOURCE`` (not
        bound), ``ZONE_CONFLICT`` (bound to another zone, which is left
        alone), ``INVALID_ZONE``, firewalld not on the bus.

        Raises:
            CNIError: 999 only for a lost connection or a timeout.
        """
        # Go discards the error: DEL of something gone succeeds
        with contextlib.suppress(DBusErrorResponse):
            self._zone_call("removeSource", "ss", zone, source)

    def query_source(self, zone: str, source: str) -> bool:
        """Whether ``source`` is bound to ``zone`` (``querySource``). Go's
        ``Check`` fails only on a D-Bus error and ignores this answer; the
        caller decides what False means.

        Raises:
            CNIError: 999 ``failed to find the address <source> in <zone>
                zone`` (Go's words; firewalld's error in ``details``) for a
                D-Bus error (``INVALID_ZONE``, firewalld not on the bus); 999
                for a lost connection or a timeout.
        """
        try:
            (found,) = self._zone_call("querySource", "ss", zone, source)
        except DBusErrorResponse as e:
            raise CNIError(ERR_INTERNAL, f"failed to find the address {source} in "
                           f"{zone} zone", _error_text(e)) from e
        return bool(found)

    def sources(self, zone: str) -> list[str]:
        """The sources bound to ``zone`` (``getSources``), in firewalld's
        order (the order they were added), e.g. ``["10.1.0.5/32",
        "fd00::5/128"]``. firewalld does not record who added one.

        Raises:
            CNIError: 999 ``failed to list the sources of <zone> zone:
                <firewalld's error>`` for a D-Bus error; 999 for a lost
                connection or a timeout.
        """
        try:
            (found,) = self._zone_call("getSources", "s", zone)
        except DBusErrorResponse as e:
            raise CNIError(ERR_INTERNAL, f"failed to list the sources of {zone} zone: "
                           f"{_error_text(e)}") from e
        return list(found)

    def zone_of_source(self, source: str) -> str:
        """The zone ``source`` is bound to (``getZoneOfSource``), ``""`` when
        none: what to look at when `add_source` meets ``ZONE_CONFLICT``.

        Raises:
            CNIError: 999 ``failed to find the zone of the address <source>:
                <firewalld's error>`` for a D-Bus error; 999 for a lost
                connection or a timeout.
        """
        try:
            (zone,) = self._zone_call("getZoneOfSource", "s", source)
        except DBusErrorResponse as e:
            raise CNIError(ERR_INTERNAL, f"failed to find the zone of the address {source}: "
                           f"{_error_text(e)}") from e
        return str(zone)


def firewalld_running(address: str | None = None) -> bool:
    """`Firewalld.running` as a function (Go's ``isFirewalldRunning``)."""
    return Firewalld.running(address)
