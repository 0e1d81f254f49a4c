"""The host install (issue 19): `cni-skel install` writes launchers and
socket-activated systemd units, `systemd-analyze verify` accepts the units,
the worker takes its socket from systemd, serves the first call, exits when
idle and is started again by the next call; `cni-skel uninstall` removes
what is ours and says what state stays.

systemd is not PID 1 here (../shared/CONTAINERS-HERE.md): the units are run
the way systemd runs them (`cni_skel.harness.SocketActivation`: the unit's
own ExecStart through Debian's systemd-socket-activate). Units and launchers
go to temporary directories, never /etc/systemd/system or /opt/cni/bin. The
rest of the warm suite runs on a socket-activated worker too
(``conftest.cni_worker``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from cni_skel.harness import SocketActivation, run_plugin, run_plugin_raw, unit_values
from cni_skel.warm import client as launcher
from cni_skel.warm import protocol
from cni_skel.warm.install import SERVICE_UNIT, SOCKET_UNIT, launcher_info

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")


@pytest.fixture
def host(tmp_path):
    """A throw-away stand-in for the host's paths: bin dir, unit dir, socket
    (short: sun_path holds 108 bytes)."""
    run = tempfile.mkdtemp(prefix="cnsk-sd-")
    yield {"bin": str(tmp_path / "bin"), "units": str(tmp_path / "units"),
           "sock": os.path.join(run, "cni-skel", "worker.sock"), "tmp": tmp_path}
    shutil.rmtree(run, ignore_errors=True)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=False)


def install(host: dict, *args: str) -> subprocess.CompletedProcess:
    proc = cli("install", "--bin-dir", host["bin"], "--systemd-dir", host["units"],
               "--worker-socket", host["sock"], *args)
    assert proc.returncode == 0, proc.stderr
    return proc


def lo_conf() -> dict:
    return {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback"}


def test_install_writes_units_systemd_verifies(host):
    proc = install(host, "--idle-exit", "30")
    units = {SOCKET_UNIT, SERVICE_UNIT}
    assert set(os.listdir(host["units"])) == units
    for name in units:
        assert f"installed {os.path.join(host['units'], name)}" in proc.stdout
    # Not a directory systemd reads (nor is systemd PID 1 here): the command is printed.
    assert "systemctl enable --now cni-skel-worker.socket" in proc.stdout, proc.stdout
    verify = subprocess.run(["systemd-analyze", "verify",
                             *(os.path.join(host["units"], u) for u in sorted(units))],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stderr
    socket_unit = os.path.join(host["units"], SOCKET_UNIT)
    service = os.path.join(host["units"], SERVICE_UNIT)
    assert unit_values(socket_unit, "ListenStream") == [host["sock"]]
    assert unit_values(socket_unit, "SocketMode") == ["0600"]
    (exec_start,) = unit_values(service, "ExecStart")
    assert exec_start.split() == [sys.executable, "-m", "cni_skel.cli", "worker", "--socket",
                                  host["sock"], "--idle-exit", "30"]
    caps = unit_values(service, "CapabilityBoundingSet")[0].split()
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN"} <= set(caps) and "CAP_SYS_MODULE" not in caps
    assert unit_values(service, "NoNewPrivileges") == ["yes"]
    # The launchers point at the unit's socket, with the one-shot fallback.
    info = launcher_info(os.path.join(host["bin"], "bridge"))
    assert info["socket"] == host["sock"] and info["fallback"] == "oneshot"
    # Someone else's unit of that name is not replaced without --force.
    with open(service, "w") as fp:
        fp.write("[Service]\nExecStart=/bin/true\n")
    again = cli("install", "--bin-dir", host["bin"], "--systemd-dir", host["units"],
                "--worker-socket", host["sock"])
    assert again.returncode != 0 and "--force" in again.stderr, again
    with open(service) as fp:
        assert "cni-skel" not in fp.read()


def test_socket_activation_first_call_idle_exit_next_call(host, node_netns, pod_netns):
    install(host, "--idle-exit", "2", "--fallback", "none", "loopback")
    log = str(host["tmp"] / "worker.log")
    activation = SocketActivation(host["units"], log)
    try:
        exe = os.path.join(host["bin"], "loopback")
        kw = dict(netns=pod_netns.path, ifname="lo", node=node_netns)
        assert activation.proc.poll() is None and "listening" not in activation.log(), \
            "nothing starts before the first call"
        # First call: systemd-socket-activate starts the worker on it.
        started = time.monotonic()
        first = run_plugin(exe, "ADD", lo_conf(), container_id="sa-1", **kw)
        first_call = time.monotonic() - started
        assert first["interfaces"][0]["name"] == "lo"
        worker = activation.proc
        assert "(systemd socket)" in activation.log(), activation.log()
        assert " cid=sa-1 " in activation.log()
        # Idle for 2 s: it exits 0; the socket stays (systemd keeps it).
        assert worker.wait(30) == 0, activation.log()
        assert "idle for 2 s: exiting" in activation.log()
        assert os.path.exists(host["sock"])
        # The next call starts a new worker on the same socket.
        run_plugin(exe, "DEL", lo_conf(), container_id="sa-1", **kw)
        assert len(activation.procs) >= 2 and activation.proc.pid != worker.pid
        assert activation.log().count("(systemd socket)") == 2, activation.log()
        ok, about = launcher.ping(host["sock"])
        assert ok and json.loads(about)["systemdSocket"] is True
        print(f"\nfirst call after socket activation: {first_call * 1e3:.0f} ms")
    finally:
        status = activation.stop()
    assert status in (0, None), activation.log()


def test_uninstall_removes_ours_and_says_what_stays(host, node_netns):
    install(host)
    foreign = os.path.join(host["bin"], "vlan")
    with open(foreign, "wb") as fp:
        fp.write(b"\x7fELF a Go plugin")
    # In the node namespace: the nftables tables it reports are that namespace's.
    uninstall = ["ip", "netns", "exec", node_netns.name, CLI, "uninstall", "--bin-dir",
                 host["bin"], "--systemd-dir", host["units"]]
    subprocess.run(["ip", "netns", "exec", node_netns.name, "nft", "add", "table", "inet",
                    "cni_portmap"], check=True)
    proc = subprocess.run(uninstall, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for name in ("bridge", "host-local", "loopback", "portmap", "tuning"):
        assert f"removed {os.path.join(host['bin'], name)}" in proc.stdout
    assert sorted(os.listdir(host["bin"])) == ["vlan"], "another program's file stays"
    assert os.listdir(host["units"]) == []
    assert "state left on this node" in proc.stdout, proc.stdout
    assert "  portmap: nftables table inet cni_portmap" in proc.stdout, proc.stdout
    again = subprocess.run(uninstall, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and "removed /" not in again.stdout, again


def test_no_worker_and_fallback_oneshot_still_serves(host, node_netns, pod_netns):
    """Socket unit not started (systemctl stopped it): launchers installed
    with the default fallback run the plugin themselves and say so."""
    install(host, "loopback")
    run = run_plugin_raw(os.path.join(host["bin"], "loopback"), "ADD", lo_conf(),
                         container_id="sa-off", netns=pod_netns.path, ifname="lo",
                         node=node_netns, env={protocol.REQUIRED_ENV: ""})
    assert run.exit_code == 0, run
    assert host["sock"] in run.stderr and "running it one-shot" in run.stderr
