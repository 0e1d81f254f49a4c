"""dhcp's configuration: the ``ipam`` object and the DHCP options it names
(Go's plugins/ipam/dhcp 1.1.1 keys; ``priority`` as Go 1.9)::

    ipam.type              "dhcp"
    ipam.daemonSocketPath  Go's daemon socket: accepted and not used (the
                           leases live in the cni-skel worker)
    ipam.request           [{"option": NAME|CODE, "skipDefault": bool}, ...]
                           options asked for (parameter request list, 55);
                           by default subnet-mask, routers,
                           domain-name-servers and domain-name; any
                           ``skipDefault: true`` drops those defaults
    ipam.provide           [{"option": NAME|CODE, "value": str,
                             "fromArg": CNI_ARGS key}, ...]
                           options sent to the server (a CNI_ARGS value
                           wins over ``value``); ``dhcp-client-identifier``
                           replaces the default client ID
    ipam.priority          metric of the result's routes (Go >= 1.5)
    ipam.timeout           seconds ADD waits for a lease (ours; Go: the
                           daemon's ``-timeout``), default 10

Option names are dhcp-options(5)'s (`OPTION_NAMES`) or a code 1-254 as a
string or number; anything else is code 7 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool

from cni_skel.config import IPAMConf, NetConf
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.model import CNIModel

__all__ = ["DEFAULT_REQUEST", "DEFAULT_TIMEOUT", "OPTION_NAMES", "DhcpConf", "DhcpIPAM",
           "ProvideOption", "RequestOption", "option_code", "provided_options",
           "requested_options"]

#: dhcp-options(5) names accepted for ``option`` (Go 1.1.1 knows the first
#: six), by code.
OPTION_NAMES = {
    "dhcp-client-identifier": 61,
    "subnet-mask": 1,
    "routers": 3,
    "host-name": 12,
    "user-class": 77,
    "vendor-class-identifier": 60,
    "domain-name-servers": 6,
    "domain-name": 15,
    "interface-mtu": 26,
    "broadcast-address": 28,
    "static-routes": 33,
    "ntp-servers": 42,
    "domain-search": 119,
    "classless-static-routes": 121,
}
#: Requested unless a ``request`` entry says ``skipDefault``: Go's two
#: (subnet mask, routers) and the DNS options the result reads.
DEFAULT_REQUEST = (1, 3, 6, 15)
#: Seconds ADD waits for the server's ACK.
DEFAULT_TIMEOUT = 10.0
# Options the client sets itself (message type, parameter list, lease
# times, server ID, requested address, maximum size): never provided.
_OWN = frozenset({50, 51, 53, 54, 55, 57, 58, 59})


def _null_to_list(value: Any) -> Any:
    return [] if value is None else value


class RequestOption(CNIModel):
    """One ``request`` entry."""

    option: str | int = ""
    skip_default: StrictBool = Field(False, alias="skipDefault")


class ProvideOption(CNIModel):
    """One ``provide`` entry."""

    option: str | int = ""
    value: str = ""
    from_arg: str = Field("", alias="fromArg")


class DhcpIPAM(IPAMConf):
    """The ``ipam`` object of dhcp."""

    daemon_socket_path: str = Field("", alias="daemonSocketPath")
    request: Annotated[list[RequestOption], BeforeValidator(_null_to_list)] = Field(
        default_factory=list)
    provide: Annotated[list[ProvideOption], BeforeValidator(_null_to_list)] = Field(
        default_factory=list)
    priority: int = Field(0, ge=0, le=0xFFFFFFFF)
    timeout: float = Field(DEFAULT_TIMEOUT, gt=0, le=600)


class DhcpConf(NetConf):
    """The config dhcp reads; ``ipam`` is required for ADD and CHECK."""

    ipam: DhcpIPAM | None = None  # type: ignore[assignment]


def option_code(option: str | int, key: str) -> int:
    """An ``option`` value as its code (1-254).

    Raises:
        CNIError: 7 naming ``key`` and the value, for a name not in
            `OPTION_NAMES` or a number outside 1-254 (0 and 255 are the
            pad and end markers; Go fails the same names later, with 999).
    """
    if isinstance(option, int) and not isinstance(option, bool):
        code = option
    elif isinstance(option, str) and option in OPTION_NAMES:
        return OPTION_NAMES[option]
    elif isinstance(option, str) and option.strip().isdigit():
        code = int(option)
    else:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"invalid network config: {key}: unknown DHCP option {option!r}",
                       f"a code 1-254 or one of {', '.join(sorted(OPTION_NAMES))}")
    if not 1 <= code <= 254:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"invalid network config: {key}: DHCP option code {code} out of "
                       f"range 1-254")
    return code


def requested_options(ipam: DhcpIPAM) -> list[int]:
    """The parameter request list: the ``request`` entries' codes, then
    `DEFAULT_REQUEST` unless an entry says ``skipDefault`` (Go's rule)."""
    codes: list[int] = []
    skip = False
    for i, entry in enumerate(ipam.request):
        skip = skip or entry.skip_default
        code = option_code(entry.option, f"ipam.request[{i}].option")
        if code not in codes:
            codes.append(code)
    if not skip:
        codes += [c for c in DEFAULT_REQUEST if c not in codes]
    return codes


def provided_options(ipam: DhcpIPAM, cni_args: str) -> dict[int, bytes]:
    """The options to send, ``{code: value}``: each entry's ``value``, or the
    CNI_ARGS value of its ``fromArg`` key when CNI_ARGS has one (Go reads
    CNI_ARGS as ``K=V;...`` pairs itself, unknown keys and all). An entry
    with neither is left out, as in Go.

    Raises:
        CNIError: 7 for an unknown option, a value over 255 bytes (naming
            the entry), or an option the client sets itself.
    """
    pairs: dict[str, str] = {}
    for pair in cni_args.split(";"):
        k, sep, v = pair.partition("=")
        if sep:
            pairs[k] = v
    out: dict[int, bytes] = {}
    for i, entry in enumerate(ipam.provide):
        key = f"ipam.provide[{i}]"
        code = option_code(entry.option, f"{key}.option")
        if code in _OWN:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid network config: {key}.option: option {code} is the "
                           f"DHCP client's own, not to be provided")
        value = pairs.get(entry.from_arg) if entry.from_arg else None
        if value is None:
            value = entry.value or None
        if value is None:
            continue
        data = value.encode()
        if len(data) > 255:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid network config: {key}: value too long for option "
                           f"{entry.option!r} ({len(data)} bytes, at most 255)")
        out[code] = data
    return out
