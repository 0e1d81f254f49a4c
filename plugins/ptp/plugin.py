"""CNI plugin ``ptp``: a veth pair between node and pod, routed (no bridge).

Go's ptp (containernetworking/plugins 1.1.1 to 1.9.1) on cni-skel's public API; this
one file is cni-skel's reference ``ptp`` and the plugin its tutorial writes.
The pod end gets the IPAM addresses and reaches everything, its own subnet
included, through the gateway, which lives as a /32 (/128) on the host end;
the host routes each pod address to its veth. Config: ``ipam`` (required),
``mtu`` (bytes, 0: the kernel's), ``ipMasq`` and ``ipMasqBackend``
(`cni_skel.config.IPMasqBackend`), ``dns`` (wins over IPAM's).
"""

from __future__ import annotations

import ipaddress

from cni_skel import CmdArgs, CNIError, IPAMConf, NetConf, Plugin, Result, gomasq, netlink
from cni_skel.config import IPMasqBackend
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.gorules import GoHandOver
from cni_skel.invoke import delegate_check, delegate_del, ipam_add
from cni_skel.ipam import check_interface_ips, check_routes, configure_iface
from cni_skel.masq import check_ip_masq, gc_ip_masq, setup_ip_masq, teardown_ip_masq
from cni_skel.netns import NetNS, open_netns
from cni_skel.nft import nft_status
from cni_skel.rollback import rollback
from cni_skel.rtnl import Rtnl
from cni_skel.sysctl import enable_forward
from cni_skel.tags import attachment_tag
from cni_skel.types import Interface
from cni_skel.veth import delete_veth, setup_veth
from pydantic import Field

__all__ = ["Ptp", "PtpConf"]


class PtpConf(NetConf):
    """NetConf (cniVersion, name, dns, ...) with ``ipam`` required, plus
    ``mtu`` (bytes, 0-65535), ``ipMasq`` and ``ipMasqBackend``; a bad value
    is code 7 naming it."""

    ipam: IPAMConf
    mtu: int = Field(0, ge=0, le=65535)
    ip_masq: bool = Field(False, alias="ipMasq")
    ip_masq_backend: IPMasqBackend = Field(None, alias="ipMasqBackend")

    @property
    def go_masq(self) -> bool:
        """Masquerade in Go's iptables layout (`cni_skel.gomasq`)."""
        return self.ip_masq and self.ip_masq_backend == "iptables"


def _host_net(ip) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(ip)  # an address alone: /32 or /128


def _route_pod(cipr, cont: netlink.Link, ipc) -> None:
    """Go's trick: veth has no point-to-point mode, so the subnet's route
    goes via the gateway and only the gateway is on-link."""
    netlink.del_route(cipr, ipc.address.network, dev=cont)
    netlink.add_route(cipr, _host_net(ipc.gateway), dev=cont, scope="link", src=ipc.address.ip)
    netlink.add_route(cipr, ipc.address.network, gw=ipc.gateway, dev=cont, src=ipc.address.ip)


def _route_node(ipr, host: netlink.Link, ipc) -> None:
    """The gateway as a /32 (/128) on the host end, and a host-scoped route
    to the pod's address through it."""
    netlink.add_address(ipr, host, ipaddress.ip_interface(_host_net(ipc.gateway)))
    netlink.add_route(ipr, _host_net(ipc.address.ip), dev=host, scope="host")


class Ptp(Plugin):
    """ptp: ADD, DEL, CHECK as Go's ptp; GC and STATUS pass to IPAM, then
    look at masquerade (cni_skel.masq) when ``ipMasq`` is set."""

    name = "ptp"
    config_model = PtpConf

    def add(self, args: CmdArgs, conf: PtpConf) -> Result:
        """IPAM ADD, forwarding on, the veth pair, pod addresses and routes,
        host address and routes, masquerade. Any failure undoes it all.

        Returns:
            IPAM's result with ``interfaces`` [host end, pod end] (Go's
            order), every IP on interface 1, and the config's ``dns``
            when it sets any.

        Raises:
            CNIError: 999 when IPAM gives no IP or an IP without a gateway,
                or a step fails; IPAM's error.
        """
        tag = attachment_tag(args.container_id, args.ifname)
        with NetNS.open(args.netns) as pod, Rtnl() as ipr, pod.rtnl() as cipr, \
                rollback(self.name) as undo:
            result = ipam_add(undo, conf.ipam.type, args.stdin_data, args)
            if not result.ips:
                raise CNIError(ERR_INTERNAL, "IPAM plugin returned missing IP config")
            if any(ipc.gateway is None for ipc in result.ips):
                raise CNIError(ERR_INTERNAL, "ptp routes through the gateway: IPAM gave none")
            enable_forward(result.ips)
            host, cont = setup_veth(ipr, pod, args.ifname, mtu=conf.mtu or None, peer_ipr=cipr)
            undo.callback(f"deleting {host.name}", netlink.delete_link, ipr, host)
            result.interfaces = [Interface(name=host.name, mac=host.mac),
                                 Interface(name=args.ifname, mac=cont.mac, sandbox=args.netns)]
            for ipc in result.ips:
                ipc.interface = 1
            configure_iface(pod, cont, result, ipr=cipr)
            for ipc in result.ips:
                _route_pod(cipr, cont, ipc)
                _route_node(ipr, host, ipc)
            addrs = [ipc.address for ipc in result.ips]
            if conf.go_masq:
                undo.callback("removing masquerade", gomasq.teardown, conf.name,
                              args.container_id, args.ifname)
                gomasq.setup_iptables(conf.name, args.container_id, addrs)
            elif conf.ip_masq:
                setup_ip_masq(conf.name, tag, addrs)
                undo.callback("removing masquerade", teardown_ip_masq, conf.name, tag)
        if conf.dns is not None and not conf.dns.is_empty():
            result.dns = conf.dns
        return result

    def delete(self, args: CmdArgs, conf: PtpConf) -> None:
        """IPAM DEL, the pod's veth (by its host end: `delete_veth`), masquerade
        by the attachment's tag, ours and either of Go's layouts
        (`cni_skel.gomasq.teardown`: Go's DEL removes both). Repeatable; a
        gone netns is fine."""
        delegate_del(conf.ipam.type, args.stdin_data, args)
        if pod := open_netns(args.netns, missing_ok=True):
            with pod, Rtnl() as ipr, pod.rtnl() as cipr:
                delete_veth(ipr, cipr, args.ifname)
        if conf.ip_masq:
            teardown_ip_masq(conf.name, attachment_tag(args.container_id, args.ifname))
            gomasq.teardown(conf.name, args.container_id, args.ifname)

    def check(self, args: CmdArgs, conf: PtpConf) -> None:
        """IPAM CHECK, then prevResult's veth, MAC, IPs and routes in the pod,
        and the masquerade entries.

        Raises:
            CNIError: 7 without prevResult; 999 naming what differs.
        """
        with NetNS.open(args.netns) as pod, pod.rtnl() as cipr:
            delegate_check(conf.ipam.type, args.stdin_data, args)
            prev = conf.prev_result
            if prev is None:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG, "ptp: Required prevResult missing")
            named = [i for i in prev.interfaces if i.name == args.ifname]
            want = next((i for i in named if i.sandbox == args.netns), None)
            if want is None:
                had = named[0].sandbox if named else ""
                raise CNIError(ERR_INTERNAL, f"Sandbox in prevResult {had} doesn't match "
                                             f"configured netns: {args.netns}")
            link = netlink.find_link(cipr, args.ifname)
            if link is None:
                raise CNIError(ERR_INTERNAL, f"ptp: Container Interface name in prevResult: "
                                             f"{args.ifname} not found")
            if link.kind != "veth":
                raise CNIError(ERR_INTERNAL, f"Error: Container interface {args.ifname} "
                                             f"not of type veth/p2p")
            if want.mac and want.mac != link.mac:
                raise CNIError(ERR_INTERNAL, f"ptp: Interface {args.ifname} Mac {want.mac} "
                                             f"doesn't match container Mac: {link.mac}")
            check_interface_ips(cipr, link, prev.ips)
            check_routes(cipr, prev.routes)
        addrs = [ipc.address for ipc in prev.ips]
        if conf.go_masq:
            problems = gomasq.missing_iptables(conf.name, args.container_id, addrs)
            if problems:
                raise CNIError(ERR_INTERNAL, "; ".join(problems))
        elif conf.ip_masq and not gomasq.nft_rules(conf.name, args.container_id, args.ifname):
            # (a pod Go >= 1.5 masqueraded with nftables passes as Go's CHECK)
            check_ip_masq(conf.name, attachment_tag(args.container_id, args.ifname), addrs)

    def gc(self, args: CmdArgs, conf: PtpConf) -> None:
        """IPAM GC, then masquerade of attachments not in the valid list:
        ours and Go's (`cni_skel.gomasq.gc`)."""
        super().gc(args, conf)
        if conf.ip_masq:
            gc_ip_masq(conf.name, conf.gc_keep_tags())
            gomasq.gc(conf.name, {(a.container_id, a.ifname) for a in conf.gc_keep()})

    def status(self, args: CmdArgs, conf: PtpConf) -> None:
        """IPAM STATUS; 50 when ``ipMasq`` needs nftables (iptables with
        ``ipMasqBackend: "iptables"``) and it is unusable."""
        super().status(args, conf)
        if conf.go_masq:
            gomasq.status()
        elif conf.ip_masq:
            nft_status()

    @classmethod
    def hand_over_to_go(cls, conf: PtpConf, handover: GoHandOver, *,
                        dry_run: bool = False) -> list[str]:
        """``cni-skel migrate --to-go`` of a pod that stays: with ``ipMasq``,
        Go's masquerade rules for its cached addresses (Go's DEL fails
        without them), then ours of the attachment go."""
        prev = conf.prev_result
        if not conf.ip_masq or prev is None or not prev.ips:
            return []
        lines = gomasq.hand_over(conf.name, handover.container_id,
                                 [ipc.address for ipc in prev.ips], dry_run=dry_run)
        if not dry_run:
            teardown_ip_masq(conf.name, attachment_tag(handover.container_id, handover.ifname))
        return [*lines, f"{'would remove' if dry_run else 'removed'} our masquerade entries"]


if __name__ == "__main__":
    Ptp.main()
