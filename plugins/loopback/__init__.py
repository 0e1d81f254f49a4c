"""The ``loopback`` plugin: brings ``lo`` up inside the container's netns.

A drop-in for the Go reference loopback (containernetworking/plugins,
plugins/main/loopback): same answers, same executable name. The module is
light on purpose (the skel and this class only); netlink loads in the verbs.
"""

from __future__ import annotations

import sys

from cni_skel.errors import ERR_INTERNAL, CNIError
from cni_skel.skel import Plugin

TYPE_CHECKING = False  # typing stays out of the VERSION path
if TYPE_CHECKING:
    from typing import Any

    from cni_skel.env import CmdArgs

__all__ = ["Loopback", "main"]

LO = "lo"


class Loopback(Plugin):
    """ADD: ``lo`` up, result with its loopback addresses (or prevResult when
    chained). CHECK: ``lo`` is up. DEL: ``lo`` down; a gone netns is done.

    CNI_IFNAME is ignored, as upstream: this plugin only ever acts on ``lo``.

    A failed ADD leaves ``lo`` as it found it. Errors: 999 when ``lo`` holds
    a non-loopback address; 1 at cniVersion 0.1.0/0.2.0 when the result has
    no IP, which those versions cannot carry (`check_expressible`): an
    IP-less prevResult (checked before ``lo`` is touched), or an ``lo`` the
    kernel gave no address (MTU too small, IPv6 off; ``lo`` is put down
    again). At 0.1.0/0.2.0 Go prints the 1.0.0 shape (or an IP-less 0.1.0
    document) there; we print the spec's ``ip4``/``ip6`` shape, so its
    success with addresses is ours too, and refuse what that shape cannot
    hold.
    """

    name = "loopback"

    def add(self, args: CmdArgs, conf: Any) -> Any:
        from cni_skel import netlink
        from cni_skel.netns import NetNS
        from cni_skel.types import check_expressible

        if conf.prev_result is not None:
            check_expressible(conf.cni_version, conf.prev_result)  # returned as is
        with NetNS.open(args.netns) as ns, ns.iproute() as ipr:
            lo = netlink.find_link(ipr, LO)
            was_up = lo is not None and lo["up"]
            netlink.link_up(ipr, LO)
            try:
                # The kernel puts lo's addresses on as it goes up: only now
                # is the result known.
                return self._result(args, conf, netlink.addresses(ipr, LO))
            except BaseException:
                if not was_up:
                    try:
                        netlink.link_down(ipr, LO)
                    except CNIError as exc:  # keep the original error
                        sys.stderr.write(f"loopback: rolling back lo up: {exc}\n")
                raise

    @staticmethod
    def _result(args: CmdArgs, conf: Any, addrs: list[Any]) -> Any:
        from cni_skel.types import Interface, IPConfig, Result, check_expressible

        for addr in addrs:
            if not addr.ip.is_loopback:
                raise CNIError(ERR_INTERNAL,
                               f'loopback interface found with non-loopback address "{addr}"')
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

    def check(self, args: CmdArgs, conf: Any) -> None:
        from cni_skel import netlink
        from cni_skel.netns import NetNS

        with NetNS.open(args.netns) as ns, ns.iproute() as ipr:
            link = netlink.find_link(ipr, LO)
        if link is None or not link["up"]:
            raise CNIError(ERR_INTERNAL, "loopback interface is down", args.netns)

    def delete(self, args: CmdArgs, conf: Any) -> None:
        from cni_skel import netlink
        from cni_skel.netns import open_netns

        ns = open_netns(args.netns, missing_ok=True)
        if ns is None:
            return
        with ns, ns.iproute() as ipr:
            netlink.link_down(ipr, LO)


def main() -> None:
    """Executable entry point (``cni-skel install`` writes a script calling it)."""
    Loopback.main()


if __name__ == "__main__":
    main()
