"""Deprecated names: one table, one way to warn.

Every public name of an earlier release that moved, was renamed or went away
is listed in `DEPRECATED` with what replaces it, the release that deprecated
it and the first release that may remove it (docs/stability.md: at least one
minor release of warnings). The aliases themselves live where the old name
did (a module ``__getattr__``, a property, a method) and call `warn`, so the
warning points at the line of the plugin author's code that used the name.

Internal: plugin authors never import this module; the API snapshot
(``make api``) lists the table beside the public surface.
"""

from __future__ import annotations

import warnings

TYPE_CHECKING = False  # skel imports this only for a class that sets `verbs`
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["DEPRECATED", "message", "module_getattr", "removed", "warn"]

#: Old dotted name -> (replacement, deprecated in, removed in). A name whose
#: alias cannot work says so in its replacement text and raises (`removed`).
DEPRECATED: dict[str, tuple[str, str, str]] = {
    "cni_skel.skel.Plugin.verbs": (
        "methods add/check/delete/gc/status/validate_config defined on the Plugin subclass",
        "0.2.0", "0.3.0"),
    "cni_skel.ipam_add_guard": (
        "cni_skel.rollback() with cni_skel.ipam_add(undo, ...)", "0.2.0", "0.3.0"),
    "cni_skel.invoke.ipam_add_guard": (
        "cni_skel.rollback() with cni_skel.invoke.ipam_add(undo, ...)", "0.2.0", "0.3.0"),
    "cni_skel.invoke.set_in_process_runner": (
        "no alias can work: pass an Exec to dispatch(exec=...) or "
        "Runtime(exec=...); a plugin delegates through args.exec", "0.2.0", "0.2.0"),
    "cni_skel.netlink.Link.__getitem__": (
        "attribute access on the Link (link.mac, link.mtu, link.peer_index for 'link')",
        "0.2.0", "0.3.0"),
    "cni_skel.netlink.Link.get": (
        "attribute access on the Link (link.mac, link.mtu, link.peer_index for 'link')",
        "0.2.0", "0.3.0"),
    "cni_skel.env.CmdArgs.cni_args": ("cni_skel.env.CmdArgs.typed_args", "0.2.0", "0.3.0"),
    "cni_skel.config.ValidAttachment": ("cni_skel.config.GCAttachment", "0.2.0", "0.3.0"),
    "cni_skel.runtime.RuntimeConf.cni_args": ("cni_skel.runtime.RuntimeConf.args_string()",
                                              "0.2.0", "0.3.0"),
    "cni_skel.runtime.NetworkAttachment.cni_args": ("cni_skel.runtime.NetworkAttachment.args",
                                                    "0.2.0", "0.3.0"),
    "cni_skel.install": ("cni_skel.cli.write_executable and cni_skel.cli.plugin_registry "
                         "(the module moved to cni_skel.warm.install, which is internal)",
                         "0.2.0", "0.3.0"),
    "cni_skel.worker": ("the cni-skel worker command (the module moved to "
                        "cni_skel.warm.server, which is internal)", "0.2.0", "0.3.0"),
}


def message(name: str) -> str:
    """The warning text for ``name`` (a key of `DEPRECATED`)."""
    replacement, since, until = DEPRECATED[name]
    if since == until:
        return f"{name} was removed in cni-skel {since}: {replacement}"
    return (f"{name} is deprecated since cni-skel {since} and goes away in {until}: "
            f"use {replacement}")


def warn(name: str, stacklevel: int = 2) -> None:
    """Emit the `DeprecationWarning` for ``name`` (a key of `DEPRECATED`).

    ``stacklevel`` as `warnings.warn`, counted from the caller of `warn`
    (2: the line that called the function that calls this)."""
    warnings.warn(message(name), DeprecationWarning, stacklevel=stacklevel + 1)


def removed(name: str) -> Callable[..., Any]:
    """A stand-in for a name no alias can serve: calling it raises
    `RuntimeError` with `message` (which names the replacement)."""

    def gone(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(message(name))

    gone.__name__ = name.rpartition(".")[2]
    gone.__doc__ = message(name)
    return gone


def module_getattr(module: str, aliases: dict[str, Callable[[], Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) serving the deprecated names of
    ``module``: ``aliases`` maps each old name to a function returning its
    value. Each access warns (pointing at the accessing line) and returns
    the value; any other name raises AttributeError as usual."""

    def __getattr__(name: str) -> Any:
        make = aliases.get(name)
        if make is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn(f"{module}.{name}" if f"{module}.{name}" in DEPRECATED else module)
        return make()

    return __getattr__
