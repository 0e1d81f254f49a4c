"""CNI meta plugin ``firewall``: lets a pod's traffic through the node's
packet filter (Go 1.1.1's firewall, plus nodes whose filter is nftables).

Chained after an interface plugin, it lets forwarded traffic from the
pod's addresses (prevResult's ``ips``) and the replies to it through the
node's filter, wherever that filter lives:

* ``backend: "iptables"`` (Go's): the iptables filter's FORWARD chain, via
  Go's ``CNI-FORWARD`` and admin chains, pods in an ipset (`.iptables`).
  A FORWARD policy of DROP (Docker sets it) is overridden only there: an
  accept in another nftables table does not stop a drop in this one;
* ``backend: "firewalld"`` (Go's): the pod's addresses become sources of
  ``firewalldZone`` (default ``trusted``) over D-Bus (`.firewalld`), at
  most `FIREWALLD_MAX_ADDRESSES` of them;
* ``backend: "nftables"`` (ours): each nftables base chain on the forward
  hook that drops by policy gets an accept for pods (`.nftables`);
* no ``backend`` (Go's choice first): firewalld when it runs, else
  iptables, and then also every nftables drop chain, so a node filtering
  in plain nftables lets pods through too.

``ingressPolicy``: ``open`` (default) or ``same-bridge``: Go's isolation
chains drop traffic into the pod's bridge (prevResult's first interface)
from other such bridges; ``isolated`` (Go >= 1.7.0) also between the
bridge's own ports. Written with iptables whatever the backend, as Go.

DEL undoes what its ADD recorded (`.records`; flat in pods); a pod with no
record (Go's ADD made it) gets Go's DEL. GC undoes the records of
attachments not in ``cni.dev/valid-attachments``. Supports cniVersion
0.4.0 and later, as Go.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import sys
from typing import Any, Literal

from pydantic import Field, StrictStr

from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result
from cni_skel.env import ifname_problem
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.ipset import COMMENT_MAX, IPSets
from cni_skel.nft import Nft
from cni_skel.rollback import rollback
from cni_skel.tags import attachment_tag, network_tag
from cni_skel.types import check_expressible

from . import nftables, records
from .firewalld import Firewalld
from .iptables import SETS, Layout, isolate_bridge

__all__ = ["FIREWALLD_MAX_ADDRESSES", "Firewall", "FirewallConf", "owner"]

#: The most addresses an ADD through the firewalld backend takes (a
#: prevResult may carry 1,024, `cni_skel.config.PREV_RESULT_MAX_ENTRIES`):
#: firewalld 1.3 applies each source in a transaction of its own, and each
#: costs more the more sources its zones hold, so 1,024 took about a minute
#: (256: 3 s). More is refused with code 7 before anything is added. A pod
#: has a handful.
FIREWALLD_MAX_ADDRESSES = 256

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
#: iptables chain names we write: none or 1..28 (XT_EXTENSION_MAXNAMELEN - 1)
#: letters, digits, ``_.-`` (iptables refuses blanks; ``!`` and ``-`` first read as options).
_CHAIN_PATTERN = r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,27})?$"


class FirewallConf(NetConf):
    """NetConf plus Go's keys: ``backend`` (``iptables``, ``firewalld``,
    ours ``nftables``; none: see the module), ``iptablesAdminChainName``
    (default ``CNI-ADMIN``), ``firewalldZone`` (default ``trusted``),
    ``ingressPolicy`` (``open``, ``same-bridge``, ``isolated``), and ours
    ``dataDir`` (the records, default /run/cni/firewall). A value of the
    wrong type is code 7 naming it; an unknown backend or policy is code 7
    too (Go takes an unknown backend for none)."""

    backend: Literal["", "iptables", "firewalld", "nftables"] = ""
    iptables_admin_chain_name: StrictStr = Field("", alias="iptablesAdminChainName",
                                                 pattern=_CHAIN_PATTERN)
    firewalld_zone: StrictStr = Field("", alias="firewalldZone")
    ingress_policy: Literal["", "open", "same-bridge", "isolated"] = Field(
        "", alias="ingressPolicy")
    data_dir: StrictStr = Field(records.DEFAULT_DIR, alias="dataDir", min_length=1)

    @property
    def admin_chain(self) -> str:
        return self.iptables_admin_chain_name or "CNI-ADMIN"

    @property
    def zone(self) -> str:
        return self.firewalld_zone or "trusted"


def owner(network: str, container_id: str, ifname: str) -> str:
    """The comment on every set entry of an attachment: the network's tag
    and the attachment's (`cni_skel.tags`), hashed when it would not fit
    an ipset or nftables comment."""
    text = f"{network_tag(network)} {attachment_tag(container_id, ifname)}"
    if len(text.encode()) <= min(COMMENT_MAX, 250):
        return text
    digest = hashlib.sha256(attachment_tag(container_id, ifname).encode()).hexdigest()
    return f"{network_tag(network)} sha256:{digest}"


def _addrs(prev: Result | None) -> list[IP]:
    return [ipc.address.ip for ipc in prev.ips] if prev is not None else []


def _versions(addrs: list[IP]) -> list[int]:
    return sorted({ip.version for ip in addrs})


class Firewall(Plugin):
    """firewall: ADD, CHECK and DEL as Go's (see the module for what each
    backend writes); GC undoes the records of attachments gone; STATUS
    succeeds."""

    name = "firewall"
    config_model = FirewallConf
    supported_versions = ("0.4.0", "1.0.0", "1.1.0")

    @staticmethod
    def _backend(conf: FirewallConf) -> str:
        """The backend in force: the configured one, else ``firewalld`` when
        it runs (Go's choice), else ``auto`` (iptables and nftables), or
        ``nftables`` on a node without the iptables command."""
        if conf.backend:
            return conf.backend
        if Firewalld.running():
            return "firewalld"
        # a node without iptables (nftables only): nothing to write there
        return "auto" if shutil.which("iptables") else "nftables"

    @staticmethod
    def _prev(conf: FirewallConf) -> Result:
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "missing prevResult from earlier plugin")
        return conf.prev_result

    def add(self, args: CmdArgs, conf: FirewallConf) -> Result:
        """Let the pod's addresses through (module docstring), then apply
        ``ingressPolicy``; record what was added. A failure undoes it all.

        Returns:
            prevResult, unchanged.

        Raises:
            CNIError: 7 without prevResult, or ``same-bridge``/``isolated``
                with no interface in it (or one no link can be named), or
                more than `FIREWALLD_MAX_ADDRESSES` addresses for the
                firewalld backend; 5 when the record can not be written;
                999 when iptables, ipset, nftables or firewalld refuse
                (naming what), or iptables is missing.
        """
        prev = self._prev(conf)
        check_expressible(conf.cni_version, prev)
        addrs = _addrs(prev)
        bridge = self._policy_bridge(conf, prev)
        backend = self._backend(conf)
        if backend == "firewalld" and len(addrs) > FIREWALLD_MAX_ADDRESSES:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f'firewall: {len(addrs)} addresses in prevResult "ips", more than '
                           f"the {FIREWALLD_MAX_ADDRESSES} the firewalld backend takes",
                           "firewalld applies each source in a transaction of its own")
        tag = owner(conf.name, args.container_id, args.ifname)
        old = records.read(conf.data_dir, args.container_id, args.ifname)
        doc: dict[str, Any] = {"network": conf.name, "containerID": args.container_id,
                               "ifname": args.ifname}
        with rollback(self.name) as undo:
            if backend == "firewalld":
                doc["firewalld"] = self._firewalld_add(conf, addrs, undo)
            else:
                if backend in ("iptables", "auto"):
                    doc["ipset"] = self._ipset_add(conf, addrs, tag, undo)
                if backend in ("nftables", "auto"):
                    nft = Nft()
                    added = nftables.add_pods(nft, addrs, tag)
                    undo.callback("deleting the pod from nftables sets",
                                  nftables.delete_pods, nft, added)
                    doc["nftables"] = added
            if bridge is not None:
                for v in _versions(addrs):
                    isolate_bridge(v, bridge, isolated=conf.ingress_policy == "isolated")
            records.write(conf.data_dir, args.container_id, args.ifname, records.merge(old, doc))
        return prev

    @staticmethod
    def _policy_bridge(conf: FirewallConf, prev: Result) -> str | None:
        """The bridge ``same-bridge``/``isolated`` isolates (prevResult's
        first interface, Go), None for ``open``; code 7 when there is none."""
        if conf.ingress_policy in ("", "open"):
            return None
        if not prev.interfaces or not prev.interfaces[0].name:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f'interface needs to be set for ingress policy "{conf.ingress_policy}", '
                           'make sure to chain "firewall" plugin with "bridge"')
        name = prev.interfaces[0].name
        problem = ifname_problem(name)
        if problem is not None:  # it goes into iptables rules: refused before any
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"prevResult interfaces[0].name for ingress policy "
                           f'"{conf.ingress_policy}": {problem[0]}', problem[1])
        return name

    @staticmethod
    def _ipset_add(conf: FirewallConf, addrs: list[IP], tag: str, undo: Any) -> dict:
        added: dict[str, list[str]] = {}
        with IPSets() as ipsets:
            for v in _versions(addrs):
                Layout(v, conf.admin_chain).ensure(ipsets)
            for ip in addrs:
                if ipsets.add(SETS[ip.version], ip, tag):
                    added.setdefault(SETS[ip.version], []).append(str(ip))
                    undo.callback(f"deleting {ip} from ipset {SETS[ip.version]}",
                                  _ipset_delete, SETS[ip.version], str(ip))
        return added

    @staticmethod
    def _firewalld_add(conf: FirewallConf, addrs: list[IP], undo: Any) -> dict:
        sources = [f"{ip}/{ip.max_prefixlen}" for ip in addrs]
        with Firewalld() as fwd:
            for src in sources:
                fwd.add_source(conf.zone, src)
                undo.callback(f"removing source {src} from zone {conf.zone}",
                              _firewalld_remove, conf.zone, [src])
        return {"zone": conf.zone, "sources": sources}

    def delete(self, args: CmdArgs, conf: FirewallConf) -> None:
        """Undo what this attachment's ADD recorded, then drop the record;
        without a record (a pod Go's ADD made), Go's DEL for prevResult's
        addresses: its two iptables rules per address, or the addresses as
        sources of ``firewalldZone``. Succeeds when things are gone;
        ``ingressPolicy`` chains stay (Go: the bridge may serve others).

        Raises:
            CNIError: 5 for an unreadable record; 999 when the kernel or
                firewalld refuses a removal.
        """
        doc = records.read(conf.data_dir, args.container_id, args.ifname)
        if doc is not None:
            _undo(doc)
        else:
            self._go_delete(conf)
        records.remove(conf.data_dir, args.container_id, args.ifname)

    def _go_delete(self, conf: FirewallConf) -> None:
        addrs = _addrs(conf.prev_result)
        if not addrs:
            return
        backend = self._backend(conf)
        if backend == "firewalld":
            _firewalld_remove(conf.zone, [f"{ip}/{ip.max_prefixlen}" for ip in addrs])
        elif backend in ("iptables", "auto"):
            for v in _versions(addrs):
                layout = Layout(v, conf.admin_chain)
                if shutil.which(layout.ipt.tool):
                    layout.delete_go_rules(ip for ip in addrs if ip.version == v)

    def check(self, args: CmdArgs, conf: FirewallConf) -> None:
        """Everything ADD makes for prevResult's addresses is there: the
        iptables chains, jumps and set rules with each address in its set
        (or Go's two rules for it), the nftables jumps and elements, or
        each address as a source of the zone (Go's CHECK only asks
        firewalld, and passes whatever the answer).

        Raises:
            CNIError: 7 without prevResult; 999 naming what is missing.
        """
        prev = self._prev(conf)
        addrs = _addrs(prev)
        if not addrs:
            return
        backend = self._backend(conf)
        problems: list[str] = []
        if backend == "firewalld":
            with Firewalld() as fwd:
                # one getSources for all; querySource (Go's call) for what
                # it does not list, in case firewalld spells a source otherwise
                bound = set(fwd.sources(conf.zone))
                for ip in addrs:
                    src = f"{ip}/{ip.max_prefixlen}"
                    if src not in bound and not fwd.query_source(conf.zone, src):
                        problems.append(f"failed to find the address {src} in {conf.zone} zone")
        if backend in ("iptables", "auto"):
            with IPSets() as ipsets:
                for v in _versions(addrs):
                    layout = Layout(v, conf.admin_chain)
                    mine = [ip for ip in addrs if ip.version == v]
                    ours = {ip for ip in mine if ipsets.contains(SETS[v], ip)}
                    rest = [ip for ip in mine if ip not in ours]
                    go = layout.go_rules_of(rest) if rest else {}
                    problems += layout.problems(ipsets, with_set=not any(go.values())
                                                or bool(ours))
                    problems += [f"{ip} is not in ipset {SETS[v]}" for ip in rest if not go[ip]]
        if backend in ("nftables", "auto"):
            problems += nftables.problems(Nft(), addrs)
        if problems:
            raise CNIError(ERR_INTERNAL, "firewall: " + _joined(problems), "; ".join(problems))

    def gc(self, args: CmdArgs, conf: FirewallConf) -> None:
        """Undo the records of this network's attachments not in
        ``cni.dev/valid-attachments``, then delete the ipset entries of
        this network whose owner is not kept (an ADD killed before its
        record). Other networks' entries stay.

        Raises:
            CNIError: 7 without the list of valid attachments; 999 naming
                the problems met (the rest is still done).
        """
        keep = conf.gc_keep()
        problems = records.collect(conf.data_dir, conf.name,
                                   {(a.container_id, a.ifname) for a in keep}, _undo)
        mine = network_tag(conf.name) + " "
        owners = {owner(conf.name, a.container_id, a.ifname) for a in keep}
        with IPSets() as ipsets:
            for name in SETS.values():
                for entry in ipsets.entries(name):
                    c = entry.comment or ""
                    if c.startswith(mine) and c not in owners:
                        ipsets.delete(name, entry.address)
        if problems:
            raise CNIError(ERR_INTERNAL, "firewall GC: " + "; ".join(problems))


#: Problems a CHECK error's ``msg`` spells out (``details`` has them all).
_SHOWN_PROBLEMS = 10


def _joined(problems: list[str]) -> str:
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = len(problems) - _SHOWN_PROBLEMS
    return f"{shown}; and {more} more" if more > 0 else shown


def _ipset_delete(name: str, address: str) -> None:
    with IPSets() as ipsets:
        ipsets.delete(name, address)


def _firewalld_remove(zone: str, sources: list[str]) -> None:
    if not Firewalld.running():  # its runtime sources went with it: nothing to undo
        return
    with Firewalld() as fwd:
        for src in sources:
            fwd.remove_source(zone, src)


def _undo(doc: dict[str, Any]) -> bool:
    """Remove what a record lists; True when done (GC then drops it)."""
    sets = doc.get("ipset") or {}
    if isinstance(sets, dict) and sets:
        with IPSets() as ipsets:
            for name, addrs in sets.items():
                for a in addrs if isinstance(addrs, list) else ():
                    try:
                        ipsets.delete(name, a)
                    except ValueError:  # not an address: a damaged record
                        print(f"firewall: skipping {a!r} of ipset {name}", file=sys.stderr)
    nft = [r for r in doc.get("nftables") or [] if isinstance(r, dict)
           and {"family", "table", "set", "address"} <= r.keys()]
    if nft:
        nftables.delete_pods(Nft(), nft)
    fwd = doc.get("firewalld")
    if isinstance(fwd, dict) and isinstance(fwd.get("zone"), str):
        _firewalld_remove(fwd["zone"], [s for s in fwd.get("sources") or []
                                        if isinstance(s, str)])
    return True
