"""host-local's configuration: the models stdin and CNI_ARGS are parsed into,
and `load_ipam` (Go ``allocator.LoadIPAMConfig``), which turns them into
canonical range sets and the list of requested addresses.

Keys (under ``ipam``, matched case-insensitively like every CNI key):

    ranges      [[{subnet, rangeStart?, rangeEnd?, gateway?}, ...], ...]
                a list of range sets; one address per set
    subnet, rangeStart, rangeEnd, gateway
                the legacy single range, prepended to ``ranges`` as set 0
    routes      [{dst, gw?}, ...] copied to the result
    dataDir     store root, default /var/lib/cni/networks
    resolvConf  path of a resolv.conf whose contents become the result's dns

Requested addresses (``<ip>`` or ``<ip>/<prefix>``, the prefix ignored):
``runtimeConfig.ips`` (capability ``ips``), ``args.cni.ips``, and CNI_ARGS
``IP=a,b``. ``runtimeConfig.ipRanges`` (capability) range sets come first,
followed by the configured ones (Go's LoadIPAMConfig prepends them).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainValidator
from pydantic_core import PydanticCustomError

from cni_skel.args import CNIArgs
from cni_skel.config import IPAMConf, NetConf
from cni_skel.errors import (
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_IO_FAILURE,
    CNIError,
)
from cni_skel.model import CNIModel
from cni_skel.types import DNS, IPAddress, IPInterface, Route

from .allocator import IP, Range, RangeError, RangeSet, canonical_ip

__all__ = [
    "HostLocalArgs",
    "HostLocalConf",
    "HostLocalConfArgs",
    "HostLocalRuntimeConfig",
    "IPAMSettings",
    "LoadedIPAM",
    "RangeConf",
    "Requested",
    "ipam_settings",
    "load_ipam",
    "parse_resolv_conf",
]


# --- field types ---------------------------------------------------------------

IPv4, IPv6 = ipaddress.IPv4Address, ipaddress.IPv6Address


def _requested_ip(value: Any) -> IP:
    # Go's ip.ParseIP: "<ip>" or a CIDR "<ip>/<prefix>" whose prefix is dropped.
    if isinstance(value, IPv4 | IPv6):
        return canonical_ip(value)
    if isinstance(value, str) and value.strip() == value and "%" not in value:
        addr, sep, prefix = value.partition("/")
        try:
            if sep and not (prefix.isascii() and prefix.isdigit()):
                raise ValueError(prefix)
            if sep:
                ipaddress.ip_interface(value)
            return canonical_ip(ipaddress.ip_address(addr))
        except ValueError:
            pass
    raise PydanticCustomError("cni_ip_address", "{value} is not an IP address (<ip>[/<prefix>])",
                              {"value": repr(value)})


#: A requested address, ``<ip>`` or ``<ip>/<prefix>``.
RequestedIP = Annotated[IPv4 | IPv6, PlainValidator(_requested_ip)]


def _empty_to_none(value: Any) -> Any:
    # Go's net.IP decodes "" as "not set".
    return None if value == "" else value


def _null_to_list(value: Any) -> Any:
    return [] if value is None else value


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


_OptIP = Annotated[IPAddress | None, BeforeValidator(_empty_to_none)]
_OptSubnet = Annotated[IPInterface | None, BeforeValidator(_empty_to_none)]
_RangeSets = Annotated[list[Annotated[list["RangeConf"], BeforeValidator(_null_to_list)]],
                       BeforeValidator(_null_to_list)]


# --- models --------------------------------------------------------------------


class RangeConf(CNIModel):
    """One range as configured. ``subnet`` keeps host bits as written (they
    are reported by `load_ipam`, as Go does)."""

    subnet: _OptSubnet = None
    range_start: _OptIP = Field(None, alias="rangeStart")
    range_end: _OptIP = Field(None, alias="rangeEnd")
    gateway: _OptIP = None


class IPAMSettings(IPAMConf):
    """The ``ipam`` object of host-local."""

    subnet: _OptSubnet = None
    range_start: _OptIP = Field(None, alias="rangeStart")
    range_end: _OptIP = Field(None, alias="rangeEnd")
    gateway: _OptIP = None
    ranges: _RangeSets = Field(default_factory=list)
    routes: Annotated[list[Route], BeforeValidator(_null_to_list)] = Field(default_factory=list)
    data_dir: str = Field("", alias="dataDir")
    resolv_conf: str = Field("", alias="resolvConf")


class HostLocalRuntimeConfig(CNIModel):
    """The capability arguments host-local reads from ``runtimeConfig``."""

    ip_ranges: _RangeSets = Field(default_factory=list, alias="ipRanges")
    ips: Annotated[list[RequestedIP], BeforeValidator(_null_to_list)] = Field(
        default_factory=list)


class CNIArgsIPs(CNIModel):
    """``args.cni`` (CONVENTIONS.md "args in network config")."""

    ips: Annotated[list[RequestedIP], BeforeValidator(_null_to_list)] = Field(
        default_factory=list)


class HostLocalConfArgs(CNIModel):
    """The ``args`` object; only ``cni.ips`` is ours."""

    cni: CNIArgsIPs | None = None




class HostLocalConf(NetConf):
    """The network configuration host-local receives (the whole plugin
    object; ``ipam`` is its own). GC reads `NetConf.gc_keep`."""

    ipam: IPAMSettings | None = None
    runtime_config: HostLocalRuntimeConfig = Field(default_factory=HostLocalRuntimeConfig,
                                                   alias="runtimeConfig")
    args: HostLocalConfArgs = Field(default_factory=HostLocalConfArgs)


class HostLocalArgs(CNIArgs):
    """CNI_ARGS keys: ``IP`` is a comma-separated list of ``<ip>[/<prefix>]``
    (Go takes one address; a list is our extension)."""

    ip: Annotated[list[RequestedIP], BeforeValidator(_comma_list)] = Field(
        default_factory=list, alias="IP")


# --- loading -------------------------------------------------------------------


class Requested:
    """A requested address and where it came from (for messages and codes)."""

    __slots__ = ("ip", "source")

    def __init__(self, ip: IP, source: str) -> None:
        self.ip = ip
        self.source = source

    @property
    def code(self) -> int:
        """4 when it came from CNI_ARGS (an environment variable), else 7."""
        return ERR_INVALID_ENVIRONMENT_VARIABLES if self.source == "CNI_ARGS IP" \
            else ERR_INVALID_NETWORK_CONFIG

    def __repr__(self) -> str:
        return f"Requested({self.ip}, {self.source!r})"


class LoadedIPAM:
    """`load_ipam`'s answer: ``network`` (the name, the store's directory),
    ``data_dir``, ``range_sets`` (canonical, in allocation order; index n is
    ``last_reserved_ip.n``), ``requested``, ``routes``, ``resolv_conf``."""

    __slots__ = ("data_dir", "network", "range_sets", "requested", "resolv_conf", "routes")

    def __init__(self, network: str, data_dir: str, range_sets: list[RangeSet],
                 requested: list[Requested], routes: list[Route], resolv_conf: str) -> None:
        self.network = network
        self.data_dir = data_dir
        self.range_sets = range_sets
        self.requested = requested
        self.routes = routes
        self.resolv_conf = resolv_conf


def _config_error(msg: str, details: str = "") -> CNIError:
    return CNIError(ERR_INVALID_NETWORK_CONFIG, msg, details)


def ipam_settings(conf: HostLocalConf) -> IPAMSettings:
    """``conf.ipam``; code 7 ``IPAM config missing 'ipam' key`` (Go's text) without it."""
    if conf.ipam is None:
        raise _config_error("IPAM config missing 'ipam' key")
    return conf.ipam


def _range_set(index: int, confs: list[RangeConf]) -> RangeSet:
    try:
        return RangeSet([Range.build(c.subnet, c.range_start, c.range_end, c.gateway)
                         for c in confs])
    except RangeError as exc:
        raise _config_error(f"invalid range set {index}: {exc}") from None


def load_ipam(conf: HostLocalConf, typed_args: HostLocalArgs | None, *,
              ranges: bool = True) -> LoadedIPAM:
    """Go's LoadIPAMConfig: requested addresses, range sets, validation.

    Requested addresses, in order, duplicates dropped: CNI_ARGS ``IP``, then
    ``args.cni.ips``, then ``runtimeConfig.ips`` (Go's order). CONVENTIONS.md
    says a plugin that understands ``args.cni.ips`` must ignore CNI_ARGS
    ``IP`` when both are given, so we do (Go merges them).

    Range sets, as Go orders them: ``runtimeConfig.ipRanges``, then the
    legacy top-level range (when it has a subnet), then ``ranges``.
    ``ranges=False`` skips building them (DEL and GC need only the store).

    Raises:
        CNIError: code 7 for no ``ipam``, no range, an invalid range or range
            set (message ``invalid range set N: ...`` naming the range), range
            sets that overlap, or more than one set per family with a config
            version below 0.3.0 (whose results hold one address per family).
    """
    ipam = ipam_settings(conf)
    requested: list[Requested] = []
    seen: set[IP] = set()

    def want(ips: list[IP], source: str) -> None:
        for ip in ips:
            if ip not in seen:
                seen.add(ip)
                requested.append(Requested(ip, source))

    args_ips = conf.args.cni.ips if conf.args.cni is not None else []
    if typed_args is not None and not args_ips:
        want(typed_args.ip, "CNI_ARGS IP")
    want(args_ips, "args.cni.ips")
    want(conf.runtime_config.ips, "runtimeConfig.ips")

    range_sets: list[RangeSet] = []
    if ranges:
        confs = list(conf.runtime_config.ip_ranges)
        if ipam.subnet is not None:
            confs.append([RangeConf(subnet=ipam.subnet, rangeStart=ipam.range_start,
                                    rangeEnd=ipam.range_end, gateway=ipam.gateway)])
        confs.extend(ipam.ranges)
        if not confs:
            raise _config_error("no IP ranges specified")
        range_sets = [_range_set(i, c) for i, c in enumerate(confs)]
        for i, s1 in enumerate(range_sets):
            for j in range(i + 1, len(range_sets)):
                if s1.overlaps(range_sets[j]):
                    raise _config_error(f"range set {i} overlaps with {j}: "
                                        f"{s1} and {range_sets[j]}")
        per_family = [sum(1 for s in range_sets if s.version == v) for v in (4, 6)]
        if max(per_family) > 1 and conf.cni_version in ("0.1.0", "0.2.0"):
            raise _config_error(f"CNI version {conf.cni_version} does not support more "
                                "than 1 address per family")
    return LoadedIPAM(conf.name, ipam.data_dir, range_sets, requested, list(ipam.routes),
                      ipam.resolv_conf)


def parse_resolv_conf(path: str) -> DNS:
    """Read a resolv.conf into the result's DNS, as Go's parseResolvConf:
    ``nameserver`` (first value), ``domain``, ``search`` and ``options`` (all
    values); comments (``#``, ``;``), blank and one-word lines skipped.

    Raises:
        CNIError: code 7 when the file does not exist (the config names it),
            code 5 when it cannot be read.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            lines = fp.read().splitlines()
    except FileNotFoundError:
        raise _config_error(f"resolvConf {path} does not exist") from None
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"cannot read resolvConf {path}: {exc.strerror or exc}") \
            from None
    dns = DNS()
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        fields = line.split()
        if len(fields) < 2:
            continue
        key, values = fields[0], fields[1:]
        if key == "nameserver":
            dns.nameservers.append(values[0])
        elif key == "domain":
            dns.domain = values[0]
        elif key == "search":
            dns.search.extend(values)
        elif key == "options":
            dns.options.extend(values)
    return dns
