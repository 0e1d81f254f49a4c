"""Warm worker mode: a pool of processes that run CNI plugins with the imports done.

``cni-skel worker`` imports the registered plugins and their heavy modules
(pyroute2, pydantic, the config and result models) once, listens on a unix
socket (its own, or the one systemd passes: `systemd_socket`), and keeps a
pool of forked serving processes (`Worker`, the parent; `WorkerChild`, each
process). A serving process answers one connection from a launcher
(`cni_skel.warm.client`, ``launcher.c``) at a time and runs the same
`cni_skel.skel.dispatch` as a one-shot executable, as if the runtime had
started it; then it puts its own state back (`ProcessBaseline`) and serves
the next.

Same machine, same user namespace, same PID namespace and same root as the
runtime are assumed; cgroups, rlimits, securebits and seccomp are the
worker's.

The worker is split by job, as prefork servers are; each module's docstring
tells its part:

* `cni_skel.warm.pool`: the parent, the arbiter of the pool (`Worker`): the
  listening socket (bound here, or systemd's), the warm-up before forking,
  forking, reaping and retiring serving processes, the run deadline and the
  answer for a process that ends without answering, the children's reports,
  metrics, idle exit and the drain on SIGTERM;
* `cni_skel.warm.serving`: a serving process (`WorkerChild`): reading a
  request, entering the caller's namespaces and process context,
  ``dispatch`` (a delegate this worker serves runs in the same process:
  `InProcessExec`), the answer and its log line, putting the process back
  after each call (`ProcessBaseline`), and its reports to the parent; it
  never imports the pool;
* `cni_skel.warm.caller`: who is served: the caller's credentials and
  capabilities, checked before anything of a request is acted on, and the
  drop to the caller's capability sets;
* ``cni_skel.warm._common``: where the log lines of both go (`LogSink`).

This module is the entry: `serve`, `check` and `describe`, and the names
other code takes from here (`Worker`, `WorkerChild`, `MAX_REQUESTS`...),
re-exported from where they live.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ._common import LogSink
from .client import ping
from .pool import LINGER as LINGER
from .pool import MAX_CHILDREN as MAX_CHILDREN
from .pool import (
    MOUNT_NAMESPACES,
    ChildState,
    Worker,
    default_max_processes,
    systemd_socket,
    writable_proc_sys,
)
from .protocol import DEFAULT_SOCKET
from .serving import MAX_REQUESTS as MAX_REQUESTS
from .serving import InProcessExec, WorkerChild
from .serving import ProcessBaseline as ProcessBaseline

__all__ = ["DEFAULT_SOCKET", "MOUNT_NAMESPACES", "ChildState", "InProcessExec", "LogSink", "Worker",
           "WorkerChild", "check", "default_max_processes", "describe", "held_lines", "serve",
           "systemd_socket",
           "writable_proc_sys"]


def serve(socket_path: str = DEFAULT_SOCKET, refs: list[str] | None = None,
          **options: Any) -> int:
    """Run a `Worker` in this process (``options``: its keyword arguments,
    see there); returns an exit status."""
    return Worker(socket_path, refs, **options).serve()


def check(socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> tuple[bool, str]:
    """Does a worker answer on ``socket_path``? ``(True, its description)``
    or ``(False, why not)``."""
    ok, text = ping(socket_path, timeout, held=True)
    return ok, describe(text) if ok else text


def describe(pong: str) -> str:
    """A worker's ping answer (`Worker.about`, JSON) in one line, then one
    line per service of its keeper and one per thing it holds (`held_lines`)."""
    try:
        about = json.loads(pong)
        held = held_lines(about)
        up = max(0, int(time.time() - about["started"]))
        versions = about["protocol"]
        return (f"cni-skel {about['version']}, pid {about['pid']}, up {up // 3600}h"
                f"{up // 60 % 60:02d}m{up % 60:02d}s, protocol {versions[0]}-{versions[-1]}, "
                f"{'systemd socket, ' if about['systemdSocket'] else ''}"
                f"mount namespace {about['mountNamespace']}"
                + (f", up to {about['maxProcesses']} serving processes"
                   if about.get("maxProcesses") else "")
                + "; plugins: "
                + ", ".join(ref.rpartition(":")[2] for ref in about["plugins"])
                + "".join("\n" + line for line in held))
    except (ValueError, KeyError, TypeError, IndexError):
        return pong


def held_lines(about: dict[str, Any]) -> list[str]:
    """What the keeper's services hold (a ping answer's ``held``: `Service.listing`
    by service), as indented lines: the count, then each item's fields as
    ``key=value`` (``expires``, a unix time, as seconds from now)."""
    held = about.get("held")
    if not isinstance(held, dict):
        return []
    lines = []
    for service, items in sorted(held.items()):
        if not isinstance(items, list):
            lines.append(f"  {service}: {items.get('error') if isinstance(items, dict) else items}")
            continue
        lines.append(f"  {service}: {len(items)} held")
        for item in items:
            parts = []
            for key, value in item.items() if isinstance(item, dict) else []:
                if key == "expires" and isinstance(value, (int, float)):
                    parts.append(f"expires in {int(value - time.time())} s")
                else:
                    parts.append(f"{key}={value}")
            lines.append("    " + " ".join(parts))
    return lines
