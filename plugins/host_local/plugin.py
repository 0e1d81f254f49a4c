"""The host-local plugin: `HostLocal`, its verbs over the disk store.

Every verb that reads or changes allocations does so under the store's lock
(``<dataDir>/<network>/lock``, the file the Go plugin flocks), so Python and
Go host-local processes on one node exclude each other. ADD holds the lock
for the whole allocation: it checks every range set and every requested
address first and writes only when all can be granted, so it never leaves
half an allocation behind on a refusal.

ADD, CHECK and DEL cost the same whatever the number of allocations: they
find the container's addresses through the store's owner index
(`Store.owned`), and ADD tries candidate addresses one lstat at a time from
``last_reserved_ip.N`` on, as Go does. GC and STATUS read the whole store.

Store errors are code 5 (STATUS: 50) and name the path: I/O failures, and
a symlink where the network directory, ``lock``, ``last_reserved_ip.N`` or
an address file should be (refused, never followed; see `.store`). GC also
removes the temp files of killed writers (``.tmp-*``): the only verb that
lists the directory anyway.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from ipaddress import ip_interface

from cni_skel.env import CmdArgs
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_IO_FAILURE,
    ERR_PLUGIN_NOT_AVAILABLE,
    ERR_UNKNOWN_CONTAINER,
    CNIError,
)
from cni_skel.rollback import rollback
from cni_skel.skel import Plugin
from cni_skel.types import DNS, IPConfig, Result

from .allocator import IP, Range, RangeSet, walk
from .config import (
    HostLocalArgs,
    HostLocalConf,
    LoadedIPAM,
    Requested,
    load_ipam,
    parse_resolv_conf,
)
from .store import DEFAULT_DATA_DIR, Scan, Store

__all__ = ["HostLocal"]


def _io_error(what: str, exc: OSError) -> CNIError:
    """Code 5 naming the path that failed (a refused symlink included:
    `cni_skel.state.SYMLINK_REFUSED`)."""
    where = getattr(exc, "filename", None)
    return CNIError(ERR_IO_FAILURE, f"host-local: {what}: "
                    f"{f'{where}: ' if where else ''}{exc.strerror or exc}", where or "")


def _store(ipam: LoadedIPAM) -> Store:
    try:
        return Store(ipam.data_dir, ipam.network)
    except ValueError as exc:  # the skel's name check makes this unreachable
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, str(exc)) from None


def _held(store: Store, container_id: str, ifname: str) -> list[IP]:
    """Addresses of (ID, ifname) as Go's ReleaseByID/FindByID see them: the
    new-format files, or else the old ID-only ones."""
    new, old = store.owned(container_id, ifname)
    return new or old


def _unmatched_requests(ipam: LoadedIPAM) -> tuple[list[Requested | None], list[Requested]]:
    """Requested address per range set (None: allocate one), and the rest.

    As Go: each set takes the first requested address it contains; whatever
    is left over (outside every set, or a second one for the same set) makes
    the ADD fail.
    """
    pending = list(ipam.requested)
    per_set: list[Requested | None] = []
    for rset in ipam.range_sets:
        req = next((r for r in pending if rset.contains(r.ip)), None)
        if req is not None:
            pending.remove(req)
        per_set.append(req)
    return per_set, pending


def _plan(store: Store, ipam: LoadedIPAM, cid: str, ifname: str) -> list[tuple[int, IP, Range]]:
    """Choose (set index, address, range) for every set, writing nothing.

    Raises:
        CNIError: see `HostLocal` (codes 4, 7 and 50).
    """
    per_set, leftover = _unmatched_requests(ipam)
    if leftover:
        why = []
        for req in leftover:
            holder = next((i for i, s in enumerate(ipam.range_sets) if s.contains(req.ip)), None)
            granted = per_set[holder] if holder is not None else None
            where = (f"range set {holder} already gets {granted.ip} (one address per set)"
                     if granted is not None else "it is in no range set")
            why.append(f"{req.ip} (from {req.source}): {where}")
        raise CNIError(leftover[0].code, "failed to allocate all requested IPs: "
                       + " ".join(str(r.ip) for r in leftover), "; ".join(why))

    new, old = store.owned(cid, ifname)
    mine = new + old
    for idx, rset in enumerate(ipam.range_sets):
        dup = next((ip for ip in mine if rset.contains(ip)), None)
        if dup is not None:
            # Spec: no second ADD for one (container, ifname) without a DEL.
            raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                           f"failed to allocate for range {idx}: {dup} has been allocated to "
                           f"{cid}, duplicate allocation is not allowed",
                           f"CNI_CONTAINERID {cid} with CNI_IFNAME {ifname} already holds {dup}")

    picks: list[tuple[int, IP, Range]] = []
    picked: set[IP] = set()

    def taken(ip: IP) -> bool:
        return ip in picked or store.occupied(ip)

    for idx, (rset, req) in enumerate(zip(ipam.range_sets, per_set, strict=True)):
        if req is not None:
            picks.append((idx, req.ip, _check_requested(idx, rset, req, taken)))
            picked.add(req.ip)
            continue
        choice = next(((ip, r) for ip, r in walk(rset, store.last_reserved(idx))
                       if not taken(ip)), None)
        if choice is None:
            raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, f"failed to allocate for range {idx}: "
                           f"no IP addresses available in range set: {rset}",
                           f"all {rset.allocatable_count()} allocatable addresses are in use; "
                           "a DEL or GC of this network frees some")
        picked.add(choice[0])
        picks.append((idx, *choice))
    return picks


def _check_requested(idx: int, rset: RangeSet, req: Requested,
                     taken: Callable[[IP], bool]) -> Range:
    r = rset.range_for(req.ip)
    assert r is not None  # _unmatched_requests matched it to this set
    prefix = f"failed to allocate for range {idx}: "
    if req.ip == r.gateway:
        raise CNIError(req.code, f"{prefix}requested ip {req.ip} is subnet's gateway",
                       f"from {req.source}")
    if r.reserved(req.ip):
        raise CNIError(req.code, f"{prefix}requested ip {req.ip} is the network or broadcast "
                       f"address of {r.subnet}", f"from {req.source}")
    if taken(req.ip):
        raise CNIError(req.code, f"{prefix}requested IP address {req.ip} is not available in "
                       f"range set {rset}", f"from {req.source}; another container holds it")
    return r


def _commit(store: Store, picks: list[tuple[int, IP, Range]], cid: str, ifname: str) -> None:
    """Write the address files, then last_reserved_ip.N, then the index; on
    an error remove the files this call wrote and re-raise (the index, not
    updated, is then stale and rebuilt by the next call)."""
    with rollback("host-local") as undo:
        written: list[IP] = []
        for _, ip, _ in picks:
            store.reserve(ip, cid, ifname)
            undo.callback(f"releasing {ip}", store.release, ip)
            written.append(ip)
        for idx, ip, _ in picks:
            store.set_last_reserved(idx, ip)
        store.index_add(cid, ifname, written)


# --- the plugin ----------------------------------------------------------------


class HostLocal(Plugin):
    """host-local: one address per range set, round-robin, stored on disk.

    Config: see `cni_skel_plugins.host_local.config` (``ranges``, the legacy
    ``subnet``/``rangeStart``/``rangeEnd``/``gateway``, ``routes``,
    ``dataDir``, ``resolvConf``; ``runtimeConfig.ips``/``ipRanges``,
    ``args.cni.ips``, CNI_ARGS ``IP``). Store: `.store`.

    ADD: for each range set, the requested address it contains, else the
    first free one after ``last_reserved_ip.N`` (Go's round-robin; the
    gateway, and for IPv4 the network and broadcast addresses, are never
    handed out). All sets and requests are decided under the lock before
    anything is written: a refused ADD allocates nothing. Result: ``ips``
    (address/prefix, gateway), ``routes``, ``dns``, in the config's version.
    Errors:

    * 50 ``failed to allocate for range N: no IP addresses available in
      range set: A-B`` (Go's text; Go answers 999). The spec defines 50 as
      "the plugin is not available (cannot service ADD requests)", which is
      exactly an exhausted set; it is what STATUS answers for the same state,
      so a runtime learns the same thing either way. Not 7: the config is
      valid (the same one served the previous ADD). Not 11: nothing clears
      up by waiting, only a DEL or GC frees an address.
    * 4 a second ADD for the same (CNI_CONTAINERID, CNI_IFNAME) holding an
      address in a set (Go's text, Go 999): the spec forbids it, and these
      two variables are what is wrong. Checked with or without a requested
      address (Go checks only without).
    * a requested address outside every set, two in one set, the gateway,
      an IPv4 network/broadcast address, or one another container holds
      (Go's texts, Go 999): 4 when it came from CNI_ARGS, 7 from the config.
    * 7 invalid config (``invalid range set N: ...``, ``range set N overlaps
      with M``, ``no IP ranges specified``...); 5 store I/O errors.

    DEL: release (ID, ifname)'s addresses in the network's directory (Go:
    new-format files, else old ID-only ones). Idempotent; a missing
    ``dataDir`` is fine; ranges are not validated (only the store matters).
    CHECK: the container holds an address in every set (3 when it holds
    none, 999 when a set is missing; Go only asks for one, with 999).
    GC (1.1.0): release allocations not in ``cni.dev/valid-attachments``.
    STATUS (1.1.0): 50 when the store is not writable or a set is exhausted.
    """

    name = "host-local"
    config_model = HostLocalConf
    args_model = HostLocalArgs

    @classmethod
    def node_state(cls) -> list[str]:
        """Address files in the default store (/var/lib/cni/networks), per
        network (`cni_skel.skel.Plugin.node_state`)."""
        lines = []
        with contextlib.suppress(OSError):
            for network in sorted(os.listdir(DEFAULT_DATA_DIR)):
                d = os.path.join(DEFAULT_DATA_DIR, network)
                with contextlib.suppress(OSError):
                    n = sum(1 for f in os.listdir(d)
                            if f != "lock" and not f.startswith("last_reserved_ip."))
                    if n:
                        lines.append(f"{n} address reservation(s) in {d}")
        return lines

    def add(self, args: CmdArgs, conf: HostLocalConf) -> Result:
        """Allocate one address per range set; see `HostLocal` for the rules.

        Returns the IPAM result: ``ips`` (address with the subnet's prefix length,
        gateway), the configured ``routes``, ``dns`` from ``resolvConf``.
        """
        ipam = load_ipam(conf, args.typed_args)
        dns = parse_resolv_conf(ipam.resolv_conf) if ipam.resolv_conf else DNS()
        store = _store(ipam)
        try:
            store.ensure()
            with store.lock():
                picks = _plan(store, ipam, args.container_id, args.ifname)
                _commit(store, picks, args.container_id, args.ifname)
        except OSError as exc:
            raise _io_error(f"cannot allocate in {store.dir}", exc) from None
        ips = [IPConfig(address=ip_interface(f"{ip}/{r.subnet.prefixlen}"), gateway=r.gateway)
               for _, ip, r in picks]
        return Result(cni_version=conf.cni_version, ips=ips, routes=ipam.routes, dns=dns)

    def delete(self, args: CmdArgs, conf: HostLocalConf) -> None:
        """Release every address of (ID, ifname) in this network's directory
        (which covers every range set, and sets since removed from the config).
        Idempotent; a missing store is nothing to release.

        Raises:
            CNIError: code 5 when a file could not be removed (after trying all).
        """
        ipam = load_ipam(conf, args.typed_args, ranges=False)
        store = _store(ipam)
        failed = []
        try:
            if not store.exists():
                return
            with store.lock():
                released = []
                for ip in _held(store, args.container_id, args.ifname):
                    try:
                        store.release(ip)
                        released.append(ip)
                    except OSError as exc:
                        failed.append(f"{ip}: {exc.strerror or exc}")
                if released:
                    store.index_remove(args.container_id, released)
        except OSError as exc:
            raise _io_error(f"cannot release in {store.dir}", exc) from None
        if failed:
            raise CNIError(ERR_IO_FAILURE, f"host-local: cannot release {len(failed)} address(es)",
                           "; ".join(failed))

    def check(self, args: CmdArgs, conf: HostLocalConf) -> None:
        """The container holds an address in every range set.

        Raises:
            CNIError: code 3 when it holds none at all (Go's message; Go answers
                999), 999 when some range set has none of its addresses.
        """
        ipam = load_ipam(conf, args.typed_args)
        store = _store(ipam)
        held: list[IP] = []
        try:
            if store.exists():
                with store.lock():
                    held = _held(store, args.container_id, args.ifname)
        except OSError as exc:
            raise _io_error(f"cannot read {store.dir}", exc) from None
        if not held:
            raise CNIError(ERR_UNKNOWN_CONTAINER, "host-local: Failed to find address added by "
                           f"container {args.container_id}", f"ifname {args.ifname}")
        for idx, rset in enumerate(ipam.range_sets):
            if not any(rset.contains(ip) for ip in held):
                raise CNIError(ERR_INTERNAL, f"host-local: container {args.container_id} holds no "
                               f"address in range set {idx}: {rset}",
                               f"it holds {', '.join(str(ip) for ip in held)}")

    def gc(self, args: CmdArgs, conf: HostLocalConf) -> None:
        """Release every allocation of this network not owned by a listed
        attachment; an old ID-only file stays when its container ID is listed.
        Files naming nobody (empty) and temp files of a crashed writer go too.
        Entries that cannot be read are reported and left; the rest goes on.

        Raises:
            CNIError: code 7 without a list of valid attachments
                (`NetConf.gc_keep`: we release nothing rather than
                everything); code 5 naming what could not be read
                or removed, after doing all the rest.
        """
        keep = conf.gc_keep()
        valid = {(a.container_id, a.ifname) for a in keep}
        valid_ids = {a.container_id for a in keep}
        ipam = load_ipam(conf, args.typed_args, ranges=False)
        store = _store(ipam)
        problems: list[str] = []
        try:
            if not store.exists():
                return
            with store.lock():
                scan = store.scan()
                problems.extend(scan.problems.values())
                kept = dict(scan.owners)
                for ip, owner in scan.owners.items():
                    if owner is not None and (
                            (owner.ifname is not None
                             and (owner.container_id, owner.ifname) in valid)
                            or (owner.ifname is None and owner.container_id in valid_ids)):
                        continue
                    try:
                        store.release(ip)
                        del kept[ip]
                    except OSError as exc:
                        problems.append(f"{store.path(str(ip))}: {exc.strerror or exc}")
                problems.extend(store.remove_temp_files())
                store.rebuild_index(Scan(kept, scan.problems))
        except OSError as exc:
            raise _io_error(f"cannot collect in {store.dir}", exc) from None
        if problems:
            raise CNIError(ERR_IO_FAILURE, f"host-local: GC left {len(problems)} entr"
                           f"{'y' if len(problems) == 1 else 'ies'} it could not handle",
                           "; ".join(problems))

    def validate_config(self, args: CmdArgs, conf: HostLocalConf) -> None:
        """ADD's checks of the config, without the store: `load_ipam` (range
        sets, their overlaps, requested addresses) and ``resolvConf`` readable.

        Raises:
            CNIError: as ADD: code 7 naming the range set or key, 5 for an
                unreadable resolvConf.
        """
        ipam = load_ipam(conf, args.typed_args)
        if ipam.resolv_conf:
            parse_resolv_conf(ipam.resolv_conf)

    def status(self, args: CmdArgs, conf: HostLocalConf) -> None:
        """Ready when the store is writable and every range set has a free address.

        Raises:
            CNIError: code 50 (spec: cannot service ADD) naming the store or the
                exhausted range set; code 7 for an invalid config.
        """
        ipam = load_ipam(conf, args.typed_args)
        store = _store(ipam)
        try:
            store.ensure()
            with store.lock():
                store.probe_write()
                taken = store.scan().taken()
        except OSError as exc:
            where = getattr(exc, "filename", None) or store.dir
            raise CNIError(ERR_PLUGIN_NOT_AVAILABLE,
                           f"host-local: store {store.dir} is not writable: {where}: "
                           f"{exc.strerror or exc}", where) from None
        for idx, rset in enumerate(ipam.range_sets):
            used = 0
            for ip in taken:
                r = rset.range_for(ip)
                if r is not None and not r.reserved(ip):
                    used += 1
            if used >= rset.allocatable_count():
                raise CNIError(ERR_PLUGIN_NOT_AVAILABLE,
                               f"host-local: no IP addresses available in range set {idx}: {rset}",
                               f"all {rset.allocatable_count()} allocatable addresses are in use")
