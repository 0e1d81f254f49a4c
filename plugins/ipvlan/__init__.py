"""The ``ipvlan`` plugin: an ipvlan link on a node interface (the master),
put in the pod; it shares the master's MAC. Addresses from the IPAM plugin,
or, chained without IPAM, from prevResult.

A drop-in for Go's plugins/main/ipvlan (containernetworking/plugins 1.1.1;
``linkInContainer`` from later versions). The flow is the shared one of
`cni_skel_plugins.podlink`. Needs a kernel with CONFIG_IPVLAN (else ADD is
999 "operation not supported", as Go's).
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from cni_skel import netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.rollback import Rollback
from cni_skel.types import Result

from ..podlink import MasterLinkConf, MasterLinkPlugin, ipam_type, link_mode

__all__ = ["IPVlan", "IPVlanConf"]

MODES = ("l2", "l3", "l3s")


class IPVlanConf(MasterLinkConf):
    """Network config of ``ipvlan``.

    Keys (Go's): ``master`` (default: chained, the single interface of
    prevResult; else the node's default-route interface), ``mode`` (``l2``
    default, ``l3``, ``l3s``), ``mtu`` (<= the master's), ``linkInContainer``,
    ``ipam``, ``dns``. An unknown mode is code 7 naming it (Go's text).
    """

    mode: str = "l2"

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return link_mode("ipvlan", value, MODES)


def _chained_ips(conf: IPVlanConf) -> bool:
    # Go: without an IPAM type, a prevResult with IPs gives the addresses.
    return not ipam_type(conf) and conf.prev_result is not None and bool(conf.prev_result.ips)


class IPVlan(MasterLinkPlugin):
    """ipvlan: ADD, DEL, CHECK as Go's (`cni_skel_plugins.podlink`); GC and
    STATUS pass to IPAM. Addresses come from IPAM or, chained with no
    ``ipam.type``, from prevResult (Go 1.1.1: its IPs and routes, on the
    ipvlan link; no IPAM is called). ``arp_notify``/``ndisc_notify`` are set
    before the link goes up with its addresses: the kernel announces each."""

    name = "ipvlan"
    config_model = IPVlanConf
    kind = "ipvlan"
    mode_label = "IPVlan"
    announce = True
    ip_source_required = "ipvlan interface requires an IPAM configuration or a prevResult with IPs"

    def master_name(self, args: CmdArgs, conf: IPVlanConf, ipr: Any, *,
                    checking: bool) -> str | None:
        """``master``; else, at ADD, prevResult's single named interface when
        chained (Go 1.1.1), or the default-route interface. At CHECK
        without ``master`` there is nothing to compare (prevResult is then
        ipvlan's own result): None.

        Raises:
            CNIError: 7 ``chained master failure. PrevResult lacks a single
                named interface`` (Go's text; Go: 999); as
                `MasterLinkPlugin.master_name`.
        """
        if conf.master or checking:
            return conf.master
        prev = conf.prev_result
        if prev is None:
            return super().master_name(args, conf, ipr, checking=checking)
        if len(prev.interfaces) == 1 and prev.interfaces[0].name:
            return prev.interfaces[0].name
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       "chained master failure. PrevResult lacks a single named interface",
                       "master")

    def ip_source(self, conf: IPVlanConf) -> bool:
        """An ``ipam.type``, or a chained prevResult with IPs."""
        return bool(ipam_type(conf)) or _chained_ips(conf)

    def addresses(self, undo: Rollback, args: CmdArgs, conf: IPVlanConf) -> Result:
        """prevResult's IPs, routes and DNS when chained without IPAM, else
        IPAM's (`PodLinkPlugin.addresses`)."""
        if _chained_ips(conf):
            assert conf.prev_result is not None
            prev = conf.prev_result.model_copy(deep=True)
            return Result(ips=prev.ips, routes=prev.routes, dns=prev.dns)
        return super().addresses(undo, args, conf)

    def create_link(self, ipr: Any, name: str, args: CmdArgs, conf: IPVlanConf,
                    master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """`cni_skel.netlink.create_ipvlan` on ``master``, mode, MTU."""
        assert master is not None
        return netlink.create_ipvlan(ipr, name, master, mode=conf.mode,
                                     mtu=conf.mtu or None, **target)
