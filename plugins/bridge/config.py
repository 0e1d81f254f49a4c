"""The bridge plugin's configuration: keys, defaults and checks as Go's
``plugins/main/bridge`` (``loadNetConf``, ``collectVlanTrunk``, the checks at
the top of ``cmdAdd``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from cni_skel.args import K8sArgs, MacAddress
from cni_skel.config import IfName, IPMasqBackend, NetConf
from cni_skel.model import CNIModel

__all__ = ["BridgeArgs", "BridgeConf", "BridgeConfArgs", "BridgeRuntimeConfig", "VlanTrunk"]

DEFAULT_BRIDGE = "cni0"


class VlanTrunk(CNIModel):
    """One ``vlanTrunk`` entry: ``{"id": N}`` or ``{"minID": A, "maxID": B}``
    (both forms may appear in one entry), VLAN IDs 1-4094."""

    min_id: int | None = Field(None, alias="minID")
    max_id: int | None = Field(None, alias="maxID")
    id: int | None = None


class BridgeRuntimeConfig(CNIModel):
    """``runtimeConfig``: the ``mac`` capability (``args.cni`` has the same shape)."""

    mac: MacAddress | None = None


class BridgeConfArgs(CNIModel):
    """``args`` in the config: ``args.cni.mac`` (CONVENTIONS.md)."""

    cni: BridgeRuntimeConfig = Field(default_factory=BridgeRuntimeConfig)


class BridgeArgs(K8sArgs):
    """CNI_ARGS of the bridge plugin: ``MAC`` for the container interface."""

    mac: MacAddress | None = Field(None, alias="MAC")


def _trunk_vlans(trunks: list[VlanTrunk]) -> list[int]:
    # Go's collectVlanTrunk (messages included): a sorted set of VLAN IDs.
    vlans: set[int] = set()
    for t in trunks:
        if t.min_id is not None and t.max_id is not None:
            if not 0 < t.min_id <= 4094:
                raise ValueError("incorrect trunk minID parameter")
            if not 0 < t.max_id <= 4094:
                raise ValueError("incorrect trunk maxID parameter")
            if t.max_id < t.min_id:
                raise ValueError("minID is greater than maxID in trunk parameter")
            vlans.update(range(t.min_id, t.max_id + 1))
        elif t.max_id is not None:
            raise ValueError("minID and maxID should be configured simultaneously, "
                             "minID is missing")
        elif t.min_id is not None:
            raise ValueError("minID and maxID should be configured simultaneously, "
                             "maxID is missing")
        if t.id is not None:
            if not 0 < t.id <= 4094:
                raise ValueError("incorrect trunk id parameter")
            vlans.add(t.id)
    return sorted(vlans)


class BridgeConf(NetConf):
    """Network config of ``bridge``.

    Keys (Go's names and defaults): ``bridge`` ("cni0"), ``isGateway``,
    ``isDefaultGateway`` (implies isGateway), ``forceAddress``, ``ipMasq``,
    ``ipMasqBackend`` (absent or "nftables": ours, `cni_skel.masq`;
    "iptables": Go's chain per pod, `cni_skel.gomasq`), ``mtu`` (bytes, 0:
    kernel default), ``hairpinMode``,
    ``promiscMode``, ``vlan`` (0-4094, 0: none), ``vlanTrunk``,
    ``preserveDefaultVlan``, ``macspoofchk``, ``enabledad``,
    ``disableContainerInterface``, ``portIsolation``, ``ipam``, ``dns``;
    ``args.cni.mac`` and ``runtimeConfig.mac`` (capability ``mac``).

    Derived: ``vlans`` (the trunk's sorted VLAN IDs), ``mac`` (container MAC:
    CNI_ARGS ``MAC`` < ``args.cni.mac`` < ``runtimeConfig.mac``, applied by
    the plugin), ``layer3`` (an IPAM type is set).

    Errors (code 7 unless said): VLAN out of range (Go's text), trunk errors
    (Go's texts), hairpinMode with promiscMode, disableContainerInterface with
    IPAM, an invalid MAC.
    """

    bridge: IfName = DEFAULT_BRIDGE
    is_gateway: bool = Field(False, alias="isGateway")
    is_default_gateway: bool = Field(False, alias="isDefaultGateway")
    force_address: bool = Field(False, alias="forceAddress")
    ip_masq: bool = Field(False, alias="ipMasq")
    ip_masq_backend: IPMasqBackend = Field(None, alias="ipMasqBackend")
    mtu: int = 0
    hairpin_mode: bool = Field(False, alias="hairpinMode")
    promisc_mode: bool = Field(False, alias="promiscMode")
    vlan: int = 0
    vlan_trunk: list[VlanTrunk] | None = Field(None, alias="vlanTrunk")
    preserve_default_vlan: bool = Field(False, alias="preserveDefaultVlan")
    macspoofchk: bool = False
    enabledad: bool = False
    disable_container_interface: bool = Field(False, alias="disableContainerInterface")
    port_isolation: bool = Field(False, alias="portIsolation")

    vlans: list[int] = Field(default_factory=list, exclude=True)
    mac: str | None = Field(None, exclude=True)

    @field_validator("bridge", mode="before")
    @classmethod
    def _default_bridge(cls, value: Any) -> Any:
        # Go keeps the default when the key is absent; "" is not a name.
        return DEFAULT_BRIDGE if value in (None, "") else value

    @field_validator("mtu")
    @classmethod
    def _mtu(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"invalid MTU {value}")
        return value

    @field_validator("vlan")
    @classmethod
    def _vlan(cls, value: int) -> int:
        if not 0 <= value <= 4094:
            raise ValueError(f"invalid VLAN ID {value} (must be between 0 and 4094)")
        return value

    @model_validator(mode="after")
    def _derive(self) -> BridgeConf:
        if self.vlan_trunk is not None:
            self.vlans = _trunk_vlans(self.vlan_trunk)
        if self.is_default_gateway:
            self.is_gateway = True
        if self.hairpin_mode and self.promisc_mode:
            raise ValueError("cannot set hairpin mode and promiscuous mode at the same time")
        if self.layer3 and self.disable_container_interface:
            raise ValueError("cannot use IPAM when DisableContainerInterface flag is set")
        args = BridgeConfArgs.model_validate(self.args or {})
        runtime = BridgeRuntimeConfig.model_validate(self.runtime_config or {})
        self.mac = runtime.mac or args.cni.mac
        return self

    @property
    def layer3(self) -> bool:
        return bool(self.ipam is not None and self.ipam.type)

    @property
    def vlan_filtering(self) -> bool:
        """Go turns VLAN filtering on when ``vlan`` or ``vlanTrunk`` is set."""
        return self.vlan != 0 or self.vlan_trunk is not None
