"""``worker-probe``: reports the context it runs in, or misbehaves on purpose.

Config keys (besides NetConf's): ``mode`` (``probe``: write ``report`` as
JSON; ``sleep``: create ``marker`` then sleep ``seconds``; ``segv``: die of
SIGSEGV; ``exit``: os._exit(0) without answering), ``report``, ``marker``,
``seconds``. ADD answers an empty result; the other verbs succeed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from cni_skel import NetConf, Plugin, Result


class ProbeConf(NetConf):
    mode: str = "probe"
    report: str = ""
    marker: str = ""
    seconds: float = 0.0


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
                           "stdin_left": os.read(0, 100).decode()}, fp)
        elif conf.mode == "sleep":
            with open(conf.marker, "w") as fp:
                fp.write(str(os.getpid()))
            time.sleep(conf.seconds)
        elif conf.mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif conf.mode == "exit":
            os._exit(0)
        return Result()

    def delete(self, args, conf):
        return None

    def check(self, args, conf):
        return None
