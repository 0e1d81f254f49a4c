"""The ``dummy`` plugin: a dummy link in the pod holding the IPAM plugin's
addresses (no master, no traffic leaves through it).

Go's plugins/main/dummy appeared after 1.1.1 (Debian's release has none):
this follows v1.9.1, its newest. The flow is the shared one of
`cni_skel_plugins.podlink`; the link is created inside the pod, as Go does.
Needs a kernel with CONFIG_DUMMY (else ADD is 999 "operation not
supported").
"""

from __future__ import annotations

from typing import Any

from cni_skel import netlink
from cni_skel.config import NetConf
from cni_skel.env import CmdArgs

from ..podlink import PodLinkPlugin

__all__ = ["Dummy"]


class Dummy(PodLinkPlugin):
    """dummy: ADD, DEL, CHECK as Go's v1.9.1 (`cni_skel_plugins.podlink`);
    GC and STATUS pass to IPAM. Config: the plain `NetConf` with ``ipam``
    required (code 7, Go's text; Go: 999). The result's ``dns`` is IPAM's,
    as Go's (the config's ``dns`` is not copied)."""

    name = "dummy"
    config_model = NetConf
    kind = "dummy"
    ip_source_required = "dummy interface requires an IPAM configuration"
    dns_from_config = False

    def link_in_pod(self, conf: Any) -> bool:
        """Always: a dummy has no master, it is made in the pod."""
        return True

    def create_link(self, ipr: Any, name: str, args: CmdArgs, conf: NetConf,
                    master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """`cni_skel.netlink.create_dummy` through the pod's socket."""
        return netlink.create_dummy(ipr, name, **target)
