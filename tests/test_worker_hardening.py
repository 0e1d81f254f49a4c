"""The worker holds against broken and hostile callers (issue 17, points 1-2).

Each test starts its own `cni-skel worker` (conftest.SuiteWorker: its own
socket and log) and talks to it through both launcher kinds or a raw client
that speaks the wire format (`cni_skel.warm.client`) without the launchers'
manners: long identifiers, oversized and half-sent frames, junk reports from
a child, children that hang, callers without capabilities, requests naming a
module to import. After each, the worker's parent is the same process and
still serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import HERE, SuiteWorker

from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.warm import client as launcher
from cni_skel.warm import protocol
from cni_skel.warm.install import plugin_registry, write_executable

PROBE_REF = "worker_plugins.probe:WorkerProbe"
PROBE_PATH = (str(HERE),)
NO_NET_ADMIN = ("setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin")
NO_SYS_ADMIN = ("setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin")
NO_CAPS = ("setpriv", "--inh-caps=-all", "--bounding-set=-all")


@pytest.fixture
def wdir():
    d = tempfile.mkdtemp(prefix="cnsk-h-")  # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_worker(wdir: str, *args: str) -> SuiteWorker:
    return SuiteWorker(os.path.join(wdir, "w.sock"), os.path.join(wdir, "worker.log"),
                       preload=(PROBE_REF,), pythonpath=PROBE_PATH, args=args)


@pytest.fixture
def worker(wdir):
    w = start_worker(wdir)
    yield w
    w.stop()


@pytest.fixture(params=["native", "python"])
def wbin(request, wdir):
    """Launchers of both kinds for the test worker's socket."""
    d = os.path.join(wdir, f"bin-{request.param}")
    os.makedirs(d)
    sock = os.path.join(wdir, "w.sock")
    for name, ref in plugin_registry().items():
        write_executable(d, name, ref, worker_socket=sock, launcher=request.param)
    write_executable(d, "worker-probe", PROBE_REF, pythonpath=list(PROBE_PATH),
                     worker_socket=sock, launcher=request.param)
    return d


REQUIRED = {protocol.REQUIRED_ENV: "1"}


def lo_conf(version="1.1.0"):
    return {"cniVersion": version, "name": "lonet", "type": "loopback"}


def probe_conf(**kw):
    return {"cniVersion": "1.1.0", "name": "probenet", "type": "worker-probe", **kw}


def assert_serving(w: SuiteWorker, pid: int) -> None:
    """The worker's parent is still ``pid`` and answers."""
    assert w.alive() and w.proc.pid == pid, w.log()
    ok, why = launcher.ping(w.sock, 10)
    assert ok, why


def raw_request(sock_path: str, frame: bytes, fds=(), timeout: float = 30):
    """Send ``frame`` as is; ``(status, exit code, stdout)`` or the exception."""
    s = launcher.connect(sock_path, timeout)
    try:
        with contextlib.suppress(OSError):  # it may answer and close before reading it all
            launcher.send_request(s, frame, fds)
        return launcher.read_reply(s)
    finally:
        s.close()


def run_frame(ref: str, env: dict[str, str], stdin: bytes, pythonpath: str = "") -> bytes:
    return protocol.encode_request([
        b"run", ref.encode(), pythonpath.encode(), b"/", b"18",
        b"\0".join(f"{k}={v}".encode() for k, v in env.items()), stdin, b"test frame"])


def context_fds():
    return [os.open("/proc/self/ns/net", os.O_RDONLY), os.open("/proc/self/ns/mnt", os.O_RDONLY),
            os.open(os.devnull, os.O_WRONLY)]


def lo_is_up(ns_path: str) -> bool:
    """IFF_UP on ``lo`` in that namespace, as the kernel reports it."""
    out = subprocess.run(["nsenter", f"--net={ns_path}", "ip", "-json", "link", "show", "lo"],
                         capture_output=True, text=True, check=True).stdout
    return "UP" in json.loads(out)[0]["flags"]


# --------------------------------------------------------------------------
# 1. nothing a client or a child sends ends or wedges the parent


@pytest.mark.parametrize("length", [4_000, 5_000, 100_000])
def test_long_container_id_is_served_and_keeps_the_worker(worker, wbin, netns_factory, length):
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    pid = worker.proc.pid
    cid = ("c" * length)
    kw = dict(container_id=cid, netns=pod.path, ifname="lo", node=node, env=REQUIRED)
    result = run_plugin(os.path.join(wbin, "loopback"), "ADD", lo_conf(), **kw)
    assert result["interfaces"][0]["name"] == "lo" and lo_is_up(pod.path)
    run_plugin(os.path.join(wbin, "loopback"), "DEL", lo_conf(), **kw)
    assert not lo_is_up(pod.path)
    assert_serving(worker, pid)
    assert any(" exit=0 " in ln for ln in worker.served(cid[:256])), worker.log()[-2000:]


def test_oversized_frame_is_answered_error_5_unread(worker):
    pid = worker.proc.pid
    head = protocol.REQUEST_MAGIC + (protocol.MAX_REQUEST_BYTES + 1).to_bytes(4, "big")
    status, code, out = raw_request(worker.sock, head + b"\0" * 1000)
    assert status == protocol.ST_DONE and code == 1
    doc = json.loads(out)
    assert doc["code"] == 5 and str(protocol.MAX_REQUEST_BYTES) in doc["msg"], doc
    assert_serving(worker, pid)


def test_config_over_the_limit_is_error_5_in_both_modes(worker, wbin, wdir, node_netns,
                                                        pod_netns):
    """16 MiB + 1 byte of config: the same Error from the worker and one-shot."""
    obin = os.path.join(wdir, "obin")
    os.makedirs(obin)
    write_executable(obin, "loopback", plugin_registry()["loopback"], worker_socket=None)
    conf = json.dumps(lo_conf()).encode()
    big = conf[:-1] + b" " * (protocol.MAX_STDIN_BYTES + 1 - len(conf)) + b"}"
    assert len(big) == protocol.MAX_STDIN_BYTES + 1
    kw = dict(container_id="big1", netns=pod_netns.path, ifname="lo", node=node_netns)
    warm = run_plugin_raw(os.path.join(wbin, "loopback"), "ADD", big, env=REQUIRED, **kw)
    cold = run_plugin_raw(os.path.join(obin, "loopback"), "ADD", big, **kw)
    assert warm.exit_code == cold.exit_code == 1
    assert warm.doc == cold.doc and warm.doc["code"] == 5, (warm.doc, cold.doc)
    assert "larger than" in warm.doc["msg"] and not lo_is_up(pod_netns.path)
    assert worker.served("big1")
    # One byte less is a config like any other.
    ok = run_plugin_raw(os.path.join(wbin, "loopback"), "ADD", big[:-2] + b"}", env=REQUIRED,
                        **kw)
    assert ok.exit_code == 0, ok.doc


def test_stalled_client_costs_one_connection(wdir, netns_factory):
    w = start_worker(wdir, "--request-timeout", "2")
    try:
        pid = w.proc.pid
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        exe = write_executable(os.path.join(wdir, "bin"), "loopback",
                               plugin_registry()["loopback"], worker_socket=w.sock)
        stalled = []
        for part in (b"CS", protocol.REQUEST_MAGIC + (1000).to_bytes(4, "big") + b"x" * 10):
            s = launcher.connect(w.sock, 30)
            s.sendall(part)  # then nothing more
            stalled.append(s)
        # Others are served meanwhile ...
        result = run_plugin(exe, "ADD", lo_conf(), container_id="beside1", netns=pod.path,
                            ifname="lo", node=node, env=REQUIRED)
        assert result["interfaces"][0]["name"] == "lo"
        # ... and each stalled connection is answered "bad request" and
        # closed at the deadline (its child goes: it serves nothing else).
        for s in stalled:
            status, _, body = launcher.read_reply(s)
            assert status == protocol.ST_BAD and b"did not arrive in time" in body, body
            assert s.recv(1) == b""
            s.close()
        assert_serving(w, pid)
    finally:
        w.stop()


def test_garbled_child_reports_are_dropped(worker, wbin, node_netns, pod_netns):
    pid = worker.proc.pid
    run = run_plugin_raw(os.path.join(wbin, "worker-probe"), "ADD", probe_conf(mode="garble"),
                         container_id="garble1", netns=pod_netns.path, node=node_netns,
                         env=REQUIRED)
    assert run.exit_code == 0, run
    # The parent reads children's reports in its own loop: the answer can come first.
    deadline = time.monotonic() + 10
    while "dropped a malformed report" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "dropped a malformed report" in worker.log(), worker.log()
    assert_serving(worker, pid)
    again = run_plugin_raw(os.path.join(wbin, "loopback"), "ADD", lo_conf(),
                           container_id="garble2", netns=pod_netns.path, ifname="lo",
                           node=node_netns, env=REQUIRED)
    assert again.exit_code == 0, again


def test_hung_child_is_killed_at_the_run_deadline_and_answered_11(wdir, netns_factory):
    w = start_worker(wdir, "--run-timeout", "2")
    try:
        pid = w.proc.pid
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        exe = write_executable(os.path.join(wdir, "bin"), "worker-probe", PROBE_REF,
                               pythonpath=list(PROBE_PATH), worker_socket=w.sock)
        marker = os.path.join(wdir, "hung.started")
        run = run_plugin_raw(exe, "ADD", probe_conf(mode="sleep", marker=marker, seconds=120),
                             container_id="hung1", netns=pod.path, node=node, env=REQUIRED,
                             timeout=60)
        assert run.exit_code == 1 and run.doc["code"] == 11, run
        assert "after running 2 s" in run.doc["msg"], run.doc
        with open(marker) as fp:
            child = int(fp.read())
        assert not os.path.exists(f"/proc/{child}"), "the hung child is gone"
        assert_serving(w, pid)
    finally:
        w.stop()


def test_child_killed_mid_request_costs_only_its_request(worker, wbin, wdir, node_netns,
                                                         pod_netns):
    """Killed while a second request runs beside it: 11 to the first, the
    second is answered as usual."""
    pid = worker.proc.pid
    marker = os.path.join(wdir, "kill.started")
    exe = os.path.join(wbin, "worker-probe")
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "killed1",
           "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0", "CNI_PATH": wbin, **REQUIRED}
    proc = subprocess.Popen(["ip", "netns", "exec", node_netns.name, exe],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    out, _ = b"", b""
    try:
        proc.stdin.write(json.dumps(probe_conf(mode="sleep", marker=marker,
                                               seconds=60)).encode())
        proc.stdin.close()
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) or not open(marker).read():  # noqa: SIM115
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        with open(marker) as fp:
            os.kill(int(fp.read()), 9)
        out = proc.stdout.read()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads(out)
    assert proc.returncode == 1 and doc["code"] == 11, doc
    assert "killed by signal 9" in doc["msg"]
    beside = run_plugin_raw(os.path.join(wbin, "loopback"), "ADD", lo_conf(),
                            container_id="beside2", netns=pod_netns.path, ifname="lo",
                            node=node_netns, env=REQUIRED)
    assert beside.exit_code == 0, beside
    assert_serving(worker, pid)


# --------------------------------------------------------------------------
# 2. nothing the caller chooses runs with more privilege than it has


def _evil_module(wdir: str) -> tuple[str, str]:
    """A module that leaves a file when imported: (its dir, the file)."""
    d = os.path.join(wdir, "evil")
    os.makedirs(d)
    marker = os.path.join(wdir, "evil.imported")
    with open(os.path.join(d, "evilmod.py"), "w") as fp:
        fp.write(f"open({marker!r}, 'w').write(str(__import__('os').getpid()))\n"
                 "from cni_skel import Plugin\n"
                 "class Evil(Plugin):\n    name = 'evil'\n")
    os.chmod(d, 0o755)
    return d, marker


def test_a_request_never_makes_the_worker_import(worker, wdir):
    d, marker = _evil_module(wdir)
    fds = context_fds()
    try:
        status, _, out = raw_request(worker.sock, run_frame(
            "evilmod:Evil", {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "evil1"},
            json.dumps({"cniVersion": "1.1.0", "name": "n", "type": "evil"}).encode(), d), fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert status == protocol.ST_UNKNOWN, (status, out)
    assert b"is not served by this worker" in out
    assert not os.path.exists(marker), "the worker imported a module a request named"


def _cap_eff(status: str) -> int:
    return int(next(ln for ln in status.splitlines() if ln.startswith("CapEff:")).split()[1], 16)


@pytest.mark.parametrize("drop,lacks", [(NO_NET_ADMIN, "CAP_NET_ADMIN"),
                                        (NO_SYS_ADMIN, "CAP_SYS_ADMIN"),
                                        (NO_CAPS, "CAP_NET_ADMIN and CAP_SYS_ADMIN")])
def test_caller_without_network_capabilities_is_not_served(
        worker, wbin, wdir, node_netns, pod_netns, drop, lacks):
    """The worker does nothing for it: with the fallback off the answer is
    11 naming what it lacks and the plugin does not run; with it on, the
    plugin runs in the launcher's own process, with no more than its caps."""
    pid = worker.proc.pid
    report = os.path.join(wdir, "caps.json")
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "nocaps1",
           "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0", "CNI_PATH": wbin}

    def call(extra):
        return subprocess.run(["ip", "netns", "exec", node_netns.name, *drop,
                               os.path.join(wbin, "worker-probe")],
                              input=json.dumps(probe_conf(report=report)).encode(),
                              capture_output=True, env={**env, **extra}, timeout=60,
                              check=False)

    proc = call(REQUIRED)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["code"] == 11, (doc, proc.stderr)
    assert f"lacks {lacks}" in doc["details"] and doc["cniVersion"] == "1.1.0", doc
    assert not os.path.exists(report), "the plugin ran"
    proc = call({})
    assert proc.returncode == 0, proc
    with open(report) as fp:
        ran = json.load(fp)
    assert ran["ppid"] != pid and ran["pid"] not in worker_children(pid), "ran in the worker"
    expected = subprocess.run(["ip", "netns", "exec", node_netns.name, *drop, "cat",
                               "/proc/self/status"], capture_output=True, text=True,
                              check=True).stdout
    assert _cap_eff(ran["status"]) == _cap_eff(expected)
    assert sum(f"lacks {lacks}" in ln for ln in worker.served("nocaps1")) == 2, worker.log()
    assert_serving(worker, pid)


def worker_children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fp:
        return {int(p) for p in fp.read().split()}


def test_capless_caller_cannot_make_the_worker_import(worker, wdir):
    """The attack as found: a root process with an empty capability set
    names a module and a path; it is refused before anything is looked up."""
    d, marker = _evil_module(wdir)
    script = (
        "import json, os, sys\n"
        "from cni_skel.warm import client as L, protocol as P\n"
        "fds = [os.open('/proc/self/ns/net', os.O_RDONLY), "
        "os.open('/proc/self/ns/mnt', os.O_RDONLY), 2]\n"
        "frame = P.encode_request([b'run', b'evilmod:Evil', sys.argv[2].encode(), b'/', b'18',"
        " b'CNI_COMMAND=ADD\\0CNI_CONTAINERID=evil2', b'{\"cniVersion\": \"1.1.0\"}',"
        " b'test frame'])\n"
        "s = L.connect(sys.argv[1], 30)\n"
        "L.send_request(s, frame, fds)\n"
        "st, code, out = L.read_reply(s)\n"
        "print(json.dumps([st, code, out.decode()]))\n")
    proc = subprocess.run([*NO_CAPS, sys.executable, "-c", script, worker.sock, d],
                          capture_output=True, text=True, timeout=60, check=True)
    status, _, out = json.loads(proc.stdout)
    assert status == protocol.ST_REFUSED and "lacks CAP_NET_ADMIN" in out, (status, out)
    assert not os.path.exists(marker), "the worker imported a module a request named"


def test_worker_log_line_for_a_refused_caller(worker, wbin, node_netns, pod_netns):
    run = subprocess.run(["ip", "netns", "exec", node_netns.name, *NO_NET_ADMIN,
                          os.path.join(wbin, "loopback")],
                         input=json.dumps(lo_conf()).encode(), capture_output=True,
                         env={"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD",
                              "CNI_CONTAINERID": "nocaps2", "CNI_NETNS": pod_netns.path,
                              "CNI_IFNAME": "lo", "CNI_PATH": wbin}, timeout=60, check=False)
    assert run.returncode == 1  # one-shot, without CAP_NET_ADMIN: EPERM
    (line,) = worker.served("nocaps2")
    assert "refused" in line and "lacks CAP_NET_ADMIN" in line and "one-shot" in line
    assert not lo_is_up(pod_netns.path)


def test_worker_socket_modes_whatever_the_umask(wdir):
    """The directory it makes 0755, the socket 0600, under umask 000."""
    old = os.umask(0)
    try:
        w = SuiteWorker(os.path.join(wdir, "run", "w.sock"), os.path.join(wdir, "worker.log"))
    finally:
        os.umask(old)
    try:
        assert os.stat(os.path.join(wdir, "run")).st_mode & 0o7777 == 0o755
        assert os.stat(w.sock).st_mode & 0o7777 == 0o600
    finally:
        w.stop()
