"""The ``vlan`` plugin: an 802.1Q VLAN link on a node interface (the master),
put in the pod, with addresses from the IPAM plugin.

A drop-in for Go's plugins/main/vlan (containernetworking/plugins 1.1.1;
``linkInContainer`` from later versions). The flow is the shared one of
`cni_skel_plugins.podlink`. Needs a kernel with CONFIG_VLAN_8021Q (else ADD
is 999 "operation not supported", as Go's).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from cni_skel import netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError

from ..podlink import MasterLinkConf, MasterLinkPlugin

__all__ = ["Vlan", "VlanConf"]

_NO_MASTER = ('"master" field is required. It specifies the host interface name to create '
              "the VLAN for.")


class VlanConf(MasterLinkConf):
    """Network config of ``vlan``.

    Keys (Go's): ``master`` (required; no default-route guess), ``vlanId``
    (0..4094, default 0 as Go's), ``mtu`` (<= the master's),
    ``linkInContainer``, ``ipam`` (required), ``dns``. Errors: code 7 with
    Go's texts (no master; a VLAN ID out of range).
    """

    vlan_id: int = Field(0, alias="vlanId")

    @field_validator("vlan_id")
    @classmethod
    def _vlan_id(cls, value: int) -> int:
        if not 0 <= value <= 4094:
            raise ValueError(f"invalid VLAN ID {value} (must be between 0 and 4095 inclusive)")
        return value


class Vlan(MasterLinkPlugin):
    """vlan: ADD, DEL, CHECK as Go's (`cni_skel_plugins.podlink`); GC and
    STATUS pass to IPAM. CHECK also compares the VLAN ID and a configured
    MTU (as Go's)."""

    name = "vlan"
    config_model = VlanConf
    kind = "vlan"
    ip_source_required = "vlan interface requires an IPAM configuration"

    def validate_config(self, args: CmdArgs, conf: VlanConf) -> None:
        """A ``master`` (code 7, Go's text), then `PodLinkPlugin.validate_config`."""
        self.master_name(args, conf, None, checking=False)
        super().validate_config(args, conf)

    def master_name(self, args: CmdArgs, conf: VlanConf, ipr: Any, *,
                    checking: bool) -> str | None:
        """``master``, which is required.

        Raises:
            CNIError: 7 with Go's text when it is missing (Go: 999).
        """
        if not conf.master:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, _NO_MASTER, "master")
        return conf.master

    def create_link(self, ipr: Any, name: str, args: CmdArgs, conf: VlanConf,
                    master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """`cni_skel.netlink.create_vlan` on ``master``, VLAN ID, MTU."""
        assert master is not None
        return netlink.create_vlan(ipr, name, master, conf.vlan_id,
                                   mtu=conf.mtu or None, **target)

    def link_problem(self, link: netlink.Link, conf: VlanConf) -> str | None:
        """The VLAN ID, and the MTU when configured (Go checks both)."""
        if link.vlan_id != conf.vlan_id:
            return (f"Error: Container vlan {link.name} VLAN ID is {link.vlan_id}, "
                    f"configured {conf.vlan_id}")
        if conf.mtu and link.mtu != conf.mtu:
            return (f"Error: configured MTU of {link.name} is {conf.mtu}, current value "
                    f"is {link.mtu}")
        return None
