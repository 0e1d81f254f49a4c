"""How the CLI reports failures: one message a shell user can act on, no
traceback, and the exit status the commands document."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click

from ..errors import CNIError
from ..runtime import describe_error

__all__ = ["EXIT_FAILURE", "EXIT_UNKNOWN", "CNICommandError", "reporting"]

#: Exit status of a failed command (cnitool's too).
EXIT_FAILURE = 1
#: Exit status of `status` and `validate` when they cannot tell: the plugins
#: were not asked (STATUS below 1.1.0), or a plugin's config was not checked.
EXIT_UNKNOWN = 3


class CNICommandError(click.ClickException):
    """A failure shown to a shell user as is (click prints ``Error: `` and
    the text on stderr, exit status 1): for a CNI error, the lines of
    `cni_skel.runtime.describe_error` (operation, plugin, code/msg/details,
    the tail of its stderr, a hint)."""

    exit_code = EXIT_FAILURE

    def __init__(self, text: str) -> None:
        super().__init__(text)

    @classmethod
    def of(cls, exc: Exception, *, operation: str = "", network: str = "", hint: str = "",
           head: str = "") -> CNICommandError:
        """``exc`` described by `describe_error` (same arguments)."""
        return cls(describe_error(exc, operation=operation, network=network, hint=hint,
                                  head=head))

    def format_message(self) -> str:
        return self.message


@contextlib.contextmanager
def reporting(operation: str = "", network: str = "", *, head: str = "") -> Iterator[None]:
    """Turn a `CNIError` raised in the block into a `CNICommandError`
    describing it (``ADD of network "net" failed ...``, or ``head``)."""
    try:
        yield
    except CNIError as exc:
        raise CNICommandError.of(exc, operation=operation, network=network, head=head) \
            from None
