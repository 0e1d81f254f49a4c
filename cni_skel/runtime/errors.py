"""What running a network list can fail with, and how to say it to a person.

`NetworkNotFound`, `PluginError` and `GCError` are `cni_skel.errors.CNIError`
subclasses: each keeps the spec's code, msg and details (a plugin's own Error
object for `PluginError`) and adds what a runtime knows, such as which plugin
of which list failed. `describe_error` turns any of them into lines a shell
user can act on; the CLI and the demo print those.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ERR_INVALID_NETWORK_CONFIG, CNIError

__all__ = ["GCError", "NetworkNotFound", "PluginError", "describe_error", "error_hint"]

#: Lines of a failing plugin's stderr shown by `describe_error`.
_STDERR_TAIL = 8


class NetworkNotFound(CNIError):
    """No configuration file in the directory defines the network (code 7).

    Attributes:
        conf_dir: the directory searched.
        name: the network name asked for.
        found: network names that were found (for the message).
    """

    def __init__(self, conf_dir: str, name: str, found: Iterable[str] = (),
                 problems: Iterable[str] = ()) -> None:
        found = sorted(set(found))
        problems = list(problems)
        if not found and not problems:
            msg = f"no net configurations found in {conf_dir}"
        else:
            msg = f'no net configuration with name "{name}" in {conf_dir}'
        parts = []
        if found:
            parts.append("networks there: " + ", ".join(found))
        if problems:
            parts.append("files skipped: " + "; ".join(problems))
        super().__init__(ERR_INVALID_NETWORK_CONFIG, msg, "; ".join(parts))
        self.conf_dir = conf_dir
        self.name = name
        self.found = found


class PluginError(CNIError):
    """One plugin of a list failed. ``code``, ``msg``, ``details`` and
    ``stderr`` are the plugin's own (its Error object); the other attributes
    say which plugin it was.

    Attributes:
        network: the network (list) name.
        command: ``ADD``, ``CHECK``, ``DEL``, ``GC`` or ``STATUS``.
        plugin_type: the failing plugin's ``type``.
        index: its 1-based position in the list; ``count``: the list's length.
        cause: the `CNIError` as raised by the execution.
    """

    def __init__(self, cause: CNIError, *, network: str, command: str, plugin_type: str,
                 index: int, count: int) -> None:
        super().__init__(cause.code, cause.msg, cause.details, stderr=cause.stderr)
        self.cause = cause
        self.network = network
        self.command = command
        self.plugin_type = plugin_type
        self.index = index
        self.count = count

    def __str__(self) -> str:
        return (f'plugin type="{self.plugin_type}" ({self.index} of {self.count}) of network '
                f'"{self.network}" failed ({self.command}): {CNIError.__str__(self)}')


class GCError(CNIError):
    """GC went on past failures (spec: best effort) and some happened.

    ``code`` is the first failure's; ``errors`` holds them all (each a
    `PluginError` or a `CNIError` about a stale attachment's DEL).
    """

    def __init__(self, network: str, errors: list[CNIError]) -> None:
        super().__init__(errors[0].code, f'GC of network "{network}": {len(errors)} error(s)',
                         "; ".join(str(e) for e in errors))
        self.network = network
        self.errors = errors


def error_hint(exc: CNIError) -> str:
    """What a shell user can try about ``exc`` ("" when nothing useful):
    point NETCONFPATH or CNI_PATH elsewhere, compare versions with
    ``cni-skel validate``, retry (code 11), create the netns (code 3), wait
    for a plugin that is not ready (codes 50/51)."""
    text = f"{exc.msg} {exc.details}"
    if isinstance(exc, NetworkNotFound):
        return "point NETCONFPATH (or --conf-dir) at the directory holding the network's config"
    if "failed to find plugin" in text or "CNI_PATH is empty" in text:
        return "point CNI_PATH (or --cni-path) at the directory holding the plugin executables"
    if exc.code == 1:
        return ("the plugins and the config disagree on cniVersion: `cni-skel validate NETWORK` "
                "shows what each plugin supports")
    if exc.code == 11:
        return "the plugin timed out or asked to retry: try again later (or raise --timeout)"
    if exc.code == 3 and "netns" in text:
        return "the network namespace does not exist: create it first (ip netns add NAME)"
    if exc.code in (50, 51):
        return "the plugin reports it cannot serve ADD right now (see its message)"
    return ""


def describe_error(exc: Exception, *, operation: str = "", network: str = "",
                   hint: str = "", head: str = "") -> str:
    """``exc`` as lines a shell user can act on (no traceback).

    The first line says what failed: ``head``, or built from ``operation``
    and ``network`` (``ADD of network "net" failed``); for a `PluginError`
    it names the plugin and its place in the list. Then the code, msg and
    details; for a `PluginError` the last lines of the plugin's stderr; for
    a `GCError` each failure. Last, ``hint``, or `error_hint`'s when none is
    given.
    """
    if not head:
        head = f"{operation} of network \"{network}\" failed" if operation and network else \
            (f"{operation} failed" if operation else "failed")
    lines: list[str] = []
    if isinstance(exc, PluginError):
        lines.append(f"{head} in plugin \"{exc.plugin_type}\" "
                     f"({exc.index} of {exc.count} in the list)")
        lines.append(f"  code {exc.code}: {exc.msg}")
        if exc.details:
            lines.append(f"  details: {exc.details}")
        tail = [ln for ln in (exc.stderr or "").strip().splitlines() if ln.strip()]
        if tail:
            lines.append("  plugin stderr (last lines):")
            lines.extend(f"    | {ln}" for ln in tail[-_STDERR_TAIL:])
    elif isinstance(exc, GCError):
        lines.append(f"{head}: {len(exc.errors)} error(s), the rest was done")
        lines.extend(f"  - code {err.code}: {err}" for err in exc.errors)
    elif isinstance(exc, CNIError):
        lines.append(head)
        lines.append(f"  code {exc.code}: {exc.msg}")
        if exc.details:
            lines.append(f"  details: {exc.details}")
    else:
        lines.append(f"{head}: {exc}")
    if not hint and isinstance(exc, CNIError):
        hint = error_hint(exc)
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)
