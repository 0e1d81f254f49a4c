"""The warm worker under faults: 8-way ADD/DEL churn of many pods (bridge +
host-local, ipMasq and macspoofchk, through the real launchers) while a
thread SIGKILLs random children of the worker every 20-200 ms.

The test starts its own worker (`conftest.SuiteWorker`: its own socket and
log) and writes the launchers of every plugin into a bin dir pointing at it,
as ``cni-skel install`` does (no ``CNI_SKEL_WORKER_REQUIRED``: a node's
default). Pods are network namespaces made by the test (a per-test prefix);
each is ADDed then DELeted by one of 8 threads; a killed call is answered by
the worker (999) or by its launcher (11), as the runtime sees it. Then the
runtime's DEL for every pod, retried up to `DEL_TRIES` times as a kubelet
would, and:

* no address was ever handed to two live pods (a pod is live from its
  successful ADD until its DEL starts);
* every call answered by the contract: exit 0 and no Error, or non-zero and
  an Error object (code > 0, msg);
* every final DEL succeeded; nothing is left: no address file in host-local's
  dataDir, no veth in the node namespace, no nftables element;
* the worker is the same process and answers ping.

Calls per answer code, kills and time are printed at the end.
``CNI_SKEL_FAULT_PODS`` sets the number of pods (default 500).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import SuiteWorker

from cni_skel.conformance import snapshot
from cni_skel.harness import TestNetNS, create_netns, remove_netns
from cni_skel.warm import client as launcher
from cni_skel.warm.install import plugin_registry, write_executable

PODS_ENV = "CNI_SKEL_FAULT_PODS"
THREADS = 8
KILL_EVERY = (0.02, 0.2)  # seconds between two kills, uniform
DEL_TRIES = 5
CALL_TIMEOUT = 120.0
IP = shutil.which("ip") or "/usr/sbin/ip"
NET = "fltnet"
BRIDGE = "cnskflt0"


def worker_children(pid: int) -> list[int]:
    """PIDs of ``pid``'s children: /proc/<pid>/task/*/children, or (kernels
    without CONFIG_PROC_CHILDREN) the PPid field of every /proc/<n>/stat."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        kids = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children") as fp:
                kids += [int(x) for x in fp.read().split()]
        return kids
    except FileNotFoundError:
        pass
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ppid(int(entry)) == pid:
            kids.append(int(entry))
    return kids


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


class Killer(threading.Thread):
    """SIGKILLs a random child of ``pid`` every 20-200 ms until `stop`.

    A child is pinned with a pidfd and its parent checked again before the
    signal, so a recycled PID is never hit."""

    def __init__(self, pid: int, seed: int) -> None:
        super().__init__(name="worker-child-killer", daemon=True)
        self.pid, self.rng = pid, random.Random(seed)
        self.kills = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.rng.uniform(*KILL_EVERY)):
            kids = worker_children(self.pid)
            if not kids:
                continue
            victim = self.rng.choice(kids)
            try:
                pidfd = os.pidfd_open(victim)
            except OSError:
                continue  # gone already
            try:
                if _ppid(victim) == self.pid:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    self.kills += 1
            except OSError:
                pass
            finally:
                os.close(pidfd)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@dataclass
class Pod:
    cid: str
    ns: TestNetNS | None = None
    ips: list[Any] = field(default_factory=list)


@dataclass
class Answer:
    exit_code: int
    doc: Any
    problem: str | None  # the output contract, broken


def _answer(proc: subprocess.CompletedProcess) -> Answer:
    out = proc.stdout
    doc = None
    problem = None
    if out.strip():
        try:
            doc = json.loads(out)
        except ValueError:
            problem = f"stdout is not one JSON document: {out[:200]!r}"
    is_error = isinstance(doc, dict) and "code" in doc
    if problem is None and proc.returncode == 0 and is_error:
        problem = f"exit 0 with an Error: {doc}"
    if problem is None and proc.returncode != 0:
        code = doc.get("code") if is_error else None
        if not (type(code) is int and code > 0 and isinstance(doc.get("msg"), str)):
            problem = f"exit {proc.returncode} without an Error object: {out[:200]!r}"
    return Answer(proc.returncode, doc, problem)


@pytest.fixture
def fault_worker(tmp_path: Any) -> Any:
    sock_dir = tempfile.mkdtemp(prefix="cnsk-flt-")  # short: sun_path holds 108 bytes
    worker = SuiteWorker(os.path.join(sock_dir, "worker.sock"), str(tmp_path / "worker.log"))
    try:
        yield worker
    finally:
        worker.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_churn_while_worker_children_are_killed(fault_worker: Any, tmp_path: Any,
                                                capsys: pytest.CaptureFixture) -> None:
    n_pods = int(os.environ.get(PODS_ENV) or 500)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, ref in plugin_registry().items():
        write_executable(str(bin_dir), name, ref, worker_socket=fault_worker.sock)
    bridge = str(bin_dir / "bridge")
    data_dir = str(tmp_path / "ipam")
    conf = json.dumps({
        "cniVersion": "1.1.0", "name": NET, "type": "bridge", "bridge": BRIDGE,
        "isGateway": True, "ipMasq": True, "macspoofchk": True,
        "ipam": {"type": "host-local", "dataDir": data_dir, "ranges": [
            [{"subnet": "10.89.0.0/24"}],
            [{"subnet": "fd00:89::/64", "rangeStart": "fd00:89::10", "rangeEnd": "fd00:89::ff"}],
        ]}}).encode()
    prefix = f"cnsk-flt{uuid.uuid4().hex[:6]}"
    node = create_netns(f"{prefix}n")
    pods = [Pod(f"flt-{i:04d}") for i in range(n_pods)]
    codes: collections.Counter[str] = collections.Counter()
    broken: list[str] = []
    duplicates: list[str] = []
    live: dict[Any, str] = {}  # address -> container ID of the live pod holding it
    lock = threading.Lock()

    def call(verb: str, pod: Pod) -> Answer:
        assert pod.ns is not None
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "CNI_COMMAND": verb, "CNI_CONTAINERID": pod.cid, "CNI_NETNS": pod.ns.path,
               "CNI_IFNAME": "eth0", "CNI_PATH": str(bin_dir)}
        try:
            proc = subprocess.run([IP, "netns", "exec", node.name, bridge], input=conf,
                                  env=env, capture_output=True, timeout=CALL_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired:
            with lock:
                codes[f"{verb} timed out"] += 1
                broken.append(f"{verb} {pod.cid}: no answer within {CALL_TIMEOUT:.0f} s")
            return Answer(-1, None, "timeout")
        answer = _answer(proc)
        key = "ok" if answer.exit_code == 0 else (
            f"code {answer.doc['code']}" if answer.problem is None else "broken")
        with lock:
            codes[f"{verb} {key}"] += 1
            if answer.problem:
                broken.append(f"{verb} {pod.cid}: {answer.problem}")
        return answer

    def lifecycle(pod: Pod) -> None:
        pod.ns = create_netns(prefix)
        add = call("ADD", pod)
        if add.exit_code == 0 and isinstance(add.doc, dict):
            ips = [ipaddress.ip_interface(i["address"]).ip for i in add.doc.get("ips", [])]
            with lock:
                for ip in ips:
                    if ip in live:
                        duplicates.append(f"{ip}: {live[ip]} and {pod.cid}")
                    live[ip] = pod.cid
                pod.ips = ips
        with lock:  # the runtime starts tearing the pod down: no longer live
            for ip in pod.ips:
                if live.get(ip) == pod.cid:
                    del live[ip]
        call("DEL", pod)

    def final_del(pod: Pod) -> str | None:
        for _ in range(DEL_TRIES):
            if call("DEL", pod).exit_code == 0:
                return None
            time.sleep(0.2)
        return f"DEL {pod.cid} still failing after {DEL_TRIES} tries"

    started = time.monotonic()
    killer = Killer(fault_worker.proc.pid, seed=n_pods)
    try:
        killer.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(lifecycle, pods))
        finally:
            killer.stop()
        churn_seconds = time.monotonic() - started
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            stuck = [r for r in pool.map(final_del, [p for p in pods if p.ns]) if r]

        left = snapshot.take({"node": node.path}, [data_dir])
        address_files = sorted(key[1] for key in left if key[0] == "file"
                               and _is_address(os.path.basename(key[1])))
        veths = sorted(key[2] for key, value in left.items()
                       if key[0] == "link" and value.kind == "veth")
        elements = sorted(f"{key[2]} {key[3]} {key[4]}: {key[5]}" for key in left
                          if key[0] == "elem")
        alive, pong = fault_worker.alive(), launcher.ping(fault_worker.sock, 10.0)
    finally:
        for pod in pods:
            if pod.ns is not None:
                with contextlib.suppress(Exception):
                    remove_netns(pod.ns)
        remove_netns(node)

    summary = (f"{n_pods} pods, {sum(codes.values())} calls, {killer.kills} worker children "
               f"killed; churn {churn_seconds:.0f} s, all {time.monotonic() - started:.0f} s; "
               "answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    with capsys.disabled():
        print(f"\nworker faults: {summary}")
    assert killer.kills > 0, "no worker child was ever killed: " + summary
    assert not duplicates, f"addresses handed to two live pods: {duplicates[:20]}; {summary}"
    assert not broken, f"answers breaking the contract: {broken[:20]}; {summary}"
    assert not stuck, f"{stuck[:20]}; {summary}"
    assert not address_files, f"host-local leaked {address_files[:20]}; {summary}"
    assert not veths, f"veths left in the node namespace: {veths[:20]}; {summary}"
    assert not elements, f"nftables elements left: {elements[:20]}; {summary}"
    assert alive and pong[0] and json.loads(pong[1])["pid"] == fault_worker.proc.pid, \
        f"the worker is not the same process answering ping ({pong}); {summary}"


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
