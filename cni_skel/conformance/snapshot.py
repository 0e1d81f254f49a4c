"""What is there: a comparable picture of the state plugins leave behind.

`take` reads, for each named network namespace, its links (kind, MTU, MAC,
up/promisc/allmulti flags, queue length, master, veth peer) and addresses
(pyroute2, IPv6 link-local left out: the kernel adds those by itself), its
policy-routing rules and the routes of every table (each route by table,
destination, gateway, link, metric, proto, type, scope and preferred source;
the local table and routes to IPv6 link-local and multicast destinations left
out, the kernel's own as their addresses are), its nftables ruleset
(libnftables JSON; every set/map element is an item of its own; iptables-nft's
``ip filter`` / ``ip6 filter`` tables are among them, their ``-m`` matches
seen as bare ``xt`` expressions, enough to compare), its ipsets and their
entries with comments (netlink), the chosen sysctls (read inside the
namespace: /proc/sys/net belongs to the reading thread's namespace); and every
file under the given directories (size and SHA-256). `diff` compares two
pictures and names what appeared, vanished or changed, leaving out `is_infra`
items.

Infrastructure (`is_infra`) is what a plugin creates once for a whole network
and keeps, as the Go plugins do: the bridge device with its gateway addresses
and its VLAN gateway veth pair (Go's bridge never deletes them), the
loopback addresses of ``lo`` (the kernel's, kept once lo has been up), the rule
layout inside the nftables tables shared by all pods (``cni_skel_bridge``,
``cni_portmap``: chains, sets and rules, e.g. another network's masquerade
chain; the tables themselves and their *elements* always count: a node has
the tables from its first pod on), host-local's bookkeeping files (``lock``,
``last_reserved_ip.N``, the ``.cni-skel-index`` cache), and forwarding /
``route_localnet`` switched on in the node namespace (Go never switches them
back), and the l3mdev rules the kernel adds with a namespace's first VRF (it
never adds them again there: they stay); a route through an infrastructure
link is infrastructure with it (the bridge's own subnet route).

The firewall's per-node layout is infrastructure too when it *appears* (one
copy of each rule; a rule doubled, changed or gone still counts): in
iptables' tables, the chains it names (``CNI-FORWARD``, the admin chain its
rule there jumps to, ``CNI-ISOLATION-STAGE-1/2``, base chains iptables-nft
makes with policy accept) and every rule carrying ``-m comment`` (all of its
layout and isolation rules do; Go's per-pod rules never do); the ipsets
themselves; in native nftables tables, the ``cni_firewall`` chain and its
rules, the ``cni_firewall_pods4/6`` sets and the bare jump to the chain.
Set entries and elements never are: they are the pods.

Go's iptables layouts (portmap ``backend: "iptables"``) leave in the node's
``ip``/``ip6 nat`` (iptables-nft) the table, its base chains, the
``CNI-HOSTPORT-SETMARK``/``-MASQ``/``-DNAT`` chains with their rules and the
base chains' jumps to them, as Go does: infrastructure when they appear.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pyroute2.ipset import IPSet
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.ipset import IPSET_FLAG_LIST_HEADER

from cni_skel.errors import CNIError
from cni_skel.ipset import IPSets
from cni_skel.netns import NetNS
from cni_skel.nft import Nft

__all__ = ["INFRA_TABLES", "IPTABLES_TABLES", "LinkState", "Observer", "Snapshot", "diff",
           "is_infra", "take"]

#: nftables tables whose layout (not elements) is shared by every pod of a node.
INFRA_TABLES = frozenset({("inet", "cni_skel_bridge"), ("bridge", "cni_skel_bridge"),
                          ("inet", "cni_portmap")})
# Routes the kernel makes and drops with the links' own addresses (the local
# table's: an IPv6 address's only once its DAD is over), and to these.
_RT_TABLE_LOCAL = 255
_LINK_LOCAL6 = ipaddress.ip_network("fe80::/10")
_MULTICAST6 = ipaddress.ip_network("ff00::/8")
#: Node sysctls a plugin may switch on for good (bridge: forwarding; portmap:
#: route_localnet), matched on the /proc/sys-relative path.
_INFRA_SYSCTL = re.compile(r"^net/ipv4/ip_forward$|^net/ipv6/conf/all/forwarding$"
                           r"|^net/ipv4/conf/[^/]+/route_localnet$")
_VLAN_GATEWAY = re.compile(r"\.\d+$")
#: The tables iptables-nft writes for the iptables filter.
IPTABLES_TABLES = frozenset({("ip", "filter"), ("ip6", "filter")})
# The firewall's chains there (its admin chain may have any name: found
# from the rule jumping to it), and its objects in native nftables tables.
_FW_IPT_CHAINS = frozenset({"CNI-FORWARD", "CNI-ADMIN", "CNI-ISOLATION-STAGE-1",
                            "CNI-ISOLATION-STAGE-2"})
_FW_NFT_CHAIN = "cni_firewall"
_FW_NFT_SETS = frozenset({"cni_firewall_pods4", "cni_firewall_pods6"})
_IFF_UP, _IFF_PROMISC, _IFF_ALLMULTI = 0x1, 0x100, 0x200
#: The nat tables iptables-nft writes for Go's iptables layouts (portmap's
#: ``backend`` and bridge/ptp's ``ipMasqBackend`` "iptables"), and the chains
#: of it shared by every pod, which Go (and so ours) never removes.
GO_NAT_TABLES = frozenset({("ip", "nat"), ("ip6", "nat")})
_GO_NAT_CHAINS = frozenset({"CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-DNAT"})


class LinkState(NamedTuple):
    """One link as compared: ``peer`` is the veth peer's name when it lives in
    the same namespace."""

    kind: str | None
    mtu: int | None
    mac: str | None
    up: bool
    promisc: bool
    allmulti: bool
    txqlen: int | None
    master: str | None
    peer: str | None


#: key -> value; keys are tuples whose first item says what they are:
#: ("link", ns, name), ("addr", ns, ifname, cidr), ("nft", ns, kind, family,
#: table, name), ("rule", ns, family, table, chain, rule JSON) -> count,
#: ("elem", ns, family, table, set, element JSON), ("iprule", ns, family,
#: priority, selector, table), ("route", ns, table, dst, gateway, link name,
#: metric, proto, type, scope, prefsrc), ("ipset", ns, name), ("ipentry", ns, name,
#: address) -> comment, ("file", relative path), ("sysctl", ns, key).
Snapshot = dict[tuple, Any]


def _links(ns: str, ipr: Any, out: Snapshot) -> None:
    links = ipr.get_links()
    names = {m["index"]: m.get_attr("IFLA_IFNAME") for m in links}
    for m in links:
        info = m.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        flags = m["flags"]
        out[("link", ns, m.get_attr("IFLA_IFNAME"))] = LinkState(
            kind, m.get_attr("IFLA_MTU"), m.get_attr("IFLA_ADDRESS"), bool(flags & _IFF_UP),
            bool(flags & _IFF_PROMISC), bool(flags & _IFF_ALLMULTI),
            m.get_attr("IFLA_TXQLEN"), names.get(m.get_attr("IFLA_MASTER")),
            names.get(m.get_attr("IFLA_LINK"))
            if kind == "veth" and m.get_attr("IFLA_LINK_NETNSID") is None else None)
    for a in ipr.get_addr():
        ip = a.get_attr("IFA_LOCAL") or a.get_attr("IFA_ADDRESS")
        if ip is None or ipaddress.ip_address(ip).is_link_local:
            continue
        out[("addr", ns, names.get(a["index"]), f"{ip}/{a['prefixlen']}")] = True
    for r in ipr.get_rules():
        selector = " ".join(f"{k} {v}" for k, v in (
            ("from", r.get_attr("FRA_SRC") and f"{r.get_attr('FRA_SRC')}/{r['src_len']}"),
            ("to", r.get_attr("FRA_DST") and f"{r.get_attr('FRA_DST')}/{r['dst_len']}"),
            ("iif", r.get_attr("FRA_IIFNAME")), ("oif", r.get_attr("FRA_OIFNAME")),
            ("fwmark", r.get_attr("FRA_FWMARK")), ("l3mdev", r.get_attr("FRA_L3MDEV"))) if v)
        out[("iprule", ns, r["family"], r.get_attr("FRA_PRIORITY") or 0, selector,
             r.get_attr("FRA_TABLE") or r["table"])] = True
    for r in ipr.get_routes(family=socket.AF_UNSPEC, table=None):
        if r["family"] not in (socket.AF_INET, socket.AF_INET6):
            continue
        zero = "0.0.0.0" if r["family"] == socket.AF_INET else "::"
        dst = ipaddress.ip_network(f"{r.get_attr('RTA_DST') or zero}/{r['dst_len']}",
                                   strict=False)
        table = r.get_attr("RTA_TABLE") or r["table"]
        if table == _RT_TABLE_LOCAL or (dst.version == 6 and (
                dst.subnet_of(_LINK_LOCAL6) or dst.subnet_of(_MULTICAST6))):
            continue
        out[("route", ns, table, str(dst),
             r.get_attr("RTA_GATEWAY"), names.get(r.get_attr("RTA_OIF")),
             r.get_attr("RTA_PRIORITY") or 0, r["proto"], r["type"], r["scope"],
             r.get_attr("RTA_PREFSRC"))] = True


def _scrub(obj: Any) -> Any:
    # Counters and timeouts move by themselves (traffic, time): not state.
    if isinstance(obj, dict):
        return {k: (None if k in ("counter", "expires") else _scrub(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _canon(obj: Any) -> str:
    return json.dumps(_scrub(obj), sort_keys=True, separators=(",", ":"))


def _nft(ns: str, handle: NetNS, nft: Nft, out: Snapshot) -> None:
    objects = handle.run(lambda: nft.run([{"list": {"ruleset": None}}]))
    for obj in objects:
        kind, spec = next(iter(obj.items()))
        spec = {k: v for k, v in spec.items() if k != "handle"}
        family = spec.get("family")
        if kind == "table":
            out[("nft", ns, "table", family, spec["name"], "")] = _canon(spec)
        elif kind == "rule":
            body = {k: v for k, v in spec.items() if k in ("expr", "comment")}
            key = ("rule", ns, family, spec["table"], spec["chain"], _canon(body))
            out[key] = out.get(key, 0) + 1
        else:
            elems = spec.pop("elem", None) or []
            out[("nft", ns, kind, family, spec.get("table"), spec.get("name"))] = _canon(spec)
            for elem in elems:
                out[("elem", ns, family, spec.get("table"), spec.get("name"), _canon(elem))] = True


class _IPSetReader:
    """The ipsets of the namespace it is made in: names from a header-only
    listing, entries (with comments) through `IPSets`."""

    def __init__(self) -> None:
        self._names = IPSet()
        try:
            self._sets = IPSets()
        except BaseException:
            self._names.close()
            raise

    def read(self, ns: str, out: Snapshot) -> None:
        names = [m.get_attr("IPSET_ATTR_SETNAME")
                 for m in self._names.list(flags=IPSET_FLAG_LIST_HEADER)]
        for name in filter(None, names):
            out[("ipset", ns, name)] = True
            for entry in self._sets.entries(name):
                out[("ipentry", ns, name, str(entry.address))] = entry.comment

    def close(self) -> None:
        self._names.close()
        self._sets.close()


def _ipset_reader(handle: NetNS) -> _IPSetReader | None:
    # A kernel without ip_set has no ipsets to compare.
    try:
        return handle.run(_IPSetReader)
    except (OSError, NetlinkError, CNIError):
        return None


def _sysctls(ns: str, handle: NetNS, keys: Sequence[str], out: Snapshot) -> None:
    with handle.enter():
        for key in keys:
            try:
                with open(f"/proc/sys/{key}", "rb") as fp:
                    out[("sysctl", ns, key)] = fp.read().decode("utf-8", "replace").strip()
            except OSError:
                pass


def _files(root: str, out: Snapshot) -> None:
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            try:
                with open(path, "rb") as fp:
                    data = fp.read()
            except OSError as exc:
                out[("file", os.path.relpath(path, root))] = f"unreadable: {exc}"
                continue
            out[("file", os.path.relpath(path, root))] = (
                len(data), hashlib.sha256(data).hexdigest()[:16])


class Observer:
    """Takes snapshots of ``namespaces`` (label -> netns path: links,
    addresses, nftables, ipsets, and the sysctls ``sysctls[label]`` lists as
    /proc/sys-relative paths) and of the files under each of ``roots`` (keyed
    by path relative to its root; roots should not nest). Holds one netlink
    socket per namespace until `close` (use it from one thread)."""

    def __init__(self, namespaces: Mapping[str, str], roots: Sequence[str] = (),
                 sysctls: Mapping[str, Sequence[str]] | None = None) -> None:
        self.roots = list(roots)
        self.sysctls = dict(sysctls or {})
        self._handles: dict[str, NetNS] = {}
        self._iprs: dict[str, Any] = {}
        self._nfts: dict[str, Nft] = {}
        self._ipsets: dict[str, _IPSetReader | None] = {}
        try:
            for label, path in namespaces.items():
                handle = self._handles[label] = NetNS.open(path)
                self._iprs[label] = handle.iproute()
                # libnftables keeps the netlink socket it opened at creation:
                # one context per namespace, made inside it.
                self._nfts[label] = handle.run(Nft)
                self._ipsets[label] = _ipset_reader(handle)
        except BaseException:
            self.close()
            raise

    def take(self) -> Snapshot:
        out: Snapshot = {}
        for label, handle in self._handles.items():
            _links(label, self._iprs[label], out)
            _nft(label, handle, self._nfts[label], out)
            ipsets = self._ipsets.get(label)
            if ipsets is not None:
                ipsets.read(label, out)
            keys = self.sysctls.get(label)
            if keys:
                _sysctls(label, handle, keys, out)
        for root in self.roots:
            _files(root, out)
        return out

    def close(self) -> None:
        for ipr in self._iprs.values():
            ipr.close()
        for ipsets in self._ipsets.values():
            if ipsets is not None:
                ipsets.close()
        for handle in self._handles.values():
            handle.close()
        self._iprs, self._handles, self._nfts, self._ipsets = {}, {}, {}, {}

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def take(namespaces: Mapping[str, str], roots: Sequence[str] = (),
         sysctls: Mapping[str, Sequence[str]] | None = None) -> Snapshot:
    """One snapshot (see `Observer`)."""
    with Observer(namespaces, roots, sysctls) as observer:
        return observer.take()


def _link_of(snaps: Sequence[Snapshot], ns: str, name: str | None) -> LinkState | None:
    for snap in snaps:
        link = snap.get(("link", ns, name))
        if link is not None:
            return link
    return None


def _is_infra_link(snaps: Sequence[Snapshot], ns: str, name: str | None) -> bool:
    link = _link_of(snaps, ns, name)
    if ns != "node" or link is None or name is None:
        return False
    if link.kind == "bridge":
        return True
    # Go's ensureVlanInterface: veth "<bridge>.<vlan>", its peer a bridge port.
    return link.kind == "veth" and (bool(_VLAN_GATEWAY.search(name))
                                    or bool(link.peer and _VLAN_GATEWAY.search(link.peer)))


def _exprs(body: str) -> list:
    return json.loads(body).get("expr") or []


def _admin_chains(ns: str, family: str, snaps: Sequence[Snapshot]) -> set[str]:
    """Chains the firewall's commented rules in CNI-FORWARD jump to (its
    admin chain, ``iptablesAdminChainName``)."""
    out = set()
    for snap in snaps:
        for key in snap:
            if key[:5] == ("rule", ns, family, "filter", "CNI-FORWARD") \
                    and _is_firewall_rule(key):
                out.update(e["jump"]["target"] for e in _exprs(key[5]) if "jump" in e)
    return out


def _is_firewall_object(key: tuple, new: str, snaps: Sequence[Snapshot]) -> bool:
    """A chain or set of the firewall's per-node layout (module docstring)."""
    kind, family, table, name = key[2:6]
    if (family, table) in IPTABLES_TABLES:
        if kind != "chain":
            return False
        spec = json.loads(new)
        # iptables-nft makes a base chain when first used, policy accept
        return name in _FW_IPT_CHAINS or ("hook" in spec and spec.get("policy") == "accept") \
            or name in _admin_chains(key[1], family, snaps)
    return (kind == "chain" and name == _FW_NFT_CHAIN) or (kind == "set" and name in _FW_NFT_SETS)


def _is_firewall_rule(key: tuple) -> bool:
    """A rule of the firewall's per-node layout (module docstring)."""
    family, table, chain = key[2:5]
    exprs = _exprs(key[5])
    if (family, table) in IPTABLES_TABLES:
        return any(isinstance(e, dict) and e.get("xt", {}).get("name") == "comment"
                   for e in exprs)
    return chain == _FW_NFT_CHAIN or exprs == [{"jump": {"target": _FW_NFT_CHAIN}}]


def _is_go_nat_infra(key: tuple, new: Any) -> bool:
    """Go's shared iptables layout in the node's nat tables, when it
    appears (module docstring): the table, its base chains (policy accept),
    the ``CNI-HOSTPORT-*`` chains, their rules, and the base chains' bare
    jumps to them. Every ``CNI-DN-*`` / ``CNI-<hash>`` chain and rule is a pod's."""
    if key[0] == "nft":
        kind, family, table, name = key[2:6]
        if (family, table) not in GO_NAT_TABLES or key[1] != "node":
            return False
        if kind == "table":
            return True
        spec = json.loads(new)
        return kind == "chain" and (name in _GO_NAT_CHAINS
                                    or ("hook" in spec and spec.get("policy") == "accept"))
    family, table, chain = key[2:5]
    if (family, table) not in GO_NAT_TABLES or key[1] != "node":
        return False
    if chain in _GO_NAT_CHAINS:
        return True
    targets = {e["jump"]["target"] for e in _exprs(key[5]) if isinstance(e, dict) and "jump" in e}
    return chain in ("PREROUTING", "OUTPUT", "POSTROUTING") and bool(targets) \
        and targets <= _GO_NAT_CHAINS


def _is_kernel_loopback(key: tuple) -> bool:
    """127.0.0.1/8 or ::1/128 on ``lo``: the kernel adds them when lo first
    goes up and keeps them when it goes down (loopback's DEL)."""
    if key[2] != "lo":
        return False
    try:
        return ipaddress.ip_interface(key[3]).ip.is_loopback
    except ValueError:
        return False


def is_infra(key: tuple, old: Any, new: Any, before: Snapshot, after: Snapshot) -> bool:
    """Is this difference a network's lasting infrastructure (see the module
    docstring) rather than state of one attachment?"""
    what = key[0]
    snaps = (after, before)
    if what == "link":
        return _is_infra_link(snaps, key[1], key[2])
    if what == "addr":
        return _is_infra_link(snaps, key[1], key[2]) or _is_kernel_loopback(key)
    if what == "route":
        return key[5] is not None and _is_infra_link(snaps, key[1], key[5])
    if what in ("nft", "rule") and old is None and _is_go_nat_infra(key, new):
        return True
    if what == "nft":  # a table itself is never infrastructure a call may add
        if key[2] == "table":
            return False
        if (key[3], key[4]) in INFRA_TABLES:
            return True
        return old is None and _is_firewall_object(key, new, snaps)
    if what == "rule":
        if (key[2], key[3]) in INFRA_TABLES:
            return True
        return not old and new == 1 and _is_firewall_rule(key)
    if what == "ipset":  # the set, not its entries (those are "ipentry")
        return old is None
    if what == "iprule":  # the kernel's l3mdev rules, added with a namespace's first VRF
        return key[4] == "l3mdev 1"
    if what == "file":
        parts = key[1].split(os.sep)
        return parts[-1] == "lock" or parts[-1].startswith("last_reserved_ip.") \
            or ".cni-skel-index" in parts
    if what == "sysctl":
        return key[1] == "node" and bool(_INFRA_SYSCTL.match(key[2])) and new == "1"
    return False


def _show(key: tuple, value: Any) -> str:
    what = key[0]
    if what == "link":
        return f"link {key[1]}/{key[2]} {value.kind or 'device'}"
    if what == "addr":
        return f"address {key[3]} on {key[1]}/{key[2]}"
    if what == "nft":
        return f"nftables {key[2]} {key[1]}: {key[3]} {key[4]} {key[5]}".rstrip()
    if what == "rule":
        return f"nftables rule {key[1]}: {key[2]} {key[3]} chain {key[4]}: {key[5][:160]}"
    if what == "elem":
        return f"nftables element {key[1]}: {key[2]} {key[3]} set {key[4]}: {key[5][:160]}"
    if what == "iprule":
        return f"ip rule {key[1]}: {key[3]}: {key[4] or 'all'} lookup {key[5]}"
    if what == "route":
        return (f"route {key[1]}: table {key[2]} {key[3]}"
                + (f" via {key[4]}" if key[4] else "") + (f" dev {key[5]}" if key[5] else "")
                + f" metric {key[6]} proto {key[7]} type {key[8]} scope {key[9]}"
                + (f" src {key[10]}" if key[10] else ""))
    if what == "ipset":
        return f"ipset {key[1]}: {key[2]}"
    if what == "ipentry":
        return f"ipset entry {key[1]}: {key[2]} {key[3]} (comment {value!r})"
    if what == "file":
        return f"file {key[1]}"
    if what == "sysctl":
        return f"sysctl {key[1]} {key[2]}"
    return repr(key)


def diff(before: Snapshot, after: Snapshot,
         allow: Callable[[tuple, Any, Any, Snapshot, Snapshot], bool] | None = is_infra
         ) -> list[str]:
    """What differs, one line each (``+`` appeared, ``-`` vanished, ``~``
    changed), minus what ``allow`` accepts (default: `is_infra`)."""
    lines = []
    for key in sorted(set(before) | set(after), key=repr):
        old, new = before.get(key), after.get(key)
        if old == new or (allow is not None and allow(key, old, new, before, after)):
            continue
        if old is None:
            lines.append(f"+ {_show(key, new)}")
        elif new is None:
            lines.append(f"- {_show(key, old)}")
        elif key[0] == "link":
            changed = [f"{f} {a!r} -> {b!r}" for f, a, b in zip(LinkState._fields, old, new,
                                                                 strict=True) if a != b]
            lines.append(f"~ {_show(key, new)}: {', '.join(changed)}")
        else:
            lines.append(f"~ {_show(key, new)}: {old!r} -> {new!r}")
    return lines
