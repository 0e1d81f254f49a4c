"""The conformance kit (``cni-skel conformance``, `cni_skel.conformance`,
issue 50) catches broken plugins, each by the check naming the rule it
breaks and by no other.

toyveth (tests/conformance_plugins/toyveth.py) is a small veth plugin
written without the SDK, delegating to our host-local; as written it passes
every check, and each ``CNSK_TOY_BREAK`` variant breaks one rule. The kit
runs as a user runs it: the CLI, as a process, with ``--json -`` read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from cni_skel.conformance import CHECKS, Rig, Target
from cni_skel.netns import NetNS
from cni_skel.sysctl import read_sysctl
from cni_skel.warm.install import plugin_registry, write_executable

pytestmark = pytest.mark.root

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
TOY = Path(__file__).parent / "conformance_plugins" / "toyveth.py"
#: Each variant and the one check it must fail.
BROKEN = {
    "leak-veth": "del.leaves-nothing",
    "del-twice": "del.twice",
    "traceback": "answer.contract",
    "wrong-code": "input.unknown-verb",
    "no-rollback": "failure.leaves-nothing",
    "dup-addresses": "concurrency.unique-addresses",
    "invalid-result": "add.result-valid",
    "exit0-error": "answer.contract",
}
#: Checks a variant leaves unjudged: its answer has no Error object whose
#: code they could judge (answer.contract fails it).
UNJUDGED = {"traceback": {"input.bad-json"}}


@pytest.fixture
def worker_sock(cni_worker: Any) -> str:
    """The suite worker's socket: toyveth's host-local runs warm."""
    return cni_worker.sock


def toy_target(tmp: Path, sock: str, variant: str = "") -> tuple[Path, Path]:
    """A bin dir with toyveth (as ``variant``) and our host-local (a launcher
    for the worker on ``sock``), and a 1.1.0 config for it: (bin dir,
    config file)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "toyveth"
    exe.write_text(f"#!/bin/sh\nCNSK_TOY_BREAK={variant} exec {sys.executable} {TOY}\n")
    exe.chmod(0o755)
    write_executable(str(bin_dir), "host-local", plugin_registry()["host-local"],
                     worker_socket=sock)
    conf = tmp / "toy.conf"
    conf.write_text(json.dumps({
        "cniVersion": "1.1.0", "name": "cftoy", "type": "toyveth",
        "dataDir": str(tmp / "toy-state"),
        "ipam": {"type": "host-local", "subnet": "10.79.0.0/24",
                 "dataDir": str(tmp / "ipam")}}))
    return bin_dir, conf


def conformance(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "conformance", "-q", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def report_of(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def failures(report: dict[str, Any]) -> str:
    return "\n".join(f"{c['name']}: {f}" for c in report["checks"] for f in c["failures"])


def test_a_plugin_keeping_every_rule_passes_every_check(tmp_path, worker_sock):
    """Every check runs against toyveth (1.1.0, IPAM, a state directory:
    nothing is n/a) and passes; exit status 0; the JUnit file has a case
    per check and no failure."""
    bin_dir, conf = toy_target(tmp_path, worker_sock)
    junit = tmp_path / "report.xml"
    proc = conformance("--plugin-dir", str(bin_dir), "--config", str(conf), "--json", "-",
                       "--junit", str(junit))
    report = report_of(proc)
    assert set(statuses(report).values()) == {"pass"}, (statuses(report), failures(report))
    assert proc.returncode == 0 and report["ok"]
    assert list(statuses(report)) == list(CHECKS)
    assert report["claims"] == {"toyveth": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}
    assert {"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"} <= set(report["timings"])
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == list(CHECKS)


@pytest.mark.parametrize("variant", list(BROKEN))
def test_a_broken_plugin_fails_the_check_of_its_rule_alone(variant, tmp_path, worker_sock):
    """Each variant fails exactly the check of the rule it breaks (exit 1);
    every other check passes, or (`UNJUDGED`) has nothing to judge."""
    bin_dir, conf = toy_target(tmp_path, worker_sock, variant)
    proc = conformance("--plugin-dir", str(bin_dir), "--config", str(conf), "--json", "-")
    report = report_of(proc)
    failed = [name for name, status in statuses(report).items() if status == "fail"]
    assert failed == [BROKEN[variant]], failures(report)
    assert proc.returncode == 1 and not report["ok"]
    unjudged = {name for name, status in statuses(report).items() if status == "n/a"}
    assert unjudged == UNJUDGED.get(variant, set()), statuses(report)


def test_the_table_and_the_selection(tmp_path, worker_sock):
    """--checks/--skip pick checks by pattern (the rest shown as skipped);
    the table names each check with its spec section; a pattern matching
    nothing, or no config, is a usage error (exit 2)."""
    bin_dir, conf = toy_target(tmp_path, worker_sock, "del-twice")
    proc = conformance("--plugin-dir", str(bin_dir), "--config", str(conf),
                       "--checks", "del.*", "--skip", "del.netns-gone")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("FAIL  del.twice") and "spec 2, DEL" in ln for ln in lines), \
        proc.stdout
    assert any(ln.startswith("PASS  del.succeeds") for ln in lines), proc.stdout
    assert any(ln.startswith("skip  del.netns-gone") for ln in lines), proc.stdout
    assert any(ln.startswith("skip  concurrency.adds") for ln in lines), proc.stdout
    assert "FAILED: " in lines[-1] and " 1 failed" in lines[-1], lines[-1]

    assert conformance("--config", str(conf), "--checks", "nothing.*").returncode == 2
    assert conformance("--plugin-dir", str(bin_dir)).returncode == 2
    listed = subprocess.run([CLI, "conformance", "--list"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert [ln.split()[0] for ln in listed.splitlines()] == list(CHECKS)


def test_sysctls_are_set_in_the_node_and_each_pod(tmp_path):
    """--sysctl (`Target.sysctls`) holds in the node and in every pod the rig
    makes, before a plugin runs there; a key outside /proc/sys or a pair
    without ``=`` is a usage error naming the option."""
    conf = tmp_path / "lo.conf"
    conf.write_text(json.dumps({"cniVersion": "1.1.0", "name": "cfsys", "type": "loopback"}))
    key = "net.ipv6.conf.default.accept_dad"
    target = Target.from_file(str(conf), [], sysctls={key: "0"})
    with Rig(target, str(tmp_path / "rig")) as rig:
        pods = [rig.pod(), rig.pod()]
        for ns in (rig.node, *pods):
            with NetNS.open(ns.path) as handle, handle.enter():
                assert read_sysctl(key) == "0", ns.name
    for bad in ("../../etc/passwd=1", key):
        proc = conformance("--config", str(conf), "--sysctl", bad)
        assert proc.returncode == 2 and "--sysctl" in proc.stderr, proc.stderr
