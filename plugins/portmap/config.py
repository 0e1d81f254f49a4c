"""portmap's configuration: the keys of Go's ``plugins/meta/portmap``
(``PortMapConf``, containernetworking/plugins 1.9.1), both backends.

Keys (matched case-insensitively like every CNI key; containerd sends
``HostPort``/``ContainerPort``/``Protocol``/``HostIP``)::

    runtimeConfig.portMappings  [{hostPort, containerPort, protocol?, hostIP?}]
                                capability "portMappings"; ports 1-65535,
                                protocol tcp (default) | udp | sctp,
                                hostIP "" (every local address) or an address
    snat           bool, default true: masquerade hairpin and localhost traffic
    masqAll        bool, default false: masquerade mapped traffic from any source
    backend        absent, "nftables" (ours, inet cni_portmap) or "iptables"
                   (Go's chains, `.goiptables`); absent with a key only the
                   iptables backend reads (markMasqBit, externalSetMarkChain,
                   iptables conditions) means "iptables"
    conditionsV4   extra matches for IPv4 DNAT: nft match expressions
                   (nftables), iptables arguments (iptables: ["-d", "10.0.0.1"])
    conditionsV6   the same for IPv6
    markMasqBit    0-31, default 13: the mark of traffic to masquerade (iptables)
    externalSetMarkChain  a chain of the operator's that sets the mark instead
                   (iptables; Go's CNI-HOSTPORT-SETMARK/-MASQ are not made)

Conditions are told apart as Go tells them: iptables syntax starts with
``-`` or ``!``. Code 7 (naming the key, with Go's wording): another
``backend``, ``markMasqBit`` with ``externalSetMarkChain`` or out of range,
conditions of the other backend's syntax, a bad port, protocol or hostIP
(naming ``runtimeConfig.portMappings.N.<key>``), a condition that is not a
string.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cni_skel.config import NetConf
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
    backend: Literal["nftables", "iptables"] | None = None
    conditions_v4: list[str] | None = Field(None, alias="conditionsV4")
    conditions_v6: list[str] | None = Field(None, alias="conditionsV6")
    mark_masq_bit: StrictInt | None = Field(None, alias="markMasqBit")
    external_set_mark_chain: str | None = Field(None, alias="externalSetMarkChain")

    @field_validator("conditions_v4", "conditions_v6")
    @classmethod
    def _iptables_conditions(cls, value: list[str] | None) -> list[str] | None:
        # iptables arguments go into iptables-restore lines: a line break
        # (any control character) in one would start another command.
        if value and value[0][:1] in ("-", "!"):
            for i, arg in enumerate(value):
                if not arg.isprintable():
                    raise PydanticCustomError(
                        "cni_condition", "{index}: an iptables argument holds a control "
                        "character", {"index": i})
        return value

    @field_validator("external_set_mark_chain")
    @classmethod
    def _external_chain(cls, value: str | None) -> str | None:
        # an iptables chain name: what iptables itself takes (28 characters)
        if value is not None and (not value or len(value) > 28 or value[0] in "-!"
                                  or any(c.isspace() or not c.isprintable() for c in value)):
            raise ValueError("must be an iptables chain name (1-28 characters, no blank, "
                             "not starting with - or !)")
        return value

    @field_validator("mark_masq_bit")
    @classmethod
    def _mark_bit(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 31:
            raise ValueError("MasqMarkBit must be between 0 and 31")  # Go's words
        return value

    def _options(self) -> dict[str, list[str]]:
        """The keys that only one backend reads, by backend (Go's ensureBackend)."""
        options: dict[str, list[str]] = {"iptables": [], "nftables": []}
        if self.external_set_mark_chain is not None:
            options["iptables"].append("externalSetMarkChain")
        for key, value in (("conditionsV4", self.conditions_v4),
                           ("conditionsV6", self.conditions_v6)):
            if value and value[0]:
                options["iptables" if value[0][0] in "-!" else "nftables"].append(key)
        return options

    @model_validator(mode="after")
    def _backend_options(self) -> PortMapConf:
        # Go's parseConfig and ensureBackend, in Go's order and words.
        if self.mark_masq_bit is not None and self.external_set_mark_chain is not None:
            raise ValueError("markMasqBit, externalSetMarkChain: Cannot specify "
                             "externalSetMarkChain and markMasqBit")
        backend = self.effective_backend
        wrong = "nftables" if backend == "iptables" else "iptables"
        if keys := self._options()[wrong]:
            raise ValueError(f"{keys[0]}: {backend} backend was requested but configuration "
                             f"contains {wrong}-specific options [{' '.join(keys)}]")
        return self

    @property
    def effective_backend(self) -> str:
        """``"nftables"`` or ``"iptables"``: ``backend``, or when absent
        ``"iptables"`` if a key only that backend reads is set
        (``markMasqBit``, ``externalSetMarkChain``, iptables conditions: a
        config written for Go's default), else ours."""
        if self.backend is not None:
            return self.backend
        if self.mark_masq_bit is not None or self._options()["iptables"]:
            return "iptables"
        return "nftables"

    @property
    def mark_bit(self) -> int:
        """``markMasqBit``, Go's default 13 when absent."""
        return 13 if self.mark_masq_bit is None else self.mark_masq_bit

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

