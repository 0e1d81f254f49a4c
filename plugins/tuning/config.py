"""tuning's configuration: the models stdin and CNI_ARGS are parsed into, and
`load_settings`, which applies Go's precedence rules and checks every sysctl
key before anything is touched.

Keys (matched case-insensitively like every CNI key)::

    sysctl      {"net.core.somaxconn": "500", "net/ipv4/conf/IFNAME/rp_filter": "2"}
    mac         "aa:bb:cc:dd:ee:ff" (or "-" separated)
    mtu         bytes; 0 or absent: unchanged
    promisc     true / false; absent: unchanged
    allmulti    true / false; absent: unchanged
    txQLen      packets (0 is a valid queue length); absent: unchanged
    dataDir     where the original values are saved, default /run/cni/tuning

MAC precedence (Go's parseConf): ``mac`` < CNI_ARGS ``MAC`` <
``runtimeConfig.mac`` (capability ``mac``) < ``args.cni.mac``. ``args.cni``
may also override ``sysctl`` (merged key by key), ``promisc``, ``mtu``,
``allmulti`` and ``txQLen``.

Values are typed as Go decodes them: strings must be strings, numbers
integers, booleans JSON booleans. A wrong type is code 7 naming the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from cni_skel.args import CNIArgs
from cni_skel.config import NetConf
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, ERR_IO_FAILURE, CNIError
from cni_skel.model import CNIModel

__all__ = [
    "ALLOWLIST_FILE",
    "DEFAULT_DATA_DIR",
    "Settings",
    "Sysctl",
    "TuningArgs",
    "TuningConf",
    "TuningConfArgs",
    "TuningRuntimeConfig",
    "check_allowed",
    "load_allowlist",
    "load_settings",
    "resolve_sysctl_key",
]

DEFAULT_DATA_DIR = "/run/cni/tuning"
ALLOWLIST_FILE = "/etc/cni/tuning/allowlist.conf"
#: Placeholder a sysctl key component may use for CNI_IFNAME.
IFNAME = "IFNAME"


# --- field types ---------------------------------------------------------------


def _mac(value: Any) -> Any:
    # "" means "not set", as Go's empty string does.
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("a MAC address must be a string")
    parts = value.replace("-", ":").split(":")
    try:
        if len(parts) != 6 or not all(len(p) == 2 for p in parts):
            raise ValueError
        octets = bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ValueError(f"invalid MAC address {value!r} (want aa:bb:cc:dd:ee:ff)") from None
    # The kernel refuses these on an Ethernet device (eth_validate_addr);
    # saying so here keeps a bad MAC from getting half-way through ADD.
    if octets[0] & 1:
        raise ValueError(f"{value!r} is a multicast MAC address")
    if not any(octets):
        raise ValueError(f"{value!r} is the all-zero MAC address")
    return ":".join(f"{b:02x}" for b in octets)


def _null_to_dict(value: Any) -> Any:
    return {} if value is None else value


#: A unicast 48-bit MAC address normalised to ``aa:bb:cc:dd:ee:ff``; "" is None.
Mac = Annotated[str | None, BeforeValidator(_mac)]
SysctlMap = Annotated[dict[str, StrictStr], BeforeValidator(_null_to_dict)]
Mtu = Annotated[StrictInt | None, Field(ge=0, le=2**31 - 1)]
TxQLen = Annotated[StrictInt | None, Field(ge=0, le=2**32 - 1)]


# --- models --------------------------------------------------------------------


class CNIOverrides(CNIModel):
    """``args.cni``: per-attachment overrides (Go's ``IPAMArgs``)."""

    sysctl: SysctlMap | None = None
    mac: Mac = None
    promisc: StrictBool | None = None
    mtu: Mtu = None
    allmulti: StrictBool | None = None
    tx_qlen: TxQLen = Field(None, alias="txQLen")


class TuningConfArgs(CNIModel):
    """The ``args`` object; only ``cni`` is ours."""

    cni: CNIOverrides | None = None


class TuningRuntimeConfig(CNIModel):
    """``runtimeConfig``: the ``mac`` capability."""

    mac: Mac = None


class TuningConf(NetConf):
    """The plugin object tuning receives (Go ``TuningConf``)."""

    sysctl: SysctlMap = Field(default_factory=dict)
    mac: Mac = None
    promisc: StrictBool | None = None
    mtu: Mtu = None
    allmulti: StrictBool | None = None
    tx_qlen: TxQLen = Field(None, alias="txQLen")
    data_dir: str = Field("", alias="dataDir")
    runtime_config: TuningRuntimeConfig = Field(default_factory=TuningRuntimeConfig,
                                                alias="runtimeConfig")
    args: TuningConfArgs = Field(default_factory=TuningConfArgs)


class TuningArgs(CNIArgs):
    """CNI_ARGS keys: ``MAC`` (Go's ``MacEnvArgs``); others need IgnoreUnknown."""

    mac: Mac = Field(None, alias="MAC")


# --- settings ------------------------------------------------------------------


@dataclass(frozen=True)
class Sysctl:
    """One sysctl to set: ``key`` as written, ``rel`` its file relative to
    /proc/sys (``/``-separated, IFNAME substituted), ``value`` as written."""

    key: str
    rel: str
    value: str


@dataclass
class Settings:
    """What ADD applies and CHECK compares, precedence already resolved.

    ``None`` (and an ``mtu`` of 0) means "leave as it is". ``mac_source``
    names where the MAC came from, for messages.
    """

    data_dir: str
    sysctls: list[Sysctl] = field(default_factory=list)
    mac: str | None = None
    mac_source: str = "mac"
    promisc: bool | None = None
    mtu: int | None = None
    allmulti: bool | None = None
    tx_qlen: int | None = None

    def link_changes(self) -> list[tuple[str, Any]]:
        """``(backup key, value)`` per link setting to apply, in Go's order
        (MAC, promisc, MTU, allmulti, txQLen)."""
        pairs = (("mac", self.mac), ("promisc", self.promisc), ("mtu", self.mtu),
                 ("allmulti", self.allmulti), ("txQLen", self.tx_qlen))
        return [(k, v) for k, v in pairs if v is not None]


def _bad(msg: str, details: str = "") -> CNIError:
    return CNIError(ERR_INVALID_NETWORK_CONFIG, f"tuning: {msg}", details)


def split_sysctl_key(key: str) -> list[str]:
    """The components of ``key``: split on ``/`` when it has one (so an
    interface name may contain dots), else on ``.``.

    Raises:
        CNIError: code 7 naming the key when it is empty, absolute, has NUL,
            an empty / ``.`` / ``..`` component, or is not under ``net``.
    """
    if not key or "\0" in key:
        raise _bad(f'invalid sysctl key "{key}": empty or contains NUL')
    if key.startswith("/"):
        raise _bad(f'invalid sysctl key "{key}": absolute paths are not allowed')
    parts = key.split("/") if "/" in key else key.split(".")
    if any(p in ("", ".", "..") for p in parts):
        raise _bad(f'invalid sysctl key "{key}": empty, "." or ".." path component')
    if parts[0] != "net":
        hint = '; a key containing "/" is split on "/" only' if "/" in key else ""
        raise _bad(f'invalid sysctl key "{key}": only net.* sysctls may be set',
                   f'first component is "{parts[0]}"{hint}')
    if len(parts) < 2:
        raise _bad(f'invalid sysctl key "{key}": names a directory, not a sysctl')
    return parts


def resolve_sysctl_key(key: str, ifname: str) -> str:
    """``key`` as a path relative to /proc/sys, components equal to
    ``IFNAME`` replaced by ``ifname``: ``net.ipv4.conf.IFNAME.rp_filter`` ->
    ``net/ipv4/conf/eth0/rp_filter``. Raises as `split_sysctl_key`."""
    return "/".join(ifname if p == IFNAME else p for p in split_sysctl_key(key))


def _merge_sysctls(base: dict[str, str], over: dict[str, str], ifname: str) -> list[Sysctl]:
    def resolve(items: dict[str, str], where: str) -> dict[str, Sysctl]:
        out: dict[str, Sysctl] = {}
        for key, value in items.items():
            rel = resolve_sysctl_key(key, ifname)
            if rel in out:
                raise _bad(f'duplicate sysctl in {where}: "{out[rel].key}" and "{key}" '
                           f'both name {rel}')
            out[rel] = Sysctl(key, rel, value)
        return out

    merged = resolve(base, "sysctl")
    # args.cni.sysctl replaces a configured key however it is spelled.
    merged.update(resolve(over, "args.cni.sysctl"))
    return list(merged.values())


class _Pairs(dict):
    """A decoded JSON object that remembers keys it saw twice."""

    dups: list[str]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs()
    obj.dups = []
    for key, value in pairs:
        if key in obj:
            obj.dups.append(key)
        obj[key] = value
    return obj


def _get_folded(obj: Any, name: str) -> Any:
    if not isinstance(obj, dict):
        return None
    if name in obj:
        return obj[name]
    return next((v for k, v in obj.items() if k.lower() == name.lower()), None)


def check_raw_duplicates(stdin_data: bytes) -> None:
    """Reject a ``sysctl`` object with the same key twice in the JSON text
    (Go's validateSysctlConflictingKeys), which json.loads would hide.

    Raises:
        CNIError: code 7 naming the key.
    """
    try:
        doc = json.loads(stdin_data, object_pairs_hook=_pairs_hook)
    except ValueError:
        return  # the skel already decoded it; nothing more to learn here
    for where, obj in (("sysctl", _get_folded(doc, "sysctl")),
                       ("args.cni.sysctl",
                        _get_folded(_get_folded(_get_folded(doc, "args"), "cni"), "sysctl"))):
        if isinstance(obj, _Pairs) and obj.dups:
            raise _bad(f'duplicate sysctl key "{obj.dups[0]}" in {where}')


def load_settings(args: CmdArgs, conf: TuningConf) -> Settings:
    """Resolve precedence and every sysctl key (nothing is read or written).

    Raises:
        CNIError: code 7 for an invalid or duplicated sysctl key (naming it).
    """
    check_raw_duplicates(args.stdin_data)
    over = conf.args.cni or CNIOverrides()
    s = Settings(data_dir=conf.data_dir or DEFAULT_DATA_DIR)
    s.sysctls = _merge_sysctls(conf.sysctl, over.sysctl or {}, args.ifname)
    for source, mac in (("mac", conf.mac),
                        ("CNI_ARGS MAC", getattr(args.typed_args, "mac", None)),
                        ("runtimeConfig.mac", conf.runtime_config.mac),
                        ("args.cni.mac", over.mac)):
        if mac is not None:
            s.mac, s.mac_source = mac, source
    s.promisc = over.promisc if over.promisc is not None else conf.promisc
    mtu = over.mtu if over.mtu is not None else conf.mtu
    s.mtu = mtu or None  # Go: 0 means "not set"
    s.allmulti = over.allmulti if over.allmulti is not None else conf.allmulti
    s.tx_qlen = over.tx_qlen if over.tx_qlen is not None else conf.tx_qlen
    return s


# --- allowlist -----------------------------------------------------------------


def load_allowlist(path: str = ALLOWLIST_FILE) -> list[re.Pattern[str]] | None:
    """The allowlist's patterns (one regex a line; blank lines and lines
    starting with ``#`` skipped), or None when the file does not exist.

    Raises:
        CNIError: code 5 when it exists but cannot be read; code 7 naming
            the line for an invalid regex (we fail closed either way).
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            lines = fp.read().splitlines()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"tuning: cannot read sysctl allowlist {path}: "
                       f"{exc.strerror or exc}") from None
    patterns = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            patterns.append(re.compile(line))
        except re.error as exc:
            raise _bad(f"invalid regex on line {n} of sysctl allowlist {path}: {exc}",
                       line) from None
    return patterns


def check_allowed(sysctls: list[Sysctl], patterns: list[re.Pattern[str]],
                  path: str = ALLOWLIST_FILE) -> None:
    """Every sysctl must match a pattern (``re.search``, Go's MatchString)
    against the key as written or, when no component holds a dot, its
    dotted spelling (``net/core/x`` -> ``net.core.x``; IFNAME kept).

    Raises:
        CNIError: code 7 naming the first key no pattern allows.
    """
    for item in sysctls:
        parts = split_sysctl_key(item.key)
        names = [item.key]
        if not any("." in p for p in parts):
            names.append(".".join(parts))
        if not any(p.search(n) for p in patterns for n in names):
            raise _bad(f'sysctl "{item.key}" is not allowed by {path}',
                       "allowed: " + (" ".join(p.pattern for p in patterns) or "(nothing)"))
