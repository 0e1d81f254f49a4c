"""The ``static`` IPAM plugin: the addresses the config (or the runtime)
names, handed out as they are; nothing is allocated or recorded.

A drop-in for the Go reference static (containernetworking/plugins,
plugins/ipam/static 1.1.1): same executable name, config keys, CNI_ARGS
keys, precedence between the address sources and error texts. The plugin
is `Static`; its config and `load_static` (Go's LoadIPAMConfig) are in
`.config`. Like every IPAM plugin it never enters CNI_NETNS and does no
netlink; it writes nothing on disk.
"""

from __future__ import annotations

from ipaddress import IPv6Address

from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.skel import Plugin
from cni_skel.types import IPAddress, IPConfig, Result, check_expressible

from .config import StaticArgs, StaticConf, load_static

__all__ = ["Static"]


def _v4(ip: IPAddress | None) -> IPAddress | None:
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _same_ip(a: IPAddress | None, b: IPAddress | None) -> bool:
    # Go's net.IP.Equal: an IPv4 address equals its IPv4-mapped IPv6 form.
    return _v4(a) == _v4(b)


class Static(Plugin):
    """static: ``ipam.addresses``, CNI_ARGS ``IP``/``GATEWAY``,
    ``args.cni.ips`` or ``runtimeConfig.ips`` as the result's ``ips``, with
    ``ipam.routes`` and ``ipam.dns`` (merging and precedence: see
    `cni_skel_plugins.static.config`).

    Error codes where Go answers 999 for all: 7 for the config (a missing
    ``ipam``, an address that is no CIDR, two addresses of a family at
    0.1.0/0.2.0: Go's texts; a value of the wrong type, a gateway that is no
    address: ours, naming the key), 4 for CNI_ARGS (an ``IP`` that is no
    CIDR, a ``GATEWAY`` that is no address: Go's texts; an unknown key), 7
    for CHECK without prevResult (Go's text). A result without any address
    at 0.1.0/0.2.0 is code 1 (the version cannot express it; Go: 999
    "cannot convert: no valid IP addresses").

    Also ours: an address entry's key ``Address`` (capitalised so) is its
    address, as every key matches case-insensitively (Go's decoder fills an
    internal field of that name and fails); GC and STATUS (1.1.0), which Go
    1.1.1 does not know.

    DEL, GC and STATUS: nothing held, nothing to do: they succeed (DEL
    whatever ``ipam``, ``runtimeConfig``, ``args`` and CNI_ARGS hold, as
    Go's reads nothing).
    """

    name = "static"
    config_model = StaticConf
    args_model = StaticArgs

    def add(self, args: CmdArgs, conf: StaticConf) -> Result:
        """The configured addresses as the IPAM result (Go's cmdAdd).

        Returns ``ips`` (address with its prefix length, host bits kept;
        gateway when one was given), ``routes``, ``dns``, in the config's
        version. Raises: see `Static`.
        """
        loaded = load_static(conf, args.typed_args)
        check_expressible(conf.cni_version, has_ip=bool(loaded.ips))
        return Result(cni_version=conf.cni_version, ips=loaded.ips, routes=loaded.routes,
                      dns=loaded.dns)

    def check(self, args: CmdArgs, conf: StaticConf) -> None:
        """Go's cmdCheck: the config loads as for ADD, there is a prevResult,
        and each configured address found in it (the first entry with that
        IP, prefix length not compared) has the configured gateway, when one
        is configured. An address prevResult lacks passes, as in Go.

        Raises:
            CNIError: as ADD for the config; 7 ``Required prevResult
                missing`` (Go: 999); 999 ``static: Failed to match addr A on
                interface IFNAME`` (Go's).
        """
        loaded = load_static(conf, args.typed_args)
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "Required prevResult missing")
        # the first prevResult entry of each address (Go's loop takes the
        # first match): one pass, not one per configured address
        first: dict[IPAddress | None, IPConfig] = {}
        for ip in prev.ips:
            first.setdefault(_v4(ip.address.ip), ip)
        for want in loaded.ips:
            got = first.get(_v4(want.address.ip))
            if got is None or want.gateway is None or _same_ip(want.gateway, got.gateway):
                continue
            raise CNIError(ERR_INTERNAL, f"static: Failed to match addr {got.address.ip} on "
                           f"interface {args.ifname}",
                           f"gateway {got.gateway or 'none'} in prevResult, "
                           f"{want.gateway} configured")

    def delete(self, args: CmdArgs, conf: StaticConf) -> None:
        """Nothing was allocated: nothing to release (Go's cmdDel)."""

    def gc(self, args: CmdArgs, conf: StaticConf) -> None:
        """Nothing is held between calls: nothing to collect."""

    def status(self, args: CmdArgs, conf: StaticConf) -> None:
        """Always ready: static needs nothing but its config."""

    def validate_config(self, args: CmdArgs, conf: StaticConf) -> None:
        """ADD's checks (`load_static`, the result's version), for ``cni-skel
        validate``."""
        loaded = load_static(conf, args.typed_args)
        check_expressible(conf.cni_version, has_ip=bool(loaded.ips))
