"""Input models of the older result shapes (spec 0.1.0 to 0.4.0).

These classes are only used to read results; `cni_skel.types.convert` turns
them into the current `Result` and writes every version's wire shape.

* 0.3.0, 0.3.1 and 0.4.0 (Go pkg/types/040): like the current shape, with a
  ``version`` ("4"/"6") in each ``ips`` entry and interfaces limited to
  ``name``/``mac``/``sandbox``. The declared ``version`` is read but not
  trusted: the address family decides.
* 0.1.0 and 0.2.0 (Go pkg/types/020): one ``ip4`` and one ``ip6`` object, each
  with ``ip``, ``gateway`` and ``routes``; no interfaces.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, StrictInt

from .current import (
    DNS,
    IPInterface,
    Route,
    _null_to_dict,
    _null_to_list,
    _OptIPAddress,
    _OptStr,
    _ResultModel,
)

__all__ = [
    "IPConfig020",
    "IPConfig040",
    "Interface040",
    "Result020",
    "Result040",
]

_DNSField = Annotated[DNS, BeforeValidator(_null_to_dict)]


class Interface040(_ResultModel):
    """0.3.x/0.4.0 ``interfaces`` entry (no mtu, socketPath or pciID)."""

    name: str
    mac: _OptStr = None
    sandbox: _OptStr = None


class IPConfig040(_ResultModel):
    """0.3.x/0.4.0 ``ips`` entry; ``version`` may be missing (Go's loopback)."""

    version: _OptStr = None
    interface: StrictInt | None = None
    address: IPInterface
    gateway: _OptIPAddress = None


class Result040(_ResultModel):
    """A 0.3.0, 0.3.1 or 0.4.0 result."""

    cni_version: str | None = Field(None, alias="cniVersion")
    interfaces: Annotated[list[Interface040], BeforeValidator(_null_to_list)] = Field(
        default_factory=list
    )
    ips: Annotated[list[IPConfig040], BeforeValidator(_null_to_list)] = Field(
        default_factory=list
    )
    routes: Annotated[list[Route], BeforeValidator(_null_to_list)] = Field(default_factory=list)
    dns: _DNSField = Field(default_factory=DNS)


class IPConfig020(_ResultModel):
    """0.1.0/0.2.0 ``ip4``/``ip6`` object."""

    ip: IPInterface
    gateway: _OptIPAddress = None
    routes: Annotated[list[Route], BeforeValidator(_null_to_list)] = Field(default_factory=list)


class Result020(_ResultModel):
    """A 0.1.0 or 0.2.0 result."""

    cni_version: str | None = Field(None, alias="cniVersion")
    ip4: IPConfig020 | None = None
    ip6: IPConfig020 | None = None
    dns: _DNSField = Field(default_factory=DNS)
