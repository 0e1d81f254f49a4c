# 0.1.0-style fixture: never edit (tests/test_compat_010.py pins its hash)
"""The verbs of `pyptp.plugin.PyPtp`, as module-level functions taking
``(args, conf)``: a veth pair, one end in the pod holding the IPAM plugin's
addresses and routes (through the result's gateway), the other end up on the
node."""

from cni_skel import (
    CNIError,
    Interface,
    NetNS,
    delegate_check,
    delegate_del,
    delegate_gc,
    delegate_status,
    ipam_add_guard,
    netlink,
)
from cni_skel.netns import current_netns, open_netns


def host_ifname(args):
    return "vp" + args.container_id[:12]


def add(args, conf):
    host_if = host_ifname(args)
    # IPAM ADD; if anything below raises, the guard runs IPAM DEL before the error goes out.
    with ipam_add_guard(conf.ipam.type, args.stdin_data, args) as result, \
            NetNS.open(args.netns) as pod, current_netns() as node, node.iproute() as ipr:
        host, peer = netlink.create_veth_pair(ipr, host_if, args.ifname, pod, mtu=conf.mtu)
        netlink.link_up(ipr, host_if)
        with pod.iproute() as pod_ipr:
            for ip in result.ips:
                netlink.add_address(pod_ipr, args.ifname, ip.address)
                ip.interface = 1
            netlink.link_up(pod_ipr, args.ifname)
            for route in result.routes:
                gw = route.gw or next((ip.gateway for ip in result.ips
                                       if ip.address.version == route.dst.version), None)
                netlink.add_route(pod_ipr, str(route.dst), gw=gw, dev=args.ifname)
    result.interfaces = [Interface(name=host_if, mac=host["mac"]),
                         Interface(name=args.ifname, mac=peer["mac"], sandbox=args.netns)]
    return result                                     # printed in the config's cniVersion


def check(args, conf):
    if conf.prev_result is None:
        raise CNIError(7, "pyptp: CHECK needs a prevResult")
    delegate_check(conf.ipam.type, args.stdin_data, args)
    with NetNS.open(args.netns) as pod, pod.iproute() as ipr:
        link = netlink.find_link(ipr, args.ifname)
        if link is None:
            raise CNIError(100, f'pyptp: no interface "{args.ifname}" in the pod')
        if link["mtu"] != conf.mtu or not link["up"]:
            raise CNIError(100, f'pyptp: "{args.ifname}" has MTU {link["mtu"]}, '
                                f'up {link["up"]}; want MTU {conf.mtu}, up')
        have = {str(a) for a in netlink.addresses(ipr, args.ifname)}
        for ip in conf.prev_result.ips:
            if str(ip.address) not in have:
                raise CNIError(100, f'pyptp: "{args.ifname}" lacks {ip.address}')
    with current_netns() as node, node.iproute() as ipr:
        host = netlink.find_link(ipr, host_ifname(args))
        if host is None or not host["up"]:
            raise CNIError(100, f'pyptp: the node end "{host_ifname(args)}" is not up')


def delete(args, conf):                               # must succeed when things are gone
    if pod := open_netns(args.netns, missing_ok=True):
        with pod, pod.iproute() as ipr:
            netlink.delete_link(ipr, args.ifname)      # takes the node's end with it
    with current_netns() as node, node.iproute() as ipr:
        netlink.delete_link(ipr, host_ifname(args))    # a pod gone first left it (or not)
    delegate_del(conf.ipam.type, args.stdin_data, args)


def gc(args, conf):
    delegate_gc(conf.ipam.type, args.stdin_data, args)


def status(args, conf):
    delegate_status(conf.ipam.type, args.stdin_data, args)
