"""The current result model (spec 1.1.0; 1.0.0 has the same shape).

Every other spec version is converted to and from these classes by
`cni_skel.types.convert`, which imports this module and registers its writers
in `cni_skel.types.registry` when it loads; `Result.to_version` looks its
writer up there and never imports the converter (Go's
pkg/types/internal/convert.go). Field semantics follow the Go SDK
(pkg/types/100):

* addresses and route destinations keep their host bits as written
  (``10.1.2.3/24`` stays ``10.1.2.3/24``, as Go's ``types.ParseCIDR``);
* values that Go omits when empty or zero (``mac``, ``sandbox``, interface and
  route ``mtu``, ``advmss``, ``priority`` ...) are normalised to ``None`` when
  given as ``""`` or ``0``, so that a result compares equal after a trip
  through JSON; ``table`` and ``scope`` are pointers in Go and keep ``0``;
* JSON ``null`` for a list or for ``dns`` means "empty", as in Go;
* integers are strict (no ``"1500"``, ``1500.0`` or ``true``), as Go's decoder.

Unknown keys are ignored, as Go's decoder drops them.
"""

from __future__ import annotations

import json
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
    ip_address,
    ip_interface,
)
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictInt,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from ..model import CNIModel
from ..version import CURRENT_VERSION
from . import registry

__all__ = [
    "CURRENT_VERSION",
    "DNS",
    "IPAddress",
    "IPConfig",
    "IPInterface",
    "Interface",
    "Result",
    "Route",
]


# --- field types -------------------------------------------------------------


def _check_ip_text(text: str) -> bool:
    # Python accepts IPv6 zone ids ("fe80::1%eth0"); Go's net.ParseIP does not.
    return "%" not in text and text.strip() == text


def _to_ip_interface(value: Any) -> IPv4Interface | IPv6Interface:
    if isinstance(value, IPv4Interface | IPv6Interface):
        return value
    if isinstance(value, IPv4Network | IPv6Network):
        return ip_interface(value.with_prefixlen)
    if isinstance(value, str) and _check_ip_text(value):
        # CIDR notation only: an address and a decimal prefix length, as
        # Go's net.ParseCIDR (no bare address, no dotted netmask).
        addr, sep, prefix = value.partition("/")
        if sep and addr and prefix.isascii() and prefix.isdigit():
            try:
                return ip_interface(value)
            except ValueError:
                pass
    raise PydanticCustomError(
        "cni_ip_interface", "{value} is not a valid IP interface", {"value": repr(value)}
    )


def _to_ip_address(value: Any) -> IPv4Address | IPv6Address:
    if isinstance(value, IPv4Address | IPv6Address):
        return value
    if isinstance(value, str) and _check_ip_text(value):
        try:
            return ip_address(value)
        except ValueError:
            pass
    raise PydanticCustomError(
        "cni_ip_address", "{value} is not a valid IP address", {"value": repr(value)}
    )


def _empty_to_none(value: Any) -> Any:
    return None if value == "" else value


def _zero_to_none(value: Any) -> Any:
    return None if type(value) is int and value == 0 else value


def _null_to_list(value: Any) -> Any:
    return [] if value is None else value


def _null_to_dict(value: Any) -> Any:
    return {} if value is None else value


IPInterface = Annotated[
    IPv4Interface | IPv6Interface,
    PlainValidator(_to_ip_interface),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "description": "IP address with prefix length"}),
]
"""An address in CIDR notation, host bits kept (``10.1.2.3/24``)."""

IPAddress = Annotated[
    IPv4Address | IPv6Address,
    PlainValidator(_to_ip_address),
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "description": "IP address"}),
]
"""A bare IPv4 or IPv6 address."""

_OptIPAddress = Annotated[IPAddress | None, BeforeValidator(_empty_to_none)]
_OptStr = Annotated[str | None, BeforeValidator(_empty_to_none)]
_OmitEmptyInt = Annotated[StrictInt | None, BeforeValidator(_zero_to_none)]
_StrList = Annotated[list[str], BeforeValidator(_null_to_list)]


class _ResultModel(CNIModel):
    """Base of result objects: unknown keys are dropped, as Go does."""

    model_config = ConfigDict(extra="ignore")


# --- models -----------------------------------------------------------------


class DNS(_ResultModel):
    """DNS settings (spec "DNS" well-known structure). Empty fields mean unset."""

    nameservers: _StrList = Field(default_factory=list)
    domain: _OptStr = None
    search: _StrList = Field(default_factory=list)
    options: _StrList = Field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)


class Interface(_ResultModel):
    """An interface created by the plugin (``interfaces`` entry)."""

    name: str
    mac: _OptStr = None
    mtu: _OmitEmptyInt = None
    sandbox: _OptStr = None
    socket_path: _OptStr = Field(None, alias="socketPath")
    pci_id: _OptStr = Field(None, alias="pciID")


class IPConfig(_ResultModel):
    """An assigned address (``ips`` entry); ``interface`` indexes ``interfaces``."""

    address: IPInterface
    gateway: _OptIPAddress = None
    interface: StrictInt | None = None

    @property
    def version(self) -> str:
        """``"4"`` or ``"6"``, from the address family."""
        return "4" if self.address.version == 4 else "6"


class Route(_ResultModel):
    """A route (``routes`` entry). ``dst`` keeps host bits as written."""

    dst: IPInterface
    gw: _OptIPAddress = None
    mtu: _OmitEmptyInt = None
    advmss: _OmitEmptyInt = None
    priority: _OmitEmptyInt = None
    table: StrictInt | None = None
    scope: StrictInt | None = None


class Result(_ResultModel):
    """A plugin's success result in the current shape.

    ``cni_version`` is the version the result was read as (or will be
    printed as); conversions take the target version as an argument, so it is
    informative only. `parse_result` reads results of every spec version.
    """

    cni_version: str | None = Field(None, alias="cniVersion")
    interfaces: Annotated[list[Interface], BeforeValidator(_null_to_list)] = Field(
        default_factory=list
    )
    ips: Annotated[list[IPConfig], BeforeValidator(_null_to_list)] = Field(default_factory=list)
    routes: Annotated[list[Route], BeforeValidator(_null_to_list)] = Field(default_factory=list)
    dns: Annotated[DNS, BeforeValidator(_null_to_dict)] = Field(default_factory=DNS)

    def to_version(self, version: str | None = None) -> dict:
        """The result as a JSON-ready dict in the wire shape of ``version``.

        ``version`` defaults to ``cni_version``, then the current version.
        An empty ``dns`` is left out of the 1.0.0/1.1.0 shape (Go >= 1.6)
        and printed ``{}`` in the 0.x ones. Raises `CNIError` (code 1) when
        the version is unknown or the result cannot be expressed in it (ADD
        asks `check_expressible` first).
        """
        return registry.convert(self, version or self.cni_version or CURRENT_VERSION)

    def to_json(self, version: str | None = None) -> bytes:
        """`to_version` serialised as compact JSON bytes."""
        return json.dumps(self.to_version(version)).encode()
