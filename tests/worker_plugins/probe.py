"""``worker-probe``: reports the context it runs in, or misbehaves on purpose.

Config keys (besides NetConf's): ``mode`` (``probe``: write ``report`` as
JSON; ``sleep``: create ``marker`` then sleep ``seconds``; ``segv``: die of
SIGSEGV; ``exit``: os._exit(0) without answering; ``garble``: send junk on
every unix datagram socket it holds, i.e. the worker child's report channel,
then answer), ``report``, ``marker``,
``seconds``. ADD answers an empty result; the other verbs succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from cni_skel import NetConf, Plugin, Result


class ProbeConf(NetConf):
    mode: str = "probe"
    report: str = ""
    marker: str = ""
    seconds: float = 0.0


def _garble_reports() -> None:
    junk = [b"", b"accepted", b"accepted\0" + b"9" * 30, b"request\0only-two", b"\xff" * 9000,
            b"request\0" + b"x" * 5000 + b"\0ADD\0ref\0" + b"1.1.0", b"nonsense\0\0\0\0"]
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with sock:
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM:
                continue
            for msg in junk:
                with contextlib.suppress(OSError):
                    sock.send(msg)
            with contextlib.suppress(OSError):  # an fd with a report that wants none
                sock.sendmsg([b"request\0a\0b\0c\0d"],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                sock.fileno().to_bytes(4, sys.byteorder))])


def _ino(path: str) -> int:
    return os.stat(path).st_ino


class WorkerProbe(Plugin):
    name = "worker-probe"
    config_model = ProbeConf

    def add(self, args, conf):
        print("probe: to stdout, which must land on stderr")
        sys.stderr.write(f"probe: to stderr, container {args.container_id}\n")
        if conf.mode == "probe":
            mask = os.umask(0)
            os.umask(mask)
            with open(conf.report, "w") as fp:
                json.dump({"pid": os.getpid(), "cwd": os.getcwd(), "umask": mask,
                           "env": dict(os.environ), "netns": _ino("/proc/self/ns/net"),
                           "mntns": _ino("/proc/self/ns/mnt"),
                           "sys_class_net": sorted(os.listdir("/sys/class/net")),
                           "stdin_left": os.read(0, 100).decode(),
                           "ppid": os.getppid(), "status": Path("/proc/self/status").read_text()},
                          fp)
        elif conf.mode == "sleep":
            with open(conf.marker, "w") as fp:
                fp.write(str(os.getpid()))
            time.sleep(conf.seconds)
        elif conf.mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif conf.mode == "exit":
            os._exit(0)
        elif conf.mode == "garble":
            _garble_reports()
        return Result()

    def delete(self, args, conf):
        return None

    def check(self, args, conf):
        return None
