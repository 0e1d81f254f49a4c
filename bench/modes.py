"""Implementations under test ("modes"). Each gets its own node namespace.

A mode installs its plugins into a bin dir and turns one CNI call into a
request for the node agent (`bench.node`). Adding a mode is one class here
plus an entry in MODES:

  go       Debian's Go reference plugins (/usr/lib/cni), one process per call
  oneshot  ours as `cni-skel install` writes them by default (launchers) with
           no worker running: each call answers VERSION in the launcher, or
           runs the plugin in the launcher's process (one process per call).
           This is what a node gets without `cni-skel worker`.
  script   ours as `cni-skel install --one-shot` writes them: plain scripts
           that always import the SDK (VERSION included)
  inproc   ours, `cni_skel.skel.dispatch` called in the agent process: the
           plugin's work without interpreter start-up and imports
  warm     ours as `cni-skel install` sets up a node by default: the same
           launchers, and the worker's systemd units run as systemd runs
           them (cni_skel.harness.SocketActivation: the unit's ExecStart,
           started by the first call); skipped with ModeUnavailable when the
           installed cni_skel has no worker
"""

from __future__ import annotations

import inspect
import os
import subprocess
import time

from cni_skel.harness import SocketActivation
from cni_skel.warm.client import ping
from cni_skel.warm.install import plugin_registry, write_executable

GO_BIN = "/usr/lib/cni"
PLUGINS = ("bridge", "host-local", "loopback", "portmap", "tuning")


class ModeUnavailable(Exception):
    """This mode cannot run here; the message says why."""


class Mode:
    key = ""
    label = ""
    #: whether wait4 rusage (peak RSS) describes the plugin (process per call)
    per_process = True

    def __init__(self) -> None:
        self.bin_dir = ""
        self.node = None  # bench.run.Node, set by the runner

    @property
    def cni_path(self) -> str:
        return self.bin_dir

    def install(self, work_dir: str) -> None:
        raise NotImplementedError

    def request(self, plugin: str, env: dict[str, str], stdin: str) -> dict:
        """The node-agent request for one call."""
        return {"op": "exec", "argv": [os.path.join(self.bin_dir, plugin)], "env": env,
                "stdin": stdin}

    def close(self) -> None:
        """Stop whatever install() started."""

    def helper_cpu(self) -> float:
        """CPU seconds used so far by long-lived helpers of this mode that
        wait4 on the plugin process does not see (0: none)."""
        return 0.0


class GoMode(Mode):
    key, label = "go", "Go 1.1.1"

    def install(self, work_dir: str) -> None:
        missing = [p for p in PLUGINS if not os.access(os.path.join(GO_BIN, p), os.X_OK)]
        if missing:
            raise ModeUnavailable(f"Go plugins missing in {GO_BIN}: {', '.join(missing)} "
                                  "(apt-get install containernetworking-plugins)")
        self.bin_dir = GO_BIN


class OneShotMode(Mode):
    """The default install (launchers) with no worker: the socket they try is
    one nothing listens on (never the node's /run/cni-skel/worker.sock, where
    a real worker may run), so every call other than VERSION falls back to
    running the plugin in the launcher's process."""

    key, label = "oneshot", "ours (launchers, no worker)"

    def install(self, work_dir: str) -> None:
        self.refs = plugin_registry()
        missing = [p for p in PLUGINS if p not in self.refs]
        if missing:
            raise ModeUnavailable(f"plugins not registered: {', '.join(missing)}")
        self.bin_dir = os.path.join(work_dir, f"bin-{self.key}")
        kw = {}
        # (A cni_skel without launchers writes plain scripts: its default install.)
        if "worker_socket" in inspect.signature(write_executable).parameters:
            kw["worker_socket"] = self.worker_socket(work_dir)  # None: plain one-shot script
        for name in PLUGINS:
            write_executable(self.bin_dir, name, self.refs[name], force=True, **kw)

    def worker_socket(self, work_dir: str) -> str | None:
        return os.path.join(work_dir, self.key, "no-worker.sock")  # nothing listens here


class ScriptMode(OneShotMode):
    """Plain one-shot scripts (`cni-skel install --one-shot`)."""

    key, label = "script", "ours (plain scripts)"

    def worker_socket(self, work_dir: str) -> str | None:
        return None


class InProcMode(OneShotMode):
    """dispatch() in the agent; delegates (host-local under bridge) still run
    as one-shot executables from this mode's bin dir, as CNI_PATH says."""

    key, label = "inproc", "ours in-process"
    per_process = False

    def request(self, plugin: str, env: dict[str, str], stdin: str) -> dict:
        return {"op": "dispatch", "ref": self.refs[plugin], "env": env, "stdin": stdin}


class WarmMode(OneShotMode):
    """The default install: launchers handing calls to `cni-skel worker`,
    socket-activated through the units `cni-skel install` writes. wait4 sees
    the launcher only: per-call CPU and RSS exclude the worker's forked
    child (a lower bound); churn adds the worker's CPU (`helper_cpu`).
    ``first_call``: seconds from the first connection to the socket (the
    worker not running yet) to its answer."""

    key, label = "warm", "ours, default install (socket-activated worker)"

    def worker_socket(self, work_dir: str) -> str | None:
        return os.path.join(work_dir, "warm", "worker.sock")

    def install(self, work_dir: str) -> None:
        super().install(work_dir)
        sock = self.worker_socket(work_dir)
        try:
            self.activation = SocketActivation.install(
                os.path.join(work_dir, "warm", "units"), sock,
                os.path.join(work_dir, "warm", "worker.log"))
        except RuntimeError as exc:
            raise ModeUnavailable(str(exc)) from None
        start = time.monotonic()
        ok, why = ping(sock, 30.0)  # the first call: systemd starts the worker on it
        self.first_call = time.monotonic() - start
        if not ok:
            self.close()
            raise ModeUnavailable(f"socket-activated worker did not answer: {why}")

    @property
    def proc(self) -> subprocess.Popen:
        return self.activation.proc

    def helper_cpu(self) -> float:
        """The worker's CPU, its own (accepting, forking) plus its reaped
        children's (the requests): utime, stime, cutime, cstime of
        /proc/<pid>/stat, in clock ticks."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        activation = getattr(self, "activation", None)
        if activation is not None:
            activation.stop()
            self.activation = None


MODES: dict[str, type[Mode]] = {m.key: m for m in (GoMode, OneShotMode, ScriptMode, InProcMode,
                                                    WarmMode)}
