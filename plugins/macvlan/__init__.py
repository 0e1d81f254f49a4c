"""The ``macvlan`` plugin: a macvlan link on a node interface (the master),
put in the pod, with its own MAC, addresses from the IPAM plugin (optional).

A drop-in for Go's plugins/main/macvlan (containernetworking/plugins 1.1.1;
``linkInContainer`` from later versions): same keys, defaults, result and
error texts. The flow is the shared one of `cni_skel_plugins.podlink`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from cni_skel import netlink
from cni_skel.args import K8sArgs, MacAddress
from cni_skel.env import CmdArgs
from cni_skel.model import CNIModel, validate_nested

from ..bridge.config import BridgeArgs, BridgeConfArgs, BridgeRuntimeConfig
from ..podlink import MasterLinkConf, MasterLinkPlugin, link_mode

__all__ = ["CNIModel", "K8sArgs", "Macvlan", "MacvlanArgs", "MacvlanConf"]

#: Go 1.1.1's modes, plus ``source`` (the kernel has it; Go refuses it).
MODES = ("bridge", "private", "vepa", "passthru", "source")


# runtimeConfig / args.cni: a ``mac``, and CNI_ARGS ``MAC``, as bridge reads them
_MacOnly = BridgeRuntimeConfig
_ConfArgs = BridgeConfArgs


class MacvlanArgs(BridgeArgs):
    """CNI_ARGS of macvlan: ``MAC`` for the pod's link (a bad one is code 4)."""


class MacvlanConf(MasterLinkConf):
    """Network config of ``macvlan``.

    Keys (Go's): ``master`` (default: the node's default-route interface),
    ``mode`` (``bridge`` default, ``private``, ``vepa``, ``passthru``,
    ``source``), ``mtu`` (<= the master's), ``mac``, ``linkInContainer``,
    ``ipam`` (optional: without a type the link is L2 only), ``dns``;
    ``runtimeConfig.mac`` (capability ``mac``) and ``args.cni.mac``.
    ``bcqueuelen`` (packets, 0..2**32-1, Go >= 1.6's key: the master's
    broadcast queue; 0 leaves the kernel's default).

    The pod link's MAC (`mac_for`), in Go's precedence: the ``mac`` key <
    CNI_ARGS ``MAC`` < ``args.cni.mac`` (ours, as bridge) <
    ``runtimeConfig.mac``.

    Errors: code 7 naming the key (an unknown mode with Go's text, an
    invalid MAC, a negative MTU).
    """

    mode: str = "bridge"
    mac: MacAddress | None = None
    bcqueuelen: int = Field(0, ge=0, le=2**32 - 1)  # Go's uint32

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return link_mode("macvlan", value, MODES)

    @field_validator("runtime_config", "args")
    @classmethod
    def _mac_keys(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Checked here so that an error names runtimeConfig.mac / args.cni.mac.
        validate_nested(_MacOnly if info.field_name == "runtime_config" else _ConfArgs, value)
        return value

    def mac_for(self, args: CmdArgs) -> str | None:
        """The pod link's MAC in Go's precedence (class docstring); None:
        the kernel's random one."""
        runtime = _MacOnly.model_validate(self.runtime_config or {}).mac
        in_args = _ConfArgs.model_validate(self.args or {}).cni.mac
        env_mac = getattr(args.typed_args, "mac", None)
        return runtime or in_args or env_mac or self.mac


class Macvlan(MasterLinkPlugin):
    """macvlan: ADD, DEL, CHECK as Go's (`cni_skel_plugins.podlink`); GC and
    STATUS pass to IPAM. After IPAM, ``arp_notify``/``ndisc_notify`` are set
    before the link goes up with its addresses, so the kernel announces
    each (gratuitous ARP; unsolicited NA once DAD is done)."""

    name = "macvlan"
    config_model = MacvlanConf
    args_model = MacvlanArgs
    kind = "macvlan"
    mode_label = "macvlan"
    announce = True

    def create_link(self, ipr: Any, name: str, args: CmdArgs, conf: MacvlanConf,
                    master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """`cni_skel.netlink.create_macvlan` on ``master``, mode, MTU, MAC,
        broadcast queue length."""
        assert master is not None
        return netlink.create_macvlan(ipr, name, master, mode=conf.mode,
                                      mtu=conf.mtu or None, mac=conf.mac_for(args),
                                      bcqueuelen=conf.bcqueuelen or None, **target)
