"""cni-skel benchmark: our plugins against the Go reference plugins, Debian's
1.1.1 (mode ``go``, the tables' ratios) and upstream 1.9.1 (``go191``, its
columns and the summary's "vs Go 1.9.1" ratios) in the same run.

    python -m bench [--quick] [--modes go,oneshot,inproc] [--out bench/results]
                    [--long-churn 10000] [--only chained,firewall-scale]

Every implementation ("mode", see bench/modes.py) gets its own node
namespace with an agent in it (bench/node.py); pods get fresh namespaces.
Calls are interleaved call by call with the mode order rotated per sample, so
the noise of a shared machine hits every mode alike: read the ratios, not the
absolute times. Writes <out>/bench-<quick|full>-<stamp>.md (also printed) and
.json (every sample); the last printed line is a one-line summary. Exit 1 on
plugin errors, duplicate IPs or leaks; a missed budget is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

from cni_skel.harness import create_netns, remove_netns
from cni_skel.warm.install import python_argv

from . import chained, interfaces
from .chart import draw
from .modes import MODES, PLUGINS, Mode, ModeUnavailable
from .stats import (
    CNI_VERSION,
    REFERENCES,
    MiB,
    busy_share,
    cpu_ticks,
    fake_result,
    log,
    med,
    mib,
    ms,
    p95,
    p99,
    pct,
    ratio,
    rx,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH_ENV = "/usr/sbin:/usr/bin:/sbin:/bin"
IDLE_PROCESSES = 3  # a quiet worker: its parent and its 2 spares (--spares)


@dataclass(frozen=True)
class Profile:
    name: str
    pods: int
    version_samples: int
    scale_samples: int
    hl_levels: tuple[int, ...]
    pm_levels: tuple[int, ...]
    churn_pods: int
    churn_workers: tuple[int, ...]
    chain_pods: int  # all live at once on one bridge: at most 1,023 (a bridge's port limit)
    chain_workers: int = 8
    fill_workers: int = 4
    long_round: int = 100  # pods per round of --long-churn
    #: bridge churn rounds per worker count, Go's and ours interleaved (one-shot: one)
    churn_rounds: int = 1
    fw_levels: tuple[int, ...] = (0, 1000)  # other pods' firewall entries (bench.chained)
    fw_samples: int = 20  # probe ADD+DEL pairs per firewall level and mode


QUICK = Profile("quick", pods=2, version_samples=3, scale_samples=2, hl_levels=(0, 1000),
                pm_levels=(0, 20), churn_pods=4, churn_workers=(8,), chain_pods=4, long_round=20,
                fw_levels=(0, 100), fw_samples=3)
FULL = Profile("full", pods=50, version_samples=30, scale_samples=15,
               hl_levels=(0, 1000, 10000), pm_levels=(0, 100, 1000), churn_pods=100,
               churn_workers=(2, 8), chain_pods=1000, churn_rounds=5)
#: modes the full chain churn runs (one-shot, ~25x Go per call, would take too long)
CHAIN_MODES = ("go", "warm")
#: what --only selects from, in the order a run takes them (memory: the idle worker's)
SCENARIOS = ("version", "lifecycle", "interfaces", "chained", "memory", "churn", "chain-churn",
             "long-churn", "scale-hl", "scale-pm", "firewall-scale", "profile")


def churn_medians(rounds: list[dict]) -> dict:
    """One mode's churn figures over its rounds (`Bench.churn_round`'s
    dicts): the medians of rates, phase times, CPU shares, CPU per pod and
    p99; errors and duplicates summed, leaks joined; the rounds themselves
    under ``"rounds"``."""
    out: dict = {key: med([r[key] for r in rounds if r.get(key) is not None])
                 for key in ("seconds", "add_seconds", "del_seconds", "add_busy", "del_busy",
                             "pods_per_s", "cpu_per_pod", "p99")}
    out.update(pods=rounds[0]["pods"], errors=sum(r["errors"] for r in rounds),
               duplicates=sum(r["duplicates"] for r in rounds),
               leaks=[leak for r in rounds for leak in r["leaks"]], rounds=rounds)
    return out


class MemSampler:
    """The peak (by PSS) of ``mode.memory()`` read every ``period`` seconds
    on a thread of this process while the block runs."""

    def __init__(self, mode: Mode, period: float = 0.2) -> None:
        self.mode = mode
        self.period = period
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)

    def __enter__(self) -> MemSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            m = self.mode.memory()
            if m and m["procs"]:
                self.samples.append(m)
            if self._stop.wait(self.period):
                return

    def peak(self) -> dict | None:
        if not self.samples:
            return None
        top = max(self.samples, key=lambda m: m["pss"])
        return {**top, "rss_max": max(m["rss"] for m in self.samples),
                "samples": len(self.samples)}


# --- the node agent ----------------------------------------------------------------


class Node:
    """A node namespace plus its agent (bench/node.py) for one mode."""

    def __init__(self, key: str, spawn: str | None, log_fp) -> None:
        self.ns = create_netns(f"cnbn-{key}")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns.name, sys.executable, "-m", "bench.node",
             "--spawn", spawn or ""],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fp, text=True)
        line = self.proc.stdout.readline()
        if not line or not json.loads(line).get("ready"):
            raise RuntimeError(f"node agent for {key} did not start (see the log)")

    def request(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("node agent died (see the log)")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"node agent: {answer['error']}")
        return answer["ok"]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        remove_netns(self.ns)


# --- configs -------------------------------------------------------------------------


def net_conf(name: str, plugin: dict, prev: dict | None = None,
             runtime: dict | None = None) -> dict:
    """One plugin's config as libcni builds it from a conflist."""
    conf = {"cniVersion": CNI_VERSION, "name": name, **plugin}
    caps = plugin.get("capabilities") or {}
    rc = {k: v for k, v in (runtime or {}).items() if caps.get(k)}
    if rc:
        conf["runtimeConfig"] = rc
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def ipam(store: str, subnet: str) -> dict:
    return {"type": "host-local", "dataDir": store, "ranges": [[{"subnet": subnet}]]}


def chain(store: str, bridge: str = "cnbr0", subnet: str = "10.88.0.0/16") -> list[dict]:
    return [
        {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
         "ipam": ipam(store, subnet)},
        # dataDir beside the IPAM store: never the node's real /run/cni/tuning
        {"type": "tuning", "sysctl": {"net.core.somaxconn": "500"},
         "dataDir": os.path.join(store, "tuning"), "capabilities": {"mac": True}},
        {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
    ]


def mappings(tcp: int, udp: int) -> list[dict]:
    return [{"hostPort": tcp, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": udp, "containerPort": 53, "protocol": "udp"}]


# --- the benchmark ----------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.prof = QUICK if args.quick else FULL
        if args.pods:
            self.prof = Profile(**{**self.prof.__dict__, "pods": args.pods})
        self.samples: list[dict] = []
        self.errors: list[str] = []  # ours: fatal (exit 1)
        self.ref_errors: list[str] = []  # the Go reference's own failures: reported only
        self.modes: list[Mode] = []
        self.skipped: dict[str, str] = {}
        self.pods: list = []
        self.results: dict = {}
        self.work = tempfile.mkdtemp(prefix="cni-bench-")
        self.spawn: str | None = None
        self.log_fp = open(os.path.join(self.work, "agents.log"), "w")  # noqa: SIM115

    # --- set-up / tear-down

    def setup(self) -> None:
        self.spawn = self.build_spawner()
        for key in self.args.modes:
            mode = MODES[key]()
            try:
                mode.install(self.work)
            except ModeUnavailable as exc:
                self.skipped[key] = str(exc)
                log(f"mode {key} skipped: {exc}")
                continue
            mode.node = Node(key, self.spawn, self.log_fp)
            self.modes.append(mode)
        keys = [m.key for m in self.modes]
        if "go" not in keys or "oneshot" not in keys:
            raise SystemExit("bench needs modes go and oneshot (ratios are ours/Go)")

    def build_spawner(self) -> str | None:
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            log("no C compiler: peak RSS is not measured (a Python parent's own RSS would "
                "be reported); install gcc for it")
            return None
        out = os.path.join(self.work, "spawn")
        subprocess.run([cc, "-O2", "-o", out, os.path.join(ROOT, "bench", "spawn.c")],
                       check=True)
        return out

    def close(self) -> None:
        for ns in self.pods:
            try:
                remove_netns(ns)
            except Exception as exc:
                log(f"cannot remove {ns.name}: {exc}")
        self.pods.clear()
        for mode in self.modes:
            try:
                mode.node.close()
            finally:
                mode.close()
        self.log_fp.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def pod(self):
        ns = create_netns("cnbp")
        self.pods.append(ns)
        return ns

    def drop_pod(self, ns) -> None:
        remove_netns(ns)
        self.pods.remove(ns)

    def rotation(self, i: int, modes: list[Mode] | None = None) -> list[Mode]:
        modes = modes or self.modes
        k = i % len(modes)
        return modes[k:] + modes[:k]

    def store(self, mode: Mode, what: str) -> str:
        return os.path.join(self.work, mode.key, what)

    # --- one call

    def env(self, mode: Mode, cmd: str, cid: str, netns: str, ifname: str) -> dict:
        return {"PATH": PATH_ENV, "CNI_COMMAND": cmd, "CNI_CONTAINERID": cid,
                "CNI_NETNS": netns, "CNI_IFNAME": ifname, "CNI_ARGS": "",
                "CNI_PATH": mode.cni_path}

    def call(self, mode: Mode, plugin: str, cmd: str, conf: dict, *, scenario: str,
             cid: str = "", netns: str = "", ifname: str = "eth0", record: bool = True,
             **tags) -> tuple[dict, dict | None]:
        req = mode.request(plugin, self.env(mode, cmd, cid, netns, ifname), json.dumps(conf))
        r = mode.node.request(req)
        return self.record(mode, plugin, cmd, r, scenario, record, tags)

    def record(self, mode: Mode, plugin: str, cmd: str, r: dict, scenario: str,
               record: bool, tags: dict) -> tuple[dict, dict | None]:
        s = {"scenario": scenario, "mode": mode.key, "plugin": plugin, "verb": cmd,
             "wall": r["wall"], "cpu": r["cpu"], "rss": r["rss"], "code": r["code"], **tags}
        if record:
            self.samples.append(s)
        doc = None
        if r["code"] != 0:
            sink = self.ref_errors if mode.key in REFERENCES else self.errors
            sink.append(f"{scenario} {mode.key} {plugin} {cmd} {tags}: exit {r['code']} "
                        f"{r['out'].strip()[:300]} {r['err'].strip()[-300:]}")
        elif r["out"].strip():
            doc = json.loads(r["out"])
        return s, doc

    def sel(self, scenario: str, mode: str, plugin: str | None = None, verb: str | None = None,
            key: str = "wall", **tags) -> list[float]:
        return [s[key] for s in self.samples
                if s["scenario"] == scenario and s["mode"] == mode and s["code"] == 0
                and (plugin is None or s["plugin"] == plugin)
                and (verb is None or s["verb"] == verb)
                and all(s.get(k) == v for k, v in tags.items()) and s[key] is not None]

    # --- scenarios

    def version(self) -> None:
        log(f"VERSION: {self.prof.version_samples} samples per plugin and mode")
        for k in range(self.prof.version_samples):
            for plugin in PLUGINS:
                for mode in self.rotation(k):
                    self.call(mode, plugin, "VERSION", {"cniVersion": CNI_VERSION},
                              scenario="version")

    def lifecycle(self) -> None:
        n = self.prof.pods
        log(f"pod lifecycle: {n} pods per mode, interleaved")
        for i in range(n):
            for idx, mode in enumerate(self.rotation(i)):
                self.one_pod(mode, i, idx)

    def one_pod(self, mode: Mode, i: int, idx: int) -> None:
        sc = "lifecycle"
        pod = self.pod()
        cid = f"{mode.key}-life-{i}"
        lo = {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}
        plugins = chain(self.store(mode, "life-ipam"))
        runtime = {"mac": f"0a:58:0a:{i // 256:02x}:{i % 256:02x}:{idx:02x}",
                   "portMappings": mappings(8080, 8053)}
        kw = {"scenario": sc, "cid": cid, "netns": pod.path, "pod": i}
        _, lo_res = self.call(mode, "loopback", "ADD", lo, ifname="lo", **{**kw})
        prev = None
        done = []
        for p in plugins:
            _, doc = self.call(mode, p["type"], "ADD", net_conf("benchnet", p, prev, runtime),
                               **kw)
            if doc is None:
                break
            done.append(p)
            prev = doc
        if lo_res is not None:
            self.call(mode, "loopback", "CHECK", {**lo, "prevResult": lo_res}, ifname="lo", **kw)
        if len(done) == len(plugins):
            for p in plugins:
                self.call(mode, p["type"], "CHECK", net_conf("benchnet", p, prev, runtime), **kw)
        for p in reversed(plugins):  # DEL every plugin, as libcni does
            self.call(mode, p["type"], "DEL", net_conf("benchnet", p, prev, runtime), **kw)
        self.call(mode, "loopback", "DEL", {**lo, **({"prevResult": lo_res} if lo_res else {})},
                  ifname="lo", **kw)
        self.drop_pod(pod)

    def churn(self) -> None:
        """Bridge churn: ``churn_rounds`` rounds per worker count, the modes
        interleaved round by round (the order rotated; one-shot, ~50 s a
        round, in the first only). A mode's figures are its rounds' medians
        (`churn_medians`): one round of 100 pods moved 8-way pods/s by 20 %
        between runs of the same code on this machine."""
        prof = self.prof
        modes = [m for m in self.modes if m.per_process]
        out = self.results.setdefault("churn", {})
        top = max(prof.churn_workers)
        for workers in prof.churn_workers:
            rounds: dict[str, list[dict]] = {}
            peaks: dict[str, dict] = {}
            for rnd in range(prof.churn_rounds):
                for mode in self.rotation(rnd, modes):
                    if rnd and mode.key == "oneshot":
                        continue
                    log(f"churn: {mode.key}, {workers} workers, {prof.churn_pods} pods, "
                        f"round {rnd + 1}/{prof.churn_rounds}")
                    sampler = self.sampler(mode) if workers == top else nullcontext()
                    with sampler:
                        res = self.churn_round(mode, workers)
                    rounds.setdefault(mode.key, []).append(res)
                    if isinstance(sampler, MemSampler):
                        peak, best = sampler.peak(), peaks.get(mode.key)
                        if peak is not None and (best is None or peak["pss"] > best["pss"]):
                            peaks[mode.key] = peak
            out[str(workers)] = {key: churn_medians(res) for key, res in rounds.items()}
            for mode in modes:
                if mode.key in peaks:
                    self.memory_result(mode, "peak", f"bridge churn, {workers} workers",
                                       peaks[mode.key])

    def sampler(self, mode: Mode) -> MemSampler | nullcontext:
        """A memory sampler for a mode with a worker, else nothing."""
        return MemSampler(mode) if mode.memory() is not None else nullcontext()

    def memory_result(self, mode: Mode, kind: str, label: str, m: dict | None) -> None:
        if m is not None:
            self.results.setdefault("memory", {}).setdefault(mode.key, {}).setdefault(
                kind, {})[label] = m

    def idle_memory(self, label: str) -> None:
        """The worker tree's memory once it has served calls and is quiet: 1 s
        after the last one in the quick profile; in the full one, once the
        pool is back to its spares (the worker retires idle processes beyond
        them after --linger, 30 s), at most 45 s."""
        modes = [m for m in self.modes if m.memory() is not None]
        if not modes:
            return
        time.sleep(1.0)
        deadline = time.monotonic() + (45.0 if self.prof.name == "full" else 0.0)
        while time.monotonic() < deadline and any(
                m.memory()["procs"] > IDLE_PROCESSES for m in modes):
            time.sleep(1.0)
        for mode in modes:
            self.memory_result(mode, "idle", label, mode.memory())

    def churn_round(self, mode: Mode, workers: int, *, pods: int = 0, scenario: str = "churn",
                    record: bool = True, store: str = "") -> dict:
        sc = scenario
        store = self.store(mode, store or f"churn-ipam-{workers}")
        plugin = {"type": "bridge", "bridge": "cnch0", "isGateway": True, "ipMasq": False,
                  "ipam": ipam(store, "10.77.0.0/24")}
        pods = [self.pod() for _ in range(pods or self.prof.churn_pods)]
        before = mode.node.request({"op": "inspect"})
        errors0 = len(self.errors)

        def reqs(cmd: str, prevs: list | None) -> list[dict]:
            return [mode.request("bridge",
                                 self.env(mode, cmd, f"{mode.key}-ch{workers}-{i}", p.path, "eth0"),
                                 json.dumps(net_conf("churnnet", plugin,
                                                     prevs[i] if prevs else None)))
                    for i, p in enumerate(pods)]

        tags = {"workers": workers}
        helper0 = mode.helper_cpu()
        ticks0 = cpu_ticks()
        add = mode.node.request({"op": "batch", "workers": workers, "calls": reqs("ADD", None)})
        ticks1 = cpu_ticks()
        results = [self.record(mode, "bridge", "ADD", r, sc, record, tags)[1]
                   for r in add["results"]]
        ips = [ip["address"].split("/")[0] for doc in results if doc for ip in doc["ips"]]
        live = mode.node.request({"op": "inspect", "store": os.path.join(store, "churnnet"),
                                  "bridge": "cnch0"})
        dups = len(ips) - len(set(ips))
        if len(live["ips"]) != len(set(ips)) or len(live["ports"]) != len(ips):
            dups += abs(len(live["ips"]) - len(set(ips)))
        ticks2 = cpu_ticks()
        dele = mode.node.request({"op": "batch", "workers": workers,
                                  "calls": reqs("DEL", results)})
        ticks3 = cpu_ticks()
        for r in dele["results"]:
            self.record(mode, "bridge", "DEL", r, sc, record, tags)
        after = mode.node.request({"op": "inspect", "store": os.path.join(store, "churnnet"),
                                   "bridge": "cnch0"})
        leaks = sorted(set(after["veths"]) - set(before["veths"])) + after["ports"] + after["ips"]
        for p in pods:
            self.drop_pod(p)
        n = len(pods)
        calls = add["results"] + dele["results"]
        # plugin processes (wait4) plus helpers they hand work to (the warm worker)
        cpu = sum(r["cpu"] for r in calls) + mode.helper_cpu() - helper0
        return {"pods": n, "seconds": add["wall"] + dele["wall"],
                "add_seconds": add["wall"], "del_seconds": dele["wall"],
                "add_busy": busy_share(ticks0, ticks1), "del_busy": busy_share(ticks2, ticks3),
                "pods_per_s": n / (add["wall"] + dele["wall"]), "cpu_per_pod": cpu / n,
                "p99": p99([r["wall"] for r in calls if r["code"] == 0]),
                "errors": len(self.errors) - errors0, "duplicates": dups, "leaks": leaks}

    def chain_churn(self) -> None:
        """The Kubernetes-style chain of the lifecycle scenario under churn:
        every pod's chain ADDed (loopback, bridge + host-local, tuning,
        portmap, in order in one worker thread, prevResult passed on), all
        live at once, then DELed (reverse order per pod)."""
        prof = self.prof
        modes = [m for m in self.modes if m.key in CHAIN_MODES]
        if not prof.chain_pods or not modes:
            return
        out = self.results.setdefault("chain_churn", {})
        for mode in modes:
            log(f"chain churn: {mode.key}, {prof.chain_workers} workers, "
                f"{prof.chain_pods} pods")
            sampler = self.sampler(mode)
            with sampler:
                out[mode.key] = self.chain_round(mode, prof.chain_workers, prof.chain_pods)
            if isinstance(sampler, MemSampler):
                self.memory_result(mode, "peak", f"chain churn, {prof.chain_workers} workers",
                                   sampler.peak())

    def chain_round(self, mode: Mode, workers: int, n: int) -> dict:
        sc = "chain-churn"
        store = self.store(mode, "chain-ipam")
        plugins = chain(store, "cnck0", "10.78.0.0/16")
        names = ["loopback"] + [p["type"] for p in plugins]
        lo = {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}
        idx = self.modes.index(mode)
        pods = [self.pod() for _ in range(n)]
        look = {"op": "inspect", "store": os.path.join(store, "chainnet"), "bridge": "cnck0",
                "files": os.path.join(store, "tuning"), "nft": True}
        before = mode.node.request(look)
        errors0 = len(self.errors)

        def runtime(i: int) -> dict:
            return {"mac": f"0a:58:0b:{i // 256:02x}:{i % 256:02x}:{idx:02x}",
                    "portMappings": mappings(30000 + i, 50000 + i)}

        def step(plugin: str, cmd: str, i: int, conf: dict, ifname: str = "eth0",
                 chained: bool = False) -> dict:
            env = self.env(mode, cmd, f"{mode.key}-chain-{i}", pods[i].path, ifname)
            return {"req": mode.request(plugin, env, ""), "conf": conf, "chain": chained}

        adds = [{"op": "chain", "steps": [
            step("loopback", "ADD", i, lo, "lo"),
            *(step(p["type"], "ADD", i, net_conf("chainnet", p, None, runtime(i)),
                   chained=True) for p in plugins)]} for i in range(n)]
        helper0 = mode.helper_cpu()
        add = mode.node.request({"op": "batch", "workers": workers, "calls": adds})
        lo_res: list[dict | None] = []
        finals: list[dict | None] = []
        ips: list[str] = []
        calls = []
        for i, r in enumerate(add["results"]):
            docs = [self.record(mode, names[k], "ADD", c, sc, True,
                                {"workers": workers, "pod": i})[1]
                    for k, c in enumerate(r["steps"])]
            calls += r["steps"]
            lo_res.append(docs[0] if docs else None)
            chained = [d for d in docs[1:] if d is not None]
            finals.append(chained[-1] if chained else None)
            if len(docs) > 1 and docs[1]:
                ips += [ip["address"].split("/")[0] for ip in docs[1]["ips"]]
        live = mode.node.request(look)
        dups = len(ips) - len(set(ips))
        if len(live["ips"]) != len(set(ips)) or len(live["ports"]) != len(ips):
            dups += abs(len(live["ips"]) - len(set(ips)))
        dels = [{"op": "chain", "all": True, "steps": [
            *(step(p["type"], "DEL", i, net_conf("chainnet", p, finals[i], runtime(i)))
              for p in reversed(plugins)),
            step("loopback", "DEL", i, {**lo, **({"prevResult": lo_res[i]} if lo_res[i] else {})},
                 "lo")]} for i in range(n)]
        dele = mode.node.request({"op": "batch", "workers": workers, "calls": dels})
        for i, r in enumerate(dele["results"]):
            for k, c in enumerate(r["steps"]):
                self.record(mode, names[-1 - k], "DEL", c, sc, True,
                            {"workers": workers, "pod": i})
            calls += r["steps"]
        after = mode.node.request(look)
        leaks = (sorted(set(after["veths"]) - set(before["veths"])) + after["ports"]
                 + after["ips"] + [f"tuning {f}" for f in after["files"]])
        if after["nft"] is not None and before["nft"] is not None:
            leaks += sorted((Counter(after["nft"]) - Counter(before["nft"])).elements())
        for p in pods:
            self.drop_pod(p)
        cpu = sum(c["cpu"] for c in calls) + mode.helper_cpu() - helper0
        seconds = add["wall"] + dele["wall"]
        return {"pods": n, "workers": workers, "seconds": seconds, "pods_per_s": n / seconds,
                "cpu_per_pod": cpu / n, "p99": p99([c["wall"] for c in calls if c["code"] == 0]),
                "calls": len(calls), "errors": len(self.errors) - errors0, "duplicates": dups,
                "nft_checked": after["nft"] is not None,
                "nft_live": (len(live["nft"]) - len(before["nft"])
                             if live["nft"] is not None and before["nft"] is not None else None),
                "leaks": leaks}

    def long_churn(self) -> None:
        """--long-churn N: N pods of bridge churn (8 workers) in rounds of
        ``long_round`` pods, warm mode only; the worker tree's memory after
        each round."""
        total = self.args.long_churn
        mode = next((m for m in self.modes if m.key == "warm"), None)
        if not total or mode is None:
            return
        per = min(self.prof.long_round, total)
        rounds = math.ceil(total / per)
        log(f"long churn: warm, {rounds} rounds of {per} pods, 8 workers")
        points = [{"pods": 0, **mode.memory()}]
        agg = {"errors": 0, "duplicates": 0, "leaks": [], "seconds": 0.0}
        for k in range(rounds):
            res = self.churn_round(mode, 8, pods=per, scenario="long-churn", record=False,
                                   store="long-ipam")
            for key in ("errors", "duplicates", "leaks", "seconds"):
                agg[key] += res[key]
            points.append({"pods": (k + 1) * per, **mode.memory()})
            if (k + 1) % 10 == 0:
                log(f"long churn: {(k + 1) * per} pods, worker PSS "
                    f"{mib(points[-1]['pss'])} MiB")
        done = rounds * per
        self.results["long_churn"] = {"pods": done, "per_round": per, "workers": 8,
                                      "pods_per_s": done / agg["seconds"], **agg,
                                      "points": points}

    def scale_host_local(self) -> None:
        sc = "scale-hl"
        pod = self.pod()
        filled = 0
        for lvl in self.prof.hl_levels:
            log(f"scale: host-local with {lvl} allocations")
            for mode in self.modes:
                self.fill_store(self.store(mode, "scale-ipam"), filled, lvl)
            filled = lvl
            for k in range(self.prof.scale_samples):
                for mode in self.rotation(k):
                    conf = net_conf("scalenet", {"type": "bridge", "ipam": ipam(
                        self.store(mode, "scale-ipam"), "10.99.0.0/16")})
                    cid = f"{mode.key}-hl-{lvl}-{k}"
                    kw = {"scenario": sc, "netns": pod.path, "level": lvl}
                    self.call(mode, "host-local", "ADD", conf, cid=cid, **kw)
                    self.call(mode, "host-local", "CHECK", conf, cid=cid, **kw)
                    self.call(mode, "host-local", "DEL", conf, cid=cid, **kw)
                    _, _ = self.call(mode, "host-local", "DEL", conf, cid=f"unknown-{k}",
                                     **{**kw, "unknown": True})
        self.drop_pod(pod)

    @staticmethod
    def fill_store(store: str, start: int, stop: int) -> None:
        """Go's on-disk format: <dataDir>/<net>/<ip> holding "<cid>\\r\\n<ifname>"."""
        d = os.path.join(store, "scalenet")
        os.makedirs(d, exist_ok=True)
        base = ipaddress.ip_address("10.99.0.2")
        for i in range(start, stop):
            with open(os.path.join(d, str(base + i)), "w") as fp:
                fp.write(f"fill-{i}\r\neth0")
        if stop:
            with open(os.path.join(d, "last_reserved_ip.0"), "w") as fp:
                fp.write(str(base + stop - 1))

    def scale_portmap(self) -> None:
        sc = "scale-pm"
        pod = self.pod()
        conf_pm = {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}}
        filled = 0
        for lvl in self.prof.pm_levels:
            log(f"scale: portmap with {lvl} other pods' mappings (filling {lvl - filled})")
            for mode in self.modes:
                self.fill_portmap(mode, pod.path, conf_pm, filled, lvl)
            filled = lvl
            for k in range(self.prof.scale_samples):
                for mode in self.rotation(k):
                    conf = net_conf("benchnet", conf_pm,
                                    fake_result(pod.path, "10.66.255.2/16"),
                                    {"portMappings": mappings(9080, 9053)})
                    kw = {"scenario": sc, "netns": pod.path, "level": lvl,
                          "cid": f"{mode.key}-pm-{lvl}-{k}"}
                    for verb in ("ADD", "CHECK", "DEL"):
                        self.call(mode, "portmap", verb, conf, **kw)
        self.drop_pod(pod)

    def fill_portmap(self, mode: Mode, pod_path: str, conf_pm: dict, start: int,
                     stop: int) -> None:
        def req(j: int) -> dict:
            ip = f"10.66.{j // 250}.{j % 250 + 2}/16"
            conf = net_conf("benchnet", conf_pm, fake_result(pod_path, ip),
                            {"portMappings": mappings(20000 + j, 40000 + j)})
            return mode.request("portmap", self.env(mode, "ADD", f"pmfill-{j}", pod_path, "eth0"),
                                json.dumps(conf))

        self.bulk(mode, "portmap", "ADD", req, start, stop, "scale-pm-fill")

    def bulk(self, mode: Mode, plugin: str, verb: str, req, start: int, stop: int,
             scenario: str) -> float:
        """The agent requests ``req(j)`` for j in [start, stop): calls of
        ``plugin`` ``verb`` filling or emptying a scale level (not samples; a
        failure is an error as any call's). From 0 the first goes alone (an
        ADD creates the chains, tables or sets the rest would race for), the
        rest as one batch on ``fill_workers`` threads. Returns the wall
        seconds of it all."""
        wall = 0.0
        if start == 0 and stop > 0:
            r = mode.node.request(req(0))
            self.record(mode, plugin, verb, r, scenario, False, {})
            wall, start = r["wall"], 1
        if stop > start:
            out = mode.node.request({"op": "batch", "workers": self.prof.fill_workers,
                                     "calls": [req(j) for j in range(start, stop)]})
            for r in out["results"]:
                self.record(mode, plugin, verb, r, scenario, False, {})
            wall += out["wall"]
        return wall

    def traced_argv(self, exe: str) -> list[str]:
        """``exe``'s Python command line plus ``-X importtime``."""
        return python_argv(exe, ("-X", "importtime"))

    def profile(self) -> None:
        """Where each one-shot call of ours spends its time: one pod through
        the chain (and host-local alone, as bridge's delegate) traced with
        ``-X importtime``; the report splits each call's median wall time into
        interpreter start, imports by package and work (see report())."""
        log("profile: one traced call per plugin and verb (-X importtime)")
        mode = next(m for m in self.modes if m.key == "oneshot")
        py = sys.executable
        env = self.env(mode, "VERSION", "", "", "eth0")
        bare = [mode.node.request({"op": "exec", "argv": [py, "-I", "-c", "pass"], "env": env})
                for _ in range(7)]
        bare_imp = mode.node.request({"op": "exec", "argv": [py, "-I", "-X", "importtime", "-c",
                                                             "pass"], "env": env, "full_err": 1})
        startup = set(importtime(bare_imp["err"], nested=True))
        out: dict = {"interpreter": med([r["wall"] for r in bare]), "calls": {}}
        pod = self.pod()
        store = self.store(mode, "prof-ipam")
        plugins = chain(store)
        runtime = {"mac": "0a:58:0a:ff:ff:01", "portMappings": mappings(8080, 8053)}
        lo = {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}

        def traced(plugin: str, verb: str, conf: dict, cid: str, ifname: str = "eth0"):
            req = {"op": "exec", "argv": self.traced_argv(os.path.join(mode.bin_dir, plugin)),
                   "env": self.env(mode, verb, cid, pod.path, ifname),
                   "stdin": json.dumps(conf), "full_err": 1}
            r = mode.node.request(req)
            _, doc = self.record(mode, plugin, verb, r, "profile", False, {})
            out["calls"][f"{plugin} {verb}"] = {
                "wall": r["wall"], "split": import_split(r["err"], startup),
                "top": sorted(importtime(r["err"]).items(), key=lambda kv: -kv[1])[:4]}
            return doc

        lo_res = traced("loopback", "ADD", lo, "prof-0", "lo")
        prev = None
        for p in plugins:
            prev = traced(p["type"], "ADD", net_conf("benchnet", p, prev, runtime), "prof-0")
        hl_conf = net_conf("benchnet", plugins[0])  # the bridge config, as the delegate gets it
        traced("host-local", "ADD", hl_conf, "prof-hl")
        traced("host-local", "DEL", hl_conf, "prof-hl")
        for p in reversed(plugins):
            traced(p["type"], "DEL", net_conf("benchnet", p, prev, runtime), "prof-0")
        traced("loopback", "DEL", {**lo, **({"prevResult": lo_res} if lo_res else {})},
               "prof-0", "lo")
        self.drop_pod(pod)
        self.results["profile"] = out

    def profile_rows(self) -> list[tuple[str, dict]]:
        """Per traced call: wall (median of the run), interpreter, imports
        split by package, work (see the report's note)."""
        pr = self.results.get("profile") or {}
        interp = pr.get("interpreter")
        inproc = any(m.key == "inproc" for m in self.modes)
        rows = []
        for call, v in pr.get("calls", {}).items():
            plugin, verb = call.split()
            if plugin == "host-local":  # as bridge's delegate: the scale run at 0 allocations
                sel = {"scenario": "scale-hl", "level": 0, "unknown": None}
            else:
                sel = {"scenario": "lifecycle"}
            wall = med(self.sel(mode="oneshot", plugin=plugin, verb=verb, **sel))
            # (the first in-process call of a plugin imports what it needs: not work)
            done = self.sel(mode="inproc", plugin=plugin, verb=verb, **sel) if inproc else []
            work = med(done[1:] or done)
            split = {k: t for k, t in v["split"].items() if k != "startup"}
            traced_imports = sum(split.values())
            if wall is None or interp is None:
                continue
            if work is None:  # no in-process run: imports as traced (inflated), the rest is work
                imports = traced_imports
                work = max(0.0, wall - interp - imports)
            else:
                imports = max(0.0, wall - interp - work)
            scale = imports / traced_imports if traced_imports else 0.0
            rows.append((call, {"wall": wall, "interpreter": interp, "work": work,
                                "imports": imports,
                                **{k: t * scale for k, t in split.items()}}))
        return rows

    # --- report

    def wants(self, scenario: str) -> bool:
        """Whether ``scenario`` (one of `SCENARIOS`) runs: --only selects."""
        return not self.args.only or scenario in self.args.only

    def run(self) -> int:
        t0 = time.monotonic()
        self.setup()
        steps = (("version", self.version), ("lifecycle", self.lifecycle),
                 ("interfaces", lambda: interfaces.run(self)),
                 ("chained", lambda: chained.run(self)),
                 ("memory", lambda: self.idle_memory("after the lifecycle")),
                 ("churn", self.churn), ("chain-churn", self.chain_churn),
                 ("long-churn", self.long_churn), ("scale-hl", self.scale_host_local),
                 ("scale-pm", self.scale_portmap), ("firewall-scale", lambda: chained.scale(self)),
                 ("profile", self.profile), ("memory", lambda: self.idle_memory("end of run")))
        for scenario, step in steps:
            if self.wants(scenario):
                step()
        self.results["seconds"] = time.monotonic() - t0
        return self.report()

    def report(self) -> int:
        lines: list[str] = []
        w = lines.append
        prof = self.prof
        extra = [m.key for m in self.modes if m.key not in ("go", "oneshot")]
        w(f"# cni-skel benchmark ({prof.name})\n")
        w(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, {platform.node()}, Linux {platform.release()}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs. Modes: "
          + ", ".join(f"`{m.key}` ({m.label})" for m in self.modes)
          + (". Skipped: " + "; ".join(f"`{k}`: {v}" for k, v in self.skipped.items())
             if self.skipped else "")
          + f". Calls interleaved per sample with the mode order rotated; wall and CPU in ms, "
          f"peak RSS in MiB (wait4 of the plugin process tree). Ratio = ours/Go 1.1.1 of medians "
          f"(the summary line adds ours/Go 1.9.1). "
          f"Took {self.results['seconds']:.0f} s."
          + (f" Only {', '.join(self.args.only)} (--only): the other tables are empty and "
             "their budgets left out." if self.args.only else "") + "\n")

        # VERSION
        w(f"## VERSION (start-up), {prof.version_samples} samples\n")
        w("| plugin | Go ms med (p95) | ours ms med (p95) | ours/Go | Go RSS | ours RSS |"
          + "".join(f" {e} ms |" for e in extra))
        w("|---" * (6 + len(extra)) + "|")
        for p in PLUGINS:
            g, o = self.sel("version", "go", p), self.sel("version", "oneshot", p)
            gr, orr = (self.sel("version", m, p, key="rss") for m in ("go", "oneshot"))
            w(f"| {p} | {ms(med(g))} ({ms(p95(g))}) | {ms(med(o))} ({ms(p95(o))}) "
              f"| {rx(ratio(med(o), med(g)))} | {mib(med(gr))} | {mib(med(orr))} |"
              + "".join(f" {ms(med(self.sel('version', e, p)), 2)} |" for e in extra))

        # lifecycle
        w(f"\n## Pod lifecycle, {prof.pods} pods sequential\n")
        w("loopback ADD; bridge(+host-local) -> tuning (sysctl + MAC) -> portmap (tcp + udp) "
          "ADD with prevResult; CHECK each; DEL in reverse. Chain rows sum the plugins of one "
          "pod (loopback included).\n")
        hdr = ("| plugin verb | Go ms med (p95) | ours ms med (p95) | ours/Go | Go CPU | ours CPU "
               "| CPU ours/Go | Go RSS | ours RSS |")
        w(hdr + "".join(f" {e} ms | {e}/Go |" for e in extra))
        w("|---" * (9 + 2 * len(extra)) + "|")
        chains = self.chain_totals()
        for verb in ("ADD", "CHECK", "DEL"):
            for p in ("loopback", "bridge", "tuning", "portmap"):
                self.row(w, f"{p} {verb}", {
                    m.key: (self.sel("lifecycle", m.key, p, verb),
                            self.sel("lifecycle", m.key, p, verb, "cpu"),
                            self.sel("lifecycle", m.key, p, verb, "rss"))
                    for m in self.modes}, extra)
            self.row(w, f"**{verb} chain**", {k: v[verb] for k, v in chains.items()}, extra)
        self.row(w, "**pod total**", {k: v["total"] for k, v in chains.items()}, extra)

        # churn
        w(f"\n## Churn: {prof.churn_pods} pods per round, bridge + one host-local range\n")
        w(f"{prof.churn_rounds} round(s) per worker count, the modes interleaved round by round "
          "(one-shot: the first round only); each figure is the median of the mode's rounds, "
          "pods/s with their range (min-max), errors, duplicates and leaks summed. "
          "All pods ADDed by N workers, duplicates checked while all are live, then DELed; "
          "leaks = veths, bridge ports or IP files left. CPU: the plugin processes (wait4) "
          "plus, in warm mode, the worker's whole process tree. p99 of every call's wall "
          "time. ADD / DEL s: the round's two phases (all ADDs, then all DELs), with the "
          "share of the machine's CPU time that was busy in each (/proc/stat).\n")
        w("| workers | mode | pods/s | vs Go | CPU/pod ms | vs Go | p99 call ms | vs Go | errors "
          "| duplicates | leaks | ADD / DEL s (CPU busy) |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for wk, res in self.results.get("churn", {}).items():
            for m, o in sorted(res.items(), key=lambda kv: kv[0] != "go"):
                phases = (f" {o['add_seconds']:.2f} ({pct(o['add_busy'])}) / "
                          f"{o['del_seconds']:.2f} ({pct(o['del_busy'])}) |"
                          if "add_seconds" in o else " - |")
                w(f"| {wk} | {m} | " + self.churn_cells(o, res.get("go", {})) + phases)

        # chain churn
        cc = self.results.get("chain_churn", {})
        if cc:
            one = next(iter(cc.values()))
            w(f"\n## Chain churn: {one['pods']} pods, {one['workers']} workers, the lifecycle's "
              "chain\n")
            w("Per pod, in one worker thread: loopback ADD, bridge(+host-local) ADD, tuning ADD "
              "with bridge's prevResult, portmap ADD with tuning's; all pods live, then DEL "
              "(reverse order per pod). CPU: the plugin processes (wait4) plus, in warm mode, "
              "the worker's whole process tree. p99 of every call's wall time. Leaks: veths, "
              "bridge ports, IP files, tuning's saved files, and nftables set/map elements "
              "(Go: CNI-DN-* chains) left in the node's ruleset. Modes: "
              + ", ".join(f"`{m}`" for m in CHAIN_MODES)
              + " only (one-shot, ~25x Go per call, would take too long).\n")
            w("| mode | pods/s | vs Go | CPU/pod ms | vs Go | p99 call ms | vs Go | errors "
              "| duplicates | leaks |")
            w("|---|---|---|---|---|---|---|---|---|---|")
            for m, o in sorted(cc.items(), key=lambda kv: kv[0] != "go"):
                w(f"| {m} | " + self.churn_cells(o, cc.get("go", {})))
            live = [f"{m} {o['nft_live']}" for m, o in cc.items() if o.get("nft_live") is not None]
            if live:
                w("\nnftables entries the leak check saw while all pods were live: "
                  + ", ".join(live) + ".")
            for m, o in cc.items():
                if o["leaks"]:
                    w(f"\n{m} leaks (first 5): " + ", ".join(f"`{x}`" for x in o["leaks"][:5]))
                if not o.get("nft_checked"):
                    w(f"\n{m}: nftables not readable (`nft -j list ruleset`): not checked")

        # memory
        mem = self.results.get("memory", {})
        if mem:
            w("\n## Memory: the warm worker and all its processes\n")
            w("PSS and RSS: sums of /proc/<pid>/smaps_rollup over the worker's live process "
              "tree. Idle: 1 s after its last call. Under churn: the peak (by PSS) of samples "
              "every 0.2 s during the round.\n")
            w("| mode | when | PSS MiB | RSS MiB | processes |")
            w("|---|---|---|---|---|")
            for m, kinds in mem.items():
                for label, v in kinds.get("idle", {}).items():
                    w(f"| {m} | idle, {label} | {mib(v['pss'])} | {mib(v['rss'])} "
                      f"| {v['procs']} |")
                for label, v in kinds.get("peak", {}).items():
                    w(f"| {m} | peak, {label} ({v['samples']} samples) | {mib(v['pss'])} "
                      f"| {mib(v['rss'])} (max {mib(v['rss_max'])}) | {v['procs']} |")
        lc = self.results.get("long_churn")
        if lc:
            w(f"\n## Long churn (warm): {lc['pods']:,} pods, {lc['per_round']} per round, "
              f"{lc['workers']} workers\n")
            w(f"{lc['pods_per_s']:.1f} pods/s; errors {lc['errors']}, duplicates "
              f"{lc['duplicates']}, leaks {len(lc['leaks'])}. The worker tree after the round "
              "ending at:\n")
            w("| pods | PSS MiB | RSS MiB | processes |")
            w("|---|---|---|---|")
            for pt in self.long_points(lc):
                w(f"| {pt['pods']:,} | {mib(pt['pss'])} | {mib(pt['rss'])} | {pt['procs']} |")
            top = max(lc["points"], key=lambda pt: pt["rss"])
            w(f"\nHighest RSS after a round: {mib(top['rss'])} MiB at {top['pods']:,} pods.")

        # scale
        w(f"\n## Scale: host-local in a /16 ({prof.scale_samples} samples per level)\n")
        w("| verb @ allocations | Go ms med | ours ms med | ours/Go | Go vs its 0 "
          "| ours vs its 0 |" + "".join(f" {e} ms |" for e in extra))
        w("|---" * (6 + len(extra)) + "|")
        for label, verb, tags in (("ADD", "ADD", {}), ("CHECK", "CHECK", {}),
                                  ("DEL", "DEL", {"unknown": None}),
                                  ("DEL unknown ID", "DEL", {"unknown": True})):
            for lvl in prof.hl_levels:
                self.scale_row(w, label, "scale-hl", "host-local", verb, lvl, extra, **tags)
        w(f"\n## Scale: portmap with other pods' mappings ({prof.scale_samples} samples)\n")
        w("| verb @ pods | Go ms med | ours ms med | ours/Go | Go vs its 0 | ours vs its 0 |"
          + "".join(f" {e} ms |" for e in extra))
        w("|---" * (6 + len(extra)) + "|")
        for verb in ("ADD", "CHECK", "DEL"):
            for lvl in prof.pm_levels:
                self.scale_row(w, verb, "scale-pm", "portmap", verb, lvl, extra)
        chained.scale_report(self, w)

        # profile
        rows = self.profile_rows()
        if rows:
            w("\n## Where the time goes: one-shot calls of ours (`oneshot` mode)\n")
            w("| call | wall ms | interpreter + site | pydantic | pyroute2 | nftables "
              "| ours (modules, model classes) | other stdlib | work |")
            w("|---|---|---|---|---|---|---|---|---|")
            for call, r in rows:
                w(f"| {call} | {ms(r['wall'])} | {ms(r['interpreter'])} | {ms(r['pydantic'])} "
                  f"| {ms(r['pyroute2'])} | {ms(r['nftables'])} | {ms(r['ours'])} "
                  f"| {ms(r['other'])} | {ms(r['work'])} |")
            w("\nMedians of the run (host-local: the scale run at 0 allocations, as bridge's "
              "delegate). Interpreter + site: `python -I -c pass`. Work: the same call "
              "in-process (`inproc` mode; bridge's includes its host-local delegate process). "
              "Imports: the rest, split in proportion to one `-X importtime` trace per call "
              "(a module counts for the package that imported it first: asyncio under pyroute2; "
              "pydantic model classes built at import count as ours).")

        interfaces.report(self, w)
        chained.report(self, w)

        budgets = self.budgets(chains)
        w("\n## Budgets\n")
        w("| budget | measured | result |")
        w("|---|---|---|")
        for name, measured, ok in budgets:
            w(f"| {name} | {measured} | {'PASS' if ok else ('FAIL' if ok is False else 'n/a')} |")

        churn = self.results.get("churn", {})
        rounds = [(f"{wk}w", res) for wk, res in churn.items()]
        rounds.append(("chain", self.results.get("chain_churn", {})))
        if "long_churn" in self.results:
            rounds.append(("long", {"warm": self.results["long_churn"]}))
        bad = [f"{label} {m}: {r['errors']} errors, {r['duplicates']} dups, "
               f"{len(r['leaks'])} leaks"
               for label, res in rounds for m, r in res.items()
               if m not in REFERENCES and (r["errors"] or r["duplicates"] or r["leaks"])]
        for title, errs in (("Errors (ours)", self.errors),
                            ("Failures of the Go reference (reported, not fatal; e.g. Go 1.1.1 "
                             "portmap CHECK wants an IPv6 DNAT chain for an IPv4-only pod)",
                             self.ref_errors)):
            if errs:
                w(f"\n## {title}: {len(errs)}\n")
                for e in errs[:20]:
                    w("- `" + " ".join(e.split())[:400] + "`")
        passed = sum(1 for _, _, ok in budgets if ok)
        judged = sum(1 for _, _, ok in budgets if ok is not None)
        cg, co = chains["go"], chains["oneshot"]
        churn_txt = " ".join(
            f"{wk}w {res.get('oneshot', {}).get('pods_per_s', 0):.1f}/"
            f"{res.get('go', {}).get('pods_per_s', 0):.1f}" for wk, res in churn.items())
        status = "ok" if not self.errors and not bad else "FAILED"
        cc = self.results.get("chain_churn", {})
        chain_txt = ""
        if "warm" in cc and "go" in cc:
            chain_txt = (f"chain churn warm/Go pods/s "
                         f"{rx(ratio(cc['warm']['pods_per_s'], cc['go']['pods_per_s']))}, "
                         f"CPU/pod {rx(ratio(cc['warm']['cpu_per_pod'], cc['go']['cpu_per_pod']))}"
                         ", ")
        add_r = rx(ratio(med(co["ADD"][0]), med(cg["ADD"][0])))
        del_r = rx(ratio(med(co["DEL"][0]), med(cg["DEL"][0])))
        head = ""
        if "warm" in chains:
            cw = chains["warm"]
            head = ("default install (warm): " + ", ".join(
                f"{label} {rx(ratio(med(cw[k][0]), med(cg[k][0])))}"
                for label, k in (("ADD chain", "ADD"), ("DEL chain", "DEL"),
                                 ("pod total", "total"))) + " Go; ")
        if "go191" in chains and chains["go191"]["ADD"][0]:
            c191 = chains["go191"]
            pairs = [("one-shot ADD chain", co, "ADD"), ("DEL chain", co, "DEL")]
            if "warm" in chains:
                pairs = [("warm ADD chain", chains["warm"], "ADD"),
                         ("DEL chain", chains["warm"], "DEL"), *pairs]
            head += "vs Go 1.9.1: " + ", ".join(
                f"{label} {rx(ratio(med(c[k][0]), med(c191[k][0])))}"
                for label, c, k in pairs) + "; "
        summary = (f"bench {prof.name} {status}: {head}one-shot fallback: ADD chain {add_r} Go, "
                   f"DEL chain {del_r}, "
                   f"pod {ms(med(co['total'][0]), 0)}/{ms(med(cg['total'][0]), 0)} ms, "
                   f"churn pods/s ours/Go {churn_txt}, {chain_txt}budgets {passed}/{judged} pass, "
                   f"errors {len(self.errors)} (Go {len(self.ref_errors)}), "
                   f"dup+leak issues {len(bad)}")
        text = "\n".join(lines) + "\n"
        os.makedirs(self.args.out, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        md = os.path.join(self.args.out, f"bench-{prof.name}-{stamp}.md")
        js = os.path.join(self.args.out, f"bench-{prof.name}-{stamp}.json")
        with open(md, "w") as fp:
            fp.write(text + "\n" + summary + "\n")
        doc = {"profile": prof.__dict__, "modes": [m.key for m in self.modes],
               "skipped": self.skipped, "results": self.results,
               "budgets": budgets, "errors": self.errors,
               "go_errors": self.ref_errors, "summary": summary,
               "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
               "samples": self.samples}
        with open(js, "w") as fp:
            json.dump(doc, fp, indent=1)
        svg = draw(doc, os.path.splitext(js)[0] + ".svg")  # the headline ratios
        print(text)
        print(f"results: {md}\n         {js}\n" + (f"         {svg}\n" if svg else ""))
        print(summary, flush=True)
        return 1 if self.errors or bad else 0

    def chain_totals(self) -> dict:
        """Per mode and verb: per-pod sums (wall list, cpu list, rss max list)."""
        out: dict = {}
        for m in (m.key for m in self.modes):
            per: dict = {}
            for s in self.samples:
                if s["scenario"] == "lifecycle" and s["mode"] == m and s["code"] == 0:
                    d = per.setdefault((s["pod"], s["verb"]), [0.0, 0.0, 0])
                    d[0] += s["wall"]
                    d[1] += s["cpu"]
                    d[2] = max(d[2], s["rss"] or 0)
            res: dict = {}
            for verb in ("ADD", "CHECK", "DEL"):
                vals = [v for (_, vb), v in per.items() if vb == verb]
                res[verb] = ([v[0] for v in vals], [v[1] for v in vals],
                             [v[2] for v in vals if v[2]])
            pods: dict = {}
            for (pod, _), v in per.items():
                t = pods.setdefault(pod, [0.0, 0.0, 0])
                t[0] += v[0]
                t[1] += v[1]
                t[2] = max(t[2], v[2])
            res["total"] = ([v[0] for v in pods.values()], [v[1] for v in pods.values()],
                            [v[2] for v in pods.values() if v[2]])
            out[m] = res
        return out

    @staticmethod
    def churn_cells(o: dict, g: dict) -> str:
        """The churn tables' cells after the mode (``g``: Go's round); over
        several rounds, pods/s is the median with the rounds' range."""
        rounds = o.get("rounds") or []
        spread = "" if len(rounds) < 2 else (
            f" ({min(r['pods_per_s'] for r in rounds):.1f}-"
            f"{max(r['pods_per_s'] for r in rounds):.1f})")
        return (f"{o['pods_per_s']:.1f}{spread} "
                f"| {rx(ratio(o['pods_per_s'], g.get('pods_per_s')))} "
                f"| {ms(o['cpu_per_pod'])} | {rx(ratio(o['cpu_per_pod'], g.get('cpu_per_pod')))} "
                f"| {ms(o.get('p99'))} | {rx(ratio(o.get('p99'), g.get('p99')))} "
                f"| {o['errors']} | {o['duplicates']} | {len(o['leaks'])} |")

    def scale_row(self, w, label: str, scenario: str, plugin: str, verb: str, level: int,
                  extra: list[str], ours: str = "oneshot", **tags) -> None:
        """A scale table's row: Go's and ``ours``'s median wall times (ms) at
        ``level``, ours/Go, each against its own median at level 0, then the
        ``extra`` modes' medians (ms)."""
        def at(mode: str, lvl: int) -> float | None:
            return med(self.sel(scenario, mode, plugin, verb, level=lvl, **tags))

        g, o, g0, o0 = at("go", level), at(ours, level), at("go", 0), at(ours, 0)
        w(f"| {label} @ {level:,} | {ms(g)} | {ms(o)} | {rx(ratio(o, g))} "
          f"| {rx(ratio(g, g0))} | {rx(ratio(o, o0))} |"
          + "".join(f" {ms(at(e, level))} |" for e in extra))

    def scale_budget(self, name: str, scenario: str, mode: str, plugin: str, verb: str,
                     top: int, limit: float, **tags) -> tuple[str, str, bool]:
        """A budget on growth: ``mode``'s median wall time at level ``top``
        over its median at level 0, at most ``limit``."""
        a = med(self.sel(scenario, mode, plugin, verb, level=0, **tags))
        z = med(self.sel(scenario, mode, plugin, verb, level=top, **tags))
        r = ratio(z, a)
        return name, f"{ms(z)} / {ms(a)} ms = {rx(r)}", r is not None and r <= limit

    @staticmethod
    def long_points(lc: dict) -> list[dict]:
        """The long churn's samples at 0, half-way and the end."""
        pts = lc["points"]
        half = min(pts, key=lambda pt: abs(pt["pods"] - lc["pods"] / 2))
        out = [pts[0], half, pts[-1]]
        return [pt for k, pt in enumerate(out) if pt not in out[:k]]

    @staticmethod
    def row(w, label: str, data: dict, extra: list[str]) -> None:
        (gw, gc, gr), (ow, oc, orr) = data["go"], data["oneshot"]
        line = (f"| {label} | {ms(med(gw))} ({ms(p95(gw))}) | {ms(med(ow))} ({ms(p95(ow))}) "
                f"| {rx(ratio(med(ow), med(gw)))} | {ms(med(gc))} | {ms(med(oc))} "
                f"| {rx(ratio(med(oc), med(gc)))} | {mib(med(gr))} | {mib(med(orr))} |")
        for e in extra:
            ew = data[e][0]
            line += f" {ms(med(ew))} | {rx(ratio(med(ew), med(gw)))} |"
        w(line)

    def default_budgets(self, chains: dict) -> list[tuple[str, str, bool | None]]:
        """Issue 19's budgets for the default install (`warm` mode: launchers
        and a socket-activated worker), same run vs Go."""
        warm = next((m for m in self.modes if m.key == "warm"), None)
        if warm is None or "warm" not in chains:
            return [("default install (warm) budgets", "warm mode not run", None)]
        b: list[tuple[str, str, bool | None]] = []
        rv = {p: ratio(med(self.sel("version", "warm", p)), med(self.sel("version", "go", p)))
              for p in PLUGINS}
        worst = max(rv, key=lambda p: rv[p] or math.inf)
        b.append(("default install: VERSION <= 1.5x Go, every plugin",
                  f"max {rx(rv[worst])} ({worst})",
                  all(r is not None and r <= 1.5 for r in rv.values())))
        for label, key, lim in (("ADD chain", "ADD", 0.8), ("DEL chain", "DEL", 0.5),
                                ("pod total", "total", 0.6)):
            g, o = med(chains["go"][key][0]), med(chains["warm"][key][0])
            r = ratio(o, g)
            b.append((f"default install: {label} <= {lim:g}x Go",
                      f"{ms(o)} / {ms(g)} ms = {rx(r)}", r is not None and r <= lim))
        for plugin in ("loopback", "tuning"):
            g = med(self.sel("lifecycle", "go", plugin, "ADD"))
            o = med(self.sel("lifecycle", "warm", plugin, "ADD"))
            r = ratio(o, g)
            b.append((f"default install: {plugin} ADD <= 1.5x Go",
                      f"{ms(o)} / {ms(g)} ms = {rx(r)}", r is not None and r <= 1.5))
        first = getattr(warm, "first_call", None)
        b.append(("default install: first call after socket activation <= 1 s",
                  f"{ms(first, 0)} ms", first is not None and first <= 1.0))
        return b

    def issue20_budgets(self, chains: dict) -> list[tuple[str, str, bool | None]]:
        """Issue 20's budgets: the default install (`warm`) against `go` in
        CPU, throughput under churn, p99 and the worker's memory."""
        if "warm" not in chains:
            return [("issue 20 (warm CPU) budgets", "warm mode not run", None)]
        pre = "issue 20 (warm CPU): "
        b: list[tuple[str, str, bool | None]] = []
        churn = self.results.get("churn", {})

        def vs_go(label: str, res: dict | None, key: str, lim: float, higher: bool,
                  unit: str, scale: float = 1.0) -> None:
            name = f"{pre}{label} {'>=' if higher else '<='} {lim:g}x Go"
            o, g = (res or {}).get("warm", {}).get(key), (res or {}).get("go", {}).get(key)
            if o is None or g is None:
                b.append((name, "not run", None))
                return
            r = ratio(o, g)
            ok = r is not None and (r >= lim if higher else r <= lim)
            b.append((name, f"{o * scale:.1f} / {g * scale:.1f} {unit} = {rx(r)}", ok))

        for wk, lim in (("8", 1.5), ("2", 1.2)):
            vs_go(f"bridge churn {wk} workers: pods/s", churn.get(wk), "pods_per_s", lim, True,
                  "pods/s")
        vs_go("bridge churn 8 workers: CPU/pod", churn.get("8"), "cpu_per_pod", 1.0, False,
              "ms", 1000)
        vs_go("bridge churn 8 workers: DEL phase (issue 36)", churn.get("8"), "del_seconds",
              0.4, False, "s")
        cc = self.results.get("chain_churn")
        cw = self.prof.chain_workers
        vs_go(f"chain churn {cw} workers: pods/s", cc, "pods_per_s", 4.0, True, "pods/s")
        vs_go(f"chain churn {cw} workers: CPU/pod", cc, "cpu_per_pod", 0.5, False, "ms", 1000)
        rounds = [(f"bridge churn {wk} workers", res.get("warm")) for wk, res in churn.items()]
        rounds.append((f"chain churn {cw} workers", (cc or {}).get("warm")))
        for label, o in rounds:
            if o is None:
                b.append((f"{pre}{label}: 0 errors, 0 duplicates, 0 leaks", "not run", None))
                continue
            b.append((f"{pre}{label}: 0 errors, 0 duplicates, 0 leaks",
                      f"{o['errors']}/{o['duplicates']}/{len(o['leaks'])}",
                      not (o["errors"] or o["duplicates"] or o["leaks"])))
        for plugin, verb in (("loopback", "ADD"), ("tuning", "ADD"), ("bridge", "CHECK")):
            g = med(self.sel("lifecycle", "go", plugin, verb))
            o = med(self.sel("lifecycle", "warm", plugin, verb))
            r = ratio(o, g)
            b.append((f"{pre}{plugin} {verb} <= 1x Go", f"{ms(o)} / {ms(g)} ms = {rx(r)}",
                      r is not None and r <= 1.0))
        g, o = med(chains["go"]["total"][0]), med(chains["warm"]["total"][0])
        r = ratio(o, g)
        b.append((f"{pre}pod total <= 0.5x Go", f"{ms(o)} / {ms(g)} ms = {rx(r)}",
                  r is not None and r <= 0.5))
        vs_go("bridge churn 8 workers: p99 call", churn.get("8"), "p99", 1.0, False, "ms", 1000)
        vs_go(f"chain churn {cw} workers: p99 call", cc, "p99", 1.0, False, "ms", 1000)
        mem = self.results.get("memory", {}).get("warm", {})
        peaks = {k: v for k, v in mem.get("peak", {}).items() if "8 workers" in k}
        if peaks:
            top = max(peaks, key=lambda k: peaks[k]["pss"])
            b.append((f"{pre}worker tree PSS under 8-way churn <= 150 MiB",
                      f"{mib(peaks[top]['pss'])} MiB ({top})",
                      peaks[top]["pss"] <= 150 * MiB))
        else:
            b.append((f"{pre}worker tree PSS under 8-way churn <= 150 MiB", "not run", None))
        idle = mem.get("idle", {})
        if idle:
            top = max(idle, key=lambda k: idle[k]["pss"])
            b.append((f"{pre}worker tree PSS idle <= 80 MiB",
                      f"{mib(idle[top]['pss'])} MiB ({top})", idle[top]["pss"] <= 80 * MiB))
        else:
            b.append((f"{pre}worker tree PSS idle <= 80 MiB", "not measured", None))
        lc = self.results.get("long_churn")
        name = f"{pre}no growth over a long churn: PSS at the end <= 1.05x half-way"
        if lc and len(self.long_points(lc)) == 3:
            _, half, end = self.long_points(lc)
            r = ratio(end["pss"], half["pss"])
            b.append((name, f"{mib(half['pss'])} MiB at {half['pods']:,} pods, "
                      f"{mib(end['pss'])} MiB at {end['pods']:,} = {rx(r)}",
                      r is not None and r <= 1.05))
        else:
            b.append((name, "not run (--long-churn N)", None))
        return b

    def budgets(self, chains: dict) -> list[tuple[str, str, bool | None]]:
        """Every group of budgets whose scenarios ran (all without --only)."""
        groups = (({"version", "lifecycle"}, self.default_budgets),
                  ({"lifecycle", "churn", "chain-churn", "memory", "long-churn"},
                   self.issue20_budgets),
                  ({"interfaces"}, lambda _: interfaces.budgets(self)),
                  ({"chained", "firewall-scale"}, lambda _: chained.budgets(self)),
                  ({"version", "lifecycle", "scale-hl", "scale-pm", "churn"},
                   self.oneshot_budgets))
        b: list[tuple[str, str, bool | None]] = []
        for scenarios, group in groups:
            if any(self.wants(sc) for sc in scenarios):
                b += group(chains)
        return b

    def oneshot_budgets(self, chains: dict) -> list[tuple[str, str, bool | None]]:
        """The one-shot fallback's budgets (`oneshot` against `go`) and the
        scale budgets of host-local and portmap."""
        b: list[tuple[str, str, bool | None]] = []
        vw = {p: med(self.sel("version", "oneshot", p)) for p in PLUGINS}
        vr = {p: med(self.sel("version", "oneshot", p, key="rss")) for p in PLUGINS}
        worst = max(vw, key=lambda p: vw[p] or 0)
        b.append(("one-shot fallback: VERSION median <= 25 ms, every plugin",
                  f"max {ms(vw[worst])} ms ({worst})",
                  all(v is not None and v <= 0.025 for v in vw.values())))
        if all(v is not None for v in vr.values()):
            worst = max(vr, key=lambda p: vr[p])
            b.append(("VERSION peak RSS <= 30 MiB, every plugin",
                      f"max {mib(vr[worst])} MiB ({worst})",
                      all(v <= 30 * MiB for v in vr.values())))
        else:
            b.append(("VERSION peak RSS <= 30 MiB, every plugin", "not measured (no cc)", None))
        hl = med(self.sel("scale-hl", "oneshot", "host-local", "ADD", level=0))
        b.append(("host-local ADD <= 60 ms", f"{ms(hl)} ms", hl is not None and hl <= 0.060))
        pg = med(self.sel("lifecycle", "go", "portmap", "DEL"))
        po = med(self.sel("lifecycle", "oneshot", "portmap", "DEL"))
        r = ratio(po, pg)
        b.append(("portmap DEL <= 1.0x Go", f"{ms(po)} / {ms(pg)} ms = {rx(r)}",
                  r is not None and r <= 1.0))
        b.append(("one nftables transaction per call", "not measured here (tests/test_nft.py)",
                  None))
        for verb, lim in (("DEL", 2.0), ("ADD", 5.0)):
            g, o = med(chains["go"][verb][0]), med(chains["oneshot"][verb][0])
            r = ratio(o, g)
            b.append((f"{verb} chain <= {lim:g}x Go (one-shot)",
                      f"{ms(o)} / {ms(g)} ms = {rx(r)}", r is not None and r <= lim))
        top = self.prof.hl_levels[-1]
        for verb, tags in (("ADD", {}), ("CHECK", {}), ("DEL", {"unknown": None}),
                           ("DEL", {"unknown": True})):
            name = verb + (" unknown ID" if tags.get("unknown") else "")
            b.append(self.scale_budget(f"host-local {name} at {top:,} <= 1.5x at 0", "scale-hl",
                                       "oneshot", "host-local", verb, top, 1.5, **tags))
        top = self.prof.pm_levels[-1]
        for verb in ("ADD", "DEL"):
            b.append(self.scale_budget(f"portmap {verb} at {top:,} pods <= 1.2x at 0", "scale-pm",
                                       "oneshot", "portmap", verb, top, 1.2))
        for wk, res in self.results.get("churn", {}).items():
            o = res.get("oneshot", {})
            g = res.get("go", {})
            ok = not (o.get("errors") or o.get("duplicates") or o.get("leaks"))
            b.append((f"churn {wk} workers: 0 errors, 0 duplicates, 0 leaks",
                      f"{o.get('errors')}/{o.get('duplicates')}/{len(o.get('leaks', []))}; "
                      f"{o.get('pods_per_s', 0):.1f} vs Go {g.get('pods_per_s', 0):.1f} pods/s, "
                      f"CPU/pod {ms(o.get('cpu_per_pod'))} vs {ms(g.get('cpu_per_pod'))} ms",
                      ok))
        return b


def _commit() -> str | None:
    """The checkout's short commit, for the chart's title (None outside git)."""
    try:
        run = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return run.stdout.strip() or None


def importtime(stderr: str, nested: bool = False) -> dict[str, float]:
    """Top-level modules of a -X importtime trace -> cumulative seconds
    (``nested``: every module, where it was first imported)."""
    out: dict[str, float] = {}
    for _self_us, cumulative_us, name in _importtime_lines(stderr):
        if name.startswith("  ") and not nested:  # counted in its parent's cumulative
            continue
        if nested and name.strip() in out:
            continue
        out[name.strip()] = out.get(name.strip(), 0.0) + cumulative_us / 1e6
    return out


def _importtime_lines(stderr: str) -> Iterator[tuple[int, int, str]]:
    """(self µs, cumulative µs, indented module name) of each -X importtime line."""
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        parts = line.split("|")
        if len(parts) != 3:
            continue
        try:
            yield int(parts[0].split(":", 1)[1]), int(parts[1]), parts[2].rstrip()
        except ValueError:
            continue


_PACKAGES = {"pydantic": "pydantic", "pydantic_core": "pydantic", "annotated_types": "pydantic",
             "typing_inspection": "pydantic", "typing_extensions": "pydantic",
             "pyroute2": "pyroute2", "nftables": "nftables",
             "cni_skel": "ours", "cni_skel_plugins": "ours"}


def import_split(stderr: str, startup: set[str]) -> dict[str, float]:
    """Self times (seconds) of a -X importtime trace by package: pydantic,
    pyroute2, nftables (each with what it imported first), ours (cni_skel and
    the plugins: module bodies, so pydantic model classes), other, and startup
    (what a bare interpreter imports, and site)."""
    pending: dict[int, list] = {}
    for self_us, _cumulative_us, name in _importtime_lines(stderr):
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        node = (name.strip(), self_us / 1e6, pending.pop(depth + 1, []))
        pending.setdefault(depth, []).append(node)
    out = dict.fromkeys(("startup", "pydantic", "pyroute2", "nftables", "ours", "other"), 0.0)

    def walk(node: tuple, inherited: str | None) -> None:
        name, t, children = node
        own = _PACKAGES.get(name.split(".")[0])
        if inherited == "startup" or name in startup or name == "site":
            cat = "startup"
        elif inherited in ("pydantic", "pyroute2", "nftables"):
            cat = inherited
        else:
            cat = own or "other"
        out[cat] += t
        for child in children:
            walk(child, cat)

    for root in pending.get(0, []):
        walk(root, None)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke size (< 60 s): 2 pods, one small churn round, scale at 0 and "
                         "1,000 allocations / 0 and 20 portmap pods / 0 and 100 firewall pods")
    ap.add_argument("--modes", default="go,go191,oneshot,inproc,warm",
                    help="comma list of: " + ", ".join(MODES) + " (default: all; a mode that "
                         "cannot run here is skipped with the reason)")
    ap.add_argument("--pods", type=int, default=0, help="pods in the lifecycle run")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"),
                    help="results directory (default bench/results)")
    ap.add_argument("--long-churn", type=int, default=0, metavar="N",
                    help="warm mode only: N pods of bridge churn (8 workers, rounds of 100 "
                         "pods), the worker tree's RSS/PSS after each round (default 0: skip; "
                         "10000 for issue 20's no-growth budget)")
    ap.add_argument("--only", default="", metavar="LIST",
                    help="comma list of scenarios to run (default: all): " + ", ".join(SCENARIOS))
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(unknown)}")
    args.only = [sc.strip() for sc in args.only.split(",") if sc.strip()]
    unknown = [sc for sc in args.only if sc not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench needs root (network namespaces)", file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    bench = Bench(args)
    try:
        return bench.run()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        bench.close()


if __name__ == "__main__":
    sys.exit(main())
