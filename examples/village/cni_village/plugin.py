"""CNI plugin ``village``: each pod on the cluster network and on the LAN.

Two interfaces per pod:

* ``eth0`` (CNI_IFNAME): a veth whose node end is a port of a Linux bridge
  (``bridge``, default ``village0``) holding the cluster gateway; the pod's
  default route. Other nodes reach it through the node's routes.
* ``net1``: a bridge-mode macvlan on the node's uplink (``uplink``, default:
  the interface of the node's IPv4 default route) with an address of the
  LAN's own subnet, so LAN hosts reach the pod directly.

Addresses come from the IPAM plugin in ``ipam`` (village-ipam): two IPs, the
first eth0's (with the gateway), the second net1's.
"""

from __future__ import annotations

from cni_skel import CmdArgs, CNIError, Interface, IPAMConf, NetConf, Plugin, Result, netlink
from cni_skel.announce import notify_sysctls
from cni_skel.config import IfName
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.invoke import delegate_check, delegate_del, ipam_add
from cni_skel.ipam import check_interface_ips, check_routes, configure_iface
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.rtnl import Rtnl
from cni_skel.sysctl import enable_forward
from cni_skel.veth import setup_veth

__all__ = ["LAN_IFNAME", "Village", "VillageConf"]

LAN_IFNAME = "net1"


class VillageConf(NetConf):
    """NetConf with ``ipam`` required, ``bridge`` and ``uplink`` (interface
    names; a bad one is code 7 naming the key)."""

    ipam: IPAMConf
    bridge: IfName = "village0"
    uplink: IfName | None = None


class Village(Plugin):
    """village: ADD, DEL, CHECK; GC and STATUS pass to IPAM (Plugin's default)."""

    name = "village"
    config_model = VillageConf

    def add(self, args: CmdArgs, conf: VillageConf) -> Result:
        """IPAM ADD, the bridge and eth0, net1, their addresses and routes.
        Any failure undoes it all (the bridge stays, as Go's bridge leaves it).

        Raises:
            CNIError: 7 without an uplink; 999 when IPAM gives other than two
                IPs, or a step fails; IPAM's error.
        """
        with NetNS.open(args.netns) as pod, Rtnl() as ipr, pod.rtnl() as cipr, \
                rollback(self.name) as undo:
            uplink = conf.uplink or netlink.default_route_interface(ipr)
            if uplink is None:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG, "uplink: not set, and the node "
                                                           "has no default route to take it from")
            result = ipam_add(undo, conf.ipam.type, args.stdin_data, args)
            if len(result.ips) != 2 or result.ips[0].gateway is None:
                raise CNIError(ERR_INTERNAL, "village needs two IPs from IPAM, the first "
                                             "with a gateway")
            cluster, lan = result.ips
            enable_forward([cluster])  # the node routes the cluster network

            # eth0: the node end of a veth on the bridge, which holds the gateway
            bridge = netlink.ensure_bridge(ipr, conf.bridge)
            gateway = f"{cluster.gateway}/{cluster.address.network.prefixlen}"
            netlink.add_address(ipr, bridge, gateway)  # kept when there already
            # pinned: a bridge's MAC otherwise follows its lowest port's
            netlink.link_set(ipr, bridge, mac=bridge.mac, up=True)
            host, eth0 = setup_veth(ipr, pod, args.ifname, master=bridge, peer_ipr=cipr)
            undo.callback(f"deleting {args.ifname}", netlink.delete_link, ipr, host)

            # net1: a macvlan on the uplink, made right inside the pod
            net1 = netlink.create_macvlan(ipr, LAN_IFNAME, uplink, netns=pod, netns_ipr=cipr)
            undo.callback(f"deleting {LAN_IFNAME}", netlink.delete_link, cipr, net1)

            result.interfaces = [Interface(name=bridge.name, mac=bridge.mac),
                                 Interface(name=host.name, mac=host.mac),
                                 Interface(name=eth0.name, mac=eth0.mac, sandbox=args.netns),
                                 Interface(name=net1.name, mac=net1.mac, sandbox=args.netns)]
            cluster.interface, lan.interface = 2, 3
            # configure_iface takes one interface's share of the result
            configure_iface(pod, eth0, Result(interfaces=result.interfaces, ips=[cluster],
                                              routes=result.routes), ipr=cipr)
            # set before net1 goes up with its address: the kernel then tells
            # the LAN (gratuitous ARP), whose neighbours forget old MACs
            pod.run(notify_sysctls, LAN_IFNAME)
            configure_iface(pod, net1, Result(interfaces=result.interfaces, ips=[lan]),
                            ipr=cipr)
        return result

    def delete(self, args: CmdArgs, conf: VillageConf) -> None:
        """eth0 and net1 first (the addresses are still in use until they
        go), then IPAM DEL. Repeatable; a gone netns is fine."""
        if pod := open_netns(args.netns, missing_ok=True):
            with pod, pod.rtnl() as cipr:
                netlink.delete_link(cipr, args.ifname)  # the node's end goes with it
                netlink.delete_link(cipr, LAN_IFNAME)
        delegate_del(conf.ipam.type, args.stdin_data, args)

    def check(self, args: CmdArgs, conf: VillageConf) -> None:
        """IPAM CHECK, then prevResult's eth0 and net1 in the pod: kind, MAC,
        addresses; and its routes.

        Raises:
            CNIError: 7 without prevResult; 999 naming what differs.
        """
        delegate_check(conf.ipam.type, args.stdin_data, args)
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "village: Required prevResult missing")
        kinds = {args.ifname: "veth", LAN_IFNAME: "macvlan"}
        with NetNS.open(args.netns) as pod, pod.rtnl() as cipr:
            for name, kind in kinds.items():
                index, want = next(((i, x) for i, x in enumerate(prev.interfaces)
                                    if x.name == name and x.sandbox == args.netns), (-1, None))
                link = netlink.find_link(cipr, name)
                if want is None or link is None or link.kind != kind or link.mac != want.mac:
                    raise CNIError(ERR_INTERNAL, f"village: {kind} {name} of prevResult not "
                                                 f"found in {args.netns}")
                check_interface_ips(cipr, link, [i for i in prev.ips if i.interface == index])
            check_routes(cipr, prev.routes)


if __name__ == "__main__":
    Village.main()
