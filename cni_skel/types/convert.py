"""Reading results of any spec version, and writing each version's shape.

The current `Result` is the hub: `parse_result` converts up into it,
`result_to_version` writes it down (or across) to a target version. The
writers are registered in `cni_skel.types.registry` when this module loads,
as Go's version packages call ``RegisterConverter`` from ``init()``
(pkg/types/internal/convert.go); `Result.to_version` finds them there, so
`cni_skel.types.current` never imports this module. The rules are those of
the CNI spec 1.1.0 and of the Go SDK's converters:

* 1.0.0 and 1.1.0 share one shape (Go keeps the 1.1.0 fields when printing
  1.0.0, and so do we);
* 0.3.0, 0.3.1 and 0.4.0 add ``version`` to each ``ips`` entry (computed here
  from the address) and drop the interface fields ``mtu``, ``socketPath``
  and ``pciID``;
* 0.1.0 and 0.2.0 hold only the first IPv4 and the first IPv6 address, as
  ``ip4``/``ip6``, each with the routes of its family reduced to ``dst`` and
  ``gw``; interfaces are dropped. A result with no address cannot be written
  in these versions: `check_expressible` says so before a plugin changes
  anything, and `result_to_version` raises the same error.

Output dicts have Go's key order so that printed results diff cleanly against
the Go plugins'. An empty ``dns`` is left out of 1.0.0 and 1.1.0 results
and printed as ``{}`` in the older shapes, as the Go plugins do since 1.6
(containernetworking/cni 1.2's ``types100.Result.MarshalJSON``; 1.1.1
printed ``{}`` in every version).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from ..errors import ERR_DECODING_FAILURE, ERR_INCOMPATIBLE_CNI_VERSION, CNIError
from ..model import CNIModel
from ..version import ALL_VERSIONS
from . import registry
from .current import (
    CURRENT_VERSION,
    DNS,
    Interface,
    IPConfig,
    Result,
    Route,
)
from .legacy import Result020, Result040

__all__ = [
    "SUPPORTED_VERSIONS",
    "ErrorResult",
    "VersionResult",
    "check_expressible",
    "parse_result",
    "result_to_version",
]

#: Every version a result can be read in or written to (the SDK's list).
SUPPORTED_VERSIONS = ALL_VERSIONS

_VERSIONS_02X = frozenset(("0.1.0", "0.2.0"))
_VERSIONS_04X = frozenset(("0.3.0", "0.3.1", "0.4.0"))
_VERSIONS_1X = frozenset(("1.0.0", "1.1.0"))


# --- other answers a plugin may print ------------------------------------------


class ErrorResult(CNIModel):
    """The spec's Error object, as printed by a failing plugin."""

    # Built on first use: a plugin call seldom reads one (start-up cost).
    model_config = ConfigDict(extra="ignore", defer_build=True)

    cni_version: str | None = Field(None, alias="cniVersion")
    code: int
    msg: str
    details: Annotated[str, BeforeValidator(lambda v: "" if v is None else v)] = ""

    def to_error(self, *, stderr: str = "") -> CNIError:
        """The equivalent `CNIError` (to re-raise a delegated plugin's error)."""
        return CNIError(self.code, self.msg, self.details, stderr=stderr)


class VersionResult(CNIModel):
    """The answer to the VERSION command."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    cni_version: str = Field(alias="cniVersion")
    supported_versions: list[str] = Field(alias="supportedVersions")


# --- reading -------------------------------------------------------------------


def _load(data: dict | str | bytes) -> dict:
    if isinstance(data, bytes | bytearray | str):
        try:
            data = json.loads(data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise CNIError(ERR_DECODING_FAILURE, "failed to decode result", str(exc)) from None
    if not isinstance(data, dict):
        raise CNIError(
            ERR_DECODING_FAILURE,
            "failed to decode result",
            f"a result must be a JSON object, not {type(data).__name__}",
        )
    return data


def _get_folded(data: dict, key: str) -> Any:
    """``data[key]`` matched as Go does: exactly first, then ignoring case."""
    if key in data:
        return data[key]
    folded = key.lower()
    for name, value in data.items():
        if isinstance(name, str) and name.lower() == folded:
            return value
    return None


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: Errors `_describe` spells out; the rest are counted (a result of many bad
#: entries must not make a message of megabytes).
_DESCRIBED_ERRORS = 10


def _describe(exc: ValidationError) -> str:
    """One line per error: ``key.path: problem``; the first
    `_DESCRIBED_ERRORS`, then how many more."""
    parts = []
    errors = exc.errors(include_url=False)
    for err in errors[:_DESCRIBED_ERRORS]:
        where = ".".join(str(p) for p in err["loc"]) or "result"
        msg = err["msg"]
        if err["type"] != "missing" and not err["type"].startswith("cni_"):
            msg = f"{msg}, got {_short_repr(err.get('input'))}"
        parts.append(f"{where}: {msg}")
    if len(errors) > _DESCRIBED_ERRORS:
        parts.append(f"and {len(errors) - _DESCRIBED_ERRORS} more")
    return "; ".join(parts)


def _looks_current(data: dict) -> bool:
    """A 0.1.0/0.2.0-labelled result in the newer shape (Go loopback 1.1.1)."""
    keys = {k.lower(): v for k, v in data.items() if isinstance(k, str)}
    if keys.get("ip4") is not None or keys.get("ip6") is not None:
        return False
    return bool(keys.get("ips") or keys.get("interfaces"))


def _folded_all(data: dict, key: str) -> list[Any]:
    """Every value of ``data`` under a spelling of ``key`` (case ignored):
    which one a model keeps depends on their order (`cni_skel.model`)."""
    folded = key.lower()
    return [v for k, v in data.items() if isinstance(k, str) and k.lower() == folded]


def _longest(data: dict, key: str) -> int:
    return max((len(v) for v in _folded_all(data, key) if isinstance(v, list)), default=0)


def list_lengths(data: dict, version: str | None = None) -> list[tuple[tuple[str, ...], int]]:
    """The length of each list `parse_result` would build from ``data`` (a
    decoded result; ``version`` as for `parse_result`), counted on the raw
    JSON before any model is built: ``(keys, length)`` for ``ips``,
    ``routes``, ``interfaces``, ``dns.nameservers``, ``dns.search`` and
    ``dns.options``; in the 0.1.0/0.2.0 shape, ``ip4.routes`` and
    ``ip6.routes`` together (the one ``routes`` list they become) instead
    of the first three. A key spelled several ways (case ignored, as Go's
    decoder) counts its longest list; a value that is not a list counts 0
    (`parse_result` refuses it). Internal: `cni_skel.config.NetConf`
    bounds a prevResult with it."""
    out: list[tuple[tuple[str, ...], int]] = []
    label = _get_folded(data, "cniVersion")
    ver = (label if isinstance(label, str) else "") or version or CURRENT_VERSION
    if ver in _VERSIONS_02X and not _looks_current(data):
        routes = {}
        for family in ("ip4", "ip6"):
            sections = [v for v in _folded_all(data, family) if isinstance(v, dict)]
            n = max((_longest(v, "routes") for v in sections), default=0)
            if n:
                routes[f"{family}.routes"] = n
        if routes:
            out.append((tuple(routes), sum(routes.values())))
    else:
        out += [((k,), _longest(data, k)) for k in ("ips", "routes", "interfaces")]
    for dns in _folded_all(data, "dns"):
        if isinstance(dns, dict):
            out += [((f"dns.{k}",), _longest(dns, k))
                    for k in ("nameservers", "search", "options")]
    return out


def _from_040(old: Result040) -> Result:
    return Result(
        interfaces=[
            Interface(name=i.name, mac=i.mac, sandbox=i.sandbox) for i in old.interfaces
        ],
        ips=[
            IPConfig(interface=ip.interface, address=ip.address, gateway=ip.gateway)
            for ip in old.ips
        ],
        routes=[r.model_copy() for r in old.routes],
        dns=old.dns.model_copy(deep=True),
    )


def _from_020(old: Result020) -> Result:
    result = Result(dns=old.dns.model_copy(deep=True))
    for section in (old.ip4, old.ip6):
        if section is None:
            continue
        result.ips.append(IPConfig(address=section.ip, gateway=section.gateway))
        result.routes.extend(r.model_copy() for r in section.routes)
    return result


def parse_result(data: dict | str | bytes, version: str | None = None) -> Result:
    """Read a result of any supported spec version into the current model.

    The version is the result's own ``cniVersion`` when present and not empty,
    else ``version`` (typically the config's), else the current version. The
    returned result's ``cni_version`` is that version.

    Raises `CNIError`: code 1 for an unsupported version, code 6 for content
    that cannot be decoded (details name the key path and the bad value).
    """
    obj = _load(data)
    label = _get_folded(obj, "cniVersion")
    if label is not None and not isinstance(label, str):
        raise CNIError(
            ERR_DECODING_FAILURE,
            "failed to decode result",
            f"cniVersion: {_short_repr(label)} is not a string",
        )
    ver = label or version or CURRENT_VERSION
    if ver not in SUPPORTED_VERSIONS:
        raise CNIError(
            ERR_INCOMPATIBLE_CNI_VERSION,
            "incompatible CNI versions",
            f'result version "{ver}" is not supported',
        )
    try:
        if ver in _VERSIONS_1X:
            result = Result.model_validate(obj)
        elif ver in _VERSIONS_04X:
            result = _from_040(Result040.model_validate(obj))
        elif _looks_current(obj):
            result = Result.model_validate(obj)
        else:
            result = _from_020(Result020.model_validate(obj))
    except ValidationError as exc:
        raise CNIError(ERR_DECODING_FAILURE, "failed to decode result", _describe(exc)) from None
    result.cni_version = ver
    return result


# --- writing -------------------------------------------------------------------


def _dns_wire(dns: DNS) -> dict:
    out: dict[str, Any] = {}
    if dns.nameservers:
        out["nameservers"] = list(dns.nameservers)
    if dns.domain:
        out["domain"] = dns.domain
    if dns.search:
        out["search"] = list(dns.search)
    if dns.options:
        out["options"] = list(dns.options)
    return out


def _route_wire(route: Route, *, full: bool = True) -> dict:
    out: dict[str, Any] = {"dst": str(route.dst)}
    if route.gw is not None:
        out["gw"] = str(route.gw)
    if not full:
        return out
    # mtu/advmss/priority are plain ints with omitempty in Go; table/scope are
    # pointers, so 0 is printed.
    if route.mtu:
        out["mtu"] = route.mtu
    if route.advmss:
        out["advmss"] = route.advmss
    if route.priority:
        out["priority"] = route.priority
    if route.table is not None:
        out["table"] = route.table
    if route.scope is not None:
        out["scope"] = route.scope
    return out


def _interface_wire(intf: Interface, *, full: bool) -> dict:
    out: dict[str, Any] = {"name": intf.name}
    if intf.mac:
        out["mac"] = intf.mac
    if full and intf.mtu:
        out["mtu"] = intf.mtu
    if intf.sandbox:
        out["sandbox"] = intf.sandbox
    if full and intf.socket_path:
        out["socketPath"] = intf.socket_path
    if full and intf.pci_id:
        out["pciID"] = intf.pci_id
    return out


def _ip_wire(ip: IPConfig, *, with_version: bool) -> dict:
    out: dict[str, Any] = {}
    if with_version:
        out["version"] = ip.version
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = str(ip.address)
    if ip.gateway is not None:
        out["gateway"] = str(ip.gateway)
    return out


def _to_list_shape(result: Result, version: str, *, legacy: bool) -> dict:
    """1.x shape, or the 0.3.x/0.4.0 one when ``legacy``."""
    out: dict[str, Any] = {"cniVersion": version}
    if result.interfaces:
        out["interfaces"] = [_interface_wire(i, full=not legacy) for i in result.interfaces]
    if result.ips:
        out["ips"] = [_ip_wire(ip, with_version=legacy) for ip in result.ips]
    if result.routes:
        out["routes"] = [_route_wire(r) for r in result.routes]
    if legacy or not result.dns.is_empty():
        # 1.x: an empty dns is left out, as Go's types100 since cni 1.2
        out["dns"] = _dns_wire(result.dns)
    return out


def _to_02x(result: Result, version: str) -> dict:
    firsts: dict[int, IPConfig] = {}
    for ip in result.ips:
        firsts.setdefault(ip.address.version, ip)
        if len(firsts) == 2:
            break
    check_expressible(version, has_ip=bool(firsts))
    out: dict[str, Any] = {"cniVersion": version}
    for family, key in ((4, "ip4"), (6, "ip6")):
        ip = firsts.get(family)
        if ip is None:
            continue
        section: dict[str, Any] = {"ip": str(ip.address)}
        if ip.gateway is not None:
            section["gateway"] = str(ip.gateway)
        routes = [_route_wire(r, full=False) for r in result.routes if r.dst.version == family]
        if routes:
            section["routes"] = routes
        out[key] = section
    out["dns"] = _dns_wire(result.dns)
    return out


def check_expressible(version: str, result: Result | None = None, *,
                      has_ip: bool | None = None) -> None:
    """Raise unless an ADD result like this can be written in ``version``.

    Call it in ADD before the first side effect, so that a result the
    config's cniVersion cannot carry fails the call with nothing applied
    (the skel converts the result only after ``add`` returns, too late to
    undo anything). Describe the result by one of:

    * ``result``: the `Result` you will return, when you have it already
      (a chained plugin passing ``conf.prev_result`` through);
    * ``has_ip``: whether it will hold at least one IP address, when it is
      built later (bridge without ``ipam``: ``has_ip=False``).

    ``version`` is the config's ``cniVersion`` (``""`` or None mean 0.1.0,
    as for a config without one)::

        check_expressible(conf.cni_version, conf.prev_result)
        check_expressible(conf.cni_version, has_ip=conf.ipam is not None)

    The rule (spec "Result types" and its version history; Go's
    pkg/types/020 converters): results before 0.3.0 have ``ip4`` and
    ``ip6`` only (one address each, routes as dst/gw) and ``dns``; no
    ``interfaces`` list and no ``ips``. A result without any IP address has
    nothing to put there, so 0.1.0 and 0.2.0 cannot express it. Everything
    else converts, losing what the older shape has no room for, silently as
    in Go: interfaces, later addresses of a family, routes of a family with
    no address (0.1.0, 0.2.0), interface ``mtu``/``socketPath``/``pciID``
    (0.3.x, 0.4.0). So several interfaces, or a single-family result, are
    fine in every version. When only a change tells what the result holds
    (loopback: the kernel puts lo's addresses on it when it goes up), check
    the result once built and undo that change when this raises.

    Raises:
        CNIError: code 1 (incompatible CNI version), msg ``cannot convert
            result to version V``, details ``no IP addresses to express as
            ip4/ip6``: exactly what `result_to_version` raises for it. Go
            answers 999 where it converts (its converter's untyped error;
            a 0.x prevResult it passes through unconverted is echoed, IP or
            not); code 1 is the spec's "incompatible CNI version" and tells
            the runtime what to change: a newer cniVersion. Also code 1 for
            a version outside `SUPPORTED_VERSIONS`. TypeError when both or
            neither of ``result`` and ``has_ip`` are given (a bug).
    """
    if (result is None) == (has_ip is None):
        raise TypeError("check_expressible: give either result or has_ip")
    version = version or "0.1.0"
    if version not in SUPPORTED_VERSIONS:
        raise registry.unsupported_version(version)
    with_ip = bool(result.ips) if result is not None else bool(has_ip)
    if version in _VERSIONS_02X and not with_ip:
        raise CNIError(
            ERR_INCOMPATIBLE_CNI_VERSION,
            f"cannot convert result to version {version}",
            "no IP addresses to express as ip4/ip6",
        )


def result_to_version(result: Result, version: str) -> dict:
    """``result`` as a JSON-ready dict in the wire shape of ``version``.

    The writer is the one registered for ``version`` below (the same lookup
    as `Result.to_version`).

    Raises `CNIError` (code 1) for an unsupported version, or when the result
    has no IP address and ``version`` is 0.1.0 or 0.2.0 (the error of
    `check_expressible`, which a plugin calls before changing anything).
    """
    return registry.convert(result, version)


# --- registration (Go: each version package's init()) ---------------------------


def _to_1x(result: Result, version: str) -> dict:
    return _to_list_shape(result, version, legacy=False)


def _to_04x(result: Result, version: str) -> dict:
    return _to_list_shape(result, version, legacy=True)


registry.register_converter(sorted(_VERSIONS_1X), _to_1x)
registry.register_converter(sorted(_VERSIONS_04X), _to_04x)
registry.register_converter(sorted(_VERSIONS_02X), _to_02x)
