"""The CNI_* environment: validation per verb and the CmdArgs a handler gets.

Source: CNI spec 1.1.0 section "Parameters" (what each verb requires) and the
Go skel (pkg/skel, pkg/utils: validation rules, error codes and texts). We
require what the spec table requires; the Go skel also requires CNI_PATH for
ADD/CHECK/DEL/STATUS, which we accept but do not insist on. Stdlib only: the
VERSION verb passes through here.
"""

from __future__ import annotations

import re

from .errors import (
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    CNIError,
)

TYPE_CHECKING = False  # not from typing: keep the VERSION path's imports minimal
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


__all__ = [
    "COMMANDS",
    "CmdArgs",
    "is_valid_name",
    "parse_cni_args",
    "parse_env",
    "validate_container_id",
    "validate_ifname",
    "validate_network_name",
]

#: Verbs the skel dispatches.
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")

# Variable order is the Go skel's, so "missing" lists read the same.
_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
_REQUIRED: dict[str, frozenset[str]] = {
    "ADD": frozenset({"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"}),
    "CHECK": frozenset({"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"}),
    "DEL": frozenset({"CNI_CONTAINERID", "CNI_IFNAME"}),
    "GC": frozenset({"CNI_PATH"}),
    "STATUS": frozenset(),
    "VERSION": frozenset(),
}

_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
IFNAMSIZ = 16


def is_valid_name(name: str) -> bool:
    """The spec's rule for container IDs and network names: alphanumeric
    first, then ``[a-zA-Z0-9_.-]``. Such a name is always a single, safe path
    component (no ``/``, never ``.`` or ``..``)."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


class CmdArgs:
    """What a plugin handler is called with (Go ``skel.CmdArgs``).

    Attributes:
        command: the verb (``ADD``, ``DEL``, ``CHECK``, ``STATUS``, ``GC``).
        container_id: CNI_CONTAINERID ("" for STATUS/GC).
        netns: CNI_NETNS, a path ("" when not given, e.g. a DEL after the
            sandbox is gone).
        ifname: CNI_IFNAME.
        args: CNI_ARGS as given (``K1=V1;K2=V2``).
        path: CNI_PATH as given (``:``-separated directories).
        stdin_data: the raw config bytes, as a delegated plugin must receive them.
        env: the whole environment the plugin was started with; delegated
            plugins inherit it with CNI_COMMAND replaced.
        cni_args: CNI_ARGS parsed into the plugin's ``args_model`` (None when
            the plugin declares none).
    """

    __slots__ = ("args", "cni_args", "command", "container_id", "env", "ifname", "netns", "path",
                 "stdin_data")

    def __init__(self, command: str, container_id: str = "", netns: str = "", ifname: str = "",
                 args: str = "", path: str = "", stdin_data: bytes = b"",
                 env: Mapping[str, str] | None = None, cni_args: Any = None) -> None:
        # A plain class, not a dataclass: importing dataclasses costs ~5 ms
        # on every VERSION call.
        self.command = command
        self.container_id = container_id
        self.netns = netns
        self.ifname = ifname
        self.args = args
        self.path = path
        self.stdin_data = stdin_data
        self.env = env if env is not None else {}
        self.cni_args = cni_args

    def replace(self, **changes: Any) -> CmdArgs:
        """A copy with some attributes changed."""
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return CmdArgs(**values)

    def __repr__(self) -> str:
        return (f"CmdArgs(command={self.command!r}, container_id={self.container_id!r}, "
                f"netns={self.netns!r}, ifname={self.ifname!r}, args={self.args!r}, "
                f"path={self.path!r})")

    @property
    def path_list(self) -> list[str]:
        """CNI_PATH split into directories, empty entries dropped."""
        return [p for p in self.path.split(":") if p]


def validate_container_id(container_id: str) -> None:
    """CNI_CONTAINERID rule: alphanumeric first, then ``[a-zA-Z0-9_.-]``.

    Raises:
        CNIError: code 4 ``invalid characters in containerID`` (details: the ID).
    """
    if not is_valid_name(container_id):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "invalid characters in containerID",
                       container_id)


def validate_network_name(name: str) -> None:
    """Network name rule (same charset as container IDs).

    Raises:
        CNIError: code 7 ``missing network name`` /
            ``invalid characters found in network name`` (details: the name).
    """
    if not name:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "missing network name")
    if not is_valid_name(name):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "invalid characters found in network name",
                       name)


def validate_ifname(ifname: str) -> None:
    """Linux interface name rule: 1-15 bytes, not ``.``/``..``, no ``/``, ``:`` or space.

    Raises:
        CNIError: code 4, with the Go skel's messages.
    """
    if not ifname:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "interface name is empty")
    if len(ifname.encode("utf-8", "surrogateescape")) > IFNAMSIZ - 1:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "interface name is too long",
                       f"interface name should be less than {IFNAMSIZ} characters")
    if ifname in (".", ".."):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "interface name is . or ..")
    if any(c in "/:" or c.isspace() for c in ifname):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                       "interface name contains / or : or whitespace characters")


_VALIDATORS = {"CNI_CONTAINERID": validate_container_id, "CNI_IFNAME": validate_ifname}


def parse_env(env: Mapping[str, str], stdin_data: bytes = b"") -> CmdArgs:
    """Validate the CNI_* variables for the verb in CNI_COMMAND.

    Mirrors the Go skel: walk the variables in order, fail on the first value
    that breaks its rule, then report every missing required one at once.

    Raises:
        CNIError: code 4 ``required env variables [A,B] missing``,
            ``unknown CNI_COMMAND: X``, or a container ID / ifname rule.
    """
    cmd = env.get("CNI_COMMAND", "")
    required = _REQUIRED.get(cmd, frozenset())
    missing = []
    values = {}
    for name in _VARS:
        value = env.get(name, "")
        values[name] = value
        if not value:
            if name == "CNI_COMMAND" or name in required:
                missing.append(name)
        elif name in required and name in _VALIDATORS:
            _VALIDATORS[name](value)
    if missing:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                       f"required env variables [{','.join(missing)}] missing")
    if cmd not in COMMANDS:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, f"unknown CNI_COMMAND: {cmd}")
    return CmdArgs(
        command=cmd,
        container_id=values["CNI_CONTAINERID"],
        netns=values["CNI_NETNS"],
        ifname=values["CNI_IFNAME"],
        args=values["CNI_ARGS"],
        path=values["CNI_PATH"],
        stdin_data=stdin_data,
        env=env,
    )


def parse_cni_args(raw: str) -> list[tuple[str, str]]:
    """Split CNI_ARGS ``K1=V1;K2=V2`` into pairs, in order.

    As the Go ``types.LoadArgs``: an empty string is no pairs; every pair must
    have exactly one ``=`` (so ``A=b=c`` and a trailing ``;`` are errors).

    Raises:
        CNIError: code 4 ``CNI_ARGS: invalid pair "X"``.
    """
    if not raw:
        return []
    pairs = []
    for pair in raw.split(";"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, f'CNI_ARGS: invalid pair "{pair}"',
                           "CNI_ARGS must be K1=V1;K2=V2")
        pairs.append((parts[0], parts[1]))
    return pairs
