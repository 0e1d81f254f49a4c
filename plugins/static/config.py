"""static's configuration: the models stdin and CNI_ARGS are parsed into,
and `load_static` (Go ``LoadIPAMConfig``, plugins/ipam/static 1.1.1), which
merges the address sources in Go's order and checks them.

Keys (matched case-insensitively like every CNI key)::

    ipam.addresses      [{"address": "10.1.0.5/24", "gateway": "10.1.0.1"}, ...]
                        CIDR, host bits kept; gateway optional, any family
    ipam.routes         [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, ...] copied to the result
    ipam.dns            {"nameservers": [...], "domain", "search", "options"}
    args.cni.ips        ["10.1.0.5/24", ...]  (CONVENTIONS.md)
    runtimeConfig.ips   ["10.1.0.5/24", ...]  (capability ``ips``)

CNI_ARGS: ``IP=a/n,b/m`` (CIDRs) and ``GATEWAY=g,h``; other keys need
``IgnoreUnknown=1``.

The result's addresses, as Go builds them: ``ipam.addresses``, then every
CNI_ARGS ``IP`` appended; each CNI_ARGS ``GATEWAY`` becomes the gateway of
every CNI_ARGS ``IP`` whose subnet holds it (the last one wins; one no
subnet holds is ignored; the configured addresses never get one: Go tests
them before parsing them). A non-empty ``args.cni.ips`` then replaces all
of them, and a non-empty ``runtimeConfig.ips`` replaces that (both without
gateways). Only then are the configured addresses that survived parsed: a
bad one that was replaced is no error, as in Go.

An IPv4-mapped IPv6 address (``::ffff:10.1.0.5/120``) becomes IPv4, its
prefix length less 96 (``10.1.0.5/24``; 0 under /96), and such a gateway
becomes IPv4: Go's canonicalizeIP and its IPNet printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv6Address, IPv6Interface
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictStr, TypeAdapter, ValidationError

from cni_skel.args import CNIArgs
from cni_skel.config import IPAMConf, NetConf, config_error
from cni_skel.errors import (
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    CNIError,
)
from cni_skel.model import CNIModel
from cni_skel.types import DNS, IPAddress, IPConfig, IPInterface, Route

__all__ = [
    "AddressConf",
    "LoadedStatic",
    "StaticArgs",
    "StaticConf",
    "StaticConfArgs",
    "StaticIPAM",
    "StaticKeys",
    "StaticRuntimeConfig",
    "load_static",
    "parse_cidr",
    "parse_ip",
    "static_keys",
]

IP = IPv4Address | IPv6Address
Cidr = IPv4Interface | IPv6Interface

# Go's net.ParseCIDR and net.ParseIP, as the result models read them.
_CIDR: TypeAdapter[Cidr] = TypeAdapter(IPInterface)
_IP: TypeAdapter[IP] = TypeAdapter(IPAddress)


# --- field types ---------------------------------------------------------------


def _null_to_list(value: Any) -> Any:
    return [] if value is None else value


def _null_to_dict(value: Any) -> Any:
    return {} if value is None else value


def _empty_to_none(value: Any) -> Any:
    # Go's net.IP decodes "" as "not set".
    return None if value == "" else value


def _null_to_empty(value: Any) -> Any:
    # Go decodes null into a string as "" (then no CIDR, with Go's text).
    return "" if value is None else value


_Str = Annotated[StrictStr, BeforeValidator(_null_to_empty)]
_StrList = Annotated[list[_Str], BeforeValidator(_null_to_list)]
_OptIP = Annotated[IPAddress | None, BeforeValidator(_empty_to_none)]


# --- models --------------------------------------------------------------------


class AddressConf(CNIModel):
    """One ``ipam.addresses`` entry: ``address`` as written (parsed by
    `load_static`, Go's text when it is no CIDR), ``gateway`` an address."""

    address: _Str = ""
    gateway: _OptIP = None


# Go decodes a null entry as the zero Address: no address, Go's text for it.
_Addresses = Annotated[list[Annotated[AddressConf, BeforeValidator(_null_to_dict)]],
                       BeforeValidator(_null_to_list)]


class StaticIPAM(IPAMConf):
    """The ``ipam`` object of static."""

    addresses: _Addresses = Field(default_factory=list)
    routes: Annotated[list[Route], BeforeValidator(_null_to_list)] = Field(default_factory=list)
    dns: Annotated[DNS, BeforeValidator(_null_to_dict)] = Field(default_factory=DNS)


class StaticRuntimeConfig(CNIModel):
    """``runtimeConfig``: the ``ips`` capability (CIDRs)."""

    ips: _StrList = Field(default_factory=list)


class _CNIArgsIPs(CNIModel):
    ips: _StrList = Field(default_factory=list)


class StaticConfArgs(CNIModel):
    """The ``args`` object; only ``cni.ips`` (CIDRs) is ours."""

    cni: _CNIArgsIPs | None = None


class StaticKeys(CNIModel):
    """static's own keys of the plugin object, read by `load_static` for
    ADD and CHECK only."""

    ipam: StaticIPAM | None = None
    runtime_config: Annotated[StaticRuntimeConfig, BeforeValidator(_null_to_dict)] = Field(
        default_factory=StaticRuntimeConfig, alias="runtimeConfig")
    args: Annotated[StaticConfArgs, BeforeValidator(_null_to_dict)] = Field(
        default_factory=StaticConfArgs)


class StaticConf(NetConf):
    """The plugin object static receives, as every verb reads it.

    Go's DEL reads nothing of it, and GC and STATUS have nothing to look
    at: so ``ipam``, ``runtimeConfig`` and ``args`` are kept as given here
    (any JSON value) and `static_keys` reads them for ADD and CHECK. A DEL
    of a config ADD refused succeeds, as Go's does.
    """

    ipam: Any = None  # type: ignore[assignment]
    runtime_config: Any = Field(None, alias="runtimeConfig")  # type: ignore[assignment]
    args: Any = None  # type: ignore[assignment]


class StaticArgs(CNIArgs):
    """CNI_ARGS keys (Go's ``IPAMEnvArgs``): ``IP`` and ``GATEWAY``, each a
    comma-separated list, kept as written (`load_static` parses them)."""

    ip: str = Field("", alias="IP")
    gateway: str = Field("", alias="GATEWAY")


# --- loading -------------------------------------------------------------------


def parse_cidr(text: str) -> Cidr | None:
    """``text`` as Go's net.ParseCIDR reads it (``<ip>/<decimal prefix>``,
    no zone, no netmask), host bits kept, IPv4-mapped made IPv4 (see the
    module docstring); None when it is not one."""
    try:
        iface = _CIDR.validate_python(text)
    except ValidationError:
        return None
    mapped = iface.ip.ipv4_mapped if isinstance(iface, IPv6Interface) else None
    if mapped is not None:
        return IPv4Interface((mapped, max(0, iface.network.prefixlen - 96)))
    return iface


def parse_ip(text: str) -> IP | None:
    """``text`` as Go's net.ParseIP reads it, IPv4-mapped made IPv4; None
    when it is no address."""
    try:
        return _canonical(_IP.validate_python(text))
    except ValidationError:
        return None


def _canonical(ip: IP) -> IP:
    # Go keeps an IPv4 address in 16 bytes and prints it dotted.
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass
class _Address:
    text: str
    iface: Cidr | None = None
    gateway: IP | None = None


@dataclass
class LoadedStatic:
    """`load_static`'s answer: ``ips`` (address with its prefix, gateway or
    None) in Go's order, ``routes`` and ``dns`` as configured."""

    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)


def _env_error(msg: str) -> CNIError:
    return CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, msg, "in CNI_ARGS")


def _from_list(ips: list[str], source: str) -> list[_Address]:
    out = []
    for text in ips:
        iface = parse_cidr(text)
        if iface is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "an entry in the 'ips' field is NOT in "
                           f"CIDR notation, got: '{text}'", f"in {source}")
        out.append(_Address(text, iface))
    return out


def static_keys(conf: StaticConf) -> StaticKeys:
    """``ipam``, ``runtimeConfig`` and ``args`` of ``conf`` as their models.

    Raises:
        CNIError: code 7 naming the key for a value of the wrong type or a
            gateway that is no address (Go: 999, its JSON decoder's text).
    """
    raw = {"ipam": conf.ipam, "runtimeConfig": conf.runtime_config, "args": conf.args}
    try:
        return StaticKeys.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc) from None


def load_static(conf: StaticConf, env: StaticArgs | None) -> LoadedStatic:
    """Go's LoadIPAMConfig: the result's addresses from every source, in
    Go's order and precedence (module docstring), checked as Go checks them.

    Raises:
        CNIError, with Go's texts (Go answers 999 for all):
            7 ``IPAM config missing 'ipam' key``; 4 ``the 'ip' field is
            expected to be in CIDR notation, got: '...'`` (CNI_ARGS IP) and
            ``invalid gateway address: ...`` (CNI_ARGS GATEWAY), both
            environment variables; 7 ``an entry in the 'ips' field is NOT in
            CIDR notation, got: '...'`` (``args.cni.ips`` or
            ``runtimeConfig.ips``, named in details), ``the 'address' field
            is expected to be in CIDR notation, got: '...'`` (an
            ``ipam.addresses`` entry: a missing address is ``''``), ``CNI
            version V does not support more than 1 address per family``
            (0.1.0 and 0.2.0 results hold one of each); 7 as `static_keys`.
    """
    keys = static_keys(conf)
    if keys.ipam is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "IPAM config missing 'ipam' key")
    addrs = [_Address(a.address, gateway=_canonical(a.gateway) if a.gateway else None)
             for a in keys.ipam.addresses]
    if env is not None and env.ip:
        for item in env.ip.split(","):
            text = item.strip()
            iface = parse_cidr(text)
            if iface is None:
                raise _env_error("the 'ip' field is expected to be in CIDR notation, "
                                 f"got: '{text}'")
            addrs.append(_Address(text, iface))
    if env is not None and env.gateway:
        for item in env.gateway.split(","):
            gw = parse_ip(item.strip())
            if gw is None:
                raise _env_error(f"invalid gateway address: {item}")
            # Configured addresses are not parsed yet: Go's Contains says no.
            for a in addrs:
                if a.iface is not None and gw in a.iface.network:
                    a.gateway = gw
    cni_ips = keys.args.cni.ips if keys.args.cni is not None else []
    if cni_ips:
        addrs = _from_list(cni_ips, "args.cni.ips")
    if keys.runtime_config.ips:
        addrs = _from_list(keys.runtime_config.ips, "runtimeConfig.ips")

    per_family = {4: 0, 6: 0}
    ips = []
    for i, a in enumerate(addrs):
        iface = a.iface if a.iface is not None else parse_cidr(a.text)
        if iface is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "the 'address' field is expected to be "
                           f"in CIDR notation, got: '{a.text}'", f"ipam.addresses[{i}]")
        per_family[iface.version] += 1
        ips.append(IPConfig(address=iface, gateway=a.gateway))
    if max(per_family.values()) > 1 and conf.cni_version in ("", "0.1.0", "0.2.0"):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"CNI version {conf.cni_version} does not "
                       "support more than 1 address per family")
    return LoadedStatic(ips, list(keys.ipam.routes), keys.ipam.dns)
