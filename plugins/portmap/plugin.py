"""The portmap plugin: `PortMap` and the nftables steps of its verbs
(layout in `.layout`).

Cost: ADD (no conflict), CHECK and DEL do not grow with the number of other
pods' mappings: ADD is one ``create element`` transaction (the kernel refuses
a taken key), CHECK and DEL read only the elements they are about
(`cni_skel.nft.lookup`, guided by the attachment's record, see `.layout`),
DEL then deletes those still tagged with its attachment in one transaction.
Only the rare paths list the whole table: ADD after a conflict or over its
own entries, DEL in a table made before records, GC.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import sys
from typing import Any

from cni_skel import __version__, gorules
from cni_skel.env import CmdArgs
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_TRY_AGAIN_LATER,
    CNIError,
)
from cni_skel.nft import (
    GetChain,
    GetSet,
    GetTable,
    Nft,
    NftError,
    Table,
    attachment_tag,
    lookup,
    network_tag,
    nft_status,
    table_state,
)
from cni_skel.rollback import rollback
from cni_skel.skel import Plugin
from cni_skel.sysctl import read_sysctl, write_sysctl
from cni_skel.types import Result, check_expressible

from . import goiptables as G
from . import layout as L
from .conditions import to_json
from .config import PROTOCOLS, PortMapConf

__all__ = ["PortMap", "container_ips"]

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
_ATTEMPTS = 5


def _log(msg: str) -> None:
    print(f"portmap: {msg}", file=sys.stderr)


def container_ips(conf: PortMapConf, ifname: str) -> dict[int, IPAddr]:
    """The first IPv4 and first IPv6 address of prevResult on the container's
    interface (Go's parseConfig: an address whose ``interface`` names an
    interface other than ``ifname``, or one without ``sandbox``, is skipped;
    an address with no ``interface`` is taken)."""
    return {v: iface.ip for v, iface in container_nets(conf, ifname).items()}


def container_nets(conf: PortMapConf, ifname: str) -> dict[int, IPInterface]:
    """`container_ips` with their prefix lengths, as prevResult gives them
    (Go's iptables backend masquerades hairpin traffic from the address's
    whole subnet)."""
    prev = conf.prev_result
    out: dict[int, IPInterface] = {}
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
        out[v] = ip.address
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
            cache["conds"] = to_json({"conditionsV4": conf.conditions(4),
                                      "conditionsV6": conf.conditions(6)})
        conds = cache["conds"]
        cmds += L.group_layout(gid, conf.name, {4: conds["conditionsV4"],
                                                6: conds["conditionsV6"]})
    return cmds


def _record_cmds(table: Table | None, tag: str, record: L.Record) -> list[dict]:
    """Commands that leave ``tag``'s record covering ``record`` (merged with
    the one there). A table without the records set gets it, with a record
    for every attachment found in it (made by an older version)."""
    if table is None or L.RECORDS not in table.sets:
        listed = {} if table is None else {n: list(table.entries(n))
                                           for n in [*table.sets, *table.maps]}
        found = L.records_from_entries(listed)
        record = found.pop(tag, L.Record()) | record
        cmds = [L.records_set(create=True)]
        for other, rec in sorted(found.items()):
            cmds += L.record_cmds(other, rec)
        return cmds + L.record_cmds(tag, record)
    chunks = L.records_by_prefix(table.entries(L.RECORDS)).get(L.tag_prefix(tag), [])
    old = L.Record.parse([c for _, _, c in chunks]) if chunks else None
    merged = (old or L.Record()) | record
    if old is not None and merged == old:
        return []
    return L.delete_cmds([(L.RECORDS, key) for _, key, _ in chunks]) + L.record_cmds(tag, merged)


def _apply_add(nft: Nft, conf: PortMapConf, gid: str, want: list[L.Entry], tag: str,
               record: L.Record) -> None:
    # Fast path, one transaction: the layout is there, no key is taken and the
    # attachment has no record yet.
    try:
        nft.run(L.create_cmds(want, tag) + L.record_cmds(tag, record),
                what="portmap: adding port mappings")
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
        cmds += _record_cmds(table, tag, record)
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


def _record_keys(table: Table, tags: set[str]) -> list[tuple[str, Any]]:
    prefixes = {L.tag_prefix(t) for t in tags}
    return [(L.RECORDS, key)
            for prefix, chunks in L.records_by_prefix(table.entries(L.RECORDS)).items()
            if prefix in prefixes for _, key, _ in chunks]


def _remove_tags(nft: Nft, tags: set[str], what: str) -> None:
    """Delete every element tagged with one of ``tags``, and their records,
    found by listing the table (O(elements)); commit nothing when there is
    none."""
    for _ in range(_ATTEMPTS):
        table = nft.table(L.FAMILY, L.TABLE)
        keys = _tagged_keys(table, tags) + _record_keys(table, tags) if table is not None else []
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


def _read_record(tag: str) -> tuple[bool | None, list[str], L.Record | None]:
    """Point reads of ``tag``'s record: (the records set exists, None when
    the table does not; keys of the record's elements found; the record,
    None when there is none or it can not be read)."""
    has_table, has_set, first = lookup(L.FAMILY, L.TABLE, [GetTable(), GetSet(L.RECORDS),
                                                           L.record_query(tag)])
    if not has_table:
        return None, [], None
    if not has_set or first is None:
        return has_set, [], None
    keys, comments = [L.record_key(tag)], [first.comment]
    n = L.Record.count(first.comment) or 1
    if n > 1:
        more = lookup(L.FAMILY, L.TABLE, [L.record_query(tag, i) for i in range(1, n)])
        for i, el in enumerate(more, 1):
            if el is not None:
                keys.append(L.record_key(tag, i))
            comments.append(None if el is None else el.comment)
    return True, keys, L.Record.parse(comments)


def _remove(tag: str, hint: list[L.Entry], what: str, nft: Nft | None = None) -> None:
    """Delete the elements of attachment ``tag`` and its record, in one
    transaction; commit nothing when there is none. Candidates come from the
    record (and ``hint``, the entries this config would make); each is read
    back and deleted only while it still carries ``tag``: a record left
    stale (entries removed by GC, taken over) deletes nothing of others.
    Without a records set (a table of an older version) or with a record
    that can not be read, the table is listed instead."""
    for _ in range(_ATTEMPTS):
        has_set, rec_keys, record = _read_record(tag)
        if has_set is None:  # no table: nothing to remove
            return
        if not has_set or (rec_keys and record is None):
            _remove_tags(nft or Nft(), {tag}, what)
            return
        seen: set[tuple[str, tuple]] = set()
        cands = []
        for e in (record.entries() if record is not None else []) + hint:
            if (e.set, e.key) not in seen:
                seen.add((e.set, e.key))
                cands.append(e)
        found = lookup(L.FAMILY, L.TABLE, [L.query(e) for e in cands])
        keys = [(e.set, e.key_json()) for e, el in zip(cands, found, strict=True)
                if el is not None and el.comment == tag]
        keys += [(L.RECORDS, k) for k in rec_keys]
        if not keys:
            return
        nft = nft or Nft()
        try:
            nft.run(L.delete_cmds(keys), what=what)
            return
        except NftError as e:  # something went meanwhile: read again
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


def _enable_localnet(conf: PortMapConf, ips: dict[int, IPAddr]) -> None:
    """Go's ADD step after the IPv4 mappings: with ``snat``, route_localnet
    on the node interface routing to the pod (`_route_localnet`)."""
    if conf.snat_enabled and 4 in ips:
        try:
            _route_localnet(conf, ips[4])
        except CNIError as e:
            raise CNIError(e.code, f"portmap: unable to enable route_localnet: {e.msg}",
                           e.details) from e


def _route_dev(ip: IPAddr) -> str | None:
    # pyroute2 only here and for UDP: a one-shot ADD otherwise never loads it (~100 ms).
    from cni_skel import netlink  # noqa: PLC0415
    from cni_skel.rtnl import Rtnl  # noqa: PLC0415

    try:
        with Rtnl() as ipr:
            route = netlink.route_get(ipr, ip)
            oif = route["oif"] if route else None
            if oif is None:
                return None
            link = netlink.find_link(ipr, oif)
            return link.name if link else None
    except Exception as e:  # best effort, as Go
        _log(f"no route to {ip}: {e}")
        return None


def _flush_udp(conf: PortMapConf, ips: dict[int, IPAddr]) -> None:
    # Go's deletePortmapStaleConnections: UDP entries to the host port were
    # made before the mapping existed and would keep bypassing it.
    ports = {m.host_port for m in conf.port_mappings if m.protocol == "udp"}
    if not ports:
        return
    from cni_skel.conntrack import delete_entries  # noqa: PLC0415 (pyroute2: see _route_dev)

    for v in ips:
        for port in sorted(ports):
            try:
                delete_entries(v, PROTOCOLS["udp"], dport=port)
            except CNIError as e:  # informative only, as Go
                _log(f"failed to delete stale UDP conntrack entries (IPv{v}, port {port}): {e}")


# --- what Go's portmap made (a node moving from the Go plugins) --------------------

#: Where Go's portmap (iptables backend) keeps its rules on an iptables-nft node.
_GO_FAMILIES = ("ip", "ip6")
_GO_TABLES = ("nat",)
_GO_FAMILY = {4: "ip", 6: "ip6"}


def _go_rules(nft: Nft) -> list[gorules.GoRule]:
    """Go portmap's rules, or none without its ``CNI-HOSTPORT-DNAT`` chain
    (what a node without Go pays: `gorules.chain_present`)."""
    if not gorules.chain_present(nft, [(f, "nat", "CNI-HOSTPORT-DNAT") for f in _GO_FAMILIES]):
        return []
    return gorules.list_rules(nft, _GO_FAMILIES, _GO_TABLES)


def _go_conflicts(nft: Nft, want: list[L.Entry], container_id: str) -> None:
    """Refuse host ports a Go portmap DNAT rule holds for another container
    (Go's rules do not see our maps, nor ours theirs: both would match, and
    whichever hook runs first would take the traffic).

    Raises:
        CNIError: 7 (as a port another attachment of ours holds) naming the
            mapping, the holder's container ID and network, and Go's chain.
    """
    held = gorules.host_ports(_go_rules(nft))
    if not held:
        return
    conflicts = []
    for e in want:
        if not e.set.startswith("claims"):
            continue
        host, proto, port = e.key
        family = _GO_FAMILY[int(e.set[-1])]
        unspec = ipaddress.ip_address(host).is_unspecified
        for hp in held:
            if (hp.family, hp.protocol, hp.port) != (family, proto, port) \
                    or hp.container_id == container_id:
                continue
            if hp.host_ip is None or unspec or hp.host_ip == host:
                conflicts.append(f"runtimeConfig.portMappings.{e.index}: {e.what} is held by "
                                 f"container {hp.container_id or '(unnamed)'} of network "
                                 f"{hp.network or '(unnamed)'} through the Go portmap plugin's "
                                 "iptables rules")
                break
    if conflicts:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"portmap: {conflicts[0]}",
                       "; ".join(conflicts))


def _go_check(conf: PortMapConf, container_id: str, ips: dict[int, IPInterface]) -> bool:
    """True when Go's portmap holds the container's mappings (a pod Go
    created, checked after the switch): its iptables layout, rule for rule
    (`.goiptables.check`), or Go 1.9.1's nftables rules, counted as Go's
    CHECK counts them."""
    addrs = [ips[v] for v in sorted(ips)]
    if G.made_by_go(conf.name, container_id):
        return not G.check(conf, container_id, addrs)
    rules = G.nft_rules(container_id)
    if not rules:
        return False
    for addr in addrs:
        family = "ip" if addr.version == 4 else "ip6"
        ports = sum(1 for m in conf.port_mappings
                    if m.host_ip is None or m.host_ip.version == addr.version)
        mine = [r for r in rules if r.family == family]
        if sum(r.chain in ("hostports", "hostip_hostports") for r in mine) < ports:
            return False
        masq = (2 if addr.version == 4 else 1) if conf.snat_enabled else 0
        if sum(r.chain == "masquerading" for r in mine) < masq:
            return False
    return True


def _wanted_quiet(handover: gorules.GoHandOver, conf: PortMapConf) -> list[L.Entry]:
    """The entries this config would make (a hint for `_remove`), none when
    ADD would refuse it."""
    try:
        return L.want_entries(conf.port_mappings, container_ips(conf, handover.ifname),
                              snat=conf.snat_enabled, masq_all=conf.masq_all,
                              gid=L.group_id(conf.name, conf.conditions(4),
                                             conf.conditions(6)))
    except CNIError:
        return []


def _need_prev(conf: PortMapConf) -> None:
    if conf.prev_result is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       "invalid network config: prevResult: required key is missing",
                       "portmap must be called as a chained plugin")


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
    stale_records = _stale_records(table, nid, valid)
    # shared-set entries left without map entries: their record says whose
    for name in L.SHARED_SETS:
        for _key, _data, comment in table.entries(name):
            if (comment is not None and comment not in stale and comment not in valid
                    and L.tag_prefix(comment) in stale_records):
                stale.add(comment)
    cmds: list[dict] = []
    records = L.delete_cmds([(L.RECORDS, k) for chunks in stale_records.values()
                             for k in chunks])
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
        return records + cmds
    names = [m for maps in groups.values() for m in maps if m not in dropped]
    names += [s for s in L.SHARED_SETS if s in table.sets]
    return L.delete_cmds(_tagged_keys(table, stale, names)) + records + cmds


def _stale_records(table: Table, nid: str, valid: set[str]) -> dict[bytes, list[str]]:
    """The records of this network's attachments that are not valid: hash
    prefix -> keys of its elements (a record naming another network's group
    too is left alone)."""
    keep = {L.tag_prefix(t) for t in valid}
    out = {}
    for prefix, chunks in L.records_by_prefix(table.entries(L.RECORDS)).items():
        if prefix in keep:
            continue
        record = L.Record.parse([c for _, _, c in chunks])
        if record is not None and record.gids and all(g.startswith(nid + "_")
                                                       for g in record.gids):
            out[prefix] = [key for _, key, _ in chunks]
    return out


# --- the plugin ----------------------------------------------------------------


class PortMap(Plugin):
    """portmap: ``runtimeConfig.portMappings`` DNATed to the container.

    Config: `cni_skel_plugins.portmap.config` (``portMappings``, ``snat``,
    ``masqAll``, ``backend``, ``conditionsV4``/``conditionsV6``,
    ``markMasqBit``, ``externalSetMarkChain``). What follows is our
    nftables backend, the default; ``backend: "iptables"`` writes Go's
    iptables layout instead (`.goiptables`, docs/netfilter.md), and DEL
    removes what Go made for the container on either of its backends.

    ADD (prevResult required, code 7 without): the first IPv4 and IPv6
    address of prevResult on CNI_IFNAME (Go's choice) get every mapping of
    their family, in one nftables transaction: DNAT for traffic to any local
    address of the node (prerouting and output hooks, ``fib daddr type
    local``), or to ``hostIP`` only; with ``snat`` (default true) hairpin
    traffic (the container to its own host port) and, for IPv4, traffic from
    127.0.0.0/8 are masqueraded (``route_localnet=1`` on the node interfaces
    of prevResult); ``masqAll`` masquerades mapped traffic from any source.
    (Hairpin through a Linux bridge with br_netfilter loaded also needs the
    bridge plugin's ``hairpinMode``, as with Go.)
    Stale UDP conntrack entries to the host ports are then deleted (failures
    logged, as Go). No mappings, or no address: prevResult passed through.
    Errors: 7 when a (hostIP, protocol, hostPort) is already mapped by
    another attachment, in any network (Go: last writer wins), or held by
    a Go portmap DNAT rule of another container (message: port, holder
    container and network), or twice in
    the request to different container ports; 7/2 for config errors (see
    the config module); nothing is applied on any error.

    CHECK: every mapping of the container is present, tagged with this
    attachment and pointing at its address and port, or held by Go's
    portmap for this container (a pod made before the switch) (999
    otherwise; 7 without prevResult). DEL: removes Go portmap's DNAT jump
    and chain of the container, and every entry tagged with this attachment
    (``containerID/ifname``), with or without portMappings and prevResult (Go
    does nothing without portMappings), in one transaction; nothing to remove
    commits nothing. ADD keeps a record of each attachment in the table, so
    CHECK and DEL read only their own elements: their cost does not grow
    with the number of pods. GC (1.1.0): removes this
    network's entries of attachments not in ``cni.dev/valid-attachments``
    (7 without the list), Go portmap's of this network's containers not in
    it, and this network's DNAT chains left empty by a
    change of conditions. STATUS (1.1.0): 50 when nftables can not be used.
    """

    name = "portmap"
    about = f"CNI portmap plugin (cni-skel {__version__}, nftables)"
    config_model = PortMapConf

    @classmethod
    def node_state(cls) -> list[str]:
        """Its nftables table in this network namespace, when it exists
        (`cni_skel.skel.Plugin.node_state`)."""
        line = table_state(L.FAMILY, L.TABLE, "port mappings of pods still attached")
        return [line] if line else []

    @classmethod
    def hand_over_to_go(cls, conf: PortMapConf, handover: gorules.GoHandOver, *,
                        dry_run: bool = False) -> list[str]:
        """For a pod that stays while the node goes back to Go's portmap
        (`cni_skel.skel.Plugin.hand_over_to_go`): Go's portmap ADD is run
        with the cached prevResult and mappings, so Go makes its own DNAT
        rules (its DEL then finds them), and only then our entries of the
        attachment are removed: the host ports never stop answering (both
        DNAT to the same pod meanwhile).

        Raises:
            CNIError: Go's portmap's error (ours are kept then); 999 when
                nftables refuses.
        """
        lines: list[str] = []
        if conf.port_mappings and conf.prev_result is not None:
            if not dry_run:
                handover.run_go("ADD")
            ports = ", ".join(f"{m.protocol}/{m.host_port}" for m in conf.port_mappings)
            lines.append(f"{'would run' if dry_run else 'ran'} Go's portmap ADD ({ports})")
        tag = attachment_tag(handover.container_id, handover.ifname)
        if lookup(L.FAMILY, L.TABLE, [GetTable()])[0]:
            if not dry_run:
                _remove(tag, _wanted_quiet(handover, conf), "portmap: handing over to Go")
            lines.append(f"{'would remove' if dry_run else 'removed'} our port mappings of {tag}")
        return lines

    @classmethod
    def release_node_state(cls, *, dry_run: bool = False) -> list[str]:
        """Delete our table (``inet cni_portmap``) when none of its sets and
        maps holds an element any more."""
        nft = Nft()
        table = nft.table(L.FAMILY, L.TABLE)
        if table is None or any(o.get("elem") for o in [*table.sets.values(),
                                                         *table.maps.values()]):
            return []
        if not dry_run:
            nft.run([{"delete": {"table": {"family": L.FAMILY, "name": L.TABLE}}}],
                    what="portmap: removing its empty table")
        return [f"{'would delete' if dry_run else 'deleted'} empty nftables table "
                f"{L.FAMILY} {L.TABLE}"]

    def add(self, args: CmdArgs, conf: PortMapConf) -> Result:
        """Map the host ports to the container (Go's cmdAdd: forwardPorts,
        route_localnet, stale UDP conntrack entries); see the class
        docstring. The mappings are removed again when route_localnet can
        not be set. Returns prevResult unchanged.

        Raises:
            CNIError: 7 without prevResult or on a port conflict; 1 when
                prevResult cannot be written in the config's cniVersion;
                999 when nftables refuses.
        """
        _need_prev(conf)
        check_expressible(conf.cni_version, conf.prev_result)  # the result is prevResult
        if not conf.port_mappings:
            return conf.prev_result
        if conf.effective_backend == "iptables":
            return self._add_iptables(args, conf)
        gid, want = _wanted(args, conf)
        if not want:
            _log("no container address for the port mappings; nothing to do")
            return conf.prev_result
        tag = attachment_tag(args.container_id, args.ifname)
        ips = container_ips(conf, args.ifname)
        nft = Nft()
        _go_conflicts(nft, want, args.container_id)
        with rollback(self.name) as undo:
            _apply_add(nft, conf, gid, want, tag, L.Record.of(gid, ips, conf.port_mappings))
            undo.callback("removing port mappings", _remove, tag, want, "portmap: rolling back",
                          nft)
            _enable_localnet(conf, ips)
        _flush_udp(conf, ips)
        return conf.prev_result

    def _add_iptables(self, args: CmdArgs, conf: PortMapConf) -> Result:
        """ADD with ``backend: "iptables"``: Go's chains and rules for the
        container's IPv4 and IPv6 address (`.goiptables.setup`), Go's
        route_localnet and conntrack steps; undone on failure. As Go, a
        host port other pods map is not refused (the newest rule's jump
        comes last in ``CNI-HOSTPORT-DNAT``: the older pod keeps it)."""
        nets = container_nets(conf, args.ifname)
        addrs = [nets[v] for v in sorted(nets)]
        ips = {v: net.ip for v, net in nets.items()}
        if not addrs:
            _log("no container address for the port mappings; nothing to do")
            return conf.prev_result
        with rollback(self.name) as undo:
            undo.callback("removing port mappings", G.remove, conf.name, args.container_id,
                          "portmap: rolling back")
            G.setup(conf, args.container_id, addrs)
            _enable_localnet(conf, ips)
        _flush_udp(conf, ips)
        return conf.prev_result

    def check(self, args: CmdArgs, conf: PortMapConf) -> None:
        """Every mapping of the container is present, tagged with this
        attachment and pointing at its address and port (point reads only);
        with ``backend: "iptables"`` every rule of Go's layout
        (`.goiptables.check`).

        Raises:
            CNIError: 7 without prevResult; 999 naming every problem.
        """
        _need_prev(conf)
        if not conf.port_mappings:
            return
        if conf.effective_backend == "iptables":
            nets = container_nets(conf, args.ifname)
            problems = G.check(conf, args.container_id, [nets[v] for v in sorted(nets)])
            if problems:
                raise CNIError(ERR_INTERNAL, f"portmap: {problems[0]}", "; ".join(problems))
            return
        gid, want = _wanted(args, conf)
        if not want:
            return
        tag = attachment_tag(args.container_id, args.ifname)
        chains = (L.HOSTPORTS, f"dnat_{gid}")
        answers = lookup(L.FAMILY, L.TABLE, [GetTable(), *(GetChain(c) for c in chains),
                                             *(L.query(e) for e in want)])
        problems = [] if answers[0] else [f"nftables table {L.FAMILY} {L.TABLE} is missing"]
        problems += [f"chain {c} is missing" for c, ok in zip(chains, answers[1:3], strict=True)
                     if not ok and answers[0]]
        for e, el in zip(want, answers[3:], strict=True):
            if not answers[0]:
                break
            if el is None:
                problems.append(f"{e.what}: missing from {e.set}")
            elif el.comment != tag:
                problems.append(f"{e.what}: {e.set} entry belongs to {el.comment}")
            elif el.data != e.data:
                problems.append(f"{e.what}: {e.set} holds {el.data}, not {e.data}")
        if problems and not _go_check(conf, args.container_id,
                                      container_nets(conf, args.ifname)):
            raise CNIError(ERR_INTERNAL, f"portmap: {problems[0]}", "; ".join(problems))

    def delete(self, args: CmdArgs, conf: PortMapConf) -> None:
        """Remove every entry tagged with this attachment, with or without
        portMappings and prevResult (Go does nothing without portMappings),
        in one transaction; nothing to remove commits nothing.

        Raises:
            CNIError: 999 when nftables refuses; 11 when the table kept
                changing under us.
        """
        hint: list[L.Entry] = []
        if conf.port_mappings and conf.prev_result is not None \
                and conf.effective_backend == "nftables":
            try:
                hint = _wanted(args, conf)[1]
            except CNIError:  # mappings that ADD would refuse: nothing of them was made
                hint = []
        _remove(attachment_tag(args.container_id, args.ifname), hint,
                "portmap: removing port mappings")
        G.remove(conf.name, args.container_id, "portmap: removing the Go plugin's rules")

    def gc(self, args: CmdArgs, conf: PortMapConf) -> None:
        """Remove this network's entries of attachments not in
        `NetConf.gc_keep`, and this network's DNAT chains and maps left
        empty by a change of conditions (Go's portmap has no GC).

        Raises:
            CNIError: 7 without a list of valid attachments; 999 when
                nftables refuses; 11 when the table kept changing.
        """
        valid = conf.gc_keep_tags()
        G.gc(conf.name, {a.container_id for a in conf.gc_keep()})
        nft = Nft()
        current = L.group_id(conf.name, conf.conditions(4), conf.conditions(6))
        for _ in range(_ATTEMPTS):
            table = nft.table(L.FAMILY, L.TABLE)
            if table is None:
                return
            cmds = _gc_cmds(table, network_tag(conf.name), current, valid)
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

    def status(self, args: CmdArgs, conf: PortMapConf) -> None:
        """Ready when the backend's tool can be used here.

        Raises:
            CNIError: 50 when it cannot (`cni_skel.nft.nft_status`;
                `.goiptables.status`).
        """
        if conf.effective_backend == "iptables":
            G.status()
        else:
            nft_status()
