"""Implementations under test ("modes"). Each gets its own node namespace.

A mode installs its plugins into a bin dir and turns one CNI call into a
request for the node agent (`bench.node`). Adding a mode is one class here
plus an entry in MODES:

  go       Debian's Go reference plugins (/usr/lib/cni), one process per call
  go191    upstream Go plugins v1.9.1 as `make go-latest` builds them (its
           cache, or $CNI_SKEL_GO_LATEST), nftables backends where they
           have one (our defaults); a second reference: the headline ratios
           are given against it too. Skipped when not built.
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
import json
import os
import subprocess
import time

from cni_skel.harness import SocketActivation
from cni_skel.warm.client import ping
from cni_skel.warm.install import plugin_registry, write_executable

from .chained import PLUGINS as CHAINED_PLUGINS
from .interfaces import PLUGINS as IFACE_PLUGINS

GO_BIN = "/usr/lib/cni"
GO_LATEST_BIN = os.environ.get("CNI_SKEL_GO_LATEST", "/var/cache/cni-skel/go-plugins-v1.9.1")
PLUGINS = ("bridge", "host-local", "loopback", "portmap", "tuning")


def proc_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants, parents before children (from
    /proc/<pid>/task/*/children; a process gone meanwhile is left out)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        out.append(p)
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of the live process tree under ``pid``: utime, stime,
    cutime and cstime of each live process (/proc/<pid>/stat, all its
    threads). A live process's c-fields hold its reaped descendants; live
    ones count by themselves. A process that exits between listing and
    reading is skipped: once its parent reaps it, its CPU is in the
    parent's cutime/cstime, so the delta of two readings stays right
    (parents are read before their children: at worst a reading taken while
    children exit is a little low)."""
    ticks = 0
    for p in proc_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_memory(pid: int) -> dict:
    """``{"pss", "rss"}`` in KiB (sums of /proc/<pid>/smaps_rollup over the
    live tree under ``pid``) and ``procs``, the number of processes read."""
    pss = rss = n = 0
    for p in proc_tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                text = f.read()
        except OSError:
            continue
        vals = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in ("Pss", "Rss"):
                vals[key] = int(rest.split()[0])
        if "Pss" not in vals:  # a zombie: nothing mapped
            continue
        pss += vals["Pss"]
        rss += vals.get("Rss", 0)
        n += 1
    return {"pss": pss, "rss": rss, "procs": n}


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

    def memory(self) -> dict | None:
        """Memory of this mode's long-lived helpers (None: none)."""
        return None


class GoMode(Mode):
    key, label = "go", "Go 1.1.1"

    def install(self, work_dir: str) -> None:
        missing = [p for p in PLUGINS if not os.access(os.path.join(GO_BIN, p), os.X_OK)]
        if missing:
            raise ModeUnavailable(f"Go plugins missing in {GO_BIN}: {', '.join(missing)} "
                                  "(apt-get install containernetworking-plugins)")
        self.bin_dir = GO_BIN


class GoLatestMode(GoMode):
    key, label = "go191", "Go 1.9.1"
    #: Config keys that pick Go 1.9.1's nftables backends, what ours use by
    #: default (absent, 1.9.1 takes iptables): the same work on both sides.
    NFT_KEYS = {"bridge": {"ipMasqBackend": "nftables"}, "ptp": {"ipMasqBackend": "nftables"},
                "portmap": {"backend": "nftables"}}

    def install(self, work_dir: str) -> None:
        missing = [p for p in PLUGINS if not os.access(os.path.join(GO_LATEST_BIN, p), os.X_OK)]
        if missing:
            raise ModeUnavailable(f"Go 1.9.1 plugins missing in {GO_LATEST_BIN}: "
                                  f"{', '.join(missing)} (make go-latest)")
        self.bin_dir = GO_LATEST_BIN

    def request(self, plugin: str, env: dict[str, str], stdin: str) -> dict:
        extra = self.NFT_KEYS.get(plugin)
        if extra:
            conf = json.loads(stdin)
            if isinstance(conf, dict) and "plugins" not in conf:
                stdin = json.dumps({**conf, **extra})
        return super().request(plugin, env, stdin)


class OneShotMode(Mode):
    """The default install (launchers) with no worker: the socket they try is
    one nothing listens on (never the node's /run/cni-skel/worker.sock, where
    a real worker may run), so every call other than VERSION falls back to
    running the plugin in the launcher's process."""

    key, label = "oneshot", "ours (launchers, no worker)"

    def install(self, work_dir: str) -> None:
        self.refs = plugin_registry()
        missing = [p for p in (*PLUGINS, *IFACE_PLUGINS) if p not in self.refs]
        if missing:
            raise ModeUnavailable(f"plugins not registered: {', '.join(missing)}")
        self.bin_dir = os.path.join(work_dir, f"bin-{self.key}")
        kw = {}
        # (A cni_skel without launchers writes plain scripts: its default install.)
        if "worker_socket" in inspect.signature(write_executable).parameters:
            kw["worker_socket"] = self.worker_socket(work_dir)  # None: plain one-shot script
        chained = [p for p in CHAINED_PLUGINS if p in self.refs]  # bench.chained says which not
        for name in (*PLUGINS, *IFACE_PLUGINS, *chained):
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
    the launcher only: per-call CPU and RSS exclude the worker's processes
    (a lower bound); churn adds the worker tree's CPU (`helper_cpu`) and
    reads its memory (`memory`).
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
        """CPU seconds of the worker's whole live process tree (`tree_cpu`):
        the parent (accepting, forking) and every process serving requests,
        long-lived or forked per request, with what each has reaped."""
        return tree_cpu(self.proc.pid)

    def memory(self) -> dict:
        """PSS and RSS (KiB) of the worker's whole live process tree
        (`tree_memory`)."""
        return tree_memory(self.proc.pid)

    def close(self) -> None:
        activation = getattr(self, "activation", None)
        if activation is not None:
            activation.stop()
            self.activation = None


MODES: dict[str, type[Mode]] = {m.key: m for m in (GoMode, GoLatestMode, OneShotMode, ScriptMode,
                                                    InProcMode, WarmMode)}
