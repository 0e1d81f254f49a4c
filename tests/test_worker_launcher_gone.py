"""A launcher killed while its call runs (issue 48, item 5): the worker lets
go of the runtime's stderr at once and runs the call to its end.

A runtime that reads a plugin's stderr until EOF (Go's os/exec without
WaitDelay) must see EOF when the launcher dies, not when the worker's call
ends: the serving process held the launcher's stderr (its fds 1 and 2 and the
received fd) for the whole call. Each test starts its own worker
(conftest.SuiteWorker, one serving process so that the next call runs in the
same process) with the test plugin ``worker-probe`` (tests/worker_plugins),
runs a call that sleeps for several seconds through the real launcher
(native and Python) with stderr on a pipe, kills the launcher after ~1 s,
and checks: the pipe reaches EOF within `EOF_WITHIN` while the call still
runs; the worker logs the call's fate (answered, not delivered); the same
serving process serves the next call normally, its stderr live.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import HERE, SuiteWorker

from cni_skel.harness import run_plugin_raw
from cni_skel.warm import protocol
from cni_skel.warm.install import write_executable

PROBE_REF = "worker_plugins.probe:WorkerProbe"
PROBE_PATH = (str(HERE),)
REQUIRED = {protocol.REQUIRED_ENV: "1"}
CALL_SECONDS = 6.0  # how long the call sleeps
KILL_AFTER = 1.0  # seconds into the call the launcher is killed
EOF_WITHIN = 2.0  # seconds after the kill the runtime's stderr pipe must reach EOF
FATE_WITHIN = 30.0


@pytest.fixture
def wdir():
    d = tempfile.mkdtemp(prefix="cnsk-lg-")  # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def worker(wdir):
    w = SuiteWorker(os.path.join(wdir, "w.sock"), os.path.join(wdir, "worker.log"),
                    preload=(PROBE_REF,), pythonpath=PROBE_PATH,
                    args=("--max-processes", "1", "--spares", "1"))
    yield w
    w.stop()


def probe_conf(**kw):
    return {"cniVersion": "1.1.0", "name": "probenet", "type": "worker-probe", **kw}


def _read_to_eof(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What ``fd`` gives until EOF or ``deadline`` (monotonic); (data, EOF seen)."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        if not select.select([fd], [], [], left)[0]:
            return data, False
        chunk = os.read(fd, 65536)
        if not chunk:
            return data, True
        data += chunk


def _wait_for(predicate, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.parametrize("kind", ["native", "python"])
def test_killed_launcher_releases_stderr_and_the_call_runs_to_its_end(
        worker, wdir, kind, node_netns, pod_netns):
    exe = write_executable(os.path.join(wdir, f"bin-{kind}"), "worker-probe", PROBE_REF,
                           pythonpath=list(PROBE_PATH), worker_socket=worker.sock,
                           launcher=kind)
    pid = worker.proc.pid
    marker = os.path.join(wdir, "slow.started")
    cid = f"gone-{kind}"
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
           "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": os.path.dirname(exe), **REQUIRED}
    # `ip netns exec` execs the launcher: the process killed below is the launcher.
    proc = subprocess.Popen(["ip", "netns", "exec", node_netns.name, exe],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(json.dumps(probe_conf(mode="sleep", marker=marker,
                                               seconds=CALL_SECONDS)).encode())
        proc.stdin.close()
        assert _wait_for(lambda: os.path.exists(marker) and open(marker).read(),  # noqa: SIM115
                         30), worker.log()
        started = time.monotonic()
        assert proc.poll() is None, "the launcher waits for its call"
        time.sleep(KILL_AFTER)
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(10)
        err, eof = _read_to_eof(proc.stderr.fileno(), killed + EOF_WITHIN)
        at_eof = time.monotonic()
        assert eof, (f"the runtime's stderr pipe still open {EOF_WITHIN} s after the launcher "
                     f"was killed (read {err!r})\n" + worker.log())
        assert b"probe: to stderr, container " + cid.encode() in err, err
        # The call still runs: its request line is not written yet.
        assert at_eof - started < CALL_SECONDS - 1.0
        assert not worker.served(cid), worker.log()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()

    # The call ran to its end; its fate is logged once, as not delivered.
    def fate() -> list[str]:
        return [ln for ln in worker.log().splitlines()
                if f" {cid} " in ln and "the launcher is gone: it went away" in ln]

    assert _wait_for(lambda: fate(), FATE_WITHIN), worker.log()
    assert time.monotonic() - started >= CALL_SECONDS - 0.5, "the call was not cut short"
    (line,) = fate()
    assert "ADD" in line and "exit=0" in line and "not delivered" in line, line
    served = worker.served(cid)
    assert len(served) == 1 and " exit=0 " in served[0], worker.log()
    assert "answered, but the launcher is gone" not in worker.log(), "one line, not two"

    # The same serving process serves the next call, its stderr live.
    nxt = run_plugin_raw(exe, "ADD", probe_conf(mode="probe",
                                                report=os.path.join(wdir, "next.json")),
                         container_id=f"next-{kind}", netns=pod_netns.path, node=node_netns,
                         env=REQUIRED, timeout=30)
    assert nxt.exit_code == 0, nxt
    assert f"probe: to stderr, container next-{kind}" in nxt.stderr, nxt
    with open(os.path.join(wdir, "next.json")) as fp:
        report = json.load(fp)
    with open(marker) as fp:
        assert report["pid"] == int(fp.read()), "served by the same process"
    assert "recycled" not in worker.log(), worker.log()
    assert worker.alive() and worker.proc.pid == pid, worker.log()


_HANGUP_SCRIPT = r"""
import fcntl, json, os, signal, socket, sys, time, _signal
from cni_skel.warm.serving import _LauncherHangup
already = sys.argv[1] == "already"
conn, peer = socket.socketpair()
conn.settimeout(5.0)  # as a served connection is (O_NONBLOCK)
flags = fcntl.fcntl(conn.fileno(), fcntl.F_GETFL)
err = os.dup(1)  # the received stderr; fds 1 and 2 are the test's pipe
pid = 0
if not already:
    pid = os.fork()
    if pid == 0:  # the launcher: holds its end, then dies
        time.sleep(0.3)
        os._exit(0)
peer.close()
hangup = _LauncherHangup()
hangup.arm(conn.fileno(), err)
time.sleep(0.3 if already else 1.5)  # the call, running on
gone = hangup.disarm()
if pid:
    os.waitpid(pid, 0)
with open(sys.argv[2], "w") as fp:
    json.dump({"gone": gone is not None,
               "handler": _signal.getsignal(signal.SIGIO) == _signal.SIG_DFL,
               "flags": fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) == flags,
               "err_null": os.readlink(f"/proc/self/fd/{err}") == "/dev/null",
               "fd2_null": os.readlink("/proc/self/fd/2") == "/dev/null"}, fp)
"""


@pytest.mark.parametrize("when", ["during", "already"])
def test_hangup_watch_lets_go_of_stderr_and_puts_the_process_back(tmp_path, when):
    """`_LauncherHangup` alone, in a process of its own: fds 1, 2 and the
    received fd stop holding the pipe once the peer is gone (during the
    call, or before it was armed), and `disarm` puts back the SIGIO handler
    and the connection's flags."""
    result = tmp_path / "result.json"
    proc = subprocess.Popen([sys.executable, "-c", _HANGUP_SCRIPT, when, str(result)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        start = time.monotonic()
        _, eof = _read_to_eof(proc.stdout.fileno(), start + 10)
        assert eof, f"still open after {time.monotonic() - start:.1f} s"
        if when == "during":
            assert proc.poll() is None, "EOF came only with the call's end"
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert json.loads(result.read_text()) == {"gone": True, "handler": True, "flags": True,
                                              "err_null": True, "fd2_null": True}
