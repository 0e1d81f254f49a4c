"""The pods' DHCP leases, held in the worker's keeper (`cni_skel.keeper`):
`Leases` is the dhcp plugin's `cni_skel.keeper.Service`.

Each lease is a thread of the keeper that enters the pod's network namespace
(the fd the plugin passed) and runs pyroute2's DHCPv4 client
(`pyroute2.dhcp.client.AsyncDHCPClient`, on its own asyncio loop) on the
pod's interface: DISCOVER/REQUEST at ADD, REQUEST to the server at T1,
broadcast at T2, RELEASE at DEL; a NAK or an expiry starts over (an expired
lease also takes the interface down, as Go's daemon does). The client ID is
Go's (``0x00`` then ``<containerID>/<network>/<ifname>``, at most 254
bytes), so a server sees the same client whichever plugin asked.

On disk, one file per attachment (`cni_skel.state.attachment_file_name`) in
`LEASE_DIR`, mode 0600, replaced atomically on each ACK: the attachment, the
pod's namespace path, the options asked for and sent, and the lease (the
server's ACK). A keeper that starts (a new worker, or the keeper forked
again after a crash) takes over every file it finds: it reopens the
namespace by path and asks the server for the same lease again (INIT-REBOOT),
then renews it as before. A file whose namespace is gone is removed (the
pod is gone; its DEL finds nothing to release).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from dataclasses import asdict
from typing import Any

from pyroute2.dhcp import fsm
from pyroute2.dhcp.client import AsyncDHCPClient, ClientConfig
from pyroute2.dhcp.dhcp4msg import dhcp4msg
from pyroute2.dhcp.hooks import Trigger, hook
from pyroute2.dhcp.leases import Lease

from cni_skel import netlink
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETNS,
    ERR_TRY_AGAIN_LATER,
    ERR_UNKNOWN_CONTAINER,
    CNIError,
)
from cni_skel.keeper import Service, close_fds
from cni_skel.netns import CLONE_NEWNET, NetNS, setns
from cni_skel.rtnl import Rtnl
from cni_skel.state import StateDir, attachment_file_name

__all__ = ["EVENTS", "LEASE_DIR", "Leases", "client_id"]

#: Where the lease files are (one per attachment) for the default worker
#: socket; a worker on another socket keeps them beside it.
LEASE_DIR = "/run/cni-skel/dhcp"
#: What `Leases.events` counts: leases acquired, renewed (T1), rebound
#: (T2), released (DEL, GC), expired; NAKs; ADDs without a lease in time.
EVENTS = ("acquired", "renewed", "rebound", "released", "expired", "nak", "timeout")
_STOP_WAIT = 5.0  # seconds a stopping lease may take to send its RELEASE
# Asked for whatever the config asks: the lease times.
_TIMES = (51, 58, 59)


def client_id(container_id: str, network: str, ifname: str) -> bytes:
    """Go's client ID for an attachment (``generateClientID``): the key of
    its lease, sent as option 61 after a type byte 0."""
    return f"{container_id}/{network}/{ifname}".encode()[:254]


class _ProvidingMsg(dhcp4msg):
    """A DHCP message that also carries the config's ``provide`` options
    (any code, raw bytes), which replace the client's own of the same code."""

    provided: dict[int, bytes] = {}

    def encode(self) -> _ProvidingMsg:
        options = self.get("options") or {}
        for name, mapping in self._encode_map.items():
            if mapping.code in self.provided:
                options.pop(name, None)
        super().encode()
        extra = b"".join(bytes((code, len(v))) + v for code, v in self.provided.items())
        self.buf = self.buf[:-1] + extra + self.buf[-1:]  # before the end marker
        return self


class _Client(AsyncDHCPClient):
    """pyroute2's client, sending the ``provide`` options too."""

    def __init__(self, config: ClientConfig, provided: dict[int, bytes],
                 holder: _Holder) -> None:
        super().__init__(config)
        self.provided = provided
        self.holder = holder

    async def nak_received(self, msg: Any) -> None:
        if self.state in (fsm.State.REQUESTING, fsm.State.REBOOTING, fsm.State.RENEWING,
                          fsm.State.REBINDING):
            self.holder.service.count("nak")
            self.holder.service.log(f"{self.holder.key}: NAK in {self.state.name}: "
                                    "asking for a lease again")
        await super().nak_received(msg)

    async def _send_message(self, msg: Any) -> None:
        if self.provided:
            carried = _ProvidingMsg(dict(msg.dhcp))
            carried.provided = self.provided
            msg.dhcp = carried
        await super()._send_message(msg)


class _Holder:
    """One attachment's lease: its thread, its client, its file."""

    def __init__(self, service: Leases, record: dict[str, Any], netns_fd: int) -> None:
        self.service = service
        self.record = record
        self.netns_fd = netns_fd
        self.key = record["clientID"]
        self.ready = threading.Event()
        self.error: str | None = None
        self.lease: dict[str, Any] | None = record.get("lease")
        self.state = "starting"
        self.renewals = 0
        self.release = True
        self.stop_requested = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"dhcp {record['containerID'][:12]}")

    # --- the thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            setns(self.netns_fd, CLONE_NEWNET)
            asyncio.run(self._main())
        except Exception as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            self.service.log(f"{self.key}: lease ended: {self.error}")
        finally:
            self.state = "stopped"
            self.ready.set()
            close_fds([self.netns_fd])

    async def _main(self) -> None:
        self.stop_event = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        if self.stop_requested:  # asked before the loop ran (see ask_stop)
            self.stop_event.set()
        holder = self

        class _Lease(Lease):
            def dump(self) -> None:
                holder._saved(self)

            @classmethod
            def load(cls, interface: str) -> Lease | None:
                saved = holder.record.get("lease")
                return cls(**saved) if saved else None

        def kept(trigger: Trigger, event: str) -> Any:
            async def counted(lease: Lease) -> None:
                holder.renewals += 1
                holder.service.count(event)
                holder.service.log(f"{holder.key}: lease of {lease.ip} {event}, expires in "
                                   f"{lease.expiration_in or 0:.0f} s")
            return hook(trigger)(counted)

        @hook(Trigger.EXPIRED)
        async def expired(lease: Lease) -> None:
            holder.service.count("expired")
            holder.service.log(f"{holder.key}: lease of {lease.ip} expired: "
                               f"{holder.record['ifname']} down until a server answers")
            holder._link_down()

        config = ClientConfig(
            interface=self.record["ifname"], lease_type=_Lease,
            hooks=(kept(Trigger.RENEWED, "renewed"), kept(Trigger.REBOUND, "rebound"), expired),
            requested_parameters=[*self.record["request"],
                                  *(c for c in _TIMES if c not in self.record["request"])],
            client_id=self.key.encode(), handle_signals=False, vendor_id=None,
            host_name=None, release=True)
        provided = {int(k): bytes.fromhex(v) for k, v in self.record["provide"].items()}
        async with _Client(config, provided, self) as client:
            await client.bootstrap()
            timeout = self.record.get("timeout")
            bound = asyncio.create_task(client.wait_for_state(fsm.State.BOUND))
            stopped = asyncio.create_task(self.stop_event.wait())
            await asyncio.wait((bound, stopped), timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            for task in (bound, stopped):
                task.cancel()
            if not bound.done() or bound.cancelled():
                what = "stopped" if self.stop_requested else f"within {timeout:g} s"
                self.error = (f"no DHCP lease on {self.record['ifname']} {what} "
                              f"(state {client.state.name})")
                client.config.release = self.release and client.state is fsm.State.BOUND
                return
            self.state = "bound"
            self.ready.set()
            await self.stop_event.wait()
            client.config.release = self.release

    def _saved(self, lease: Lease) -> None:
        """pyroute2 got an ACK: keep it (memory and disk)."""
        self.lease = json.loads(json.dumps(asdict(lease), default=str))
        self.record["lease"] = self.lease
        self.state = "bound"
        self.service.save(self.record)

    def _link_down(self) -> None:
        # This thread is in the pod's namespace: so is a socket it opens.
        with contextlib.suppress(Exception), Rtnl() as ipr:
            netlink.link_down(ipr, self.record["ifname"])

    # --- from other threads ------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self, release: bool) -> None:
        """End the lease's thread; with ``release`` a RELEASE is sent first."""
        self.ask_stop(release)
        self.thread.join(_STOP_WAIT)

    def ask_stop(self, release: bool) -> None:
        """Tell the lease's thread to end (`stop` without the wait)."""
        self.release = release
        self.stop_requested = True
        loop, event = self.loop, self.stop_event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(event.set)

    def summary(self) -> dict[str, Any]:
        lease = self.lease or {}
        options = (lease.get("ack") or {}).get("options") or {}
        expires = None
        if lease and isinstance(options.get("lease_time"), int):
            expires = round(lease.get("obtained", 0) + options["lease_time"], 3)
        return {"clientID": self.key, "network": self.record["network"],
                "containerID": self.record["containerID"], "ifname": self.record["ifname"],
                "address": (lease.get("ack") or {}).get("yiaddr"), "expires": expires,
                "state": self.state, "renewals": self.renewals}


class Leases(Service):
    """The ``dhcp`` service: one `_Holder` per attachment, keyed by
    `client_id`. Requests (`cni_skel.keeper.call`, from the dhcp plugin):

    * ``{"op": "acquire", ...attachment, "netns", "ifname", "request",
      "provide", "timeout"}`` with the pod's namespace as the one fd:
      a lease within ``timeout`` seconds -> ``{"lease": ack}``; else 11;
    * ``{"op": "release", ...attachment}``: RELEASE, forget -> ``{}``
      (nothing held: ``{}`` too);
    * ``{"op": "check", ...attachment}`` -> ``{"lease": ack}``, or 3 when
      nothing is held;
    * ``{"op": "gc", "network", "keep": [[containerID, ifname], ...]}``:
      release the network's leases not kept -> ``{"released": [...]}``;
    * ``{"op": "list"}`` -> ``{"leases": [summary, ...]}``.
    """

    name = "dhcp"

    def __init__(self, log: Any, state_dir: str = LEASE_DIR) -> None:
        super().__init__(log, state_dir)
        self.lease_dir = state_dir
        self.lock = threading.Lock()
        self.holders: dict[str, _Holder] = {}
        # Every event at 0 from the start: a metric series that appears
        # only with its first event hides that event from rate().
        self.counts: dict[str, int] = dict.fromkeys(EVENTS, 0)

    def count(self, event: str) -> None:
        """One more ``event`` (`events`)."""
        with self.lock:
            self.counts[event] = self.counts.get(event, 0) + 1

    def events(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)

    def listing(self) -> list[dict[str, Any]]:
        """Every lease held: attachment, address, expiry (unix time), state."""
        with self.lock:
            return [h.summary() for h in self.holders.values()]

    # --- disk --------------------------------------------------------------

    def _dir(self) -> StateDir:
        return StateDir.open(self.lease_dir, create_mode=0o700)

    def save(self, record: dict[str, Any]) -> None:
        """Write an attachment's record (atomically, 0600)."""
        name = attachment_file_name(record["containerID"], record["ifname"])
        try:
            with self._dir() as d:
                d.write(name, json.dumps(record, sort_keys=True).encode(), 0o600)
        except OSError as exc:
            self.log(f"{record['clientID']}: lease not saved: {exc}")

    def forget(self, record: dict[str, Any]) -> None:
        name = attachment_file_name(record["containerID"], record["ifname"])
        try:
            with self._dir() as d:
                d.unlink(name)
        except OSError as exc:
            self.log(f"{record.get('clientID', name)}: lease record not removed: {exc}")

    def start(self) -> None:
        """Take over the leases of the files in `LEASE_DIR`."""
        try:
            d = StateDir.open(self.lease_dir)
        except FileNotFoundError:
            return
        with d:
            names = sorted(n for n in d.names() if n.endswith(".json") and not n.startswith("."))
            records = []
            for name in names:
                try:
                    records.append(json.loads(d.read(name)))
                except (OSError, ValueError) as exc:
                    self.log(f"{d.join(name)}: not a lease record, left alone: {exc}")
        for record in records:
            try:
                ns = NetNS.open(record["netns"])
            except (CNIError, OSError, KeyError, TypeError) as exc:
                self.log(f"{record.get('clientID')}: namespace {record.get('netns')!r} gone "
                         f"({exc}): lease record removed")
                with contextlib.suppress(Exception):
                    self.forget(record)
                continue
            record["timeout"] = None  # nobody waits: keep asking
            holder = _Holder(self, record, os.dup(ns.fd))
            ns.close()
            with self.lock:
                self.holders[holder.key] = holder
            holder.start()
            self.log(f"{holder.key}: lease of {self._address(record)} taken over")

    @staticmethod
    def _address(record: dict[str, Any]) -> str:
        return str(((record.get("lease") or {}).get("ack") or {}).get("yiaddr") or "?")

    # --- calls -------------------------------------------------------------

    def handle(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        op = request.get("op")
        if op == "acquire":
            return self._acquire(request, fds)
        close_fds(fds)
        if op == "release":
            return self._release(request)
        if op == "check":
            return self._check(request)
        if op == "gc":
            return self._gc(request)
        if op == "list":
            return {"leases": self.listing()}
        raise CNIError(ERR_INTERNAL, f"dhcp: unknown request {op!r}")

    @staticmethod
    def _key(request: dict[str, Any]) -> str:
        return client_id(request["containerID"], request["network"],
                         request["ifname"]).decode("utf-8", "replace")

    def _acquire(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if len(fds) != 1:
            close_fds(fds)
            raise CNIError(ERR_INVALID_NETNS, "dhcp: the pod's network namespace was not passed")
        key = self._key(request)
        record = {"clientID": key, "network": request["network"],
                  "containerID": request["containerID"], "ifname": request["ifname"],
                  "netns": request["netns"], "request": list(request["request"]),
                  "provide": dict(request["provide"]), "timeout": float(request["timeout"]),
                  "acquired": time.time()}
        with self.lock:
            old = self.holders.pop(key, None)
        if old is not None:  # an ADD again: this one's lease replaces it
            old.stop(release=False)
        holder = _Holder(self, record, fds[0])
        holder.start()
        holder.ready.wait(record["timeout"] + _STOP_WAIT)
        if holder.state != "bound" or holder.lease is None:
            holder.stop(release=False)
            self.forget(record)
            self.count("timeout")
            raise CNIError(ERR_TRY_AGAIN_LATER, f"dhcp: {holder.error or 'no lease'}",
                           "is a DHCP server reachable on the pod's interface?")
        with self.lock:
            self.holders[key] = holder
        self.count("acquired")
        self.log(f"{key}: lease of {self._address(record)} acquired")
        return {"lease": holder.lease}

    def _release(self, request: dict[str, Any]) -> dict[str, Any]:
        key = self._key(request)
        with self.lock:
            holder = self.holders.pop(key, None)
        if holder is not None:
            holder.stop(release=True)
            self.forget(holder.record)
            self.count("released")
            self.log(f"{key}: lease of {self._address(holder.record)} released")
        else:
            self.forget({"containerID": request["containerID"], "ifname": request["ifname"]})
        return {}

    def _check(self, request: dict[str, Any]) -> dict[str, Any]:
        key = self._key(request)
        with self.lock:
            holder = self.holders.get(key)
        if holder is None or holder.lease is None:
            raise CNIError(ERR_UNKNOWN_CONTAINER, f"dhcp: no lease held for {key}")
        return {"lease": holder.lease, "state": holder.state}

    def _gc(self, request: dict[str, Any]) -> dict[str, Any]:
        keep = {(str(c), str(i)) for c, i in request.get("keep") or []}
        network = request["network"]
        with self.lock:
            gone = [h for h in self.holders.values() if h.record["network"] == network
                    and (h.record["containerID"], h.record["ifname"]) not in keep]
            for h in gone:
                del self.holders[h.key]
        for h in gone:
            h.stop(release=True)
            self.forget(h.record)
            self.count("released")
            self.log(f"{h.key}: lease of {self._address(h.record)} released by GC")
        return {"released": [h.key for h in gone]}

    def held(self) -> int:
        with self.lock:
            return len(self.holders)

    def stop(self) -> None:
        """The worker stops: end every lease's thread without RELEASE; the
        files stay for the next keeper."""
        with self.lock:
            holders = list(self.holders.values())
        for h in holders:  # all at once, then wait: a drain has a deadline
            h.ask_stop(release=False)
        deadline = time.monotonic() + _STOP_WAIT
        for h in holders:
            h.thread.join(max(0.0, deadline - time.monotonic()))
