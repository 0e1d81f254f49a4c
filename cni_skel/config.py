"""Network configuration models: the plugin object a plugin gets on stdin.

Source: CNI spec 1.1.0 section "Plugin configuration objects" and
CONVENTIONS.md (``runtimeConfig``, ``args``, ``cni.dev/*``). A plugin
subclasses `NetConf` with its own keys (camelCase aliases); keys match
case-insensitively and unknown keys are kept and ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from . import compat
from .env import ifname_problem
from .errors import ERR_INVALID_NETWORK_CONFIG, ERR_UNSUPPORTED_FIELD, CNIError
from .model import CNIModel
from .tags import attachment_tag
from .types import DNS, Result, parse_result
from .types.convert import list_lengths

__all__ = [
    "PREV_RESULT_MAX_ENTRIES",
    "GCAttachment",
    "IPAMConf",
    "IPMasqBackend",
    "IfName",
    "NetConf",
    "config_error",
    "unsupported",
]

#: The most entries each list of a prevResult may hold: ``ips``, ``routes``,
#: ``interfaces``, ``dns.nameservers``, ``dns.search``, ``dns.options``
#: (0.1.0/0.2.0: ``ip4.routes`` and ``ip6.routes`` together). A real pod
#: carries a handful (an address or two per family, two or three
#: interfaces, a few routes; resolv.conf reads 3 nameservers, Kubernetes
#: allows 32 search domains); the bound keeps a plugin's work on its
#: prevResult (one kernel request per address, say) to seconds at worst.
#: See `NetConf`.
PREV_RESULT_MAX_ENTRIES = 1024


def _ifname(value: str) -> str:
    problem = ifname_problem(value)
    if problem is not None:
        msg, details = problem
        raise PydanticCustomError("cni_ifname", f"{msg}: {details}" if details else msg)
    return value


#: An interface name a config gives (a bridge, a master, a device): a
#: string that `cni_skel.env.ifname_problem` passes, so a name the kernel
#: would refuse or rewrite (``br%d``) is refused with code 7, naming the key
#: and the value, when the config is parsed: before any side effect.
IfName = Annotated[str, AfterValidator(_ifname)]

#: ``ipMasqBackend`` of Go's bridge and ptp (1.5.0+): None (the key absent)
#: or ``"nftables"``: this project's masquerade (`cni_skel.masq`, per-network
#: sets); ``"iptables"``: Go's chain per container (`cni_skel.gomasq`). Go
#: takes iptables when the key is absent; ours is the one deliberate
#: difference (docs/netfilter.md). Another value is code 7 naming the key.
IPMasqBackend = Literal["nftables", "iptables"] | None


class IPAMConf(CNIModel):
    """The ``ipam`` object: ``type`` names the IPAM plugin; the rest is its own."""

    type: str = ""


@dataclass(frozen=True)
class GCAttachment:
    """An attachment still in use (Go ``types.GCAttachment``): one entry of
    ``cni.dev/valid-attachments`` in a GC config, and what
    `cni_skel.runtime.Runtime.gc` is told to keep. Hashable: GC compares sets.
    """

    container_id: str
    ifname: str

    def to_dict(self) -> dict[str, str]:
        """The spec's ``{"containerID": ..., "ifname": ...}``."""
        return {"containerID": self.container_id, "ifname": self.ifname}

    @classmethod
    def from_value(cls, value: Any) -> GCAttachment:
        """From a `GCAttachment`, a ``(container_id, ifname)`` pair or the
        spec's object (keys matched case-insensitively, as Go's JSON does).

        Raises:
            ValueError: anything else (a config model turns it into code 7).
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            folded = {str(k).lower(): v for k, v in value.items()}
            cid, ifname = folded.get("containerid"), folded.get("ifname")
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            cid, ifname = value
        else:
            raise ValueError("an attachment is an object with containerID and ifname")
        if not isinstance(cid, str) or not isinstance(ifname, str):
            raise ValueError("containerID and ifname must be strings")
        return cls(cid, ifname)


def _attachment_list(value: Any) -> Any:
    # libcni sends Go's nil slice as null: an explicit null means "none".
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("expected a list of attachments")
    return [GCAttachment.from_value(item) for item in value]


_Attachments = Annotated[list[GCAttachment] | None, BeforeValidator(_attachment_list)]


class NetConf(CNIModel):
    """The plugin configuration object (Go ``types.NetConf``).

    ``prev_result`` is the ``prevResult`` of any spec version, already
    converted to the current (1.1.0) result model; its own ``cniVersion`` is
    used to parse it, the config's when it has none.

    Each list of a prevResult holds at most `PREV_RESULT_MAX_ENTRIES`
    (1024) entries: ``ips``, ``routes``, ``interfaces``,
    ``dns.nameservers``, ``dns.search``, ``dns.options``; in the 0.1.0 and
    0.2.0 shape ``ip4.routes`` and ``ip6.routes`` together. They are
    counted on the raw JSON before any model is built, so refusing a
    million entries costs no more than reading them. More is refused with
    `cni_skel.errors.ERR_INVALID_NETWORK_CONFIG` (7), ``invalid prevResult:
    20000 entries in "ips", more than the 1024 a prevResult may carry``.
    Why: a plugin does work per entry (a kernel or D-Bus request per
    address, a route to look up), so an absurd prevResult kept calls busy
    for minutes; no real pod comes near the bound (docs/limits.md). Go's
    plugins have no such bound (they take any prevResult).
    """

    cni_version: str = Field("0.1.0", alias="cniVersion")
    name: str
    type: str = ""
    capabilities: dict[str, bool] = Field(default_factory=dict)
    ipam: IPAMConf | None = None
    dns: DNS | None = None
    runtime_config: dict[str, Any] = Field(default_factory=dict, alias="runtimeConfig")
    args: dict[str, Any] = Field(default_factory=dict)
    prev_result: Result | None = Field(None, alias="prevResult")
    valid_attachments: _Attachments = Field(None, alias="cni.dev/valid-attachments")
    attachments: _Attachments = Field(None, alias="cni.dev/attachments")

    @field_validator("prev_result", mode="before")
    @classmethod
    def _parse_prev_result(cls, value: Any, info: Any) -> Any:
        if value is None or isinstance(value, Result):
            return value
        if not isinstance(value, dict):
            raise ValueError("prevResult must be a JSON object")
        version = info.data.get("cni_version") or None
        for keys, n in list_lengths(value, version):
            if n > PREV_RESULT_MAX_ENTRIES:
                where = " and ".join(f'"{k}"' for k in keys)
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               f"invalid prevResult: {n} entries in {where}, more than the "
                               f"{PREV_RESULT_MAX_ENTRIES} a prevResult may carry",
                               "cni_skel.config.PREV_RESULT_MAX_ENTRIES bounds each list of "
                               "a prevResult (docs/limits.md)")
        try:
            return parse_result(value, version)
        except CNIError as exc:
            # Not a ValueError: pydantic lets it through with its own code.
            raise CNIError(exc.code, f"invalid prevResult: {exc.msg}", exc.details) from None

    def attachment_list(self) -> list[GCAttachment] | None:
        """The attachments GC must keep: ``cni.dev/valid-attachments``, else
        libcni's ``cni.dev/attachments`` (an early spelling it still sends),
        else None (no list: a plugin should release nothing). An explicit
        ``null`` is an empty list."""
        if self.valid_attachments is not None:
            return self.valid_attachments
        return self.attachments

    def gc_keep(self) -> list[GCAttachment]:
        """The one GC rule every plugin follows: the attachments to keep
        (`attachment_list`); everything of this network not among them may
        be released.

        Raises:
            CNIError: code 7 when the config carries no list at all: a GC
                without one releases nothing rather than everything.
        """
        keep = self.attachment_list()
        if keep is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "GC needs cni.dev/valid-attachments",
                           "without the list of valid attachments nothing is released")
        return keep

    def gc_keep_tags(self) -> set[str]:
        """`gc_keep` as nftables attachment tags (`cni_skel.tags.attachment_tag`),
        for plugins whose entries carry them. Raises as `gc_keep`."""
        return {attachment_tag(a.container_id, a.ifname) for a in self.gc_keep()}


def unsupported(key: str, value: Any, why: str = "") -> PydanticCustomError:
    """Error to raise from a validator for a key/value the plugin does not
    implement: the skel turns it into spec code 2 naming the key and value."""
    text = f"unsupported value {value!r} for {key}"
    return PydanticCustomError("cni_unsupported", text + (f": {why}" if why else ""))


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(config)"


def config_error(exc: ValidationError, *, what: str = "network config") -> CNIError:
    """A pydantic ValidationError as a CNI error naming key paths and values.

    Code 2 when any error comes from `unsupported`, code 7 otherwise.
    """
    errors = exc.errors(include_url=False)
    code = ERR_INVALID_NETWORK_CONFIG
    parts = []
    for err in errors:
        if err["type"] == "cni_unsupported":
            code = ERR_UNSUPPORTED_FIELD
        if err["type"] == "missing":
            parts.append(f"{_loc(err['loc'])}: required key is missing")
            continue
        shown = repr(err["input"])
        if len(shown) > 120:
            shown = shown[:117] + "..."
        parts.append(f"{_loc(err['loc'])}: {err['msg']} (got {shown})")
    first = parts[0] if parts else str(exc)
    msg = (f"unsupported field in {what}: {first}" if code == ERR_UNSUPPORTED_FIELD
           else f"invalid {what}: {first}")
    return CNIError(code, msg, "; ".join(parts))


# Deprecated since 0.2.0 (gone in 0.3.0): 0.1.0's name of GCAttachment (it
# was a model built with containerID=; the dataclass takes container_id=).
__getattr__ = compat.module_getattr(__name__, {"ValidAttachment": lambda: GCAttachment})
