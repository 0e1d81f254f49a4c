"""What ``cni-skel doctor`` says about a node: how its plugins run (warm via
systemd, warm in a DaemonSet, warm by hand, one-shot), the worker behind
the launchers' socket (version, uptime), the fallback policy, the launchers'
and the worker's versions, and the one-shot fallbacks launchers logged.

`diagnose` gathers it (no click, no side effects beyond a ping, which starts
a socket-activated worker as any call would).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .. import __version__
from .client import ping
from .install import SERVICE_UNIT, SOCKET_UNIT, launcher_info
from .protocol import FALLBACK_NONE, PROTOCOL_VERSION, fallback_log
from .server import describe

__all__ = ["Diagnosis", "diagnose"]


@dataclass
class Diagnosis:
    """``lines``: the report, for people; ``problems``: what needs a fix
    (empty: healthy); ``mode``: "warm (systemd)", "warm (DaemonSet)",
    "warm", "one-shot" or "down"."""

    mode: str = "down"
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _fallback_lines(socket_path: str) -> list[str]:
    try:
        with open(fallback_log(socket_path), "rb") as fp:
            lines = fp.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines


def diagnose(bin_dir: str, names: list[str], systemd_dir: str, timeout: float = 5.0
             ) -> Diagnosis:
    """Look at the executables ``names`` in ``bin_dir``, the worker their
    launchers name, and the units in ``systemd_dir``."""
    d = Diagnosis()
    infos = {}
    d.lines.append(f"launchers in {bin_dir}:")
    for name in names:
        path = os.path.join(bin_dir, name)
        info = launcher_info(path)
        if info is None:
            what = "missing" if not os.path.lexists(path) else "not a cni-skel launcher " \
                                                              "(one-shot script or another plugin)"
            d.lines.append(f"  {name:<12} {what}")
            continue
        infos[name] = info
        d.lines.append(f"  {name:<12} {info['kind']}, fallback {info['fallback']}, protocol "
                       f"{info['protocol']}, cni-skel {info['version'] or '(older)'}, "
                       f"socket {info['socket']}")
        if info["fallback"] != FALLBACK_NONE and not os.access(info["python"], os.X_OK):
            d.problems.append(f"{name}: its one-shot interpreter {info['python']} is missing: "
                              "run `cni-skel install` again")
    sockets = sorted({i["socket"] for i in infos.values()})
    if len(sockets) > 1:
        d.problems.append(f"launchers name different sockets: {', '.join(sockets)}")
    units = [u for u in (SOCKET_UNIT, SERVICE_UNIT)
             if os.path.exists(os.path.join(systemd_dir, u))]
    d.lines.append(f"systemd units in {systemd_dir}: {', '.join(units) or 'none'}")
    fallback_none = any(i["fallback"] == FALLBACK_NONE for i in infos.values())
    for sock in sockets:
        fallbacks = _fallback_lines(sock)
        if fallbacks:
            d.lines.append(f"one-shot fallbacks logged: {len(fallbacks)}; last: {fallbacks[-1]}")
        ok, text = ping(sock, timeout, held=True)
        if not ok:
            d.lines.append(f"worker on {sock}: not answering ({text})")
            if fallback_none:
                d.problems.append(f"no worker answers on {sock} and launchers have fallback "
                                  "none: every call answers code 11")
            else:
                d.mode = "one-shot"
                d.problems.append(f"no worker answers on {sock}: every call runs one-shot "
                                  "(~10x slower); start it (systemctl start "
                                  f"{SOCKET_UNIT}, or the DaemonSet)")
            continue
        d.lines.append(f"worker on {sock}: {describe(text)}")
        try:
            about = json.loads(text)
        except ValueError:
            about = {}
        if about.get("systemdSocket"):
            d.mode = "warm (systemd)"
        elif about.get("mountNamespace") == "own":
            d.mode = "warm (DaemonSet)"
        else:
            d.mode = "warm"
        served = about.get("protocol", [])
        for name, info in infos.items():
            if info["socket"] == sock and int(info["protocol"]) not in served:
                d.problems.append(f"{name}: launcher protocol {info['protocol']} is not served "
                                  f"by the worker ({served}): run `cni-skel install` again")
        versions = {i["version"] for i in infos.values() if i["socket"] == sock}
        if about.get("version") and versions - {about["version"]}:
            d.lines.append(f"note: launchers from cni-skel {', '.join(sorted(versions))}, "
                           f"worker {about['version']}")
    d.lines.insert(0, f"cni-skel {__version__} (launcher protocol {PROTOCOL_VERSION}); "
                      f"mode: {d.mode}")
    return d
