"""Serving processes are reused, and a request leaves nothing to the next (issue 20).

A worker serves calls from long-lived forked processes, one call at a time
each. After every call the process puts back what a call may change (fds
0-2, namespaces, cwd, umask, environment, sys.path) and checks the rest;
what it cannot put back (open fds, threads, signal handlers, an error 999,
smaller capability sets) ends the process instead, and a fresh one serves
the next call. These tests look at the idle process from outside, through
/proc, as well as through what the next call sees.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import HERE, SuiteWorker, serving_processes

from cni_skel import netlink
from cni_skel.harness import remove_netns, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.warm import serving
from cni_skel.warm.install import plugin_registry, write_executable

PROBE_REF = "worker_plugins.probe:WorkerProbe"
# What the process puts back itself, and what makes it step down.
RESTORED = ("cwd", "umask", "env", "netns", "syspath", "dellink")
RECYCLED = {"fd": "fds left open", "thread": "1 thread(s) left running",
            "signal": "signal handlers changed (SIGUSR2)", "raise": "answered error 999",
            "exit": "answered error 999"}


@pytest.fixture
def wdir():
    d = tempfile.mkdtemp(prefix="cnsk-r-")  # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Pool:
    """A worker with one spare, the probe's launcher, a node and a pod."""

    def __init__(self, wdir: str, netns_factory, *args: str) -> None:
        self.wdir = wdir
        self.worker = SuiteWorker(os.path.join(wdir, "w.sock"), os.path.join(wdir, "w.log"),
                                  preload=(PROBE_REF,), pythonpath=(str(HERE),),
                                  args=("--spares", "1", *args))
        self.exe = write_executable(os.path.join(wdir, "bin"), "worker-probe", PROBE_REF,
                                    pythonpath=[str(HERE)], worker_socket=self.worker.sock,
                                    launcher="native")
        self.node, self.pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        self.calls = 0

    def call(self, **conf):
        self.calls += 1
        report = os.path.join(self.wdir, f"r{self.calls}.json")
        run = run_plugin_raw(self.exe, "ADD", {"cniVersion": "1.1.0", "name": "probenet",
                                               "type": "worker-probe", "report": report,
                                               **conf},
                             container_id=f"reuse-{self.calls}", netns=self.pod.path,
                             node=self.node, env={"CNSK_CALL": str(self.calls)})
        if not os.path.exists(report):  # the modes that write none
            return run, {}
        with open(report) as fp:
            return run, json.load(fp)

    def probe(self) -> dict:
        run, doc = self.call()
        assert run.exit_code == 0, run
        return doc

    def processes(self) -> set[int]:
        return serving_processes(self.worker.proc.pid)

    def stop(self) -> None:
        self.worker.stop()


@pytest.fixture
def pool(wdir, netns_factory):
    # One serving process: which of several idle ones takes a call is the
    # kernel's choice (EPOLLEXCLUSIVE may wake more than one, and the first
    # to accept wins), and these tests follow one process from call to call.
    p = Pool(wdir, netns_factory, "--max-processes", "1")
    yield p
    p.stop()


def idle_state(pid: int) -> dict:
    """What an idle serving process holds, read from outside."""
    with open(f"/proc/{pid}/status") as fp:
        status = fp.read()
    return {"net": os.stat(f"/proc/{pid}/ns/net").st_ino,
            "mnt": os.stat(f"/proc/{pid}/ns/mnt").st_ino,
            "cwd": os.readlink(f"/proc/{pid}/cwd"),
            "umask": next(ln for ln in status.splitlines() if ln.startswith("Umask:")),
            "fds": sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd")),
            "fd1": os.readlink(f"/proc/{pid}/fd/1"),
            "threads": len(os.listdir(f"/proc/{pid}/task"))}


def wait_idle(pid: int, timeout: float = 10.0) -> dict:
    """``pid``'s state once it waits for the next connection again (it puts
    itself back after the answer, so a call right after an answer may be
    taken by another idle process) and the link deletions it answered
    early are over in the kernel (a thread each until then)."""
    deadline = time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/wchan") as fp:
            if "epoll" in fp.read() and len(os.listdir(f"/proc/{pid}/task")) == 1:
                return idle_state(pid)
        assert time.monotonic() < deadline, f"{pid} never went idle"
        time.sleep(0.01)


def test_sequential_calls_reuse_one_process(pool):
    """No fork per request: one process answers call after call, each in
    the caller's context, and the worker's process count stays put."""
    first = pool.probe()
    before = pool.processes()
    reports = []
    for _ in range(5):
        wait_idle(first["pid"])
        reports.append(pool.probe())
    assert {r["pid"] for r in reports} == {first["pid"]}, reports
    assert pool.processes() == before
    for r in reports:
        assert r["netns"] == os.stat(pool.node.path).st_ino
        assert r["sys_class_net"] == ["lo"]  # the node's own /sys: its mount namespace
        assert r["fds"] == first["fds"] and r["threads"] == 1
        assert r["env"]["CNSK_CALL"] != first["env"]["CNSK_CALL"]


@pytest.mark.parametrize("what", RESTORED)
def test_what_a_call_changes_is_put_back(pool, what):
    clean = pool.probe()
    pid = clean["pid"]
    idle = wait_idle(pid)
    run, doc = pool.call(mode="pollute", pollute=[what])
    assert run.exit_code == 0 and doc["pid"] == pid, run
    assert wait_idle(pid) == idle  # back to the state before, seen from outside
    after = pool.probe()
    assert after["pid"] == pid, "a call it can put back must not cost a process"
    for key in ("cwd", "umask", "netns", "fds", "threads", "sigusr2", "sys_path"):
        assert after[key] == clean[key], key
    assert "CNSK_POLLUTED" not in after["env"] and "PATH" in after["env"]
    assert "recycled" not in pool.worker.log()


def test_link_deletions_never_cost_the_process(pool):
    """Call after call that deletes a link (its kernel end finishing in a
    thread after the answer) is served by the same process: the thread is
    gone, as the kernel lists them, before the process counts its threads
    (a joined thread is listed a moment longer; seen as "1 thread(s) left
    running" recycles)."""
    pid = pool.probe()["pid"]
    for _ in range(25):
        wait_idle(pid)
        run, doc = pool.call(mode="pollute", pollute=["dellink"])
        assert run.exit_code == 0 and doc["pid"] == pid, (run, pool.worker.log()[-2000:])
    assert "recycled" not in pool.worker.log()


def test_the_next_call_is_served_while_a_deletion_finishes(pool):
    """A call that deleted a link is answered once the link is unlisted; the
    kernel's end of it (an RCU barrier, 15-30 ms here) goes on in a thread
    while the process serves the next call, in that caller's mount namespace
    (the thread has a root and cwd of its own, so setns still works). Once
    the thread is done the process is as it was."""
    pid = pool.probe()["pid"]
    idle = wait_idle(pid)
    overlapped = 0
    for _ in range(5):
        run, doc = pool.call(mode="pollute", pollute=["dellink"])
        assert run.exit_code == 0 and doc["pid"] == pid, run
        after = pool.probe()  # at once: the deletion's thread is most likely still there
        assert after["pid"] == pid, pool.worker.log()[-2000:]
        assert after["sys_class_net"] == ["lo"]  # the node's /sys: its mount namespace
        overlapped += after["threads"] > 1
        assert wait_idle(pid) == idle
    assert overlapped, "no call was served while a deletion finished"
    assert "recycled" not in pool.worker.log()


@pytest.mark.parametrize("what", sorted(RECYCLED))
def test_what_a_call_cannot_undo_ends_its_process(pool, what):
    clean = pool.probe()
    pid = clean["pid"]
    wait_idle(pid)
    run, doc = pool.call(mode="pollute", pollute=[what])
    assert doc["pid"] == pid
    if what in ("raise", "exit"):
        assert run.exit_code != 0 and run.doc["code"] == 999, run
    else:
        assert run.exit_code == 0, run
    after = pool.probe()
    assert after["pid"] != pid
    for key in ("fds", "threads", "sigusr2", "sys_path"):
        assert after[key] == clean[key], key
    deadline = time.monotonic() + 10
    while pid in pool.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid not in pool.processes()
    log = pool.worker.log()
    assert f"worker[{pid}]: - recycled after 2 call(s): {RECYCLED[what]}" in log, log
    assert "internal error" not in log and "crash" not in log


def test_max_requests_recycles(wdir, netns_factory):
    p = Pool(wdir, netns_factory, "--max-requests", "2", "--max-processes", "1")
    try:
        pids = [p.probe()["pid"]]
        wait_idle(pids[0])
        pids += [p.probe()["pid"], p.probe()["pid"]]  # the 2nd call ends the process
        assert pids[0] == pids[1] != pids[2], pids
        assert f"worker[{pids[0]}]: - recycled after 2 call(s): ran 2 calls" \
            in p.worker.log()
    finally:
        p.stop()


def test_a_smaller_capability_set_is_not_inherited(pool):
    """A caller holding fewer capabilities is served by a process that drops
    to them; that process never serves again."""
    clean = pool.probe()
    wait_idle(clean["pid"])
    report = os.path.join(pool.wdir, "capped.json")
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "capped1",
           "CNI_NETNS": pool.pod.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": os.path.dirname(pool.exe)}
    conf = {"cniVersion": "1.1.0", "name": "probenet", "type": "worker-probe",
            "report": report}
    proc = subprocess.run(["ip", "netns", "exec", pool.node.name, "setpriv",
                           "--inh-caps=-sys_module", "--bounding-set=-sys_module", pool.exe],
                          input=json.dumps(conf).encode(), capture_output=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc
    with open(report) as fp:
        capped = json.load(fp)
    assert capped["pid"] == clean["pid"], "served by the worker, in its reused process"
    assert capped["status"] != clean["status"]
    after = pool.probe()
    assert after["pid"] != clean["pid"]
    cap = [ln for ln in after["status"].splitlines() if ln.startswith(("CapEff", "CapBnd"))]
    assert cap == [ln for ln in clean["status"].splitlines()
                   if ln.startswith(("CapEff", "CapBnd"))]
    assert "smaller capability sets" in pool.worker.log()


def test_pool_grows_for_parallel_calls_and_shrinks_when_idle(wdir, netns_factory):
    p = Pool(wdir, netns_factory, "--linger", "1")
    try:
        p.probe()
        base = len(p.processes())
        with ThreadPoolExecutor(4) as ex:
            runs = list(ex.map(lambda i: p.call(mode="sleep", seconds=1.0,
                                                marker=os.path.join(wdir, f"m{i}")), range(4)))
        assert all(run.exit_code == 0 for run, _ in runs), runs
        grown = len(p.processes())
        assert grown >= 4, grown
        deadline = time.monotonic() + 20
        while len(p.processes()) > base and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(p.processes()) <= max(base, 2), (base, p.processes())
        assert p.probe()["pid"] in p.processes()
        assert "internal error" not in p.worker.log()
    finally:
        p.stop()


class ProcessCount:
    """The most serving processes ``pool`` had, sampled every 5 ms while the
    block runs."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.most, self._stop = pool, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            with contextlib.suppress(OSError):
                self.most = max(self.most, len(self.pool.processes()))

    def __enter__(self) -> ProcessCount:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_pool_forks_ahead_of_a_burst(wdir, netns_factory):
    """While calls run, the pool keeps as many idle processes as busy ones
    (``--spares`` at least): three calls in flight find three more ready
    for the next ones (issue 36: a burst's first calls waited for forks)."""
    p = Pool(wdir, netns_factory, "--max-processes", "8")
    try:
        p.probe()
        markers = [os.path.join(wdir, f"b{i}") for i in range(3)]
        with ThreadPoolExecutor(3) as ex:
            futures = [ex.submit(p.call, mode="sleep", seconds=1.5, marker=m) for m in markers]
            deadline = time.monotonic() + 10
            while not all(os.path.exists(m) for m in markers):
                assert time.monotonic() < deadline, "the calls never started"
                time.sleep(0.01)
            while len(p.processes()) < 6:
                assert time.monotonic() < deadline, p.processes()
                time.sleep(0.01)
            assert all(f.result()[0].exit_code == 0 for f in futures)
    finally:
        p.stop()


def test_pool_stops_growing_at_max_processes(wdir, netns_factory):
    """Past --max-processes, calls wait for a free process instead of
    forking more: 6 parallel calls on 2 processes all succeed, in turns."""
    p = Pool(wdir, netns_factory, "--max-processes", "2")
    try:
        p.probe()
        start = time.monotonic()
        with ProcessCount(p) as count, ThreadPoolExecutor(6) as ex:
            runs = list(ex.map(lambda i: p.call(mode="sleep", seconds=0.3,
                                                marker=os.path.join(wdir, f"m{i}")), range(6)))
        took = time.monotonic() - start
        assert all(run.exit_code == 0 for run, _ in runs), runs
        assert count.most == 2, count.most
        assert took >= 0.85, took  # three turns of 0.3 s
        assert "one more than" not in p.worker.log()
    finally:
        p.stop()


def test_a_stalled_pool_grows_past_max_processes(wdir, netns_factory):
    """A pool whose every process is stuck (here: one long call at
    --max-processes 1) forks one more after a second with a call waiting:
    the waiting call is answered long before the stuck one ends."""
    p = Pool(wdir, netns_factory, "--max-processes", "1")
    try:
        p.probe()
        marker = os.path.join(wdir, "stuck")
        with ThreadPoolExecutor(1) as ex:
            stuck = ex.submit(p.call, mode="sleep", seconds=6.0, marker=marker)
            deadline = time.monotonic() + 10
            while not os.path.exists(marker):
                assert time.monotonic() < deadline and not stuck.done(), stuck
                time.sleep(0.01)
            start = time.monotonic()
            run, doc = p.call()
            took = time.monotonic() - start
            assert run.exit_code == 0, run
            assert not stuck.done(), "answered only after the stuck call"
            assert took < 4.0, took
            with open(marker) as fp:
                assert doc["pid"] != int(fp.read())
            assert stuck.result()[0].exit_code == 0
        assert "one more than --max-processes (1)" in p.worker.log()
    finally:
        p.stop()


def _masquerading_bridge(pool, wdir) -> tuple[str, dict]:
    bin_dir = os.path.dirname(pool.exe)
    for name in ("bridge", "host-local"):
        write_executable(bin_dir, name, plugin_registry()[name], worker_socket=pool.worker.sock,
                         launcher="native")
    conf = {"cniVersion": "1.0.0", "name": "masqnet", "type": "bridge", "bridge": "cnsk-m0",
            "isGateway": True, "ipMasq": True,
            "ipam": {"type": "host-local", "dataDir": os.path.join(wdir, "ipam"),
                     "ranges": [[{"subnet": "10.89.0.0/24"}]]}}
    return os.path.join(bin_dir, "bridge"), conf


def test_kept_nftables_contexts_do_not_end_the_process(pool, wdir):
    """A masquerading bridge ADD's libnftables context (its netlink socket)
    is dropped or kept by the process after the call: not a leaked fd."""
    exe, conf = _masquerading_bridge(pool, wdir)
    run = run_plugin_raw(exe, "ADD", conf, container_id="masq1", netns=pool.pod.path,
                         node=pool.node)
    assert run.exit_code == 0, run
    time.sleep(0.5)  # the process puts itself back after the answer
    assert "recycled" not in pool.worker.log(), pool.worker.log()


def test_a_call_keeps_no_namespace_of_its_caller_alive(pool, wdir, netns_factory):
    """After a call, an idle serving process holds nothing of the caller's
    node namespace (nftables sockets included: issue 36), so a node
    namespace whose name is removed goes with its links: the veth it had
    with a witness namespace loses its other end there."""
    exe, conf = _masquerading_bridge(pool, wdir)
    witness = netns_factory("cnsk-wit")
    with NetNS.open(pool.node.path) as node, node.rtnl() as ipr, \
            NetNS.open(witness.path) as wit:
        netlink.create_veth_pair(ipr, "cnsk-pin0", "cnsk-pin1", peer_netns=wit)
    (server,) = pool.processes()
    for verb in ("ADD", "DEL"):
        run = run_plugin_raw(exe, verb, conf, container_id="masq2", netns=pool.pod.path,
                             node=pool.node)
        assert run.exit_code == 0, run
    wait_idle(server)
    assert pool.processes() == {server}  # the same process, not a fresh one
    remove_netns(pool.node)
    deadline = time.monotonic() + 10
    with NetNS.open(witness.path) as wit, wit.rtnl() as wipr:
        while netlink.find_link(wipr, "cnsk-pin1") is not None:
            assert time.monotonic() < deadline, "the removed node namespace is kept alive"
            time.sleep(0.05)


def test_cycles_are_collected_between_calls_not_inside_them():
    """A serving process's cycle collector: the automatic threshold is
    raised to `GC_IN_CALL` while it serves, and `_BetweenCalls.collect`
    (run after each answer) collects the young generation once it holds
    `GC_BETWEEN_CALLS` objects, the middle one every tenth pass, all of
    them every hundredth; reference cycles left by a call are freed there."""
    thresholds = gc.get_threshold()
    passes: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        collector = serving._BetweenCalls()
        assert gc.get_threshold()[0] == serving.GC_IN_CALL
        collector.collect()
        assert passes == []  # nothing piled up yet

        class Cycle:
            def __init__(self) -> None:
                self.me = self

        for n in range(1, 101):
            for _ in range(serving.GC_BETWEEN_CALLS):
                Cycle()  # garbage only a collection frees
            collector.collect()
            want = 2 if n % 100 == 0 else 1 if n % 10 == 0 else 0
            assert passes[-1] == want, (n, passes[-3:])
            assert len(passes) == n
            assert gc.get_count()[0] < serving.GC_BETWEEN_CALLS
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
