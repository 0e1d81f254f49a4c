"""Undo a failed ADD: `rollback` collects undo steps as ADD goes and runs
them only when ADD fails.

Source: CNI spec 1.1.0 section "ADD" (a plugin that fails must leave nothing
behind) and the Go plugins' ``defer func() { if !success { ... } }()`` in
``cmdAdd`` (bridge, ptp, ...). `cni_skel.invoke.ipam_add` registers the IPAM
DEL of a delegated ADD on the same stack.

    with rollback("bridge") as undo:
        host = create_veth(...)
        undo.callback("delete veth " + host.name, delete_link, ipr, host.name)
        ...                      # an exception here deletes the veth, then propagates
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

TYPE_CHECKING = False  # `cni_skel` imports this module: typing stays out of VERSION
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Any

__all__ = ["Rollback", "rollback"]


class Rollback:
    """The undo steps of one ADD, in the order they were registered (an
    `contextlib.ExitStack` that unwinds only on failure; see `rollback`)."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[..., Any], tuple, dict]] = []

    def callback(self, what: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Register ``fn(*args, **kwargs)`` to run if the ADD fails. ``what``
        names the step in the stderr line written when the step itself fails
        (unlike ``ExitStack.callback``, which takes no name)."""
        self._steps.append((what, fn, args, kwargs))

    def unwind(self, who: str, stderr: IO[str] | None = None) -> None:
        """Run every step, newest first, and forget them. A step that raises
        (any `Exception`) is reported on ``stderr`` (default sys.stderr) as
        ``"<who>: rollback: <what> failed: <error>"`` and the rest still run."""
        steps, self._steps = self._steps, []
        for what, fn, args, kwargs in reversed(steps):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # the ADD's own error is what goes out
                out = stderr if stderr is not None else sys.stderr
                out.write(f"{who}: rollback: {what} failed: {exc}\n")
                out.flush()

    def __len__(self) -> int:
        return len(self._steps)


@contextmanager
def rollback(who: str = "cni-skel", *, stderr: IO[str] | None = None) -> Iterator[Rollback]:
    """A `Rollback` for the block: when the block raises (any exception,
    BaseException included), its steps run in reverse (`Rollback.unwind`,
    failures reported on ``stderr`` prefixed with ``who``, the plugin's name)
    and the block's exception propagates unchanged; when the block
    completes, the steps are dropped and nothing is undone.

    Enter it inside the contexts its steps need (a netlink socket, a netns),
    so that they are still open while it unwinds.
    """
    undo = Rollback()
    try:
        yield undo
    except BaseException:
        undo.unwind(who, stderr)
        raise
