"""The ``loopback`` plugin: brings ``lo`` up inside the container's netns.

A drop-in for the Go reference loopback (containernetworking/plugins,
plugins/main/loopback): same answers, same executable name.
"""

from __future__ import annotations

from cni_skel import netlink
from cni_skel.config import NetConf
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, CNIError
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.skel import Plugin
from cni_skel.types import Interface, IPConfig, Result, check_expressible

__all__ = ["Loopback"]

LO = "lo"
#: ``lo``'s ifindex in every network namespace (the kernel's LOOPBACK_IFINDEX).
LO_INDEX = 1


class Loopback(Plugin):
    """loopback: ``lo`` up in CNI_NETNS. CNI_IFNAME is ignored, as upstream:
    this plugin only ever acts on ``lo``. Config: the plain `NetConf`."""

    name = "loopback"
    config_model = NetConf

    def add(self, args: CmdArgs, conf: NetConf) -> Result:
        """Bring ``lo`` up and return a result with its loopback addresses
        (or prevResult unchanged when chained), as Go's cmdAdd.

        A failed ADD leaves ``lo`` as it found it (down again if it was; Go
        leaves it up). Requests: ``lo``'s flags, the change when it is
        down, its addresses.

        Raises:
            CNIError: 999 when ``lo`` holds a non-loopback address (Go's
                text, naming the address); 1 at cniVersion 0.1.0/0.2.0 when
                the result has no IP, which those versions cannot carry
                (`check_expressible`):
                an IP-less prevResult (checked before ``lo`` is touched), or
                an ``lo`` the kernel gave no address (MTU too small, IPv6
                off). At 0.1.0/0.2.0 Go prints the 1.0.0 shape (or an
                IP-less 0.1.0 document); we print the spec's ``ip4``/``ip6``
                shape and refuse what it cannot hold.
        """
        if conf.prev_result is not None:
            check_expressible(conf.cni_version, conf.prev_result)  # returned as is
        with NetNS.open(args.netns) as ns, ns.rtnl() as ipr, rollback(self.name) as undo:
            # lo's flags only: a whole link look-up costs more than the rest
            # of the call (pyroute2 decodes its ~40 attributes).
            flags = netlink.link_flags(ipr, LO_INDEX)
            if flags is None or not flags & netlink.IFF_UP:
                undo.callback("lo down", netlink.link_down, ipr, LO_INDEX)
                netlink.link_up(ipr, LO_INDEX)
            # The kernel puts lo's addresses on as it goes up: only now is
            # the result known.
            addrs = netlink.addresses(ipr, LO_INDEX)
            for addr in addrs:
                if not addr.ip.is_loopback:
                    raise CNIError(ERR_INTERNAL, "loopback interface found with "
                                                 f'non-loopback address "{addr.ip}"')
            if conf.prev_result is not None:
                return conf.prev_result
            ips = []
            for family in (4, 6):
                first = next((a for a in addrs if a.version == family), None)
                if first is not None:
                    ips.append(IPConfig(address=first, interface=0))
            result = Result(
                cni_version=conf.cni_version,
                interfaces=[Interface(name=LO, mac="00:00:00:00:00:00", sandbox=args.netns)],
                ips=ips,
            )
            check_expressible(conf.cni_version, result)
            return result

    def check(self, args: CmdArgs, conf: NetConf) -> None:
        """``lo`` is up in CNI_NETNS (Go's cmdCheck).

        Raises:
            CNIError: 999 when it is down; 3 when CNI_NETNS is gone.
        """
        with NetNS.open(args.netns) as ns, ns.rtnl() as ipr:
            link = netlink.find_link(ipr, LO)
        if link is None or not link.up:
            raise CNIError(ERR_INTERNAL, "loopback interface is down", args.netns)

    def delete(self, args: CmdArgs, conf: NetConf) -> None:
        """``lo`` down (Go's cmdDel); a gone netns is nothing to do."""
        ns = open_netns(args.netns, missing_ok=True)
        if ns is None:
            return
        with ns, ns.rtnl() as ipr:
            netlink.link_down(ipr, LO)
