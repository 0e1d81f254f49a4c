"""What the Go reference plugins put in netfilter for a container: find it,
check it, remove it (a node moving between Go's plugins and ours).

The Go plugins (containernetworking/plugins 1.1.1, Debian's
``containernetworking-plugins``) write per-container rules whose comment
names the container, and chains those rules jump to:

* bridge ``ipMasq`` (iptables): in ``ip nat`` / ``ip6 nat``, chain
  ``CNI-<sha512(network + containerID)[:24]>`` jumped to from
  ``POSTROUTING``; the jump and the chain's rules carry
  ``name: "<network>" id: "<containerID>"`` (`owner_comment`);
* portmap (iptables backend): a rule in ``CNI-HOSTPORT-DNAT`` jumping to
  ``CNI-DN-<hash>`` with ``dnat name: "<network>" id: "<containerID>"``;
  ``CNI-DN-<hash>`` holds the DNAT rules of the container's host ports;
* bridge ``macspoofchk`` (nftables): in ``bridge nat``, a ``PREROUTING``
  rule jumping to ``cni-br-iface-<containerID>-<ifname>`` (and its
  ``-mac`` chain), every rule commented ``macspoofchk-<containerID>-<ifname>``.

On a node whose ``iptables`` is iptables-nft (Debian's default), those
rules live in nftables tables too. libnftables' JSON lists them (chains,
handles, native matches such as ``tcp dport``) but not the text of an
iptables ``-m comment`` match: the comments are read from the kernel with
`cni_skel.nft.rule_comments`. Rules are selected by comment only (never by
chain name patterns), and removed by handle through libnftables' JSON, with
every chain only those rules (or rules inside such chains) jump to: what
Go's own DEL removes, and never a chain shared with other containers
(``CNI-HOSTPORT-*``, base chains).

Source: containernetworking/plugins 1.1.1 pkg/ip/ipmasq_linux.go,
pkg/utils (FormatChainName, FormatComment), plugins/meta/portmap
(portmap_iptables), pkg/link/spoofcheck.go; checked against the Debian
binaries in tests/test_go_migration.py.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import ERR_INTERNAL, ERR_TRY_AGAIN_LATER, CNIError
from .iptables import IPTables, variant
from .nft import GetChain, GetTable, Nft, NftError, lookup, rule_comments

__all__ = [
    "FAMILIES",
    "MULTICAST",
    "TABLES",
    "GoEntries",
    "GoHandOver",
    "GoRule",
    "HostPort",
    "chain_name",
    "find",
    "go_quote",
    "host_ports",
    "ipmasq_commands",
    "ipmasq_rules",
    "iptables_versions",
    "list_rules",
    "node_report",
    "owner_comment",
    "parse_owner",
    "present",
    "remove",
    "run_commands",
]

#: The families and table names Go's plugins write to (iptables-nft's
#: ``nat``/``filter`` tables, the nftables ``bridge nat`` of macspoofchk).
FAMILIES = ("ip", "ip6", "bridge")
#: What Go's masquerade never touches, per IP version.
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}
TABLES = ("nat", "filter")
_ATTEMPTS = 5
_OWNER = re.compile(r'^(?:(?P<prefix>.*?) )?name: "(?P<net>(?:[^"\\]|\\.)*)" '
                    r'id: "(?P<cid>(?:[^"\\]|\\.)*)"$')
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n",
            "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """``text`` as Go's ``%q`` writes it (printable characters as they are,
    the usual backslash escapes, other control characters as ``\\xNN``):
    how Go's comments quote network names and container IDs."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}


def _go_unquote(quoted: str) -> str:
    # The inverse of go_quote (without the quotes).
    def one(m: re.Match[str]) -> str:
        text = m.group(0)
        if text[1] in "xuU":
            return chr(int(text[2:], 16))
        return _UNESCAPES.get(text[1], text[1])
    return re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|.)", one, quoted)


def owner_comment(network: str, container_id: str, prefix: str = "") -> str:
    """Go's comment for a container's rules (``utils.FormatComment``):
    ``name: "<network>" id: "<containerID>"``, after ``prefix`` and a space
    when given (portmap's DNAT jump: ``prefix="dnat"``)."""
    text = f"name: {go_quote(network)} id: {go_quote(container_id)}"
    return f"{prefix} {text}" if prefix else text


def parse_owner(comment: str | None) -> tuple[str, str, str] | None:
    """``(prefix, network, containerID)`` of a comment `owner_comment`
    writes; None for any other comment."""
    m = _OWNER.match(comment or "")
    if m is None:
        return None
    return m["prefix"] or "", _go_unquote(m["net"]), _go_unquote(m["cid"])


def chain_name(network: str, container_id: str, prefix: str = "CNI-",
               width: int = 24) -> str:
    """Go's ``utils.FormatChainName``: ``prefix`` + the first ``width`` hex
    digits of SHA-512 of network name + container ID (bridge's masquerade
    chain: the defaults; portmap's DNAT chain: ``"CNI-DN-"``, 21)."""
    return prefix + hashlib.sha512((network + container_id).encode()).hexdigest()[:width]


class GoRule(NamedTuple):
    """One listed rule: where it is, its kernel ``handle``, its comment
    (nftables or iptables ``-m comment``; None without), and ``expr`` as
    libnftables JSON lists it."""

    family: str
    table: str
    chain: str
    handle: int
    comment: str | None
    expr: list[dict]

    @property
    def jump(self) -> str | None:
        """The chain this rule jumps (or goes) to, if it does."""
        for e in self.expr:
            for verdict in ("jump", "goto"):
                if isinstance(e, dict) and verdict in e:
                    return e[verdict].get("target")
        return None


@dataclass(frozen=True)
class GoEntries:
    """What `find` selected: ``rules`` whose comment was selected (outside
    the chains below), and ``chains`` ``(family, table, name)`` only they
    jump to (removed whole)."""

    rules: list[GoRule]
    chains: list[tuple[str, str, str]]

    def __bool__(self) -> bool:
        return bool(self.rules or self.chains)

    def delete_cmds(self) -> list[dict]:
        """libnftables JSON commands removing them, in one transaction:
        the rules by handle, then each chain flushed and deleted."""
        cmds: list[dict] = [{"delete": {"rule": {"family": r.family, "table": r.table,
                                                 "chain": r.chain, "handle": r.handle}}}
                            for r in self.rules]
        for family, table, name in self.chains:
            spec = {"family": family, "table": table, "name": name}
            cmds.append({"flush": {"chain": dict(spec)}})
        for family, table, name in self.chains:
            cmds.append({"delete": {"chain": {"family": family, "table": table, "name": name}}})
        return cmds

    def describe(self) -> list[str]:
        """One line per rule and chain, for messages and dry runs."""
        lines = [f"rule {r.family} {r.table} {r.chain} handle {r.handle} ({r.comment})"
                 for r in self.rules]
        return lines + [f"chain {f} {t} {n}" for f, t, n in self.chains]


def present(where: Iterable[tuple[str, str, str | None]]) -> bool:
    """Whether any of ``where`` exists: ``(family, table, chain)``, or
    ``(family, table, None)`` for the table itself. Netlink point reads
    (`cni_skel.nft.lookup`, one socket per table asked), so a per-pod verb
    on a node Go never ran on pays no listing of tables that can be large
    (kube-proxy's ``ip nat``).

    Raises:
        NftError: nfnetlink failed (999).
    """
    asked: dict[tuple[str, str], list[Any]] = {}
    for family, table, chain in where:
        asked.setdefault((family, table), []).append(
            GetTable() if chain is None else GetChain(chain))
    return any(any(lookup(family, table, queries)) for (family, table), queries in asked.items())


def iptables_versions(table: str, chain: str) -> list[int]:
    """The IP versions (4, 6) whose iptables ``table`` holds ``chain``,
    whichever variant the node's ``iptables`` is (`cni_skel.iptables.variant`):
    netlink point reads on iptables-nft (`present`: no listing), one
    ``-S <chain>`` per version on iptables-legacy; a version without its
    command is left out.

    Raises:
        NftError / CNIError: 999 when nfnetlink or iptables fails.
    """
    found = []
    for version in (4, 6):
        kind = variant(version)
        if kind is None:
            continue
        if kind == "nft":
            if present([("ip" if version == 4 else "ip6", table, chain)]):
                found.append(version)
        elif IPTables(version, table=table).chain_exists(chain):
            found.append(version)
    return found


_MASQ_CHAIN = re.compile(r"-N CNI-[0-9a-f]{24}$")


def node_report() -> list[str]:
    """What the Go plugins left in this network namespace, one line per
    kind found (nothing on a node where they never ran): their iptables
    masquerade chains (``CNI-<24 hex>``, one per container of bridge/ptp's
    iptables backend, or ours with ``ipMasqBackend: "iptables"``) and
    portmap DNAT chains (``CNI-DN-``) per IP version, macspoofchk's
    ``bridge nat`` rules, and Go 1.9.1's nftables backends' rules
    (``inet cni_plugins_masquerade``, ``ip``/``ip6 cni_hostport``). For
    ``cni-skel doctor``: it lists whole tables.

    Raises:
        CNIError / NftError: 999 when iptables or nftables can not be read.
    """
    lines = []
    for version in (4, 6):
        if variant(version) is None:
            continue
        ipt = IPTables(version, table="nat")
        listed = ipt.list_rules()
        masq = sum(1 for ln in listed if _MASQ_CHAIN.match(ln))
        dnat = sum(1 for ln in listed if ln.startswith("-N CNI-DN-"))
        if masq:
            lines.append(f"{ipt.tool} nat: {masq} masquerade chain(s) CNI-<hash> of Go's "
                         "layout (bridge/ptp ipMasq; a DEL of ours removes a pod's)")
        if dnat:
            lines.append(f"{ipt.tool} nat: {dnat} portmap DNAT chain(s) CNI-DN-<hash> of Go's "
                         "layout (a DEL of ours removes a pod's)")
    nft = Nft()
    for family, table, what in (("bridge", "nat", "macspoofchk rules of Go's bridge"),
                                ("inet", "cni_plugins_masquerade",
                                 "masquerade rules of Go 1.9.1's nftables backend"),
                                ("ip", "cni_hostport", "host-port rules of Go 1.9.1's portmap"),
                                ("ip6", "cni_hostport", "host-port rules of Go 1.9.1's portmap")):
        if not present([(family, table, None)]):
            continue
        rules = [r for r in list_rules(nft, (family,), (table,)) if r.comment]
        if family == "bridge":
            rules = [r for r in rules if r.comment.startswith("macspoofchk-")]
        if rules:
            lines.append(f"nftables {family} {table}: {len(rules)} {what}")
    return lines


def chain_present(nft: Nft, where: Iterable[tuple[str, str, str]]) -> bool:
    """Whether any of the chains ``where`` (``(family, table, chain)``)
    exists, the cheapest way this process has: netlink point reads
    (`present`) once pyroute2 is loaded (the warm worker, any DEL), else a
    libnftables listing of each chain (a one-shot ADD, which must not pay
    pyroute2's ~100 ms import). A libnftables listing fills its cache with
    every table, chain and set of the family first: ~2 ms of kernel time
    per family on a node with a thousand pods' map elements.

    Raises:
        NftError: nfnetlink failed (999).
    """
    where = list(where)
    if "pyroute2" in sys.modules:
        return present(where)
    for family, table, chain in where:
        try:
            nft.run([{"list": {"chain": {"family": family, "table": table, "name": chain}}}],
                    what="a look for Go's rules")
        except NftError as e:
            if e.errno == errno.ENOENT:
                continue
            raise
        return True
    return False


def list_rules(nft: Nft | None = None, families: Iterable[str] = FAMILIES,
               tables: Iterable[str] = TABLES) -> list[GoRule]:
    """Every rule of the tables ``tables`` of ``families`` that exist in
    the calling thread's network namespace: libnftables' JSON listing with
    the comments from the kernel (`cni_skel.nft.rule_comments`).

    Raises:
        NftError: the kernel refused a listing (999; EPERM without
            CAP_NET_ADMIN).
    """
    nft = nft or Nft()
    out: list[GoRule] = []
    for family in families:
        for name in tables:
            table = nft.table(family, name)
            if table is None:
                continue
            comments = rule_comments(family, name)
            for r in table.rules:
                handle = r.get("handle")
                out.append(GoRule(family, name, r.get("chain", ""), handle,
                                  r.get("comment") or comments.get(handle), r.get("expr", [])))
    return out


def find(rules: list[GoRule], select: Callable[[str], bool]) -> GoEntries:
    """The rules whose comment ``select`` accepts, and the chains to remove
    with them: a chain jumped to by a selected rule (or by a rule inside
    such a chain) that no other rule jumps to. Selected rules inside those
    chains go with their chain."""
    picked = [r for r in rules if r.comment is not None and select(r.comment)]
    chains: set[tuple[str, str, str]] = set()
    jumps: dict[tuple[str, str, str], list[GoRule]] = {}
    for r in rules:
        if r.jump:
            jumps.setdefault((r.family, r.table, r.jump), []).append(r)
    todo = [(r.family, r.table, r.jump) for r in picked if r.jump]
    while todo:
        key = todo.pop()
        if key in chains:
            continue
        chains.add(key)
        todo += [(r.family, r.table, r.jump) for r in rules
                 if r.jump and (r.family, r.table, r.chain) == key]
    # Keep only chains every jump to which goes with them (fixed point).
    picked_ids = {(r.family, r.table, r.handle) for r in picked}
    changed = True
    while changed:
        changed = False
        for key in sorted(chains):
            for r in jumps.get(key, []):
                inside = (r.family, r.table, r.chain) in chains
                if not inside and (r.family, r.table, r.handle) not in picked_ids:
                    chains.discard(key)
                    changed = True
                    break
    rest = [r for r in picked if (r.family, r.table, r.chain) not in chains]
    return GoEntries(rest, sorted(chains))


def remove(select: Callable[[str], bool], what: str, nft: Nft | None = None, *,
           families: Iterable[str] = FAMILIES, tables: Iterable[str] = TABLES) -> GoEntries:
    """Remove the rules whose comment ``select`` accepts and the chains only
    they jump to (`find`), in one transaction; nothing found commits
    nothing. Listed again when a rule went meanwhile (Go's own DEL racing
    ours). ``families``/``tables``: where to look (`list_rules`). Returns
    what was removed.

    Raises:
        NftError: 999 when nftables refuses (the message starts with ``what``).
        CNIError: 11 when the rules kept changing.
    """
    nft = nft or Nft()
    families, tables = tuple(families), tuple(tables)
    for _ in range(_ATTEMPTS):
        found = find(list_rules(nft, families, tables), select)
        if not found:
            return found
        try:
            nft.run(found.delete_cmds(), what=what)
            return found
        except NftError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY):
                raise
    raise CNIError(ERR_TRY_AGAIN_LATER, f"{what}: the Go plugins' rules kept changing")


class HostPort(NamedTuple):
    """A host port a Go portmap DNAT rule holds: ``family`` (``ip``/``ip6``),
    ``protocol``, ``port``, ``host_ip`` (None: any local address), and the
    holder's ``network`` and ``container_id`` (from the jump's comment;
    None when it has none)."""

    family: str
    protocol: str
    port: int
    host_ip: str | None
    network: str | None
    container_id: str | None


def _dnat_match(expr: list[dict]) -> tuple[str, int, str | None] | None:
    """(protocol, destination port, destination address) of a rule ending
    in an xtables DNAT target, from its native matches."""
    if not any(isinstance(e, dict) and e.get("xt", {}).get("name") == "DNAT" for e in expr):
        return None
    proto, port, daddr = None, None, None
    for e in expr:
        m = e.get("match") if isinstance(e, dict) else None
        if not m or m.get("op") != "==":
            continue
        left: Any = m.get("left", {})
        payload = left.get("payload") if isinstance(left, dict) else None
        if not payload:
            continue
        if payload.get("field") == "dport" and isinstance(m.get("right"), int):
            proto, port = payload.get("protocol"), m["right"]
        elif payload.get("field") == "daddr" and isinstance(m.get("right"), str):
            daddr = m["right"]
    if proto is None or port is None:
        return None
    return str(proto), int(port), daddr


def host_ports(rules: list[GoRule]) -> list[HostPort]:
    """The host ports held by Go portmap's DNAT chains: each DNAT rule of a
    chain jumped to from ``CNI-HOSTPORT-DNAT``, with the holder named by
    that jump's comment."""
    holders: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}
    for r in rules:
        if r.chain == "CNI-HOSTPORT-DNAT" and r.jump:
            owner = parse_owner(r.comment)
            holders[(r.family, r.table, r.jump)] = (owner[1], owner[2]) if owner else (None, None)
    out = []
    for r in rules:
        key = (r.family, r.table, r.chain)
        if key not in holders:
            continue
        m = _dnat_match(r.expr)
        if m is not None:
            out.append(HostPort(r.family, m[0], m[1], m[2], *holders[key]))
    return out


# --- the way back: what the Go plugins need for pods we made -----------------------


@dataclass
class GoHandOver:
    """One attachment handed over to the Go plugins (`cni_skel.skel.Plugin.hand_over_to_go`):
    its ``container_id``, ``ifname``, ``netns``, and ``run_go(verb)``, which
    runs the Go plugin of the same name with the attachment's config
    (CNI_* set, from the Go plugins' directory) and returns its parsed
    answer (raises `CNIError` with its error)."""

    container_id: str
    ifname: str
    netns: str
    run_go: Callable[[str], Any]


def ipmasq_rules(network: str, container_id: str,
                 addrs: Iterable[ipaddress.IPv4Interface | ipaddress.IPv6Interface]
                 ) -> dict[int, list[list[str]]]:
    """Go's iptables layout for ``addrs`` (pod address with its subnet's
    prefix, as ``ips[].address``): per IP version, the rules as ``iptables
    -S`` lists them, as argv lists (``["-A", chain, "-d", ...]``), without
    the ``-N`` line, in Go's order with duplicates dropped."""
    chain = chain_name(network, container_id)
    comment = ["-m", "comment", "--comment", owner_comment(network, container_id)]
    out: dict[int, list[list[str]]] = {}
    for a in addrs:
        host = f"{a.ip}/{a.max_prefixlen}"
        rules = out.setdefault(a.version, [])
        for rule in (["-A", chain, "-d", str(a.network), *comment, "-j", "ACCEPT"],
                     ["-A", chain, "!", "-d", MULTICAST[a.version], *comment,
                      "-j", "MASQUERADE"],
                     ["-A", "POSTROUTING", "-s", host, *comment, "-j", chain]):
            if rule not in rules:
                rules.append(rule)
    return out


def ipmasq_commands(network: str, container_id: str,
                    addrs: Iterable[ipaddress.IPv4Interface | ipaddress.IPv6Interface]
                    ) -> list[list[str]]:
    """The commands Go bridge's ADD runs for ``ipMasq`` (1.1.1
    ``ip.SetupIPMasq``, iptables backend), as argv lists: per address, the
    chain ``CNI-<hash>`` in table nat accepting traffic to the pod's subnet
    and masquerading the rest but multicast, and the ``POSTROUTING`` jump for
    the pod's address, all commented `owner_comment`. Go's DEL of the pod
    deletes exactly these and fails when its chain is missing (iptables-nft
    answers "Chain ... does not exist", which Go does not take for "already
    gone"); they can only be written through iptables (libnftables' JSON
    cannot write an xtables comment match)."""
    chain = chain_name(network, container_id)
    comment = owner_comment(network, container_id)
    out: list[list[str]] = []
    made: set[str] = set()
    for a in addrs:
        tool = "iptables" if a.version == 4 else "ip6tables"
        multicast = "224.0.0.0/4" if a.version == 4 else "ff00::/8"
        if tool not in made:
            made.add(tool)
            out.append([tool, "-t", "nat", "-N", chain, "--wait"])
        out += [
            [tool, "-t", "nat", "-A", chain, "-d", str(a.network), "-j", "ACCEPT",
             "-m", "comment", "--comment", comment, "--wait"],
            [tool, "-t", "nat", "-A", chain, "!", "-d", multicast, "-j", "MASQUERADE",
             "-m", "comment", "--comment", comment, "--wait"],
            [tool, "-t", "nat", "-A", "POSTROUTING", "-s", str(a.ip), "-j", chain,
             "-m", "comment", "--comment", comment, "--wait"],
        ]
    return out


def run_commands(commands: list[list[str]], what: str, timeout: float = 30.0) -> None:
    """Run argv lists in order (no shell; their output is not read, only
    their exit status).

    Raises:
        CNIError: 999 naming ``what``, the command and its stderr, when one
            is missing or fails (the ones before it stay done).
    """
    for argv in commands:
        if shutil.which(argv[0]) is None:
            raise CNIError(ERR_INTERNAL, f"{what}: {argv[0]} not found",
                           "the Go plugins need iptables (iptables-nft) on the node")
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise CNIError(ERR_INTERNAL, f"{what}: {' '.join(argv)} exited {proc.returncode}",
                           proc.stderr.decode(errors="replace").strip())
