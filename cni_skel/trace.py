"""Call trace: one JSON line per plugin invocation, for operators and tests.

Set ``CNI_SKEL_TRACE=/path/file.jsonl`` in the runtime's environment
(containerd, CRI-O, podman pass their whole environment to plugins) and every
call dispatched by the SDK appends one line::

    {"time": 1732170000.12, "pid": 4242, "plugin": "bridge",
     "command": "ADD", "containerID": "…", "netns": "…", "ifname": "eth0",
     "args": "K8S_POD_NAME=…;IgnoreUnknown=1", "path": "/opt/cni/bin",
     "config": {…the network config as received…}, "exit": 0,
     "result": {…stdout as JSON…}}

This answers "what did my runtime really send?" without a wrapper script
(compare ../shared/spec/runtime-captures.md). It is off unless the variable
is set; a trace that cannot be written never fails the call. Lines are
appended with one ``write`` on an ``O_APPEND`` descriptor, so parallel
plugins do not interleave. The file is created mode 0600: configs may hold
secrets.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

__all__ = ["TRACE_ENV", "record"]

TRACE_ENV = "CNI_SKEL_TRACE"


def _json_or_text(data: bytes) -> object:
    try:
        return json.loads(data) if data.strip() else None
    except (ValueError, UnicodeDecodeError):
        return data.decode("utf-8", "replace")


def record(plugin: str, env: Mapping[str, str], stdin_data: bytes, stdout: bytes,
           code: int) -> None:
    """Append one trace line for a finished call when ``CNI_SKEL_TRACE`` is
    set in ``env``; never raises."""
    path = env.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({
        "time": round(time.time(), 6),
        "pid": os.getpid(),
        "plugin": plugin,
        "command": env.get("CNI_COMMAND", ""),
        "containerID": env.get("CNI_CONTAINERID", ""),
        "netns": env.get("CNI_NETNS", ""),
        "ifname": env.get("CNI_IFNAME", ""),
        "args": env.get("CNI_ARGS", ""),
        "path": env.get("CNI_PATH", ""),
        "config": _json_or_text(stdin_data),
        "exit": code,
        "result": _json_or_text(stdout),
    }, separators=(",", ":")) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    except OSError:
        pass
    finally:
        os.close(fd)
