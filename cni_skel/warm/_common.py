"""Where the worker's lines go, for its parent (`cni_skel.warm.pool`) and its
serving processes (`cni_skel.warm.serving`) alike: `LogSink` and ``_log``.
"""

from __future__ import annotations

import contextlib
import os


class LogSink:
    """Where the worker's lines go: a copy of its stderr (the journal) and,
    with ``--log-file``, a file opened for appending; ``fds`` as opened."""

    def __init__(self, fds: tuple[int, ...]) -> None:
        self.fds = fds

    def write(self, line: str) -> None:
        data = line.encode("utf-8", "replace")
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.write(fd, data)


def _log(log: LogSink, cid: str, text: str) -> None:
    # One line each, the container ID first ("-" outside a request).
    log.write(f"cni-skel worker[{os.getpid()}]: {cid or '-'} {text}\n")
