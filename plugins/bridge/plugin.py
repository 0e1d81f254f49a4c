"""The bridge plugin: `Bridge` and the netlink steps its ADD takes."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
from typing import Any

from cni_skel import gomasq, gorules, netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.invoke import delegate_check, delegate_del, delegate_gc, delegate_status, ipam_add
from cni_skel.ipam import check_interface_ips, check_routes, configure_iface
from cni_skel.netns import NetNS, open_netns
from cni_skel.nft import Nft, NftError, attachment_tag, nft_status, table_state
from cni_skel.rollback import rollback
from cni_skel.rtnl import Rtnl
from cni_skel.skel import Plugin
from cni_skel.sysctl import enable_forward, write_sysctl
from cni_skel.types import Interface, Result, Route, check_expressible
from cni_skel.veth import VETH_TRIES, delete_veth, random_veth_name, setup_veth

from .config import BridgeArgs, BridgeConf
from .rules import MASQ_FAMILY, SPOOF_FAMILY, TABLE, SpoofCheck, masquerade

__all__ = ["Bridge"]


def _sysctl_quiet(key: str, value: str) -> None:
    # Best effort, as Go's bridge: a missing knob (IPv6 off) is not an error.
    with contextlib.suppress(CNIError):
        write_sysctl(key, value)


def _container_mac(args: CmdArgs, conf: BridgeConf) -> str | None:
    # Go's precedence: CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac.
    env_mac = getattr(args.typed_args, "mac", None)
    return conf.mac or env_mac


def _setup_port(ipr: Rtnl, port: netlink.Link | str, bridge: netlink.Link, conf: BridgeConf,
                vlan: int, *, enslave: bool = True) -> None:
    """Make ``port`` a port of the bridge (unless created as one: ``enslave``
    False) with VLANs, hairpin and isolation, as Go's setupVeth, and bring it
    up with the last request (given its `Link`, no step looks it up)."""
    if enslave:
        netlink.link_set(ipr, port, master=bridge.index)
    if (vlan or conf.vlans) and not conf.preserve_default_vlan:
        for vid, _, _ in netlink.bridge_vlans(ipr, port):
            netlink.bridge_vlan_del(ipr, port, vid)
    if vlan:
        netlink.bridge_vlan_add(ipr, port, vlan, pvid=True, untagged=True)
    for vid in conf.vlans:
        netlink.bridge_vlan_add(ipr, port, vid)
    if not vlan and conf.vlans:
        # Go: a trunk without "vlan" keeps native VLAN 1 untagged.
        netlink.bridge_vlan_add(ipr, port, 1, pvid=True, untagged=True)
    # Port flags are applied before IFF_UP in one request (kernel order).
    netlink.link_set(ipr, port, hairpin=conf.hairpin_mode, isolated=conf.port_isolation,
                     up=True)


def _gateways(result: Result, conf: BridgeConf) -> dict[int, list[Any]]:
    """Go's calcGateways: every IP belongs to the container interface (index
    2); with isGateway a missing gateway is the subnet's first address; with
    isDefaultGateway a default route per family unless one with a gateway is
    there. Returns family -> gateway interfaces to put on the bridge."""
    gws: dict[int, list[Any]] = {4: [], 6: []}
    default_found = {4: False, 6: False}
    for ipc in result.ips:
        v = ipc.address.version
        ipc.interface = 2
        if ipc.gateway is None and conf.is_gateway:
            ipc.gateway = ipc.address.network.network_address + 1
        if conf.is_default_gateway and not default_found[v]:
            zero = ipaddress.ip_interface("0.0.0.0/0" if v == 4 else "::/0")
            default_found[v] = any(r.gw is not None and r.dst.network == zero.network
                                   for r in result.routes)
            if not default_found[v]:
                result.routes.append(Route(dst=zero, gw=ipc.gateway))
                default_found[v] = True
        if conf.is_gateway:
            gws[v].append(ipaddress.ip_interface(f"{ipc.gateway}/{ipc.address.network.prefixlen}"))
    return gws


def _ensure_gateway_addr(ipr: Rtnl, link: netlink.Link, gw: Any, force: bool) -> str | None:
    """Go's ensureAddr: the gateway address on ``link`` (the bridge). Another
    IPv4 address, or an overlapping IPv6 one, is replaced with
    ``forceAddress`` and an error without. Returns the MAC it pinned when
    it added the address (None when the address was there)."""
    for addr in netlink.addresses(ipr, link, gw.version):
        if addr == gw:
            return None
        if addr.ip.is_link_local and gw.version == 6:
            continue
        if gw.version == 4 or gw.ip in addr.network or addr.ip in gw.network:
            if not force:
                raise CNIError(ERR_INTERNAL,
                               f'"{link.name}" already has an IP address different from {gw}')
            netlink.del_address(ipr, link, addr)
    netlink.add_address(ipr, link, gw)
    # Pin the bridge's MAC; otherwise it follows the lowest port MAC and
    # changes as pods come and go (Go does the same here).
    current = netlink.find_link(ipr, link)
    if current is None:
        return None
    netlink.link_set(ipr, current, mac=current.mac)
    return current.mac


def _ensure_vlan_gateway(ipr: Rtnl, bridge: netlink.Link, conf: BridgeConf) -> netlink.Link:
    """Go's ensureVlanInterface: a veth ``<bridge>.<vlan>`` on the host whose
    peer is a port of the bridge in that VLAN; the gateway lives on it."""
    name = f"{conf.bridge}.{conf.vlan}"
    link = netlink.find_link(ipr, name)
    if link is not None:
        return link
    for _ in range(VETH_TRIES):
        peer = random_veth_name()
        try:
            link, _ = netlink.create_veth_pair(ipr, name, peer, mtu=bridge.mtu)
            break
        except netlink.LinkExists as e:
            if e.name == name:
                found = netlink.find_link(ipr, name)
                if found is not None:
                    return found
    else:
        raise CNIError(ERR_INTERNAL, "failed to find a unique veth name")
    _setup_port(ipr, peer, bridge, conf, conf.vlan)
    netlink.link_up(ipr, link)
    return netlink.find_link(ipr, link) or link


def _configure_container(netns: NetNS, cipr: Rtnl, cont: netlink.Link, result: Result,
                         conf: BridgeConf) -> None:
    """Go's cmdAdd in the container: DAD and arp_notify sysctls, then the
    result's addresses and routes on ``cont`` (through ``cipr``)."""
    ifname = cont.name
    with netns.enter():
        if conf.enabledad:
            _sysctl_quiet(f"net/ipv6/conf/{ifname}/enhanced_dad", "1")
            _sysctl_quiet(f"net/ipv6/conf/{ifname}/accept_dad", "1")
        else:
            _sysctl_quiet(f"net/ipv6/conf/{ifname}/accept_dad", "0")
        _sysctl_quiet(f"net/ipv4/conf/{ifname}/arp_notify", "1")
    configure_iface(netns, cont, result, ipr=cipr)


def _entries(conf: BridgeConf, nft: Nft, tags: set[str] | None = None, *,
             keep: set[str] | None = None,
             port_gone: Any = None) -> list[dict]:
    """Delete commands for the nftables entries of ``tags`` (or of every tag
    not in ``keep``) on this network: masquerade and spoof check together,
    each in this network's own sets (`SpoofCheck.entries` for the sets old
    versions shared, and ``port_gone``)."""
    cmds: list[dict] = []
    if conf.ip_masq:
        cmds += masquerade(conf.name, nft).entries(tags, keep=keep)
    if conf.macspoofchk:
        cmds += SpoofCheck(conf.name, nft).entries(tags, keep=keep, port_gone=port_gone)
    return cmds


def _remove_entries(conf: BridgeConf, nft: Nft, tag: str, what: str) -> None:
    """Delete attachment ``tag``'s nftables entries on this network (one
    transaction; none when there are none)."""
    nft.run(_entries(conf, nft, {tag}), what=what)


# --- what Go's bridge made (a node moving from the Go plugins) ------------------

#: Where Go's bridge keeps its rules: ipMasq in iptables-nft's ``nat`` tables,
#: macspoofchk in nftables' ``bridge nat``.
_GO_FAMILIES = ("ip", "ip6", "bridge")
_GO_TABLES = ("nat",)


def _go_spoof_comment(container_id: str, ifname: str) -> str:
    """The comment of Go bridge's MAC spoof-check rules of an attachment."""
    return f"macspoofchk-{container_id}-{ifname}"


def _go_remove(network: str, container_id: str, ifname: str, what: str) -> None:
    """Remove what Go's bridge made for this attachment (a pod Go created
    and we DEL: Go's own DEL would have): its masquerade in either of Go's
    layouts (`cni_skel.gomasq.teardown`, also the ``ipMasqBackend:
    "iptables"`` pods of ours) and its MAC spoof-check chains."""
    gomasq.teardown(network, container_id, ifname)
    # Go's spoof check lives in table bridge nat: listed only when it exists.
    if gorules.present([("bridge", "nat", None)]):
        comment = _go_spoof_comment(container_id, ifname)
        gorules.remove(comment.__eq__, what, families=("bridge",), tables=_GO_TABLES)


def _go_missing(conf: BridgeConf, args: CmdArgs, versions: set[int], *,
                masq: bool = True) -> list[str] | None:
    """CHECK of a pod Go's bridge created: what of Go's rules for this
    attachment is missing (Go's iptables masquerade jump per IP family in
    ``versions`` and its chain, unless Go's nftables masquerade holds the
    pod; its spoof-check rule), or None when Go made nothing for it (then
    ours are what CHECK wants). ``masq`` False: the spoof check only."""
    rules = gorules.list_rules(None, _GO_FAMILIES, _GO_TABLES)
    comment = gorules.owner_comment(conf.name, args.container_id)
    spoof = _go_spoof_comment(args.container_id, args.ifname)
    masq = masq and conf.ip_masq and conf.layer3
    # Go >= 1.5 with ipMasqBackend nftables: its masq_checks rules instead.
    go_nft = masq and bool(gomasq.nft_rules(conf.name, args.container_id, args.ifname))
    if not go_nft and not any(r.comment in (comment, spoof) for r in rules):
        return None
    chains = {(r.family, r.chain) for r in rules}
    problems = []
    if masq and not go_nft:
        for v in sorted(versions):
            family = "ip" if v == 4 else "ip6"
            jumps = [r for r in rules if r.family == family and r.chain == "POSTROUTING"
                     and r.comment == comment and r.jump]
            if not jumps or (family, jumps[0].jump) not in chains:
                problems.append(f"Go bridge's IPv{v} masquerade rule ({comment}) is missing")
    if conf.macspoofchk and not any(r.comment == spoof and r.chain == "PREROUTING"
                                    for r in rules):
        problems.append(f"Go bridge's MAC spoof check rule ({spoof}) is missing")
    return problems


def _ensure_bridge(ipr: Rtnl, conf: BridgeConf) -> netlink.Link:
    """Go's setupBridge: the bridge (made, or reused when it is one), its
    promiscuity, no router advertisements taken (we own its routes), up.
    What the bridge already is (promiscuous, up) is not set again."""
    bridge = netlink.ensure_bridge(ipr, conf.bridge, mtu=conf.mtu or None,
                                   vlan_filtering=conf.vlan_filtering)
    if conf.promisc_mode and not bridge.flags & netlink.IFF_PROMISC:
        netlink.link_set(ipr, bridge, promisc=True)
    _sysctl_quiet(f"net/ipv6/conf/{conf.bridge}/accept_ra", "0")
    if not bridge.up:
        netlink.link_up(ipr, bridge)
    return bridge


def _setup_gateways(ipr: Rtnl, bridge: netlink.Link, conf: BridgeConf, result: Result,
                    gws: dict[int, list[Any]]) -> str | None:
    """With ``isGateway``: the gateway addresses on the bridge (on the VLAN
    interface ``<bridge>.<vlan>`` with ``vlan``, which joins the result),
    and forwarding on for each family that has one (Go's cmdAdd). Returns
    the bridge MAC it pinned, if it pinned it."""
    target = bridge
    if conf.vlan:
        target = _ensure_vlan_gateway(ipr, bridge, conf)
        result.interfaces.append(Interface(name=target.name, mac=target.mac))
    pinned = None
    for family, addrs in gws.items():
        for gw in addrs:
            pinned = _ensure_gateway_addr(ipr, target, gw, conf.force_address) or pinned
        if addrs:
            enable_forward([family])
    return None if conf.vlan else pinned


# --- the plugin ----------------------------------------------------------------


class Bridge(Plugin):
    """bridge: attach the container to a Linux bridge through a veth pair.

    Config: `cni_skel_plugins.bridge.config.BridgeConf`. CNI_ARGS: ``MAC``
    (and the K8S_* keys kubelet sends).

    ADD: create (or reuse) the bridge and bring it up (an existing link of
    that name that is not a bridge: 999 ``"<name>" already exists but is not a
    bridge``); create the veth pair, host end ``veth<8 hex>`` on the bridge
    (hairpin, isolation, VLANs), container end CNI_IFNAME created directly in
    the container netns with the MTU and MAC (999 when that name is taken
    there); IPAM ADD; container sysctls (accept_dad off unless ``enabledad``,
    arp_notify), addresses and routes; with ``isGateway`` the gateway
    addresses on the bridge (``forceAddress``: replace a different one, else
    999) and forwarding on; with ``isDefaultGateway`` a default route per
    family. ``ipMasq`` and ``macspoofchk`` add this attachment's entries to
    shared nftables sets (`cni_skel_plugins.bridge.rules`) in one
    transaction. Any failure undoes what was created, IPAM DEL included.
    Result: interfaces [bridge, host veth, container (sandbox)] (+ the VLAN
    gateway interface), ``ips`` with ``interface: 2``, routes, dns (the
    config's ``dns`` wins when set), in the config's version. Without
    ``ipam`` at 0.1.0/0.2.0 (no IP, which those results cannot carry): code
    1 before anything is created (Go creates the veth, then fails).

    DEL: the container interface (when the netns and it exist), IPAM DEL
    (always), this attachment's nftables entries found by its tag (so it
    works with an empty CNI_NETNS and no prevResult; upstream leaks its
    masquerade rules there), and the rules and chains Go's bridge made for
    the container (a pod created before the switch, `cni_skel.gorules`).
    Never deletes the bridge. Repeatable.

    CHECK (0.4.0+): IPAM CHECK, then as upstream: bridge present with
    prevResult's MAC and the configured promiscuity, container veth with
    prevResult's MAC, IPs and routes, host veth its peer on the bridge, and
    the nftables entries present (for a pod Go's bridge made: Go's
    masquerade and spoof-check rules instead). 7 without prevResult.

    GC (1.1.0): IPAM GC, then nftables entries of attachments not in
    ``cni.dev/valid-attachments``, Go's masquerade rules of this network's
    containers not in it included. STATUS (1.1.0): IPAM STATUS; 50 when
    nftables is needed (ipMasq/macspoofchk) and not usable.
    """

    name = "bridge"
    config_model = BridgeConf
    args_model = BridgeArgs

    @classmethod
    def node_state(cls) -> list[str]:
        """Its nftables tables (masquerade, MAC spoof check) in this network
        namespace, when they exist (`cni_skel.skel.Plugin.node_state`)."""
        lines = (table_state(family, TABLE, "rules of pods still attached")
                 for family in sorted({MASQ_FAMILY, SPOOF_FAMILY}))
        return [line for line in lines if line]

    @classmethod
    def hand_over_to_go(cls, conf: BridgeConf, handover: gorules.GoHandOver, *,
                        dry_run: bool = False) -> list[str]:
        """For a pod that stays while the node goes back to Go's bridge
        (`cni_skel.skel.Plugin.hand_over_to_go`): with ``ipMasq``, the
        masquerade rules Go's bridge would have made at ADD
        (`cni_skel.gomasq.hand_over`: its DEL fails without its chain),
        then our masquerade and spoof-check entries of the attachment are
        removed. Go's MAC spoof check is not recreated (said in the lines).

        Raises:
            CNIError: 999 when iptables or nftables fails.
        """
        bconf = conf
        lines: list[str] = []
        prev = bconf.prev_result
        addrs = [ipc.address for ipc in prev.ips] if prev is not None else []
        if bconf.ip_masq and bconf.layer3 and addrs:
            lines += gomasq.hand_over(bconf.name, handover.container_id, addrs, dry_run=dry_run)
        elif bconf.ip_masq and not addrs:
            chain = gorules.chain_name(bconf.name, handover.container_id)
            lines.append("no cached addresses: Go's masquerade rules were not made; before "
                         f"Go's DEL of this pod run `iptables -t nat -N {chain}`")
        tag = attachment_tag(handover.container_id, handover.ifname)
        if bconf.ip_masq or bconf.macspoofchk:
            nft = Nft()
            cmds = _entries(bconf, nft, {tag})
            if cmds and not dry_run:
                nft.run(cmds, what="bridge: handing over to Go")
            if cmds:
                lines.append(f"{'would remove' if dry_run else 'removed'} our nftables "
                             f"entries of {tag} ({len(cmds)} set(s))")
        if bconf.macspoofchk:
            lines.append("macspoofchk: Go's spoof check is not recreated for this pod (it "
                         "stays unchecked until it is recreated)")
        return lines

    @classmethod
    def release_node_state(cls, *, dry_run: bool = False) -> list[str]:
        """Delete our tables (``inet``/``bridge cni_skel_bridge``) when no
        set of theirs holds an element any more."""
        nft = Nft()
        lines = []
        for family in sorted({MASQ_FAMILY, SPOOF_FAMILY}):
            table = nft.table(family, TABLE)
            if table is None or any(s.get("elem") for s in table.sets.values()):
                continue
            if not dry_run:
                nft.run([{"delete": {"table": {"family": family, "name": TABLE}}}],
                        what="bridge: removing its empty table")
            lines.append(f"{'would delete' if dry_run else 'deleted'} empty nftables table "
                         f"{family} {TABLE}")
        return lines

    def add(self, args: CmdArgs, conf: BridgeConf) -> Result:
        """Attach the container to the bridge (Go's cmdAdd, in its order);
        see the class docstring for the steps, result and errors. Each step
        that creates something registers its undo, so a failure drops the
        nftables entries, releases the IPAM address and deletes the veth
        before the error goes out."""
        # Without IPAM the result has no IP: 0.1.0/0.2.0 cannot carry it, so
        # say so before the bridge and veth exist (Go creates them, then fails).
        check_expressible(conf.cni_version, has_ip=conf.layer3)
        tag = attachment_tag(args.container_id, args.ifname)
        pinned = None
        with NetNS.open(args.netns) as netns, Rtnl() as ipr, netns.rtnl() as cipr, \
                rollback(self.name) as undo:
            bridge = _ensure_bridge(ipr, conf)
            # Down: _setup_port sets the port flags and IFF_UP in one request.
            host, cont = setup_veth(ipr, netns, args.ifname, mtu=conf.mtu or None,
                                    mac=_container_mac(args, conf), master=bridge, up=False,
                                    peer_ipr=cipr)
            undo.callback(f"deleting {host.name}", netlink.delete_link, ipr, host)
            _setup_port(ipr, host, bridge, conf, conf.vlan, enslave=False)
            result = Result(cni_version=conf.cni_version, interfaces=[
                Interface(name=conf.bridge, mac=bridge.mac),
                Interface(name=host.name, mac=host.mac),
                Interface(name=args.ifname, mac=cont.mac, sandbox=args.netns),
            ])
            # nftables entries are collected here and applied in one transaction.
            go_masq = conf.ip_masq and conf.ip_masq_backend == "iptables"
            nft = Nft() if (conf.macspoofchk or (conf.ip_masq and conf.layer3
                                                 and not go_masq)) else None
            elements: list[dict] = []
            layouts: list[list[dict]] = []
            if conf.macspoofchk:
                spoof = SpoofCheck(conf.name, nft)
                elements += spoof.elements(host.name, cont.mac, tag)
                layouts.append(spoof.layout())

            if conf.layer3:
                assert conf.ipam is not None
                ipam_result = ipam_add(undo, conf.ipam.type, args.stdin_data, args)
                result.ips = list(ipam_result.ips)
                result.routes = list(ipam_result.routes)
                result.dns = ipam_result.dns
                if not result.ips:
                    raise CNIError(ERR_INTERNAL, "IPAM plugin returned missing IP config")
                gws = _gateways(result, conf)
                _configure_container(netns, cipr, cont, result, conf)
                if conf.is_gateway:
                    pinned = _setup_gateways(ipr, bridge, conf, result, gws)
                if go_masq:
                    undo.callback("removing masquerade", gomasq.teardown, conf.name,
                                  args.container_id, args.ifname)
                    gomasq.setup_iptables(conf.name, args.container_id,
                                          [ipc.address for ipc in result.ips])
                elif conf.ip_masq:
                    masq = masquerade(conf.name, nft)
                    elements += masq.elements([ipc.address for ipc in result.ips], tag)
                    layouts.append(masq.layout())
            elif not conf.disable_container_interface:
                netlink.link_up(cipr, cont)

            if nft is not None and elements:
                nft.apply(elements, layouts, what=f"bridge {conf.bridge}")
                undo.callback("removing nftables entries", _remove_entries, conf, nft, tag,
                              "bridge rollback")
            # Wait for the port to forward, then read back the MACs the
            # kernel may have changed meanwhile (not a bridge MAC pinned here).
            if not conf.disable_container_interface:
                link = netlink.wait_operstate(ipr, host, "UP")
            else:
                link = netlink.find_link(ipr, host) or host
            result.interfaces[1].mac = link.mac
            now = None if pinned else netlink.find_link(ipr, bridge)
            result.interfaces[0].mac = pinned or (now.mac if now is not None else bridge.mac)
        if conf.dns is not None and not conf.dns.is_empty():
            result.dns = conf.dns  # Go's dnsConfSet: the config's dns wins over IPAM's
        return result

    def delete(self, args: CmdArgs, conf: BridgeConf) -> None:
        """IPAM DEL (always), the container interface (when the netns and it
        exist), then this attachment's nftables entries in this network's
        sets, found by its tag. Go deletes the interface before IPAM DEL; the
        other way round, a DHCP lease's RELEASE still has the pod's interface
        to go out on. Never deletes the bridge. Repeatable.

        Raises:
            CNIError: IPAM's error (the interface then stays, for the
                runtime's retry); 999 when nftables refuses.
        """
        if conf.layer3:
            assert conf.ipam is not None
            delegate_del(conf.ipam.type, args.stdin_data, args)
        if args.netns:
            netns = open_netns(args.netns, missing_ok=True)
            if netns is not None:
                with netns, Rtnl() as ipr, netns.rtnl() as cipr:
                    delete_veth(ipr, cipr, args.ifname)
        if conf.ip_masq or conf.macspoofchk:
            _remove_entries(conf, Nft(), attachment_tag(args.container_id, args.ifname),
                            "bridge DEL")
        _go_remove(conf.name, args.container_id, args.ifname, "bridge DEL of the Go plugin's rules")

    def check(self, args: CmdArgs, conf: BridgeConf) -> None:
        """IPAM CHECK, then, as Go's cmdCheck: the bridge with prevResult's
        MAC and the configured promiscuity, the container veth with
        prevResult's MAC, IPs and routes, the host veth its peer on the
        bridge; then this attachment's nftables entries.

        Raises:
            CNIError: 7 without prevResult; 999 naming the first mismatch
                (nftables: every missing entry).
        """
        if conf.layer3:
            assert conf.ipam is not None
            delegate_check(conf.ipam.type, args.stdin_data, args)
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "Required prevResult missing")
        br_if = next((i for i in prev.interfaces if i.name == conf.bridge), None)
        cont_if = next((i for i in prev.interfaces
                        if i.name == args.ifname and i.sandbox == args.netns), None)
        if cont_if is None:
            raise CNIError(ERR_INTERNAL, "Sandbox in prevResult doesn't match configured "
                                         f"netns: {args.netns}")
        with NetNS.open(args.netns) as netns, Rtnl() as ipr:
            bridge = netlink.find_link(ipr, conf.bridge)
            if bridge is None or bridge.kind != "bridge":
                raise CNIError(ERR_INTERNAL,
                               f"CNI created bridge {conf.bridge} in host namespace was not found")
            if br_if is not None and br_if.mac and br_if.mac != bridge.mac:
                raise CNIError(ERR_INTERNAL,
                               f"Bridge interface {conf.bridge} Mac doesn't match: {br_if.mac}")
            promisc = bool(bridge.flags & netlink.IFF_PROMISC)
            if promisc != conf.promisc_mode:
                raise CNIError(ERR_INTERNAL, f"Bridge interface {conf.bridge} configured Promisc "
                                             f"Mode {conf.promisc_mode} doesn't match current "
                                             f"state: {promisc}")
            with netns.rtnl() as cipr:
                cont = netlink.find_link(cipr, args.ifname)
                if cont is None:
                    raise CNIError(ERR_INTERNAL,
                                   f"CNI created interface in container {args.ifname} not found")
                if cont.kind != "veth":
                    raise CNIError(ERR_INTERNAL,
                                   f"Error: Container interface {args.ifname} not of type veth")
                if cont_if.mac and cont_if.mac != cont.mac:
                    raise CNIError(ERR_INTERNAL, f"Interface {args.ifname} Mac {cont_if.mac} "
                                                 f"doesn't match container Mac: {cont.mac}")
                # an index naming no interface (a bad prevResult) is not ours
                n = len(prev.interfaces)
                check_interface_ips(cipr, cont, [
                    ipc for ipc in prev.ips if ipc.interface is None
                    or (0 <= ipc.interface < n
                        and prev.interfaces[ipc.interface].name == args.ifname)])
                check_routes(cipr, prev.routes)
            host = None
            for intf in prev.interfaces:
                if intf.name in (conf.bridge, args.ifname) or intf.sandbox:
                    continue
                link = netlink.find_link(ipr, intf.name)
                if (link is not None and link.kind == "veth"
                        and link.index == cont.peer_index and link.peer_index == cont.index
                        and link.master == bridge.index):
                    if intf.mac and intf.mac != link.mac:
                        raise CNIError(ERR_INTERNAL,
                                       f"Interface {intf.name} Mac doesn't match: {intf.mac}")
                    host = link
                    break
            if host is None:
                raise CNIError(ERR_INTERNAL,
                               f"CNI veth created for bridge {conf.bridge} was not found")
        problems: list[str] = []
        tag = attachment_tag(args.container_id, args.ifname)
        # Go's layout, ours or Go's pod alike: named rule by rule
        go_layout = conf.ip_masq and conf.layer3 and conf.ip_masq_backend == "iptables"
        masq_problems = gomasq.missing_iptables(conf.name, args.container_id,
                                                [ipc.address for ipc in prev.ips]) \
            if go_layout else []
        if conf.ip_masq and conf.layer3 and not go_layout:
            problems += masquerade(conf.name).missing([ipc.address for ipc in prev.ips], tag)
        if conf.macspoofchk:
            problems += SpoofCheck(conf.name).missing(host.name, cont.mac, tag)
        if problems:
            go = _go_missing(conf, args, {ipc.address.version for ipc in prev.ips},
                             masq=not go_layout)
            if go is not None:  # a pod Go's bridge created: its rules, not ours
                problems = go
        problems = masq_problems + problems
        if problems:
            raise CNIError(ERR_INTERNAL, "; ".join(problems))

    def gc(self, args: CmdArgs, conf: BridgeConf) -> None:
        """IPAM GC, then this network's nftables entries of attachments not
        in `NetConf.gc_keep` (one transaction, none when clean; other
        networks' sets are never looked at). Best effort (spec): the
        nftables part runs even when IPAM GC failed, whose error is answered
        after it. Go's bridge has no GC of its own.

        Raises:
            CNIError: code 7 without a list of valid attachments (nothing is
                removed); IPAM's error; 999 when nftables refuses.
        """
        keep = conf.gc_keep_tags()
        ipam_error: CNIError | None = None
        if conf.layer3:
            assert conf.ipam is not None
            try:
                delegate_gc(conf.ipam.type, args.stdin_data, args)
            except CNIError as exc:
                ipam_error = exc
        gomasq.gc(conf.name, {(a.container_id, a.ifname) for a in conf.gc_keep()})
        if conf.ip_masq or conf.macspoofchk:
            nft = Nft()
            for attempt in range(3):
                with Rtnl() as ipr:
                    cmds = _entries(conf, nft, keep=keep,
                                    port_gone=lambda p: netlink.find_link(ipr, p) is None)
                try:
                    nft.run(cmds, what="bridge GC")
                    break
                except NftError as e:
                    # An element went meanwhile (a DEL of an old shared-set one): list again.
                    if e.errno != errno.ENOENT or attempt == 2:
                        raise
        if ipam_error is not None:
            raise ipam_error

    def status(self, args: CmdArgs, conf: BridgeConf) -> None:
        """IPAM STATUS, then nftables usable when the config needs it.

        Raises:
            CNIError: IPAM's error; 50 when ipMasq or macspoofchk is set and
                nftables can not be used.
        """
        if conf.layer3:
            assert conf.ipam is not None
            delegate_status(conf.ipam.type, args.stdin_data, args)
        if conf.macspoofchk or (conf.ip_masq and conf.ip_masq_backend != "iptables"):
            nft_status()
        if conf.ip_masq and conf.ip_masq_backend == "iptables":
            gomasq.status()
