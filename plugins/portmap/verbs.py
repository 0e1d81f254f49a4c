"""portmap's verbs: ADD, CHECK, DEL, GC, STATUS (layout in `.layout`)."""

from __future__ import annotations

import errno
import ipaddress
import os
import sys
from typing import Any

from cni_skel.env import CmdArgs
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_TRY_AGAIN_LATER,
    CNIError,
)
from cni_skel.nft import Nft, NftError, Table, attachment_tag, nft_status

from . import layout as L
from .config import PROTOCOLS, PortMapConf

__all__ = ["add", "check", "container_ips", "delete", "gc", "status"]

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
_ATTEMPTS = 5


def _log(msg: str) -> None:
    print(f"portmap: {msg}", file=sys.stderr)


def container_ips(conf: PortMapConf, ifname: str) -> dict[int, IPAddr]:
    """The first IPv4 and first IPv6 address of prevResult on the container's
    interface (Go's parseConfig: an address whose ``interface`` names an
    interface other than ``ifname``, or one without ``sandbox``, is skipped;
    an address with no ``interface`` is taken)."""
    prev = conf.prev_result
    out: dict[int, IPAddr] = {}
    if prev is None:
        return out
    for ip in prev.ips:
        v = ip.address.version
        if v in out:
            continue
        idx = ip.interface
        if idx is not None and 0 <= idx < len(prev.interfaces):
            iface = prev.interfaces[idx]
            if iface.name != ifname or not iface.sandbox:
                continue
        out[v] = ip.address.ip
    return out


def _wanted(args: CmdArgs, conf: PortMapConf) -> tuple[str, list[L.Entry]]:
    gid = L.group_id(conf.name, conf.conditions(4), conf.conditions(6))
    ips = container_ips(conf, args.ifname)
    return gid, L.want_entries(conf.port_mappings, ips, snat=conf.snat_enabled,
                               masq_all=conf.masq_all, gid=gid)


def _norm_data(set_name: str, data: Any) -> Any:
    if data is None:
        return None
    try:
        if set_name.endswith(("_a4", "_a6", "_ha4", "_ha6")):
            return str(ipaddress.ip_address(data))
        return int(data)
    except (ValueError, TypeError):
        return data


def _index(table: Table | None, names: set[str]) -> dict[tuple[str, Any], tuple]:
    """(set, canonical key) -> (canonical data, comment, key as listed)."""
    out: dict[tuple[str, Any], tuple] = {}
    if table is None:
        return out
    for name in names:
        for key, data, comment in table.entries(name):
            norm = L.normalize(name, key)
            if norm is not None:
                out[(name, norm)] = (_norm_data(name, data), comment, key)
    return out


def _plan(table: Table | None, want: list[L.Entry], tag: str) -> tuple[list[dict], list[str]]:
    """Element commands turning the listed state into ``want`` for ``tag``:
    create what is missing, keep what is ours already, replace ours with
    other data and shared masquerade entries of another attachment (same
    container address: that attachment is gone without DEL). Also returns
    notes for the log, about what was taken over.

    Raises:
        CNIError: 7 naming the mapping when one of its keys belongs to
            another attachment.
    """
    index = _index(table, {e.set for e in want})
    deletes: list[tuple[str, Any]] = []
    creates: list[L.Entry] = []
    conflicts: list[str] = []
    notes: list[str] = []
    for e in want:
        cur = index.get((e.set, e.key))
        if cur is None:
            creates.append(e)
            continue
        data, comment, key = cur
        if comment == tag and data == e.data:
            continue
        if comment == tag or e.shared_masq:
            if comment != tag:
                notes.append(f"took over {e.what} from {comment}")
            deletes.append((e.set, key))
            creates.append(e)
        else:
            text = (f"runtimeConfig.portMappings.{e.index}: {e.what} is already mapped to "
                    f"another container ({comment or 'untagged entry'})")
            if text not in conflicts:
                conflicts.append(text)
    if conflicts:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"portmap: {conflicts[0]}",
                       "; ".join(conflicts))
    return L.delete_cmds(deletes) + L.create_cmds(creates, tag), notes


def _layout_cmds(table: Table | None, conf: PortMapConf, gid: str,
                 cache: dict[str, Any]) -> list[dict]:
    cmds: list[dict] = []
    chains = table.chains if table is not None else {}
    if L.HOSTPORTS not in chains:
        cmds += L.base_layout()
    if f"dnat_{gid}" not in chains:
        if "conds" not in cache:
            from .conditions import to_json

            cache["conds"] = to_json({"conditionsV4": conf.conditions(4),
                                      "conditionsV6": conf.conditions(6)})
        conds = cache["conds"]
        cmds += L.group_layout(gid, conf.name, {4: conds["conditionsV4"],
                                                6: conds["conditionsV6"]})
    return cmds


def _apply_add(nft: Nft, conf: PortMapConf, gid: str, want: list[L.Entry], tag: str) -> None:
    # Fast path, one transaction: the layout is there and no key is taken.
    try:
        nft.run(L.create_cmds(want, tag), what="portmap: adding port mappings")
        return
    except NftError as e:
        if e.errno not in (errno.ENOENT, errno.EEXIST):
            raise
    # Something is missing or taken: look, then do exactly what is needed. A
    # concurrent ADD may win the race (EEXIST again): look again.
    cache: dict[str, Any] = {}
    for _ in range(_ATTEMPTS):
        table = nft.table(L.FAMILY, L.TABLE)
        elements, notes = _plan(table, want, tag)
        cmds = _layout_cmds(table, conf, gid, cache) + elements
        if not cmds:
            return
        try:
            nft.run(cmds, what="portmap: adding port mappings")
            for note in notes:
                _log(note)
            return
        except NftError as e:
            if e.errno not in (errno.ENOENT, errno.EEXIST):
                raise
    raise CNIError(ERR_TRY_AGAIN_LATER, "portmap: nftables table "
                   f"{L.FAMILY} {L.TABLE} kept changing while adding port mappings")


def _tagged_keys(table: Table, tags: set[str], names: Any = None) -> list[tuple[str, Any]]:
    out = []
    for name in names if names is not None else [*table.sets, *table.maps]:
        for key, _data, comment in table.entries(name):
            if comment is not None and comment in tags:
                out.append((name, key))
    return out


def _remove_tags(nft: Nft, tags: set[str], what: str) -> None:
    """Delete every element tagged with one of ``tags``; commit nothing when
    there is none."""
    for _ in range(_ATTEMPTS):
        table = nft.table(L.FAMILY, L.TABLE)
        keys = _tagged_keys(table, tags) if table is not None else []
        if not keys:
            return
        try:
            nft.run(L.delete_cmds(keys), what=what)
            return
        except NftError as e:
            if e.errno != errno.ENOENT:
                raise
    raise CNIError(ERR_TRY_AGAIN_LATER, f"{what}: nftables table {L.FAMILY} {L.TABLE} "
                   "kept changing")


def _route_localnet(conf: PortMapConf, ip: IPAddr) -> None:
    """Go's enableLocalnetRouting: route_localnet=1 on the node interfaces of
    prevResult (those without ``sandbox``: the bridge, the host veth), so
    that 127/8-sourced traffic DNATed to the container may be routed; when
    prevResult names none present here, on the interface the route to the
    container goes through (Go's getRoutableHostIF)."""
    from cni_skel.sysctl import read_sysctl, write_sysctl

    names = [i.name for i in conf.prev_result.interfaces if not i.sandbox]
    present = [n for n in names if n and "/" not in n and n not in (".", "..")
               and os.path.isdir(f"/proc/sys/net/ipv4/conf/{n}")]
    if not present:
        name = _route_dev(ip)
        present = [name] if name else []
    for name in present:
        key = f"net/ipv4/conf/{name}/route_localnet"
        if read_sysctl(key) != "1":
            write_sysctl(key, "1")


def _route_dev(ip: IPAddr) -> str | None:
    from pyroute2 import IPRoute

    try:
        with IPRoute() as ipr:
            routes = ipr.route("get", dst=str(ip))
            oif = routes[0].get_attr("RTA_OIF") if routes else None
            if oif is None:
                return None
            links = ipr.link("get", index=oif)
            return links[0].get_attr("IFLA_IFNAME") if links else None
    except Exception as e:  # best effort, as Go
        _log(f"no route to {ip}: {e}")
        return None


def _flush_udp(conf: PortMapConf, ips: dict[int, IPAddr]) -> None:
    # Go's deletePortmapStaleConnections: UDP entries to the host port were
    # made before the mapping existed and would keep bypassing it.
    ports = {m.host_port for m in conf.port_mappings if m.protocol == "udp"}
    if not ports:
        return
    from cni_skel.conntrack import delete_entries

    for v in ips:
        for port in sorted(ports):
            try:
                delete_entries(v, PROTOCOLS["udp"], dport=port)
            except CNIError as e:  # informative only, as Go
                _log(f"failed to delete stale UDP conntrack entries (IPv{v}, port {port}): {e}")


# --- verbs ---------------------------------------------------------------------------


def _need_prev(conf: PortMapConf) -> None:
    if conf.prev_result is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       "invalid network config: prevResult: required key is missing",
                       "portmap must be called as a chained plugin")


def add(args: CmdArgs, conf: PortMapConf) -> Any:
    _need_prev(conf)
    if not conf.port_mappings:
        return conf.prev_result
    gid, want = _wanted(args, conf)
    if not want:
        _log("no container address for the port mappings; nothing to do")
        return conf.prev_result
    tag = attachment_tag(args.container_id, args.ifname)
    ips = container_ips(conf, args.ifname)
    nft = Nft()
    _apply_add(nft, conf, gid, want, tag)
    if conf.snat_enabled and 4 in ips:
        try:
            _route_localnet(conf, ips[4])
        except CNIError as e:
            _remove_tags(nft, {tag}, "portmap: rolling back")
            raise CNIError(e.code, f"portmap: unable to enable route_localnet: {e.msg}",
                           e.details) from e
    _flush_udp(conf, ips)
    return conf.prev_result


def check(args: CmdArgs, conf: PortMapConf) -> None:
    _need_prev(conf)
    if not conf.port_mappings:
        return
    gid, want = _wanted(args, conf)
    if not want:
        return
    tag = attachment_tag(args.container_id, args.ifname)
    table = Nft().table(L.FAMILY, L.TABLE)
    if table is None:
        raise CNIError(ERR_INTERNAL, f"portmap: nftables table {L.FAMILY} {L.TABLE} is missing")
    problems = []
    for chain in (L.HOSTPORTS, f"dnat_{gid}"):
        if chain not in table.chains:
            problems.append(f"chain {chain} is missing")
    index = _index(table, {e.set for e in want})
    for e in want:
        cur = index.get((e.set, e.key))
        if cur is None:
            problems.append(f"{e.what}: missing from {e.set}")
        elif cur[1] != tag:
            problems.append(f"{e.what}: {e.set} entry belongs to {cur[1]}")
        elif cur[0] != e.data:
            problems.append(f"{e.what}: {e.set} holds {cur[0]}, not {e.data}")
    if problems:
        raise CNIError(ERR_INTERNAL, f"portmap: {problems[0]}", "; ".join(problems))


def delete(args: CmdArgs, conf: PortMapConf) -> None:
    _remove_tags(Nft(), {attachment_tag(args.container_id, args.ifname)},
                 "portmap: removing port mappings")


def gc(args: CmdArgs, conf: PortMapConf) -> None:
    valid_list = conf.attachment_list()
    if valid_list is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "GC needs cni.dev/valid-attachments",
                       "without the list of valid attachments nothing is removed")
    valid = {attachment_tag(a.container_id, a.ifname) for a in valid_list}
    nft = Nft()
    current = L.group_id(conf.name, conf.conditions(4), conf.conditions(6))
    for _ in range(_ATTEMPTS):
        table = nft.table(L.FAMILY, L.TABLE)
        if table is None:
            return
        cmds = _gc_cmds(table, L.network_id(conf.name), current, valid)
        if not cmds:
            return
        try:
            nft.run(cmds, what="portmap: garbage collection")
            return
        except NftError as e:
            if e.errno != errno.ENOENT:
                raise
    raise CNIError(ERR_TRY_AGAIN_LATER, "portmap: garbage collection: nftables table "
                   f"{L.FAMILY} {L.TABLE} kept changing")


def _gc_cmds(table: Table, nid: str, current: str, valid: set[str]) -> list[dict]:
    """Deletes of this network's entries whose attachment is not valid (and
    their shared claims/masquerade entries), and of this network's DNAT
    chains and maps left empty that the current config does not use."""
    groups = L.network_groups(table.maps, nid)
    stale: set[str] = set()
    for maps in groups.values():
        for name in maps:
            for _key, _data, comment in table.entries(name):
                if comment is not None and comment not in valid:
                    stale.add(comment)
    cmds: list[dict] = []
    dropped: set[str] = set()
    for gid, maps in groups.items():
        if gid == current:
            continue
        if all(c in stale for name in maps for _k, _d, c in table.entries(name)):
            dropped.update(maps)
            chain = f"dnat_{gid}"
            for rule in table.chain_rules(L.HOSTPORTS):
                if {"jump": {"target": chain}} in rule.get("expr", []):
                    cmds.append({"delete": {"rule": {"family": L.FAMILY, "table": L.TABLE,
                                                     "chain": L.HOSTPORTS,
                                                     "handle": rule["handle"]}}})
            if chain in table.chains:
                cmds.append({"delete": {"chain": {"family": L.FAMILY, "table": L.TABLE,
                                                  "name": chain}}})
            cmds += [{"delete": {"map": {"family": L.FAMILY, "table": L.TABLE, "name": m}}}
                     for m in maps]
    if not stale:
        return cmds
    names = [m for maps in groups.values() for m in maps if m not in dropped]
    names += [s for s in L.SHARED_SETS if s in table.sets]
    return L.delete_cmds(_tagged_keys(table, stale, names)) + cmds


def status(args: CmdArgs, conf: PortMapConf) -> None:
    nft_status()
