"""Operators can see the warm path (issue 19): one log line per request
(stderr and ``--log-file``), Prometheus metrics (``--metrics-address``,
scraped inside a namespace made here), and ``cni-skel doctor``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
from test_worker import Worker

from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.warm import protocol
from cni_skel.warm.install import write_executable

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
LOOPBACK = "cni_skel_plugins.loopback:Loopback"
METRICS_PORT = 19743


@pytest.fixture
def wdir():
    d = tempfile.mkdtemp(prefix="cnsk-ob-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def lo_conf(**extra) -> dict:
    return {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback", **extra}


def _lines(w: Worker, cid: str, n: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(lines := w.served(cid)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


def _logfmt(line: str) -> dict[str, str]:
    """key=value pairs of a request line (values JSON-quoted when needed)."""
    out = {}
    for key, quoted, bare in re.findall(r'(\w+)=(?:("(?:[^"\\]|\\.)*")|(\S+))', line):
        out[key] = json.loads(quoted) if quoted else bare
    return out


def _scrape(node: NetNS) -> str:
    with node.enter(), urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics",
                                timeout=10) as r:
        return r.read().decode()


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + ("{" if labels else " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_request_lines_metrics_and_log_file(wdir, node_netns, pod_netns):
    sock = os.path.join(wdir, "w.sock")
    log_file = os.path.join(wdir, "requests.log")
    # The worker in the node namespace: its metrics listen there, not on this machine.
    subprocess.run(["ip", "netns", "exec", node_netns.name, "ip", "link", "set", "lo", "up"],
                   check=True)
    w = Worker(sock, os.path.join(wdir, "worker.log"),
               prefix=("ip", "netns", "exec", node_netns.name),
               args=("--metrics-address", f"127.0.0.1:{METRICS_PORT}", "--log-file", log_file))
    try:
        exe = write_executable(os.path.join(wdir, "bin"), "loopback", LOOPBACK,
                               worker_socket=sock, fallback="none")
        kw = dict(netns=pod_netns.path, ifname="lo", node=node_netns)
        run_plugin(exe, "ADD", lo_conf(), container_id="ob1", **kw)
        run_plugin(exe, "DEL", lo_conf(), container_id="ob1", **kw)
        bad = run_plugin_raw(exe, "ADD", lo_conf(cniVersion="0.0.9"), container_id="ob1", **kw)
        assert bad.exit_code == 1 and bad.doc["code"] == 1, bad
        lines = _lines(w, "ob1", 3)
        assert len(lines) == 3, w.log()
        fields = [_logfmt(ln) for ln in lines]
        for f in fields:
            assert f["cid"] == "ob1" and f["plugin"] == "loopback", f
            assert f["netns"] == pod_netns.path and f["launcher"] == "native", f
            assert f["fallback"] == "none", f
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", f["time"]), f
            assert float(f["ms"]) >= 0
        assert [(f["verb"], f["exit"]) for f in fields] == [("ADD", "0"), ("DEL", "0"),
                                                            ("ADD", "1")]
        assert fields[2]["code"] == "1" and bad.doc["msg"] == fields[2]["msg"], fields[2]
        with open(log_file) as fp:
            assert [ln for ln in fp.read().splitlines() if " cid=ob1 " in ln] == lines
        # A launcher that fell back (worker not reachable) leaves a line the
        # metrics count.
        with open(os.path.join(wdir, protocol.FALLBACK_LOG), "a") as fp:
            fp.write("1 ADD cni_skel_plugins.loopback:Loopback x cannot connect: refused\n")
        # The parent counts a request when it reaps its child: it may lag the answer.
        deadline = time.monotonic() + 10
        with NetNS.open(node_netns.path) as node:
            while True:
                text = _scrape(node)
                if _value(text, "cni_skel_requests_in_flight") == 0 \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert _value(text, "cni_skel_requests_total", plugin="loopback", verb="ADD",
                      code="0") == 1, text
        assert _value(text, "cni_skel_requests_total", plugin="loopback", verb="DEL",
                      code="0") == 1
        assert _value(text, "cni_skel_requests_total", plugin="loopback", verb="ADD",
                      code="1") == 1
        assert _value(text, "cni_skel_request_duration_seconds_count", plugin="loopback",
                      verb="ADD") == 2
        assert _value(text, "cni_skel_requests_in_flight") == 0
        assert _value(text, "cni_skel_children", state="idle") >= 1
        assert _value(text, "cni_skel_launcher_fallbacks_total") == 1
        assert _value(text, "cni_skel_worker_info", protocol="1-2") == 1
        # A plugin the worker does not serve: not run, counted.
        nope = write_executable(os.path.join(wdir, "odd"), "nope", "nosuch.mod:Nope",
                                worker_socket=sock, fallback="none", force=True)
        refused = run_plugin_raw(nope, "ADD", lo_conf(), container_id="ob2", **kw)
        assert refused.doc["code"] == 11 and "unknown plugin" in refused.doc["details"]
        _lines(w, "ob2", 1)
        with NetNS.open(node_netns.path) as node:
            text = _scrape(node)
        assert _value(text, "cni_skel_not_served_total", reason="unknown-plugin") == 1, text
    finally:
        w.stop()


def test_doctor_says_how_plugins_run(wdir, node_netns):
    sock = os.path.join(wdir, "w.sock")
    bin_dir = os.path.join(wdir, "bin")
    write_executable(bin_dir, "loopback", LOOPBACK, worker_socket=sock)

    def doctor(*names: str) -> subprocess.CompletedProcess:
        return subprocess.run([CLI, "doctor", "--bin-dir", bin_dir, "--systemd-dir",
                               os.path.join(wdir, "units"), *names],
                              capture_output=True, text=True, check=False)

    down = doctor("loopback")
    assert down.returncode == 1, down
    assert "mode: one-shot" in down.stdout and "not answering" in down.stdout, down.stdout
    assert "every call runs one-shot" in down.stdout
    w = Worker(sock, os.path.join(wdir, "worker.log"))
    try:
        up = doctor("loopback")
        assert up.returncode == 0 and up.stdout.rstrip().endswith("ok"), up.stdout
        assert "mode: warm" in up.stdout and f"pid {w.proc.pid}" in up.stdout, up.stdout
        assert "loopback     native, fallback oneshot, protocol 2" in up.stdout
        # Everything registered: the others are missing here.
        assert "host-local   missing" in doctor().stdout
    finally:
        w.stop()
    write_executable(bin_dir, "loopback", LOOPBACK, worker_socket=sock, fallback="none")
    none = doctor("loopback")
    assert none.returncode == 1 and "every call answers code 11" in none.stdout, none.stdout
