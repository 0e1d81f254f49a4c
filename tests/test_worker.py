"""Warm worker mode: `cni-skel worker` plus the launchers `cni-skel install`
writes, run for real (root, throw-away namespaces, a socket in a temporary
directory, never /run/cni-skel).

The same calls go through the launchers (served by the worker) and through
plain one-shot scripts, and must give the same answers. Then the faults:
worker killed before, during and after a request, a stale socket, a crashing
child, a non-root client, eight parallel clients, a worker replaced while a
request is in flight.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import HERE

from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.warm import client as launcher
from cni_skel.warm import protocol
from cni_skel.warm.install import launcher_info, plugin_registry, write_executable

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
PROBE_REF = "worker_plugins.probe:WorkerProbe"
PROBE_PATH = [str(HERE)]


class Worker:
    """A `cni-skel worker` subprocess in its own session (killpg reaches
    its children), stderr in a file."""

    def __init__(self, sock: str, log: str, prefix: tuple[str, ...] = (),
                 args: tuple[str, ...] = ()) -> None:
        self.sock, self.log_path = sock, log
        self.log_fp = open(log, "ab")  # noqa: SIM115 (closed in stop)
        # The probe is served because it is preloaded: a worker imports
        # nothing a request names.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(PROBE_PATH)}
        self.proc = subprocess.Popen([*prefix, CLI, "worker", "--socket", sock,
                                      "--preload", PROBE_REF, *args],
                                     stdout=self.log_fp, env=env,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not launcher.ping(sock, 2.0)[0]:
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, "worker did not come up: " + self.log()
            time.sleep(0.05)

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fp:
            return fp.read()

    def served(self, cid: str) -> list[str]:
        return [ln for ln in self.log().splitlines() if f" cid={cid} " in ln]

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        self.kill_group()
        self.log_fp.close()


@pytest.fixture
def wdir():
    # Short path (sun_path holds 108 bytes); 0755 so the non-root test can reach it.
    d = tempfile.mkdtemp(prefix="cnsk-w-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock(wdir):
    return os.path.join(wdir, "w.sock")


@pytest.fixture
def worker(sock, wdir):
    w = Worker(sock, os.path.join(wdir, "worker.log"))
    yield w
    w.stop()


def _install(d, worker_socket, kind="auto"):
    os.makedirs(d, exist_ok=True)
    for name, ref in plugin_registry().items():
        write_executable(d, name, ref, force=True, worker_socket=worker_socket, launcher=kind)
    write_executable(d, "worker-probe", PROBE_REF, force=True, pythonpath=PROBE_PATH,
                     worker_socket=worker_socket, launcher=kind)
    return d


@pytest.fixture(params=["native", "python"])
def launcher_kind(request):
    """Both launchers `cni-skel install` writes go through every worker test."""
    return request.param


@pytest.fixture
def wbin(wdir, sock, launcher_kind):
    """Launchers pointing at the test worker's socket."""
    d = _install(os.path.join(wdir, "wbin"), sock, launcher_kind)
    assert launcher_info(os.path.join(d, "loopback"))["kind"] == launcher_kind
    return d


@pytest.fixture
def obin(wdir):
    """Plain one-shot scripts, for comparison."""
    return _install(os.path.join(wdir, "obin"), None)


def lo_conf(version="1.0.0"):
    return {"cniVersion": version, "name": "lonet", "type": "loopback"}


def probe_conf(**kw):
    return {"cniVersion": "1.1.0", "name": "probenet", "type": "worker-probe", **kw}


# --------------------------------------------------------------------------
# the launcher alone


def test_launcher_version_is_local_light_and_identical(wbin, obin):
    stdins = [b"", b'{"cniVersion": "0.4.0"}', b'{"cniVersion": "1.0"}',
              b'{"cniVersion": "1.0.0", "name": "n", "prevResult": {"cniVersion": "0.3.1"}}',
              b'{"cni\\u0056ersion": "0.3.1"}', b"[1]", b"{bad", b'{"cniVersion": 1}']
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"],
           protocol.SOCKET_ENV: "/nonexistent/w.sock"}
    for data in stdins:
        for name in ("loopback", "bridge", "worker-probe"):
            new = run_plugin_raw(os.path.join(wbin, name), "VERSION", data, env=env,
                                 replace_env=True)
            old = run_plugin_raw(os.path.join(obin, name), "VERSION", data, env=env,
                                 replace_env=True)
            assert (new.exit_code, new.stdout) == (old.exit_code, old.stdout), (name, data)
    if launcher_info(os.path.join(wbin, "loopback"))["kind"] == "native":
        return  # it execs the Python launcher for VERSION: checked with "python"
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime",
                           os.path.join(wbin, "loopback")], input=b'{"cniVersion": "1.0.0"}',
                          env=env, capture_output=True, check=True)
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.decode().splitlines()
                if ln.startswith("import time:")}
    assert not imported & {"site", "socket", "json", "re", "enum", "cni_skel", "pydantic",
                           "pyroute2"}, imported


@pytest.mark.parametrize("text", [
    '{"a": [1, -2.5e3, true, false, null, {}], "cniVersion": "1.0.0"}', "[]", "{}",
    '{"a": 01}', '{"a": 1.}', '{"a": -}', '{"a": [1,]}', '{"a" 1}', '{"a": "x\ty"}',
    ' {"a": NaN, "b": -Infinity} ', '{"a": 1} x', "", "   ", '"str"', "1e5", "-0.0E+1",
    '{"cniVersion": "1.0.0", "cniVersion": "0.4.0"}', "tru", "[1 2]", '{"a":1,}',
])
def test_light_json_parser_agrees_with_json(text):
    data = text.encode()
    try:
        expect = json.loads(data)
    except ValueError:
        expect = ValueError
    try:
        got = launcher.loads_light(data)
    except ValueError:
        got = ValueError
    if expect is ValueError or got is ValueError:
        assert got is expect
    elif isinstance(expect, dict):
        assert got.keys() == expect.keys()
        assert got.get("cniVersion") == expect.get("cniVersion")


def test_worker_check_command(sock, wdir):
    off = subprocess.run([CLI, "worker", "--check", "--socket", sock], capture_output=True,
                         text=True, check=False)
    assert off.returncode == 1 and "not answering" in off.stdout
    w = Worker(sock, os.path.join(wdir, "worker.log"))
    try:
        on = subprocess.run([CLI, "worker", "--check", "--socket", sock], capture_output=True,
                            text=True, check=False)
        assert on.returncode == 0 and "ok" in on.stdout and "Loopback" in on.stdout, on.stdout
        assert os.stat(sock).st_mode & 0o777 == 0o600
    finally:
        w.stop()
    assert not os.path.exists(sock), "a stopped worker removes its socket"


# --------------------------------------------------------------------------
# same answers in both modes


def test_loopback_same_in_both_modes(worker, wbin, obin, netns_factory):
    results = {}
    for mode, d in (("warm", wbin), ("oneshot", obin)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        kw = dict(container_id=f"lo-{mode}", netns=pod.path, ifname="lo", node=node)
        exe = os.path.join(d, "loopback")
        add = run_plugin(exe, "ADD", lo_conf(), **kw)
        check = run_plugin(exe, "CHECK", lo_conf(), **kw)
        dele = run_plugin(exe, "DEL", lo_conf(), **kw)
        bad = run_plugin_raw(exe, "ADD", lo_conf(), container_id=f"lo-{mode}",
                             netns=node.path, ifname="lo", node=node)  # pod netns == node's
        add["interfaces"][0]["sandbox"] = "<pod>"
        bad.doc["details"] = "<node>"
        results[mode] = (add, check, dele, bad.exit_code, bad.doc)
    assert results["warm"] == results["oneshot"]
    assert results["warm"][4]["code"] == 8
    served = worker.served("lo-warm")
    assert len(served) == 4 and all("plugin=loopback" in ln for ln in served), worker.log()
    assert not worker.served("lo-oneshot")


def _normalise(result):
    for iface in result.get("interfaces", []):
        iface["mac"] = "<mac>"
        if "sandbox" in iface:
            iface["sandbox"] = "<pod>"
        if iface["name"].startswith("veth"):
            iface["name"] = "<veth>"
    return result


def test_bridge_host_local_same_in_both_modes(worker, wbin, obin, netns_factory, tmp_path):
    results = {}
    for mode, d in (("warm", wbin), ("oneshot", obin)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        conf = {"cniVersion": "1.1.0", "name": "brnet", "type": "bridge", "bridge": "cnsk0",
                "isGateway": True, "ipMasq": True,
                "ipam": {"type": "host-local", "dataDir": str(tmp_path / mode),
                         "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}]]}}
        kw = dict(container_id=f"br-{mode}", netns=pod.path, node=node)
        exe = os.path.join(d, "bridge")
        add = run_plugin(exe, "ADD", conf, **kw)
        check = run_plugin(exe, "CHECK", {**conf, "prevResult": add}, **kw)
        dele = run_plugin(exe, "DEL", {**conf, "prevResult": add}, **kw)
        left = sorted(p.name for p in (tmp_path / mode / "brnet").iterdir()
                      if not p.name.startswith(("last_reserved", "lock", ".")))
        results[mode] = (_normalise(add), check, dele, left)
    assert results["warm"] == results["oneshot"]
    assert results["warm"][0]["ips"][0]["address"] == "10.77.0.2/24"
    served = worker.served("br-warm")
    # bridge ADD/CHECK/DEL, and its delegated host-local ADD/CHECK/DEL, all warm
    assert sum("plugin=bridge " in ln for ln in served) == 3, worker.log()
    assert sum("plugin=host-local " in ln for ln in served) == 3, worker.log()


GO_CNI = "/usr/lib/cni"


def test_bridge_runs_its_host_local_in_the_same_child(worker, wbin, wdir, netns_factory,
                                                      tmp_path):
    """bridge's IPAM delegate runs in bridge's worker child when CNI_PATH
    finds a launcher for this worker; Go's host-local, or a launcher for
    another socket, is exec'd as the spec says."""
    other = _install(os.path.join(wdir, "other"), os.path.join(wdir, "other.sock"))
    conf = {"cniVersion": "1.0.0", "name": "dlnet", "type": "bridge", "bridge": "cnsk1",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": "10.78.0.0/24"}]]}}
    exe = os.path.join(wbin, "bridge")
    node = netns_factory("cnsk-node")
    cases = (("here", wbin, True), ("go", f"{GO_CNI}:{wbin}", False),
             ("other", f"{other}:{wbin}", False))
    for i, (what, path, in_process) in enumerate(cases):
        pod = netns_factory("cnsk-pod")
        cid = f"dl-{what}"
        kw = dict(container_id=cid, netns=pod.path, node=node, cni_path=path)
        add = run_plugin(exe, "ADD", conf, **kw)
        assert add["ips"][0]["address"] == f"10.78.0.{i + 2}/24", add
        assert (tmp_path / "ipam" / "dlnet" / f"10.78.0.{i + 2}").read_text().startswith(cid)
        run_plugin(exe, "DEL", {**conf, "prevResult": add}, **kw)
        assert not (tmp_path / "ipam" / "dlnet" / f"10.78.0.{i + 2}").exists()
        served = worker.served(cid)
        here = [ln for ln in served if "plugin=host-local " in ln
                and 'launcher="delegated in-process"' in ln]
        assert sum("plugin=bridge " in ln and " exit=0 " in ln for ln in served) == 2, served
        assert len(here) == (2 if in_process else 0), served
    # A delegate's error comes back as from an exec'd one: code, msg, details.
    full = {**conf, "ipam": {**conf["ipam"], "ranges": [[{"subnet": "10.78.1.0/30"}]]}}
    pods = [netns_factory("cnsk-pod") for _ in range(2)]  # .1 is the gateway: room for one
    runs = {}
    for path in (wbin, f"{other}:{wbin}"):
        for j, pod in enumerate(pods):
            runs[path, j] = run_plugin_raw(exe, "ADD", full, container_id=f"dlfull{j}",
                                           netns=pod.path, node=node, cni_path=path)
            if j == 0:
                assert runs[path, j].exit_code == 0, runs[path, j]
        run_plugin(exe, "DEL", full, container_id="dlfull0", netns=pods[0].path, node=node,
                   cni_path=path)
    here, execd = runs[wbin, 1], runs[f"{other}:{wbin}", 1]
    assert here.exit_code == execd.exit_code == 1
    assert here.stdout == execd.stdout, (here, execd)
    assert "no IP addresses available" in here.doc["msg"], here


def test_big_request_is_served(worker, wbin, wdir, node_netns, pod_netns):
    report = os.path.join(wdir, "big-served.json")
    conf = probe_conf(report=report, padding="y" * 300_000)
    run = run_plugin_raw(os.path.join(wbin, "worker-probe"), "ADD", conf, container_id="big1",
                         netns=pod_netns.path, node=node_netns)
    assert run.exit_code == 0, run
    with open(report) as fp:
        assert json.load(fp)["env"]["CNI_CONTAINERID"] == "big1"
    assert worker.served("big1")


def test_native_launcher_replays_stdin_when_the_worker_refuses(sock, wdir, node_netns,
                                                               pod_netns):
    """A refused request runs one-shot with the whole stdin it had already
    sent (a memfd, here 300 KB: more than a pipe holds)."""
    d = _install(os.path.join(wdir, "nbin"), sock, "native")
    w = Worker(sock, os.path.join(wdir, "worker.log"), prefix=DROP_NET_ADMIN)
    try:
        report = os.path.join(wdir, "big.json")
        conf = probe_conf(report=report, padding="x" * 300_000)
        run = run_plugin_raw(os.path.join(d, "worker-probe"), "ADD", conf,
                             container_id="replay1", netns=pod_netns.path, node=node_netns)
        assert run.exit_code == 0, run
        with open(report) as fp:
            assert json.load(fp)["pid"] != w.proc.pid
        (line,) = w.served("replay1")
        assert "refused" in line and "one-shot" in line, line
    finally:
        w.stop()


def test_child_runs_in_the_launchers_context(worker, wbin, obin, netns_factory, wdir):
    """Network and mount namespace (the node's own /sys), cwd, umask, env,
    stdin, and stdout kept clean: as the one-shot executable sees them."""
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    reports = {}
    for mode, d in (("warm", wbin), ("oneshot", obin)):
        report = os.path.join(wdir, f"{mode}.json")
        run = run_plugin_raw(os.path.join(d, "worker-probe"), "ADD",
                             probe_conf(report=report), container_id=f"ctx-{mode}",
                             netns=pod.path, node=node, env={"CNSK_EXTRA": "x y"})
        assert run.exit_code == 0, run
        assert run.doc["cniVersion"] == "1.1.0"
        assert "probe: to stdout, which must land on stderr" in run.stderr
        assert f"probe: to stderr, container ctx-{mode}" in run.stderr
        with open(report) as fp:
            reports[mode] = json.load(fp)
    warm, cold = reports["warm"], reports["oneshot"]
    assert warm["netns"] == os.stat(node.path).st_ino == cold["netns"]
    assert warm["sys_class_net"] == ["lo"] == cold["sys_class_net"]  # the node's /sys
    for key in ("cwd", "umask", "stdin_left"):  # stdin: consumed / /dev/null
        assert warm[key] == cold[key], key
    assert warm["stdin_left"] == ""
    for env in (warm["env"], cold["env"]):
        # per call: the harness's file for the plugin's warnings too
        env.pop("CNI_CONTAINERID"), env.pop("CNI_PATH"), env.pop(protocol.WARNINGS_ENV)
        # PEP 538: without a locale in the environment, Python coerces the C
        # locale into its environ (LC_CTYPE=C.UTF-8); the native launcher
        # sends the runtime's environment as it is.
        env.pop("LC_CTYPE", None)
    # Scripts (one-shot, Python launchers) start through sh (a missing
    # interpreter still gets a spec Error), which exports PWD.
    for env in (warm["env"], cold["env"]):
        env.pop("PWD", None)
    assert warm["env"] == cold["env"]
    assert warm["env"]["CNSK_EXTRA"] == "x y"
    assert worker.served("ctx-warm") and not worker.served("ctx-oneshot")


def test_unknown_plugin_falls_back_to_one_shot(worker, wdir, netns_factory):
    d = os.path.join(wdir, "odd")
    for sock, sub in ((worker.sock, "warm"), (None, "cold")):
        write_executable(os.path.join(d, sub), "nope", "worker_plugins.nope:Nope",
                         pythonpath=PROBE_PATH, worker_socket=sock)
    runs = [run_plugin_raw(os.path.join(d, sub, "nope"), "ADD", lo_conf(),
                           container_id="nope1", netns="/run/netns/none")
            for sub in ("warm", "cold")]
    assert runs[0].exit_code == runs[1].exit_code != 0
    assert runs[0].stdout == runs[1].stdout
    assert "No module named 'worker_plugins.nope'" in runs[0].stderr  # the launcher's own try
    assert any("outcome=unknown-plugin" in ln for ln in worker.served("nope1")), worker.log()
    assert "cannot load plugin" not in worker.log()


# --------------------------------------------------------------------------
# faults


def test_sigkill_before_request_and_stale_socket_fall_back(worker, wbin, netns_factory):
    worker.kill_group()
    assert os.path.exists(worker.sock), "SIGKILL leaves the socket file behind"
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    result = run_plugin(os.path.join(wbin, "loopback"), "ADD", lo_conf(),
                        container_id="stale1", netns=pod.path, ifname="lo", node=node)
    assert result["interfaces"][0]["name"] == "lo"
    assert not worker.served("stale1")
    # A new worker takes the stale path over.
    again = Worker(worker.sock, worker.log_path)
    try:
        run_plugin(os.path.join(wbin, "loopback"), "DEL", lo_conf(), container_id="stale2",
                   netns=pod.path, ifname="lo", node=node)
        assert again.served("stale2")
    finally:
        again.stop()


def _start_sleeper(wbin, wdir, node, pod, cid, seconds):
    marker = os.path.join(wdir, f"{cid}.started")
    conf = probe_conf(mode="sleep", marker=marker, seconds=seconds)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(run_plugin_raw, os.path.join(wbin, "worker-probe"), "ADD", conf,
                      container_id=cid, netns=pod.path, node=node)
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert not fut.done(), fut.result()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pool.shutdown(wait=False)
    return fut


def test_sigkill_during_request_answers_11(worker, wbin, wdir, node_netns, pod_netns):
    fut = _start_sleeper(wbin, wdir, node_netns, pod_netns, "dying1", 30)
    t0 = time.monotonic()
    worker.kill_group()  # the worker and the child running the request
    run = fut.result(timeout=20)
    assert time.monotonic() - t0 < 10
    assert run.exit_code == 1, run
    assert run.doc["code"] == 11 and run.doc["cniVersion"] == "1.1.0", run.doc
    assert "try again later" in run.doc["details"]


def test_sigkill_of_the_parent_only_lets_the_request_finish(worker, wbin, wdir, node_netns,
                                                            pod_netns):
    fut = _start_sleeper(wbin, wdir, node_netns, pod_netns, "orphan1", 1.5)
    os.kill(worker.proc.pid, signal.SIGKILL)
    run = fut.result(timeout=30)
    assert run.exit_code == 0, run
    assert run.doc["cniVersion"] == "1.1.0"


def test_sigkill_after_request_next_call_falls_back(worker, wbin, node_netns, pod_netns):
    exe = os.path.join(wbin, "loopback")
    kw = dict(netns=pod_netns.path, ifname="lo", node=node_netns)
    run_plugin(exe, "ADD", lo_conf(), container_id="after1", **kw)
    assert worker.served("after1")
    worker.kill_group()
    run_plugin(exe, "CHECK", lo_conf(), container_id="after2", **kw)
    run_plugin(exe, "DEL", lo_conf(), container_id="after2", **kw)
    assert not worker.served("after2")


@pytest.mark.parametrize("mode", ["segv", "exit"])
def test_crashing_child_answers_11(worker, wbin, node_netns, pod_netns, mode):
    run = run_plugin_raw(os.path.join(wbin, "worker-probe"), "ADD", probe_conf(mode=mode),
                         container_id=f"crash-{mode}", netns=pod_netns.path, node=node_netns)
    assert run.exit_code == 1, run
    assert run.doc["code"] == 11 and run.doc["cniVersion"] == "1.1.0", run.doc
    expect = "killed by signal 11 (SIGSEGV)" if mode == "segv" else "exited with status 0"
    assert expect in run.doc["msg"]
    assert any("outcome=crashed" in ln and " code=11 " in ln
               for ln in worker.served(f"crash-{mode}"))
    # The worker still serves.
    assert launcher.ping(worker.sock)[0]


@pytest.mark.parametrize("extra", [0, 4 << 20], ids=["ping", "ping-4MiB"])
def test_non_root_client_is_refused(worker, extra):
    """The refusal reaches the client even when the worker closes before the
    request is sent whole (a request larger than the socket buffer: EPIPE)."""
    os.chmod(worker.sock, 0o666)  # let the filesystem allow it: the worker must refuse
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = launcher.connect(worker.sock, 10)
            fields = [b"ping"] + ([b"x" * extra] if extra else [])
            status, _, body = launcher.exchange(s, protocol.encode_request(fields))
            os.write(w, bytes([status]) + body)
        except BaseException as exc:
            os.write(w, b"\xff" + repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fp:
        answer = fp.read()
    os.waitpid(pid, 0)
    assert answer[0] == protocol.ST_REFUSED, answer
    assert b"only root" in answer[1:]
    assert "refused a client with uid 65534" in worker.log()


def test_ping_client_gone_before_the_answer(worker):
    """A ping whose client closed before reading (a timed-out ``--check``)
    costs the serving process nothing: no failure logged, it serves on."""
    for _ in range(3):
        s = launcher.connect(worker.sock, 10)
        s.sendall(protocol.encode_request([b"ping"]))
        s.close()  # the request is whole in the worker's queue; the answer meets EPIPE
    assert launcher.ping(worker.sock)[0]
    assert "child failed" not in worker.log()
    assert "exited with" not in worker.log()


def test_eight_parallel_clients(worker, wbin, tmp_path, node_netns):
    conf = {"cniVersion": "1.1.0", "name": "par", "type": "host-local",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": "10.88.0.0/24"}]]}}
    exe = os.path.join(wbin, "host-local")

    def one(i):
        return run_plugin(exe, "ADD", conf, container_id=f"par{i}", netns="/run/netns/x",
                          node=node_netns)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    addrs = [r["ips"][0]["address"] for r in results]
    assert len(set(addrs)) == 8
    assert all(ipaddress.ip_interface(a) in ipaddress.ip_network("10.88.0.0/24")
               for a in addrs)
    for i in range(8):
        assert worker.served(f"par{i}"), worker.log()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: run_plugin(exe, "DEL", conf, container_id=f"par{i}",
                                           netns="", node=node_netns), range(8)))
    store = tmp_path / "ipam" / "par"
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(("last", "lock", "."))) \
        == []


def test_replacing_the_worker_keeps_requests_in_flight(worker, wbin, wdir, node_netns,
                                                       pod_netns):
    fut = _start_sleeper(wbin, wdir, node_netns, pod_netns, "inflight1", 2)
    successor = Worker(worker.sock, os.path.join(wdir, "successor.log"))
    try:
        worker.proc.terminate()  # old one: stop accepting, let the child finish
        run = fut.result(timeout=60)
        assert run.exit_code == 0, run
        assert worker.proc.wait(30) == 0
        assert os.path.exists(worker.sock), "the old worker must not unlink its successor's"
        run_plugin(os.path.join(wbin, "loopback"), "ADD", lo_conf(), container_id="next1",
                   netns=pod_netns.path, ifname="lo", node=node_netns)
        assert successor.served("next1") and not worker.served("next1")
    finally:
        successor.stop()


# --------------------------------------------------------------------------
# capabilities: the child has the launcher's, never more

CAP_NET_ADMIN, CAP_SYS_MODULE = 12, 16
DROP_NET_ADMIN = ("setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin")
# A capability no plugin needs: a caller without it is still served, with less.
DROP_SYS_MODULE = ("setpriv", "--inh-caps=-sys_module", "--bounding-set=-sys_module")
CAP_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _status_caps(text):
    fields = dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
    return {k: int(fields[k], 16) for k in CAP_KEYS}


def test_child_takes_the_launchers_capabilities(worker, wbin, wdir, node_netns, pod_netns):
    """A launcher run without CAP_SYS_MODULE (setpriv, a confined runtime) must
    not get it back through the worker: the child drops to its sets."""
    expected = _status_caps(subprocess.run(
        ["ip", "netns", "exec", node_netns.name, *DROP_SYS_MODULE, "cat", "/proc/self/status"],
        capture_output=True, text=True, check=True).stdout)
    assert not expected["CapEff"] >> CAP_SYS_MODULE & 1
    assert not expected["CapBnd"] >> CAP_SYS_MODULE & 1
    marker = os.path.join(wdir, "caps.started")
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "caps1",
           "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0", "CNI_PATH": wbin}
    proc = subprocess.Popen(["ip", "netns", "exec", node_netns.name, *DROP_SYS_MODULE,
                             os.path.join(wbin, "worker-probe")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(json.dumps(probe_conf(mode="sleep", marker=marker,
                                               seconds=2)).encode())
        proc.stdin.close()
        deadline, pid = time.monotonic() + 60, 0
        while not pid:
            with contextlib.suppress(FileNotFoundError, ValueError), open(marker) as fp:
                pid = int(fp.read())
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with open(f"/proc/{pid}/status") as fp:
            status = fp.read()
        assert f"PPid:\t{worker.proc.pid}\n" in status, "the plugin ran in a worker child"
        assert _status_caps(status) == expected
        out, err = proc.stdout.read(), proc.stderr.read()  # a few bytes each
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert worker.served("caps1"), worker.log()


def test_caller_with_capabilities_the_worker_lacks_runs_one_shot(sock, wdir, wbin, node_netns,
                                                                 pod_netns):
    w = Worker(sock, os.path.join(wdir, "worker.log"), prefix=DROP_NET_ADMIN)
    try:
        exe = os.path.join(wbin, "loopback")
        kw = dict(netns=pod_netns.path, ifname="lo", node=node_netns)
        result = run_plugin(exe, "ADD", lo_conf(), container_id="capsmore1", **kw)
        assert result["interfaces"][0]["name"] == "lo"
        (line,) = w.served("capsmore1")
        assert "outcome=refused" in line and "this worker lacks CAP_NET_ADMIN" in line, line
        assert "the launcher falls back" in line
        run = run_plugin_raw(exe, "DEL", lo_conf(), container_id="capsmore2",
                             env={protocol.REQUIRED_ENV: "1"}, **kw)
        assert run.exit_code == 1 and run.doc["code"] == 11, run
        assert "refused: this worker lacks CAP_NET_ADMIN" in run.doc["details"]
    finally:
        w.stop()


# --------------------------------------------------------------------------
# CNI_SKEL_WORKER_REQUIRED: the launcher never runs the plugin itself


def _lo_is_up(ns_path):
    """IFF_UP on ``lo`` in that namespace, as the kernel reports it."""
    out = subprocess.run(["nsenter", f"--net={ns_path}", "ip", "-json", "link", "show", "lo"],
                         capture_output=True, text=True, check=True).stdout
    return "UP" in json.loads(out)[0]["flags"]


def test_worker_required_answers_11_instead_of_one_shot(worker, wbin, wdir, netns_factory):
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    exe = os.path.join(wbin, "loopback")
    required = {protocol.REQUIRED_ENV: "1"}
    kw = dict(netns=pod.path, ifname="lo", node=node)

    def refused(run, why):
        assert run.exit_code == 1, run
        assert run.doc["code"] == 11 and run.doc["cniVersion"] == "1.0.0", run.doc
        assert "cni-skel worker" in run.doc["msg"] and why in run.doc["details"], run.doc
        assert protocol.REQUIRED_ENV in run.doc["details"]
        assert not _lo_is_up(pod.path), "the plugin ran although the worker did not serve"

    # No worker on the socket (CNI_SKEL_WORKER_SOCKET overrides the baked path).
    dead = os.path.join(wdir, "nobody.sock")
    refused(run_plugin_raw(exe, "ADD", lo_conf(), container_id="req-dead",
                           env={**required, protocol.SOCKET_ENV: dead}, **kw),
            "cannot connect")
    # "0" or empty: fallback allowed, the plugin runs in the launcher.
    for off in ("0", ""):
        run = run_plugin_raw(exe, "DEL", lo_conf(), container_id="req-off",
                             env={protocol.REQUIRED_ENV: off, protocol.SOCKET_ENV: dead}, **kw)
        assert run.exit_code == 0, run
    # The worker answers but cannot import the plugin.
    nope = write_executable(os.path.join(wdir, "odd"), "nope", "worker_plugins.nope:Nope",
                            pythonpath=PROBE_PATH, worker_socket=worker.sock)
    run = run_plugin_raw(nope, "ADD", lo_conf(), container_id="req-nope", env=required, **kw)
    assert run.doc["code"] == 11 and "unknown plugin" in run.doc["details"], run.doc
    assert "is not served by this worker" in run.doc["details"]
    # Served: works, and the worker logged it.
    assert run_plugin(exe, "ADD", lo_conf(), container_id="req-ok", env=required, **kw)
    assert _lo_is_up(pod.path) and worker.served("req-ok"), worker.log()
    run_plugin(exe, "DEL", lo_conf(), container_id="req-ok", env=required, **kw)
    # VERSION and the about text stay local: no worker needed.
    version = run_plugin_raw(exe, "VERSION", b"", env={**required, protocol.SOCKET_ENV: dead})
    assert version.exit_code == 0 and "1.0.0" in version.doc["supportedVersions"]
    # Worker gone: refused, and the plugin does not run.
    worker.kill_group()
    refused(run_plugin_raw(exe, "ADD", lo_conf(), container_id="req-gone", env=required,
                           **kw), "connect")


# --------------------------------------------------------------------------
# the suite's own modes (tests/conftest.py): cni_bin is what it says


def test_cni_bin_is_served_as_its_mode_says(cni_bin, cni_mode, cni_worker_socket, request,
                                            netns_factory):
    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    cid = f"suite-mode-{cni_mode}"
    exe = os.path.join(cni_bin, "loopback")
    assert launcher_info(exe)["socket"] == cni_worker_socket, "a launcher for this mode's socket"
    kw = dict(container_id=cid, netns=pod.path, ifname="lo", node=node)
    add = run_plugin(exe, "ADD", lo_conf(), **kw)
    assert add["interfaces"][0]["name"] == "lo"
    run_plugin(exe, "DEL", lo_conf(), **kw)
    if cni_mode == "warm":
        assert os.environ.get(protocol.REQUIRED_ENV) == "1", "warm tests forbid the fallback"
        worker = request.getfixturevalue("cni_worker")
        assert worker.sock == cni_worker_socket and launcher.ping(cni_worker_socket)[0]
        served = worker.served(cid)
        assert len(served) == 2, worker.log()
        assert all("plugin=loopback " in ln and " exit=0 " in ln for ln in served), served
    else:
        assert protocol.REQUIRED_ENV not in os.environ
        assert not os.path.exists(cni_worker_socket), "nothing may listen in oneshot mode"
