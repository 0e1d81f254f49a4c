"""`cni-skel demo` (what `make demo` runs): two pods on a bridge network in
namespaces it makes itself, through the cni-skel runtime; everything removed
at the end, also after a failure or Ctrl-C."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys

import pytest
from conftest import GO_CNI_DIR

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")

#: Which plugins the demo test runs: None is the demo's default (ours,
#: installed by the demo, cniVersion 1.1.0).
DEMO_PLUGIN_DIR: str | None = None


def demo_args(plugin_dir=DEMO_PLUGIN_DIR):
    return ["demo", *(["--plugin-dir", plugin_dir] if plugin_dir else [])]


def leftovers(pid: int) -> list[str]:
    return glob.glob(f"/run/netns/cnsk-demo-*-{pid}-*")


def test_demo_runs_the_main_job_and_cleans_up():
    proc = subprocess.Popen([CLI, *demo_args(), "--pause"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(input="\n", timeout=300)  # Enter: past --pause
    assert proc.returncode == 0, out + err
    assert "paused with both pods up" in out
    assert "Traceback" not in err
    expected_version = "1.0.0" if DEMO_PLUGIN_DIR == GO_CNI_DIR else "1.1.0"
    assert f"-> cniVersion {expected_version}" in out
    for label in ("pod-a", "pod-b"):
        assert f"{label}: after ADD, lo in the pod is UP" in out
        assert f"{label}: after DEL, lo in the pod is DOWN" in out
        assert f"{label}: ADD demo-net (eth0): ok -> 10.99.0." in out
    summary = out.split("summary:")[1]
    for step in ("ADD", "ping", "tcp", "portmap", "CHECK", "DEL"):
        assert f"  {step:<8} ok" in summary, summary
    assert "3/3 replies" in summary
    assert "pod-a echoed 'hello from node'" in summary          # through portmap
    assert "demo passed" in out
    assert leftovers(proc.pid) == []
    if DEMO_PLUGIN_DIR is None:  # ours, warm, as `cni-skel install` sets a node up
        assert "warm, as `cni-skel install` sets a node up" in out, out
        served = re.search(r"worker: (\d+) plugin calls served warm by 1 socket-activated",
                           out)
        assert served and int(served.group(1)) >= 20, out
        assert not glob.glob("/tmp/cni-skel-demo-*/run/worker.sock")


def test_demo_one_shot_runs_without_a_worker():
    proc = subprocess.run([CLI, "demo", "--one-shot"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "one-shot (a Python process per call)" in proc.stdout
    assert "served warm" not in proc.stdout and "demo passed" in proc.stdout


def _failing_plugin_dir(tmp_path, base):
    """``base``'s plugins, but a bridge whose ADD fails with code 50."""
    d = tmp_path / "plugins"
    d.mkdir()
    for name in ("host-local", "tuning", "portmap", "loopback"):
        (d / name).symlink_to(os.path.join(base, name))
    bridge = d / "bridge"
    bridge.write_text(
        "#!/bin/sh\n"
        'if [ "$CNI_COMMAND" = VERSION ]; then\n'
        '  echo \'{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}\'; exit 0; fi\n'
        'if [ "$CNI_COMMAND" = ADD ]; then\n'
        '  echo "bridge: no bridges today" >&2\n'
        '  echo \'{"code":50,"msg":"bridge unavailable","details":"maintenance"}\'; exit 1; fi\n'
        "exit 0\n")
    bridge.chmod(0o755)
    return d


def test_demo_failure_is_reported_and_cleaned_up(tmp_path, go_cni_dir):
    d = _failing_plugin_dir(tmp_path, go_cni_dir)
    proc = subprocess.Popen([CLI, "demo", "--plugin-dir", str(d)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert 'failed in plugin "bridge" (1 of 3 in the list)' in err
    assert "code 50: bridge unavailable" in err and "| bridge: no bridges today" in err
    assert "  error    FAILED  code 50" in out and "demo FAILED" in out
    assert leftovers(proc.pid) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_demo_interrupted_still_cleans_up(sig):
    # --pause holds the demo with both pods up: the signal lands mid-run
    # (the demo's remaining ~0.6 s after ADD is a race under load). SIGINT
    # as a terminal's Ctrl-C delivers it: a suite started as a background
    # job of a shell inherits SIGINT ignored, and Python keeps it ignored.
    proc = subprocess.Popen([CLI, *demo_args(), "--pause"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:
            if line.startswith("paused with both pods up"):
                break
        assert leftovers(proc.pid), "the demo's namespaces exist while it runs"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert leftovers(proc.pid) == []


def test_demo_explicit_version_must_suit_every_plugin():
    proc = subprocess.run([CLI, "demo", "--plugin-dir", GO_CNI_DIR, "--cni-version", "1.1.0"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "cniVersion 1.1.0 is not supported by every plugin" in proc.stderr
