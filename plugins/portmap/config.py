"""portmap's configuration: the keys of Go's ``plugins/meta/portmap``
(``PortMapConf``) with the nftables backend only.

Keys (matched case-insensitively like every CNI key; containerd sends
``HostPort``/``ContainerPort``/``Protocol``/``HostIP``)::

    runtimeConfig.portMappings  [{hostPort, containerPort, protocol?, hostIP?}]
                                capability "portMappings"; ports 1-65535,
                                protocol tcp (default) | udp | sctp,
                                hostIP "" (every local address) or an address
    snat           bool, default true: masquerade hairpin and localhost traffic
    masqAll        bool, default false: masquerade mapped traffic from any source
    backend        absent or "nftables"
    conditionsV4   [nft match expression, ...]  extra matches for IPv4 DNAT
    conditionsV6   [nft match expression, ...]  extra matches for IPv6 DNAT

Code 2 (naming the key): ``backend`` other than "nftables", the iptables-only
keys ``markMasqBit`` and ``externalSetMarkChain``, and conditions written in
iptables syntax (first character ``-`` or ``!``, Go's own test). Code 7: a bad
port, protocol or hostIP (naming ``runtimeConfig.portMappings.N.<key>``), a
condition that is not a string.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, field_validator

from cni_skel.config import NetConf, unsupported
from cni_skel.model import CNIModel

__all__ = ["PROTOCOLS", "PortMapConf", "PortMapRuntimeConfig", "PortMapping"]

#: Protocols a mapping may name, with their IP protocol numbers.
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


def _null_to_list(value: Any) -> Any:
    return [] if value is None else value


def _port(value: int) -> int:
    if not 0 < value <= 65535:
        raise ValueError(f"port {value} is out of range 1-65535")
    return value


class PortMapping(CNIModel):
    """One ``runtimeConfig.portMappings`` entry (CONVENTIONS.md).

    ``protocol`` is folded to lower case, "" meaning "tcp". ``host_ip`` is
    None for "" (every local address); an IPv4-mapped IPv6 address counts as
    IPv4, as Go's ``net.ParseIP(..).To4()`` does.
    """

    host_port: StrictInt = Field(alias="hostPort")
    container_port: StrictInt = Field(alias="containerPort")
    protocol: str = "tcp"
    host_ip: IPAddr | None = Field(None, alias="hostIP")

    _check_ports = field_validator("host_port", "container_port")(_port)

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol(cls, value: Any) -> Any:
        if value is None or value == "":
            return "tcp"
        if isinstance(value, str) and value.lower() in PROTOCOLS:
            return value.lower()
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")

    @field_validator("host_ip", mode="before")
    @classmethod
    def _host_ip(cls, value: Any) -> Any:
        if value is None or value == "":
            return None
        if not isinstance(value, str) or "%" in value or value.strip() != value:
            raise ValueError("hostIP must be an IP address or empty")
        try:
            ip = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("hostIP must be an IP address or empty") from None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        return ip


class PortMapRuntimeConfig(CNIModel):
    """``runtimeConfig``: only ``portMappings`` is ours (null means none)."""

    port_mappings: Annotated[list[PortMapping], BeforeValidator(_null_to_list)] = Field(
        default_factory=list, alias="portMappings")




class PortMapConf(NetConf):
    """Network config of ``portmap`` (see the module docstring for the keys).

    ``snat`` null means the default (true), as Go's ``*bool``.
    """

    runtime_config: PortMapRuntimeConfig = Field(default_factory=PortMapRuntimeConfig,
                                                 alias="runtimeConfig")
    snat: StrictBool | None = None
    masq_all: StrictBool = Field(False, alias="masqAll")
    backend: str | None = None
    conditions_v4: list[str] | None = Field(None, alias="conditionsV4")
    conditions_v6: list[str] | None = Field(None, alias="conditionsV6")
    mark_masq_bit: Any = Field(None, alias="markMasqBit")
    external_set_mark_chain: Any = Field(None, alias="externalSetMarkChain")

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        if value is not None and value != "nftables":
            raise unsupported("backend", value, "this portmap implements the nftables backend only")
        return value

    @field_validator("mark_masq_bit")
    @classmethod
    def _mark_masq_bit(cls, value: Any) -> Any:
        if value is not None:
            raise unsupported("markMasqBit", value, "iptables backend only; nftables "
                              "masquerades by connection state, not by a mark")
        return value

    @field_validator("external_set_mark_chain")
    @classmethod
    def _external_chain(cls, value: Any) -> Any:
        if value is not None:
            raise unsupported("externalSetMarkChain", value, "iptables backend only")
        return value

    @field_validator("conditions_v4", "conditions_v6")
    @classmethod
    def _conditions(cls, value: list[str] | None, info: Any) -> list[str] | None:
        key = "conditionsV4" if info.field_name == "conditions_v4" else "conditionsV6"
        # Go's detectBackendOfConditions: an iptables condition starts with - or !.
        if value and value[0][:1] in ("-", "!"):
            raise unsupported(key, value, "iptables syntax; give nftables match expressions")
        return value

    @property
    def snat_enabled(self) -> bool:
        return self.snat is not False

    @property
    def port_mappings(self) -> list[PortMapping]:
        return self.runtime_config.port_mappings

    def conditions(self, version: int) -> list[str]:
        """The non-empty condition strings for IP ``version`` 4 or 6."""
        raw = self.conditions_v4 if version == 4 else self.conditions_v6
        return [c for c in raw or () if c.strip()]

