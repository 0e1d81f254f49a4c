"""The launcher never guesses (issue 19): what every kind of installed
executable answers when the worker cannot serve, when its interpreter or
virtualenv is gone, and when launcher and worker speak different protocol
versions; VERSION and the about text from baked data, with no Python.

Real executables run as a runtime runs them (env + stdin, stdout), workers
on sockets in temporary directories, namespaces made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from test_worker import Worker

from cni_skel import errors
from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.skel import resolve_ref, version_answer
from cni_skel.version import CURRENT_VERSION
from cni_skel.warm import protocol
from cni_skel.warm.client import read_reply, send_request
from cni_skel.warm.install import launcher_info, write_executable

LOOPBACK = "cni_skel_plugins.loopback:Loopback"
BRIDGE = "cni_skel_plugins.bridge:Bridge"
HOST_LOCAL = "cni_skel_plugins.host_local:HostLocal"


def lo_conf(version: str = "1.0.0") -> dict:
    return {"cniVersion": version, "name": "lonet", "type": "loopback"}


@pytest.fixture
def wdir():
    d = tempfile.mkdtemp(prefix="cnsk-lp-")  # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _write(d: str, kind: str, fallback: str, sock: str, python: str | None = None,
           name: str = "loopback", ref: str = LOOPBACK) -> str:
    return write_executable(d, name, ref, force=True, worker_socket=sock, launcher=kind,
                            fallback=fallback, python=python)


def _served(w: Worker, cid: str) -> list[str]:
    """The worker's lines for ``cid`` (a child logs right after it answered)."""
    deadline = time.monotonic() + 10
    while not (lines := w.served(cid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


def _lo_up(ns_path: str) -> bool:
    out = subprocess.run(["nsenter", f"--net={ns_path}", "ip", "-json", "link", "show", "lo"],
                         capture_output=True, text=True, check=True).stdout
    return "UP" in json.loads(out)[0]["flags"]


# --------------------------------------------------------------------------
# fallback none: code 11 (STATUS 50), and no Python at all in a native launcher


@pytest.mark.parametrize("kind", ["native", "python"])
def test_fallback_none_answers_11_naming_the_socket(wdir, kind, node_netns, pod_netns):
    dead = os.path.join(wdir, "nobody.sock")
    exe = _write(os.path.join(wdir, "bin"), kind, "none", dead)
    assert launcher_info(exe)["fallback"] == "none"
    kw = dict(container_id="fb-none", netns=pod_netns.path, ifname="lo", node=node_netns)
    for version in ("0.3.1", "1.0.0"):
        run = run_plugin_raw(exe, "ADD", lo_conf(version), **kw)
        assert run.exit_code == 1, run
        assert run.doc["code"] == errors.ERR_TRY_AGAIN_LATER, run.doc
        assert run.doc["cniVersion"] == version, "the config's version, as the skel answers"
        assert run.doc["msg"] == "cni-skel worker not reachable"
        assert dead in run.doc["details"] and "--fallback none" in run.doc["details"]
    assert not _lo_up(pod_netns.path), "the plugin ran although nothing was to run it"
    status = run_plugin_raw(exe, "STATUS", lo_conf("1.1.0"), **kw)
    assert status.exit_code == 1 and status.doc["code"] == errors.ERR_PLUGIN_NOT_AVAILABLE
    assert not os.path.exists(os.path.join(wdir, protocol.FALLBACK_LOG))


def test_fallback_none_native_launcher_never_starts_python(wdir, node_netns, pod_netns):
    """Built for an interpreter that does not exist (the image's launchers on
    a host without its Python): VERSION, the about text and the no-worker
    error all come from the executable itself."""
    dead = os.path.join(wdir, "nobody.sock")
    exe = _write(os.path.join(wdir, "bin"), "native", "none", dead,
                 python="/nonexistent/venv/bin/python")
    for asked in (b"", b'{"cniVersion": "0.4.0"}', b'{"cniVersion": "9.9"}', b"[1,"):
        run = run_plugin_raw(exe, "VERSION", asked)
        assert run.exit_code == 0, run
        assert run.stdout == version_answer(resolve_ref(LOOPBACK), asked), asked
    about = subprocess.run([exe], capture_output=True, text=True, env={"PATH": "/usr/bin"},
                           check=False)
    assert about.returncode == 0 and "CNI loopback plugin" in about.stderr, about
    run = run_plugin_raw(exe, "ADD", lo_conf(), container_id="np", netns=pod_netns.path,
                         ifname="lo", node=node_netns)
    assert run.exit_code == 1 and run.doc["code"] == 11, run
    # A worker serves it as usual.
    w = Worker(dead, os.path.join(wdir, "worker.log"))
    try:
        assert run_plugin(exe, "ADD", lo_conf(), container_id="np2", netns=pod_netns.path,
                          ifname="lo", node=node_netns)["interfaces"][0]["name"] == "lo"
        (line,) = _served(w, "np2")
        assert " launcher=native fallback=none " in line and " exit=0 " in line, line
    finally:
        w.stop()


# Configs for VERSION: the native launcher reads the plain ones itself; the
# rest (escapes or non-ASCII in the cniVersion, an escaped key, a BOM) it
# leaves to Python's json, or, with no Python (fallback none), answers the
# current version.
PLAIN_VERSION_CONFIGS = [
    b'{"cniVersion":"1.0.0","name":"r\xc3\xa9seau"}', b'{"cniVersion":"1.0.0","x":"a\\"b\\u00e9"}',
    b'{"cniVersion":"0.4.0"} x', b'{"cniVersion":"0.4.0","x":"\xff"}', b'{"a":"\\x"}',
    b'{"cniVersion":"0.4.0","cniVersion":3}', b'[{"cniVersion":"0.4.0"}]',
    b'{"cniVersion":"01.2.3"}', b'{"cniVersion": "1.0.0", "n": -0.5e+3}', b" \t\n",
    b'{"cniVersion":"0.3.1","a":[1,{"b":null}],"c":true}', b"{" * 300 + b"}" * 300,
    # keys match as Go matches them: any ASCII case, the last one winning
    b'{"CNIVERSION":"0.4.0"}', b'{"cniVersion":"1.0.0","cniversion":"0.3.1"}',
    b'{"CniVersion":"0.4.0","cniVersion":"1.0.0","name":"n"}',
    b'{"cniVersion":"0.4.0","CNIVERSION":1}', b'{"a":{"CNIVERSION":"0.4.0"}}']
UNSURE_VERSION_CONFIGS = [b'{"cniVersion":"1.0.\\u0030"}', b'{"cniVers\\u0069on":"0.4.0"}',
                          b'\xef\xbb\xbf{"cniVersion":"0.4.0"}', b'{"cniVersion":"1.0.0\\n"}']


@pytest.mark.parametrize("fallback", ["oneshot", "none"])
def test_native_version_answers_as_the_skel(wdir, fallback):
    exe = _write(os.path.join(wdir, "bin"), "native", fallback, os.path.join(wdir, "no.sock"))
    plugin = resolve_ref(LOOPBACK)
    for config in PLAIN_VERSION_CONFIGS + UNSURE_VERSION_CONFIGS:
        run = run_plugin_raw(exe, "VERSION", config)
        assert run.exit_code == 0, (config, run)
        if fallback == "none" and config in UNSURE_VERSION_CONFIGS:
            assert json.loads(run.stdout)["cniVersion"] == CURRENT_VERSION, config
        else:
            assert run.stdout == version_answer(plugin, config), config


# --------------------------------------------------------------------------
# fallback oneshot: runs, warns naming the socket, logs the fallback


@pytest.mark.parametrize("kind", ["native", "python"])
def test_fallback_oneshot_warns_and_logs(wdir, kind, node_netns, pod_netns):
    sock = os.path.join(wdir, "run", "w.sock")
    os.makedirs(os.path.dirname(sock))
    exe = _write(os.path.join(wdir, "bin"), kind, "oneshot", sock)
    run = run_plugin_raw(exe, "ADD", lo_conf(), container_id="fb-one", netns=pod_netns.path,
                         ifname="lo", node=node_netns)
    assert run.exit_code == 0 and run.doc["interfaces"][0]["name"] == "lo", run
    assert _lo_up(pod_netns.path)
    assert "worker not reachable" in run.stderr and sock in run.stderr, run.stderr
    assert "running it one-shot" in run.stderr
    with open(os.path.join(os.path.dirname(sock), protocol.FALLBACK_LOG)) as fp:
        (line,) = fp.read().splitlines()
    when, verb, ref, cid, why = line.split(" ", 4)
    assert int(when) > 0 and (verb, ref, cid) == ("ADD", LOOPBACK, "fb-one"), line
    assert why.startswith("cannot connect"), line


# --------------------------------------------------------------------------
# the interpreter or virtualenv is gone: a spec Error naming it and the fix


@pytest.mark.parametrize("kind", ["native", "python", "oneshot"])
def test_missing_interpreter_is_a_spec_error(wdir, kind, node_netns, pod_netns):
    gone = "/nonexistent/venv/bin/python"
    d = os.path.join(wdir, "bin")
    dead = os.path.join(wdir, "nobody.sock")
    if kind == "oneshot":
        exe = write_executable(d, "loopback", LOOPBACK, worker_socket=None, python=gone)
    else:
        exe = _write(d, kind, "oneshot", dead, python=gone)
    kw = dict(container_id="gone", netns=pod_netns.path, ifname="lo", node=node_netns)
    run = run_plugin_raw(exe, "ADD", lo_conf(), **kw)
    assert run.exit_code == 1, run
    assert run.doc["code"] == errors.ERR_IO_FAILURE, run.doc
    assert gone in run.doc["msg"] and "cni-skel install" in run.doc["details"], run.doc
    status = run_plugin_raw(exe, "STATUS", lo_conf("1.1.0"), **kw)
    assert status.doc["code"] == errors.ERR_PLUGIN_NOT_AVAILABLE, status.doc


def test_moved_virtualenv_is_a_spec_error(wdir, node_netns, pod_netns):
    """The launcher code's directory is gone (the venv moved): the Python
    launcher says so instead of a traceback."""
    copy = os.path.join(wdir, "src")
    shutil.copytree(os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__))),
                    os.path.join(copy, "cni_skel"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from cni_skel.warm.install import write_executable; "
            "write_executable(sys.argv[2], 'loopback', sys.argv[3], worker_socket=sys.argv[4], "
            "launcher='python')")
    bin_dir = os.path.join(wdir, "bin")
    subprocess.run([sys.executable, "-c", code, copy, bin_dir, LOOPBACK,
                    os.path.join(wdir, "nobody.sock")], check=True)
    shutil.rmtree(copy)
    run = run_plugin_raw(os.path.join(bin_dir, "loopback"), "ADD", lo_conf("0.4.0"),
                         container_id="moved", netns=pod_netns.path, ifname="lo", node=node_netns)
    assert run.exit_code == 1 and run.doc["code"] == errors.ERR_IO_FAILURE, run
    assert run.doc["cniVersion"] == "0.4.0"
    assert copy in run.doc["msg"] and "cni-skel install" in run.doc["details"], run.doc


# --------------------------------------------------------------------------
# versioned handshake


def _request(fields: list[bytes], version: int, fds: list[int]) -> bytes:
    return protocol.encode_request(fields, version=version)


def _run_fields(env: dict[str, str], stdin: bytes) -> list[bytes]:
    envb = b"\0".join(f"{k}={v}".encode() for k, v in env.items())
    return [protocol.KIND_RUN, LOOPBACK.encode(), b"", b"/", b"18", envb, stdin]


def test_worker_serves_the_previous_protocol_and_names_both_otherwise(wdir, node_netns,
                                                                      pod_netns):
    sock = os.path.join(wdir, "w.sock")
    w = Worker(sock, os.path.join(wdir, "worker.log"))
    try:
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "v1", "CNI_NETNS": pod_netns.path,
               "CNI_IFNAME": "lo", "CNI_PATH": "/nonexistent", "PATH": "/usr/bin:/bin"}
        stdin = json.dumps(lo_conf()).encode()
        # A protocol 1 launcher (before this version): 7 fields, 3 fds, b"CSKQ".
        fds = [os.open(f"{node_netns.path}", os.O_RDONLY), os.open("/proc/self/ns/mnt",
                                                                    os.O_RDONLY), 2]
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
                send_request(s, _request(_run_fields(env, stdin), 1, fds), fds)
                status, code, out = read_reply(s)
        finally:
            os.close(fds[0])
            os.close(fds[1])
        assert status == protocol.ST_DONE and code == 0, (status, out)
        assert json.loads(out)["interfaces"][0]["name"] == "lo"
        assert _lo_up(pod_netns.path)
        (line,) = _served(w, "v1")
        assert 'launcher="protocol 1"' in line, line
        # A launcher of the next version: named, nothing read, nothing run.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            s.sendall(protocol.encode_request([b"whatever"], version=3))
            status, code, out = read_reply(s)
        assert status == protocol.ST_VERSION, (status, out)
        assert b"protocol 1-2, not 3" in out, out
    finally:
        w.stop()


def test_launcher_answers_11_naming_both_versions(wdir, node_netns, pod_netns):
    """A worker that does not speak this launcher's protocol (a fake one,
    answering as a worker of another version would): spec error 11."""
    sock = os.path.join(wdir, "other.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(sock)
    srv.listen(8)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(8)
                conn.sendall(protocol.encode_reply(
                    protocol.ST_VERSION, 0, b"cni-skel worker 9.0 serves launcher protocol "
                                            b"7-8, not 2"))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        for kind in ("native", "python"):
            exe = _write(os.path.join(wdir, kind), kind, "oneshot", sock)
            run = run_plugin_raw(exe, "ADD", lo_conf("0.4.0"), container_id="ver",
                                 netns=pod_netns.path, ifname="lo", node=node_netns)
            assert run.exit_code == 1 and run.doc["code"] == 11, (kind, run)
            assert run.doc["cniVersion"] == "0.4.0"
            details = run.doc["details"]
            assert f"speaks protocol {protocol.PROTOCOL_VERSION}" in details, details
            assert "protocol 7-8, not 2" in details and "cni-skel install" in details
            assert not _lo_up(pod_netns.path), "never one-shot across versions"
    finally:
        stop.set()
        srv.close()


# --------------------------------------------------------------------------
# the pod's network namespace travels as an fd


def test_worker_in_its_own_mount_namespace_enters_the_pod_by_fd(wdir, node_netns, pod_netns):
    """CNI_NETNS names a bind mount only the launcher's mount namespace has
    (as a pod's namespace is for a worker in a container): with
    --mount-namespace own the worker enters it through the fd the launcher
    passed, and the result still names the path."""
    sock = os.path.join(wdir, "w.sock")
    bin_dir = os.path.join(wdir, "bin")
    for name, ref in (("bridge", BRIDGE), ("host-local", HOST_LOCAL)):
        _write(bin_dir, "native", "none", sock, name=name, ref=ref)
    hidden = os.path.join(wdir, "podns")
    open(hidden, "w").close()  # in the worker's mount namespace: an empty file
    conf = {"cniVersion": "1.0.0", "name": "fdnet", "type": "bridge", "bridge": "cnskfd0",
            "isGateway": True,
            "ipam": {"type": "host-local", "dataDir": os.path.join(wdir, "ipam"),
                     "ranges": [[{"subnet": "10.79.0.0/24"}]]}}
    w = Worker(sock, os.path.join(wdir, "worker.log"), args=("--mount-namespace", "own"))
    try:
        script = ("mount --bind \"$POD\" \"$HIDDEN\" && exec ip netns exec \"$NODE\" "
                  "\"$EXE\"")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD",
               "CNI_CONTAINERID": "byfd", "CNI_NETNS": hidden, "CNI_IFNAME": "eth0",
               "CNI_PATH": bin_dir, "POD": pod_netns.path, "HIDDEN": hidden,
               "NODE": node_netns.name, "EXE": os.path.join(bin_dir, "bridge")}
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               script], input=json.dumps(conf).encode(), env=env,
                              capture_output=True, timeout=60, check=False)
        assert proc.returncode == 0, (proc.stdout, proc.stderr, w.log())
        result = json.loads(proc.stdout)
        assert result["interfaces"][2]["sandbox"] == hidden, result
        assert result["ips"][0]["address"] == "10.79.0.2/24"
        out = subprocess.run(["nsenter", f"--net={pod_netns.path}", "ip", "-json", "addr",
                              "show", "eth0"], capture_output=True, text=True, check=True).stdout
        assert "10.79.0.2" in out, out
        served = _served(w, "byfd")
        assert any("plugin=bridge " in ln and " exit=0 " in ln for ln in served), w.log()
        assert 'mount namespace own' in w.log()
    finally:
        w.stop()
