"""``worker-probe``: reports the context it runs in, or misbehaves on purpose.

Config keys (besides NetConf's): ``mode`` (``probe``: write ``report`` as
JSON; ``sleep``: create ``marker`` then sleep ``seconds``; ``segv``: die of
SIGSEGV; ``exit``: os._exit(0) without answering; ``garble``: send junk on
every unix datagram socket it holds, i.e. the worker child's report channel,
then answer; ``pollute``: write the pid to ``report``, then leave behind what
``pollute`` lists, see `POLLUTIONS`; ``dellink`` deletes a veth in the pod,
whose kernel end goes on in a thread after the answer), ``report``, ``marker``, ``seconds``,
``pollute``. ADD answers an empty result; the other verbs succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from cni_skel import NetConf, Plugin, Result, netlink
from cni_skel.netns import CLONE_NEWNET, NetNS, setns


class ProbeConf(NetConf):
    mode: str = "probe"
    report: str = ""
    marker: str = ""
    seconds: float = 0.0
    pollute: list[str] = []


_leaked: list = []  # what "pollute" keeps alive on purpose


def _pollute(what: str, netns: str) -> None:
    if what == "fd":
        _leaked.append(os.open(os.devnull, os.O_RDONLY))
    elif what == "cwd":
        os.chdir("/tmp")
    elif what == "umask":
        os.umask(0o077)
    elif what == "env":
        os.environ["CNSK_POLLUTED"] = "1"
        os.environ.pop("PATH", None)
    elif what == "netns":
        ns = NetNS.open(netns)
        setns(ns.fd, CLONE_NEWNET)  # and never back
        ns.close()
    elif what == "syspath":
        sys.path.insert(0, "/cnsk-polluted")
    elif what == "dellink":  # answered once unlisted: the kernel's end runs on in a thread
        with NetNS.open(netns) as ns, ns.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "cnskdl0", "cnskdl1")
            assert netlink.delete_link(ipr, "cnskdl0")
            assert netlink.find_link(ipr, "cnskdl1") is None
    elif what == "thread":
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    elif what == "signal":
        signal.signal(signal.SIGUSR2, lambda signum, frame: None)
    elif what == "raise":
        raise RuntimeError("probe raised on purpose")
    elif what == "exit":
        sys.exit(3)


#: What ``mode: pollute`` can leave behind.
POLLUTIONS = ("fd", "cwd", "umask", "env", "netns", "syspath", "dellink", "thread", "signal",
              "raise", "exit")


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
            fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
            with open(conf.report, "w") as fp:
                json.dump({"pid": os.getpid(), "cwd": os.getcwd(), "umask": mask, "fds": fds,
                           "threads": len(os.listdir("/proc/self/task")),
                           "sigusr2": repr(signal.getsignal(signal.SIGUSR2)),
                           "sys_path": sys.path,
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
        elif conf.mode == "pollute":
            with open(conf.report, "w") as fp:
                json.dump({"pid": os.getpid()}, fp)
            for what in conf.pollute:
                _pollute(what, args.netns)
        return Result()

    def delete(self, args, conf):
        return None

    def check(self, args, conf):
        return None
