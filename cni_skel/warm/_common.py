"""Where the worker's lines go, for its parent (`cni_skel.warm.pool`) and its
serving processes (`cni_skel.warm.serving`) alike: `LogSink` and ``_log``;
and `received_fds`, the descriptors a message brought.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys


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


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors in ``recvmsg``'s ancillary data (SCM_RIGHTS), in order."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(int.from_bytes(data[i:i + 4], sys.byteorder)
                       for i in range(0, len(data) - len(data) % 4, 4))
    return fds
