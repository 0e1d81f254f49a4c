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
    "NETNS_MAX",
    "CmdArgs",
    "hand_over_netns",
    "handed_netns_fd",
    "ifname_problem",
    "is_valid_name",
    "parse_cni_args",
    "parse_env",
    "show",
    "validate_cni_args_text",
    "validate_container_id",
    "validate_ifname",
    "validate_netns",
    "validate_network_name",
]

#: Verbs the skel dispatches.
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")

# Variable order is the Go skel's, so "missing" lists read the same.
_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
_REQUIRED: dict[str, frozenset[str]] = {
    "ADD": frozenset({"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"}),
    "CHECK": frozenset({"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"}),
    # The spec requires CNI_CONTAINERID and CNI_IFNAME; a DEL without them
    # names no attachment and succeeds (CmdArgs.identity_error).
    "DEL": frozenset(),
    "GC": frozenset({"CNI_PATH"}),
    "STATUS": frozenset(),
    "VERSION": frozenset(),
}

_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
IFNAMSIZ = 16
#: Longest CNI_NETNS, in bytes: PATH_MAX (4096) less the terminating NUL.
NETNS_MAX = 4095
# Lone surrogates: bytes that were not UTF-8 (surrogateescape). C0, DEL, C1.
_NOT_UTF8 = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SHOW_MAX = 200


# CNI_NETNS path -> an open fd on that namespace, handed over by a launcher.
_handed_netns: dict[str, int] = {}


def hand_over_netns(path: str, fd: int | None) -> None:
    """Serve CNI_NETNS value ``path`` from ``fd``, an open network namespace
    file the launcher passed (`cni_skel.warm.serving`), instead of resolving
    the path: `cni_skel.netns.NetNS.open` (and everything built on it) and the
    skel's same-namespace check then use the fd, so a worker in another mount
    namespace enters the pod's namespace while results and logs keep the
    path. The fd stays the caller's to close. ``fd`` None forgets ``path``.
    For the one request a worker child serves."""
    if fd is None:
        _handed_netns.pop(path, None)
    else:
        _handed_netns[path] = fd


def handed_netns_fd(path: str) -> int | None:
    """The fd `hand_over_netns` registered for ``path``, if any."""
    return _handed_netns.get(path)


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
        typed_args: CNI_ARGS parsed into the plugin's ``args_model`` (None
            when the plugin declares none); Go plugins parse ``args`` with
            ``types.LoadArgs`` themselves. ``cni_args`` is an old name of it.
        exec: the `cni_skel.invoke.Exec` delegated plugins run through (Go
            ``invoke.Exec``); None means `cni_skel.invoke.DEFAULT_EXEC`
            (each delegate its own process). Set by ``dispatch(exec=...)``.
    """

    __slots__ = ("args", "command", "container_id", "env", "exec", "ifname", "netns", "path",
                 "stdin_data", "typed_args")

    def __init__(self, command: str, container_id: str = "", netns: str = "", ifname: str = "",
                 args: str = "", path: str = "", stdin_data: bytes = b"",
                 env: Mapping[str, str] | None = None, typed_args: Any = None,
                 exec: Any = None) -> None:
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
        self.typed_args = typed_args
        self.exec = exec

    @property
    def cni_args(self) -> Any:
        """Deprecated since 0.2.0 (gone in 0.3.0): the old name of
        `typed_args`; warns (DeprecationWarning)."""
        from .compat import warn  # noqa: PLC0415 (env is on the VERSION path; warnings is not)

        warn("cni_skel.env.CmdArgs.cni_args")
        return self.typed_args

    def replace(self, **changes: Any) -> CmdArgs:
        """A copy with some attributes changed."""
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return CmdArgs(**values)

    def __repr__(self) -> str:
        return (f"CmdArgs(command={self.command!r}, container_id={self.container_id!r}, "
                f"netns={self.netns!r}, ifname={self.ifname!r}, args={self.args!r}, "
                f"path={self.path!r})")

    def identity_error(self) -> CNIError | None:
        """The code-4 error ADD answers for this container ID and ifname
        (missing, or breaking `validate_container_id` / the Go skel's ifname
        rule); None when both are valid. No plugin makes anything for such
        an attachment, so the skel answers its DEL with success, running no
        plugin code: a DEL that fails for good is retried forever. (An
        ifname with ``%``, which our ADD refuses but Go's accepted, still
        gets its DEL: see `ifname_problem`.)"""
        for name, value, rule in (("CNI_CONTAINERID", self.container_id, validate_container_id),
                                  ("CNI_IFNAME", self.ifname, _validate_go_ifname)):
            if not value:
                return CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                                f"required env variables [{name}] missing")
            try:
                rule(value)
            except CNIError as exc:
                return exc
        return None

    @property
    def path_list(self) -> list[str]:
        """CNI_PATH split into directories, empty entries dropped."""
        return [p for p in self.path.split(":") if p]


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return char.encode("unicode_escape").decode("ascii")


_ESCAPED = re.compile(f"{_NOT_UTF8.pattern}|{_CONTROL.pattern}")


def show(value: str) -> str:
    """``value`` for a message: bytes that were not UTF-8 as ``\\xff``,
    control characters as ``\\x01``, cut after 200 characters."""
    shown = _ESCAPED.sub(lambda m: _escape(m.group()), value[:_SHOW_MAX])
    if len(value) > _SHOW_MAX:
        shown += f"... ({len(value)} characters)"
    return shown


def _text_rule(what: str, value: str) -> None:
    # Shared by the rules of the variables that must be text.
    if _NOT_UTF8.search(value):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, f"{what} is not valid UTF-8",
                       show(value))
    if _CONTROL.search(value):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, f"{what} contains control characters",
                       show(value))


def _byte_len(value: str) -> int:
    # Length as the kernel sees it: a surrogate-escaped byte is one byte.
    try:
        return len(value.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a surrogate that was never a byte
        return len(value.encode("utf-8", "surrogatepass"))


def validate_container_id(container_id: str) -> None:
    """CNI_CONTAINERID rule: alphanumeric first, then ``[a-zA-Z0-9_.-]``, of
    any length (the spec and the Go skel set none; the kernel caps one
    environment string at 128 KiB). Whatever a plugin derives from the ID
    must hold any length: records store it whole, nftables tags and file
    names hash it when it would not fit.

    Raises:
        CNIError: code 4 ``invalid characters in containerID`` (details: the
            ID, escaped by `show`).
    """
    if not is_valid_name(container_id):
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "invalid characters in containerID",
                       show(container_id))


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


def _go_ifname_problem(name: str) -> tuple[str, str] | None:
    # The Go skel's rule (and text): what a DEL still accepts, since Go's
    # plugins may have made an attachment of a name ours refuse (a "%").
    if not name:
        return "interface name is empty", ""
    if _byte_len(name) > IFNAMSIZ - 1:
        return ("interface name is too long",
                f"interface name should be less than {IFNAMSIZ} characters")
    if name in (".", ".."):
        return "interface name is . or ..", ""
    if any(c in "/:" or c.isspace() for c in name):
        return "interface name contains / or : or whitespace characters", ""
    try:
        _text_rule("interface name", name)
    except CNIError as exc:
        return exc.msg, exc.details
    return None


def ifname_problem(name: str) -> tuple[str, str] | None:
    """Why the kernel would refuse ``name`` as an interface name, or make
    another name of it: ``(msg, details)``, or None for a good name. The one
    rule for CNI_IFNAME (`validate_ifname`, code 4) and every interface name
    a config gives (`cni_skel.config.IfName`, code 7) or a netlink helper
    creates.

    The kernel's ``dev_valid_name()`` (the Go skel's rule: 1-15 bytes, not
    ``.``/``..``, no ``/``, ``:`` or whitespace), and no ``%``: the kernel
    takes such a name as a template (``eth%d``) and picks a free name itself,
    so the link would not have the name the plugin asked for (ours; Go 1.1.1
    accepts it and leaves the link behind). Also text: UTF-8 without control
    characters (ours: the result names the interface in a JSON string).

    A DEL is held to the Go skel's rule only (`CmdArgs.identity_error`): an
    attachment named with ``%`` may have been made by Go's plugins, and its
    DEL must still release what they left.
    """
    problem = _go_ifname_problem(name)
    if problem is None and "%" in name:
        problem = ("interface name contains %",
                   f'the kernel would take "{show(name)}" as a name template and choose '
                   "another name")
    return problem


def validate_ifname(ifname: str) -> None:
    """CNI_IFNAME's rule: `ifname_problem` (the Go skel's messages).

    Raises:
        CNIError: code 4, with the Go skel's messages, or ``interface name
            contains %``, ``interface name is not valid UTF-8`` /
            ``interface name contains control characters``.
    """
    problem = ifname_problem(ifname)
    if problem is not None:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, *problem)


def _validate_go_ifname(ifname: str) -> None:
    problem = _go_ifname_problem(ifname)
    if problem is not None:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, *problem)


def validate_netns(netns: str) -> None:
    """CNI_NETNS rule (ours; the Go skel has none): text (UTF-8, no control
    characters) of at most `NETNS_MAX` bytes. Whether the path exists is the
    plugin's business (code 3 when it does not).

    Raises:
        CNIError: code 4 ``CNI_NETNS is not valid UTF-8`` / ``... contains
            control characters`` / ``... is too long``.
    """
    _text_rule("CNI_NETNS", netns)
    if _byte_len(netns) > NETNS_MAX:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, "CNI_NETNS is too long",
                       f"{_byte_len(netns)} bytes, at most {NETNS_MAX}")


def validate_cni_args_text(raw: str) -> None:
    """CNI_ARGS must be text (UTF-8, no control characters); its pairs are
    checked by `parse_cni_args` and the plugin's model.

    Raises:
        CNIError: code 4 ``CNI_ARGS is not valid UTF-8`` / ``CNI_ARGS
            contains control characters``.
    """
    _text_rule("CNI_ARGS", raw)


# ADD and CHECK hold every given variable to its rule. DEL holds none (see
# the module doc): a broken container ID or ifname is `CmdArgs.identity_error`,
# a broken CNI_NETNS or CNI_ARGS is taken as not given.
_RULES = {"CNI_CONTAINERID": validate_container_id, "CNI_NETNS": validate_netns,
          "CNI_IFNAME": validate_ifname, "CNI_ARGS": validate_cni_args_text}
_RULED = frozenset({"ADD", "CHECK"})
_DEL_DROPPED = frozenset({"CNI_NETNS", "CNI_ARGS"})


def parse_env(env: Mapping[str, str], stdin_data: bytes = b"") -> CmdArgs:
    """Validate the CNI_* variables for the verb in CNI_COMMAND.

    Mirrors the Go skel: walk the variables in order, fail on the first value
    that breaks its rule, then report every missing required one at once.
    DEL fails on nothing here: a CNI_NETNS or CNI_ARGS that ADD would refuse
    comes out as "" (not given), and a missing or broken container ID or
    ifname is left for the skel to see in `CmdArgs.identity_error`.

    Raises:
        CNIError: code 4 ``required env variables [A,B] missing``,
            ``unknown CNI_COMMAND: X``, or a rule of `validate_container_id`,
            `validate_ifname`, `validate_netns`, `validate_cni_args_text`.
    """
    cmd = env.get("CNI_COMMAND", "")
    required = _REQUIRED.get(cmd, frozenset())
    missing = []
    values = {}
    for name in _VARS:
        value = env.get(name, "")
        if not value:
            if name == "CNI_COMMAND" or name in required:
                missing.append(name)
        elif cmd in _RULED and name in _RULES:
            _RULES[name](value)
        elif cmd == "DEL" and name in _DEL_DROPPED:
            try:
                _RULES[name](value)
            except CNIError:
                value = ""
        values[name] = value
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
