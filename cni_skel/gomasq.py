"""Go's two IP masquerade layouts, for ``ipMasqBackend: "iptables"`` and for
the pods Go's plugins made before a node switched.

Go's bridge and ptp (containernetworking/plugins >= 1.5, ``pkg/ip``
``SetupIPMasqForNetworks``) masquerade a pod with one of two backends,
chosen by ``ipMasqBackend`` (absent: iptables wherever ``iptables`` works):

* **iptables** (every release since 0.x; the default), in ``nat`` of the IP
  version of each address, all rules commented
  ``name: "<network>" id: "<containerID>"`` (`cni_skel.gorules.owner_comment`)::

      -N CNI-<24 hex>                       # gorules.chain_name(network, containerID)
      -A POSTROUTING -s <ip>/32 ... -j CNI-<24 hex>       # one per address
      -A CNI-<24 hex> -d <subnet> ... -j ACCEPT           # one per address
      -A CNI-<24 hex> ! -d 224.0.0.0/4 ... -j MASQUERADE  # ff00::/8 for IPv6

  in Go's order (each address: ACCEPT, MASQUERADE, jump; a rule already
  there is not added again). `setup_iptables` writes exactly this, through
  the node's own ``iptables`` (either variant), so Go's DEL removes our
  pods and ours removes Go's.
* **nftables** (1.5.0+), table ``inet cni_plugins_masquerade``: chain
  ``postrouting`` (multicast returns, ``goto masq_checks``) and per address
  a rule ``ip saddr <ip> ip daddr != <subnet> masquerade`` in
  ``masq_checks``, commented `nft_comment` (a hash of the network, a hash
  of ifname and container ID, then the names). This project's own
  nftables masquerade is `cni_skel.masq`; this layout is only removed
  (`teardown`, `gc`) and recognised (`made_by_go`).

`teardown` removes an attachment's entries of both layouts without its
addresses (Go needs them, and leaks its chain when the netns is gone), `gc`
those of a network's attachments not kept (Go collects only its nftables
rules). A node where Go never ran pays netlink point reads for the chain and
table names (`cni_skel.gorules.present`) on iptables-nft, an ``iptables -S``
per IP version on iptables-legacy.

Source: containernetworking/plugins 1.9.1 ``pkg/ip/ipmasq_linux.go``,
``ipmasq_iptables_linux.go``, ``ipmasq_nftables_linux.go``, checked against
its binaries in tests/test_gomasq.py.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from collections.abc import Iterable

from . import gorules
from .errors import ERR_PLUGIN_NOT_AVAILABLE, CNIError
from .iptables import IPTables, restore_line, variant
from .nft import Nft

__all__ = [
    "MULTICAST",
    "NFT_CHAIN",
    "NFT_TABLE",
    "gc",
    "hand_over",
    "made_by_go",
    "missing_iptables",
    "nft_comment",
    "nft_prefix",
    "nft_rules",
    "setup_iptables",
    "status",
    "teardown",
]

#: Go's nftables masquerade table (family inet) and its per-address chain.
NFT_TABLE = "cni_plugins_masquerade"
NFT_CHAIN = "masq_checks"
#: What Go never masquerades, per IP version.
MULTICAST = gorules.MULTICAST
_NFT_COMMENT_MAX = 128  # knftables.CommentLengthMax

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _h16(text: str) -> str:
    # surrogatepass: a GC list may name IDs no runtime sends (lone surrogates)
    return hashlib.sha512(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def nft_prefix(network: str, ifname: str | None = None,
               container_id: str | None = None) -> str:
    """How Go's nftables comments start: 16 hex of SHA-512(network), and
    with ``ifname`` and ``container_id`` ``-`` + 16 hex of
    SHA-512(``ifname:containerID``) (an attachment's)."""
    if ifname is None or container_id is None:
        return _h16(network)
    return f"{_h16(network)}-{_h16(f'{ifname}:{container_id}')}"


def nft_comment(network: str, ifname: str, container_id: str) -> str:
    """Go's comment for an attachment's ``masq_checks`` rules:
    ``<prefix>, net: <network>, if: <ifname>, id: <containerID>`` (double
    quotes dropped), cut at 128 characters."""
    def bare(text: str) -> str:
        return text.replace('"', "")
    text = (f"{nft_prefix(network, ifname, container_id)}, net: {bare(network)}, "
            f"if: {bare(ifname)}, id: {bare(container_id)}")
    return text[:_NFT_COMMENT_MAX]


def _line(argv: list[str]) -> str:
    return restore_line(argv)


def _listed(ipt: IPTables, chain: str) -> list[list[str]] | None:
    """``chain``'s ``-A`` lines, split as a shell would (iptables quotes
    comments); None when the chain is missing."""
    lines = ipt.list_rules(chain)
    if not lines:
        return None
    return [shlex.split(line) for line in lines if line.startswith("-A ")]


def setup_iptables(network: str, container_id: str, addrs: Iterable[IPInterface]) -> None:
    """ADD with ``ipMasqBackend: "iptables"``: Go's layout for ``addrs``
    (`cni_skel.gorules.ipmasq_rules`), one ``iptables-restore --noflush`` per IP version
    (all of a version's rules, or none). A chain already there (an ADD
    repeated) keeps its rules; only the missing ones are appended, as Go's
    ``AppendUnique``. Undo with `teardown`.

    Raises:
        CNIError: 999 naming the command and its stderr (``iptables`` not
            on PATH included).
    """
    chain = gorules.chain_name(network, container_id)
    for version, rules in gorules.ipmasq_rules(network, container_id, addrs).items():
        ipt = IPTables(version, table="nat")
        have = _listed(ipt, chain)
        lines = []
        if have is None:
            lines.append(f"-N {chain}")  # no chain: no jump to it either
            have = []
        else:
            have += _listed(ipt, "POSTROUTING") or []
        lines += [_line(r) for r in rules if r not in have]
        if lines:
            ipt.restore(lines)


def hand_over(network: str, container_id: str, addrs: Iterable[IPInterface], *,
              dry_run: bool = False) -> list[str]:
    """For a pod handed back to Go's bridge or ptp
    (`cni_skel.skel.Plugin.hand_over_to_go`): Go's iptables layout for
    ``addrs`` (`setup_iptables`: what is there already stays, so a pod of
    ``ipMasqBackend: "iptables"`` costs nothing), without which Go's DEL
    fails. Returns one line per rule of the layout, saying what was (or
    with ``dry_run`` would be) made.

    Raises:
        CNIError: 999 when iptables fails.
    """
    addrs = list(addrs)
    if not dry_run:
        setup_iptables(network, container_id, addrs)
    verb = "would make" if dry_run else "made"
    return [f"{verb} Go's masquerade rule: {'ip6tables' if v == 6 else 'iptables'} -t nat "
            f"{_line(rule)}"
            for v, rules in gorules.ipmasq_rules(network, container_id, addrs).items()
            for rule in rules]


def _nft_remove(select, what: str) -> None:
    if gorules.present([("inet", NFT_TABLE, NFT_CHAIN)]):
        gorules.remove(select, what, Nft(), families=("inet",), tables=(NFT_TABLE,))


def teardown(network: str, container_id: str, ifname: str) -> None:
    """DEL: what either Go layout holds for the attachment (Go's
    ``TeardownIPMasqForNetworks``): the iptables chain of ``network`` +
    ``container_id`` with its POSTROUTING jumps, and the ``masq_checks``
    rules commented for ``ifname`` + ``container_id``. Needs no address;
    nothing there is no error. Go's table and chain stay (as Go leaves them).

    Raises:
        CNIError: 999 when iptables or nftables refuses (11 when Go's rules
            kept changing).
    """
    chain = gorules.chain_name(network, container_id)
    for version in gorules.iptables_versions("nat", chain):
        IPTables(version, table="nat").remove_chain(chain, ("POSTROUTING",))
    prefix = nft_prefix(network, ifname, container_id)
    _nft_remove(lambda c: c.startswith(prefix), f"masquerade teardown of network {network}")


def gc(network: str, keep: Iterable[tuple[str, str]]) -> None:
    """GC: remove both layouts' entries of ``network``'s attachments not in
    ``keep`` (``(containerID, ifname)`` pairs, spec 1.1.0 "GC"). Go's
    iptables comments name no interface: a chain stays while any kept
    attachment has its container ID. Go collects only its nftables rules.

    Raises:
        CNIError: 999 when iptables or nftables refuses.
    """
    keep = set(keep)
    kept_ids = {cid for cid, _ in keep}
    comments = {nft_comment(network, ifname, cid) for cid, ifname in keep}
    prefix = nft_prefix(network)
    _nft_remove(lambda c: c.startswith(prefix) and c not in comments,
                f"masquerade GC of network {network}")
    for version in (4, 6):
        kind = variant(version)
        family = "ip" if version == 4 else "ip6"
        if kind is None or (kind == "nft" and not gorules.present([(family, "nat", None)])):
            continue
        ipt = IPTables(version, table="nat")
        stale = set()
        for rule in _listed(ipt, "POSTROUTING") or []:
            owner = _owner(rule)
            if owner and owner[0] == "" and owner[1] == network and owner[2] not in kept_ids \
                    and rule[-2:] == ["-j", gorules.chain_name(network, owner[2])]:
                stale.add(rule[-1])
        for chain in sorted(stale):
            ipt.remove_chain(chain, ("POSTROUTING",))


def _owner(rule: list[str]) -> tuple[str, str, str] | None:
    if "--comment" not in rule[:-1]:
        return None
    return gorules.parse_owner(rule[rule.index("--comment") + 1])


def missing_iptables(network: str, container_id: str, addrs: Iterable[IPInterface]
                     ) -> list[str]:
    """CHECK with ``ipMasqBackend: "iptables"``: one description per rule
    of Go's layout for ``addrs`` that is not there (empty: all are).

    Raises:
        CNIError: 999 when iptables fails.
    """
    chain = gorules.chain_name(network, container_id)
    problems = []
    for version, rules in gorules.ipmasq_rules(network, container_id, addrs).items():
        ipt = IPTables(version, table="nat")
        have = _listed(ipt, chain)
        if have is None:
            problems.append(f"masquerade chain {chain} is missing from "
                            f"{ipt.tool} table nat")
            continue
        have += _listed(ipt, "POSTROUTING") or []
        problems += [f"{ipt.tool} -t nat rule {_line(r)} is missing" for r in rules
                     if r not in have]
    return problems


def nft_rules(network: str, container_id: str, ifname: str) -> list[gorules.GoRule]:
    """The attachment's rules in Go's ``masq_checks`` (one per address Go
    masquerades); [] when there are none or no such table.

    Raises:
        NftError: 999 when the listing fails.
    """
    if not gorules.present([("inet", NFT_TABLE, NFT_CHAIN)]):
        return []
    prefix = nft_prefix(network, ifname, container_id)
    return [r for r in gorules.list_rules(Nft(), ("inet",), (NFT_TABLE,))
            if r.chain == NFT_CHAIN and r.comment and r.comment.startswith(prefix)]


def made_by_go(network: str, container_id: str, ifname: str) -> bool:
    """Whether either Go layout holds entries for the attachment (a pod
    Go's plugin made, or ours with ``ipMasqBackend: "iptables"``): its
    iptables chain exists, or `nft_rules` finds its rules."""
    if gorules.iptables_versions("nat", gorules.chain_name(network, container_id)):
        return True
    return bool(nft_rules(network, container_id, ifname))


def status() -> None:
    """STATUS with ``ipMasqBackend: "iptables"``: the ``iptables`` command
    is there.

    Raises:
        CNIError: 50 when it is not on PATH.
    """
    if variant(4) is None:
        raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, "iptables not found",
                       "ipMasqBackend iptables needs the iptables package")
