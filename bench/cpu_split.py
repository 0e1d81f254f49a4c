"""Where a warm call's CPU goes (issue 20's "measure before and after").

    python -m bench.cpu_split [-n 50] [--out split.md] [--json split.json]   # as root

One warm Python process (everything imported, one warm-up pod run first)
runs N pods of the lifecycle's chain through `cni_skel.skel.dispatch`:
loopback ADD, bridge ADD (its host-local delegate dispatched in the same
process through an in-process `cni_skel.invoke.Exec`), tuning ADD with
bridge's prevResult, portmap ADD with tuning's, then the DELs in reverse.
It runs inside a fresh node namespace (``ip netns exec``: the node's own
/sys, as a runtime-run plugin) with a fresh pod namespace per pod, addresses
in 10.0.0.0/8. Per plugin and verb it prints a markdown table of:

* wall and CPU per call, user vs system (getrusage of the process and its
  children; a delegate's share is taken out of its caller's row);
* netlink sends per call: send/sendto/sendmsg/sendmmsg on AF_NETLINK
  sockets, NETLINK_ROUTE and NETLINK_NETFILTER apart, counted in libc by a
  small LD_PRELOAD shim (built with ``cc``; pyroute2's Python sockets and
  libnftables' own C calls alike). One send is one request, or one
  nftables batch (a transaction);
* user CPU by package (ours = cni_skel and the plugins, pyroute2, nftables
  = the python-nftables wrapper and libnftables called through it, pydantic,
  stdlib/other): a sampling profiler, SIGVTALRM every ms of the process's
  user CPU (the kernel ticks it, so every 1-4 ms), each sample counted for
  the package of the innermost Python frame's file (time in C code counts
  for the Python function that called it: libnftables for nftables,
  pydantic-core for pydantic).

CPU and wall come from a first pass with nothing attached; netlink counts
and profile samples from a second pass over as many pods (the sampler costs
that pass a little user time; its numbers are shares, not times).
Only public entry points are used: `dispatch`, the plugin classes, the
harness' namespaces, `cni_skel.invoke`'s Exec and `plugin_outcome`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator

import annotated_types
import cni_skel_plugins
import nftables
import pydantic
import pydantic_core
import pyroute2
import typing_extensions
from cni_skel_plugins.bridge import Bridge
from cni_skel_plugins.host_local import HostLocal
from cni_skel_plugins.loopback import Loopback
from cni_skel_plugins.portmap import PortMap
from cni_skel_plugins.tuning import Tuning

import cni_skel
from cni_skel.harness import create_netns, remove_netns
from cni_skel.invoke import SubprocessExec, plugin_outcome
from cni_skel.skel import dispatch

from .run import CNI_VERSION, PATH_ENV, chain, mappings, net_conf

PLUGINS = {"bridge": Bridge, "host-local": HostLocal, "loopback": Loopback,
           "portmap": PortMap, "tuning": Tuning}
PACKAGES = ("ours", "pyroute2", "nftables", "pydantic", "stdlib/other")
HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/netlink.h>
#include <sys/socket.h>

volatile int cnisplit_on;
unsigned long cnisplit_counts[3];  /* NETLINK_ROUTE, NETLINK_NETFILTER, other netlink */

static void count(int fd) {
    int v;
    socklen_t n = sizeof v;
    if (!cnisplit_on || getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &n) || v != AF_NETLINK)
        return;
    n = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &n))
        return;
    __atomic_add_fetch(&cnisplit_counts[v == NETLINK_ROUTE ? 0 : v == NETLINK_NETFILTER ? 1 : 2],
                       1, __ATOMIC_RELAXED);
}

#define NEXT(name) static __typeof__(name) *next; if (!next) next = dlsym(RTLD_NEXT, #name)
ssize_t send(int fd, const void *b, size_t l, int f) {
    NEXT(send); count(fd); return next(fd, b, l, f);
}
ssize_t sendto(int fd, const void *b, size_t l, int f, const struct sockaddr *a, socklen_t al) {
    NEXT(sendto); count(fd); return next(fd, b, l, f, a, al);
}
ssize_t sendmsg(int fd, const struct msghdr *m, int f) {
    NEXT(sendmsg); count(fd); return next(fd, m, f);
}
int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int f) {
    NEXT(sendmmsg); count(fd); return next(fd, v, n, f);
}
"""


# --- measuring ------------------------------------------------------------------------------


def _roots() -> list[tuple[str, str]]:
    """(path prefix, package) pairs, most specific first."""
    def d(mod) -> str:
        """A package's directory, or a single-file module's file (nftables.py)."""
        path = os.path.abspath(mod.__file__)
        return os.path.dirname(path) + os.sep if hasattr(mod, "__path__") else path

    return [(d(m), pkg) for m, pkg in (
        (cni_skel, "ours"), (cni_skel_plugins, "ours"), (pyroute2, "pyroute2"),
        (nftables, "nftables"), (pydantic, "pydantic"), (pydantic_core, "pydantic"),
        (annotated_types, "pydantic"), (typing_extensions, "pydantic"))] + [
        (HERE + os.sep, "harness")]


class Meter:
    """Per (plugin, verb): calls, wall, user and system CPU, netlink sends
    and profile samples, each excluding nested regions (a delegate)."""

    def __init__(self, shim: ctypes.CDLL | None) -> None:
        self.stats: dict[tuple[str, str], Counter] = {}
        self.stack: list[tuple[tuple[str, str], Counter]] = []
        self.shim = shim
        self.counts = (ctypes.c_ulong * 3).in_dll(shim, "cnisplit_counts") if shim else None
        self.roots = _roots()
        self.where: dict[str, str] = {}
        self.sampling = False

    def netlink(self) -> tuple[int, ...]:
        return tuple(self.counts) if self.counts is not None else (0, 0, 0)

    @contextlib.contextmanager
    def region(self, plugin: str, verb: str) -> Iterator[None]:
        inner: Counter = Counter()
        self.stack.append(((plugin, verb), inner))
        nl0 = self.netlink()
        s0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            s1 = resource.getrusage(resource.RUSAGE_SELF)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            nl1 = self.netlink()
            self.stack.pop()
            incl = Counter({
                "wall": t1 - t0,
                "user": s1.ru_utime - s0.ru_utime + c1.ru_utime - c0.ru_utime,
                "sys": s1.ru_stime - s0.ru_stime + c1.ru_stime - c0.ru_stime,
                "route": nl1[0] - nl0[0], "netfilter": nl1[1] - nl0[1],
                "netlink_other": nl1[2] - nl0[2]})
            own = Counter(incl)
            own.subtract(inner)  # a delegate's share is its own row's
            st = self.stats.setdefault((plugin, verb), Counter())
            st.update(own)
            st["calls"] += 1
            if self.stack:
                self.stack[-1][1].update(incl)

    # the sampler: SIGVTALRM per ms of user CPU (setitimer ITIMER_VIRTUAL)

    def package(self, filename: str) -> str:
        pkg = self.where.get(filename)
        if pkg is None:
            path = os.path.abspath(filename)
            pkg = next((p for root, p in self.roots if path.startswith(root)), "stdlib/other")
            self.where[filename] = pkg
        return pkg

    def _sample(self, signum, frame) -> None:
        if not self.stack or frame is None:
            return
        key = self.stack[-1][0]
        self.stats.setdefault(key, Counter())["sample " + self.package(
            frame.f_code.co_filename)] += 1

    @contextlib.contextmanager
    def profiling(self) -> Iterator[None]:
        signal.signal(signal.SIGVTALRM, self._sample)
        signal.siginterrupt(signal.SIGVTALRM, False)
        signal.setitimer(signal.ITIMER_VIRTUAL, 0.001, 0.001)
        if self.shim is not None:
            ctypes.c_int.in_dll(self.shim, "cnisplit_on").value = 1
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0, 0)
            signal.signal(signal.SIGVTALRM, signal.SIG_IGN)
            if self.shim is not None:
                ctypes.c_int.in_dll(self.shim, "cnisplit_on").value = 0


class InProcessExec(SubprocessExec):
    """Delegates we have a class for (host-local) run through `dispatch` in
    this process, metered as their own row; anything else is exec'd."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def find(self, plugin_type: str, paths) -> str:
        if plugin_type in PLUGINS:
            return f"/in-process/{plugin_type}"
        return super().find(plugin_type, paths)

    def run(self, plugin_path: str, command: str, stdin_data: bytes, env, *,
            timeout: float | None = None, stderr=None) -> bytes:
        name = os.path.basename(plugin_path)
        if not plugin_path.startswith("/in-process/"):
            return super().run(plugin_path, command, stdin_data, env, timeout=timeout,
                               stderr=stderr)
        child_env = {**env, "CNI_COMMAND": command}
        err = io.StringIO()
        with self.meter.region(name, command):
            out, code = dispatch(PLUGINS[name], child_env, stdin_data, err, exec=self)
        return plugin_outcome(name, code, out, err.getvalue().encode(), stderr)


# --- the chain ------------------------------------------------------------------------------


class Runner:
    def __init__(self, work: str, meter: Meter) -> None:
        self.work = work
        self.meter = meter
        self.exec = InProcessExec(meter)
        self.plugins = chain(os.path.join(work, "ipam"), "cnsplit0", "10.91.0.0/16")
        self.errors: list[str] = []
        os.makedirs(os.path.join(work, "bin"), exist_ok=True)

    def call(self, plugin: str, verb: str, cid: str, netns: str, conf: dict,
             ifname: str = "eth0") -> dict | None:
        env = {"PATH": PATH_ENV, "CNI_COMMAND": verb, "CNI_CONTAINERID": cid,
               "CNI_NETNS": netns, "CNI_IFNAME": ifname, "CNI_ARGS": "",
               "CNI_PATH": os.path.join(self.work, "bin")}
        err = io.StringIO()
        with self.meter.region(plugin, verb):
            out, code = dispatch(PLUGINS[plugin], env, json.dumps(conf).encode(), err,
                                 exec=self.exec)
        if code != 0:
            self.errors.append(f"{plugin} {verb} {cid}: exit {code} {out.decode()[:300]} "
                               f"{err.getvalue()[-300:]}")
            return None
        return json.loads(out) if out.strip() else None

    def pod(self, i: int, cid: str, netns: str) -> None:
        lo = {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}
        runtime = {"mac": f"0a:58:0a:5b:{i // 256 % 256:02x}:{i % 256:02x}",
                   "portMappings": mappings(30000 + i % 10000, 50000 + i % 10000)}
        lo_res = self.call("loopback", "ADD", cid, netns, lo, "lo")
        prev = None
        for p in self.plugins:
            doc = self.call(p["type"], "ADD", cid, netns, net_conf("splitnet", p, prev, runtime))
            if doc is None:
                break
            prev = doc
        for p in reversed(self.plugins):
            self.call(p["type"], "DEL", cid, netns, net_conf("splitnet", p, prev, runtime))
        self.call("loopback", "DEL", cid, netns,
                  {**lo, **({"prevResult": lo_res} if lo_res else {})}, "lo")


def inside(args: argparse.Namespace) -> int:
    """In the node namespace: warm up, measure, print the table."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    shim = ctypes.CDLL(args.shim) if args.shim else None
    pods = args.pods.split(",")
    n = args.n
    meter = Meter(shim)
    work = tempfile.mkdtemp(prefix="cni-split-")
    try:
        run = Runner(work, meter)
        run.pod(0, "split-warmup", f"/run/netns/{pods[0]}")
        meter.stats.clear()
        errors0 = len(run.errors)
        for i in range(n):
            run.pod(i + 1, f"split-cpu-{i}", f"/run/netns/{pods[1 + i]}")
        timed = meter.stats
        meter.stats = {}
        with meter.profiling():
            for i in range(n):
                run.pod(n + i + 1, f"split-prof-{i}", f"/run/netns/{pods[1 + n + i]}")
        counted = meter.stats
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text, doc = report(timed, counted, n, shim is not None)
    doc["errors"] = run.errors
    if run.errors:
        text += (f"\n**Errors: {len(run.errors)}** ({errors0} in the warm-up pod):\n"
                 + "\n".join(f"- `{e}`" for e in run.errors[:10]) + "\n")
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as fp:
            fp.write(text)
    if args.json:
        with open(args.json, "w") as fp:
            json.dump(doc, fp, indent=1)
    return 1 if run.errors else 0


ORDER = [("loopback", "ADD"), ("bridge", "ADD"), ("host-local", "ADD"), ("tuning", "ADD"),
         ("portmap", "ADD"), ("portmap", "DEL"), ("tuning", "DEL"), ("bridge", "DEL"),
         ("host-local", "DEL"), ("loopback", "DEL")]


def report(timed: dict, counted: dict, n: int, shim: bool) -> tuple[str, dict]:
    lines = [f"# CPU split: {n} pods of the chain, one warm process (`dispatch`)\n",
             "| call | calls | wall ms | CPU ms | user ms | sys ms | sys % | NETLINK_ROUTE sends "
             "| NETLINK_NETFILTER sends | user: " + " % | ".join(PACKAGES) + " % | samples |",
             "|---" * (10 + len(PACKAGES)) + "|"]
    keys = [k for k in ORDER if k in timed] + sorted(k for k in timed if k not in ORDER)
    total_t: Counter = Counter()
    total_c: Counter = Counter()
    rows = {}

    def fmt(t: Counter, c: Counter, calls: float, label: str) -> str:
        cpu = t["user"] + t["sys"]
        samples = sum(v for k, v in c.items() if k.startswith("sample ") and k != "sample harness")
        shares = [100 * c[f"sample {p}"] / samples if samples else None for p in PACKAGES]
        ncalls = c["calls"] or calls
        nl = [f"{c[k] / ncalls:.1f}" if shim and ncalls else "-" for k in ("route", "netfilter")]
        return (f"| {label} | {calls:g} | {1000 * t['wall'] / calls:.2f} "
                f"| {1000 * cpu / calls:.2f} | {1000 * t['user'] / calls:.2f} "
                f"| {1000 * t['sys'] / calls:.2f} | {100 * t['sys'] / cpu if cpu else 0:.0f} "
                f"| {nl[0]} | {nl[1]} | "
                + " | ".join("-" if s is None else f"{s:.0f}" for s in shares)
                + f" | {samples} |")

    for key in keys:
        t, c = timed[key], counted.get(key, Counter())
        lines.append(fmt(t, c, t["calls"], f"{key[0]} {key[1]}"
                         + (" (bridge's delegate)" if key[0] == "host-local" else "")))
        total_t.update(t)
        total_c.update(c)
        rows[f"{key[0]} {key[1]}"] = {"timed": dict(t), "counted": dict(c)}
    pods = max(1, n)
    total_c["calls"] = pods  # per pod
    lines.append(fmt(total_t, total_c, pods, "**per pod (all calls)**"))
    other = sum(c["netlink_other"] for c in counted.values())
    lines.append("")
    lines.append(
        "Per call (per pod in the last row), means over the pods; bridge's rows exclude its "
        "host-local delegate (own rows). CPU: getrusage of the process and its children, "
        "user vs system (system = the kernel's share: netlink requests, netns and sysfs work, "
        "nftables commits). Netlink sends: send/sendto/sendmsg/sendmmsg on AF_NETLINK "
        "sockets (one nftables batch = one send)"
        + ("" if shim else ": not counted (no C compiler for the LD_PRELOAD shim)")
        + (f"; {other} sends on other netlink protocols" if other else "")
        + ". User CPU by package: shares of profile samples (SIGVTALRM per ms of user CPU, "
        "innermost Python frame's file; C code counts for its Python caller) from a second "
        f"pass of {n} pods, which the sampler slows a little; a pod's share is weighted by "
        "sample counts. The first pod (warm-up, lazy imports) is not counted.")
    doc = {"pods": n, "netlink_counted": shim, "rows": rows,
           "per_pod": {"timed": dict(total_t), "counted": dict(total_c)}}
    return "\n".join(lines) + "\n", doc


# --- outside: namespaces, the shim, the inner process ----------------------------------------


def build_shim(work: str) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("no C compiler: netlink sends are not counted", file=sys.stderr)
        return None
    src, out = os.path.join(work, "nlcount.c"), os.path.join(work, "nlcount.so")
    with open(src, "w") as fp:
        fp.write(SHIM)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", out, src, "-ldl"], check=True)
    return out


def outside(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("bench.cpu_split needs root (network namespaces)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="cni-split-")
    made = []
    try:
        shim = build_shim(work)
        node = create_netns("cnsplit-node")
        made.append(node)
        for _ in range(2 * args.n + 1):
            made.append(create_netns("cnsplit-pod"))
        env = dict(os.environ)
        if shim:
            env["LD_PRELOAD"] = shim
        argv = ["ip", "netns", "exec", node.name, sys.executable, "-m", "bench.cpu_split",
                "--inside", "-n", str(args.n), "--pods", ",".join(ns.name for ns in made[1:]),
                "--shim", shim or ""]
        if args.out:
            argv += ["--out", os.path.abspath(args.out)]
        if args.json:
            argv += ["--json", os.path.abspath(args.json)]
        return subprocess.run(argv, cwd=os.path.dirname(HERE), env=env, check=False).returncode
    finally:
        for ns in made:
            try:
                remove_netns(ns)
            except Exception as exc:
                print(f"cannot remove {ns.name}: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_split",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=50, help="pods per pass (default 50)")
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pods", default="", help=argparse.SUPPRESS)
    ap.add_argument("--shim", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("-n must be at least 1")
    return inside(args) if args.inside else outside(args)


if __name__ == "__main__":
    sys.exit(main())
