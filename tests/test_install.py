"""`cni-skel install`: executables named like the Go plugins that run from
any environment (absolute interpreter, isolated mode), and a VERSION path
that imports neither pydantic nor pyroute2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cni_skel.harness import run_plugin_raw
from cni_skel.warm.install import launcher_info, python_argv

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=False)


def test_install_writes_isolated_executables(tmp_path, node_netns, pod_netns):
    proc = cli("install", "--bin-dir", str(tmp_path), "--launcher", "python")
    assert proc.returncode == 0, proc.stderr
    assert "(python launcher)" in proc.stdout
    exe = tmp_path / "loopback"
    assert os.access(exe, os.X_OK)
    first = exe.read_text().splitlines()[0]
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    # -IS: isolated, and no site (the launcher needs only the stdlib; its
    # one-shot fallback loads site itself).
    assert first.startswith(f"#!{venv_bin}/python") and first.endswith(" -IS"), first
    # A runtime's environment must not change what the plugin imports: no
    # venv on PATH, a poisoned PYTHONPATH/PYTHONHOME, another cwd.
    hostile = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(tmp_path / "evil"),
               "PYTHONHOME": "/nonexistent", "PYTHONSTARTUP": "/nonexistent",
               "PYTHONWARNINGS": "error"}
    evil = tmp_path / "evil" / "cni_skel"
    evil.mkdir(parents=True)
    (evil / "__init__.py").write_text("raise SystemExit('imported the wrong cni_skel')\n")
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "loopback"}
    run = run_plugin_raw(str(exe), "ADD", conf, netns=pod_netns.path, ifname="lo",
                         env=hostile, node=node_netns)
    assert run.exit_code == 0, run
    assert run.doc["interfaces"][0]["name"] == "lo"


def test_install_names_and_refusals(tmp_path):
    assert cli("install", "--bin-dir", str(tmp_path), "loopback").returncode == 0
    again = cli("install", "--bin-dir", str(tmp_path), "loopback")
    assert again.returncode == 0, "replacing our own script is fine"
    unknown = cli("install", "--bin-dir", str(tmp_path), "no-such-plugin")
    assert unknown.returncode != 0 and "available:" in unknown.stderr
    assert "loopback" in unknown.stderr.split("available:")[1]
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "loopback").write_bytes(b"\x7fELF a Go binary")
    refused = cli("install", "--bin-dir", str(foreign), "loopback")
    assert refused.returncode != 0 and "--force" in refused.stderr
    assert (foreign / "loopback").read_bytes() == b"\x7fELF a Go binary"
    assert cli("install", "--bin-dir", str(foreign), "--force", "loopback").returncode == 0
    assert b"cni-skel install" in (foreign / "loopback").read_bytes()


def test_no_console_script_named_like_a_plugin():
    bindir = os.path.dirname(sys.executable)
    for name in ("bridge", "host-local", "loopback", "portmap", "tuning"):
        assert not os.path.exists(os.path.join(bindir, name)), name


def test_interpreter_path_with_spaces_goes_through_sh(tmp_path):
    odd = tmp_path / "dir with space"
    odd.mkdir()
    py = odd / "python"
    py.symlink_to(sys.executable)
    from cni_skel.cli import write_executable

    exe = write_executable(str(tmp_path), "loopback", "cni_skel_plugins.loopback:Loopback",
                           python=str(py), launcher="python")
    with open(exe) as fp:
        assert fp.readline() == "#!/bin/sh\n"
    run = run_plugin_raw(exe, "VERSION", b'{"cniVersion": "1.0.0"}', replace_env=True,
                         env={"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]})
    # The symlinked interpreter is not in the venv, so it may lack pydantic;
    # VERSION needs only the stdlib and cni_skel.
    assert run.exit_code == 0 or "No module named 'cni_skel'" in run.stderr


@pytest.mark.parametrize("command", ["VERSION", ""])
def test_version_path_stays_light(loopback, command):
    """podman runs VERSION before every command: no pydantic, no pyroute2."""
    env = {"PATH": os.environ["PATH"]}
    if command:
        env["CNI_COMMAND"] = command
    proc = subprocess.run(python_argv(loopback, ("-X", "importtime")),
                          input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True,
                          check=False)
    assert proc.returncode == 0
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    heavy = {m for m in imported if m.split(".")[0] in ("pydantic", "pyroute2", "pydantic_core")}
    assert not heavy, heavy
    if command:
        assert json.loads(proc.stdout)["cniVersion"] == "1.0.0"


def test_native_launcher_is_the_default_with_a_compiler(tmp_path, node_netns, pod_netns):
    """auto = native when cc works: an ELF file that names its plugin and
    socket, run with the same hostile environment as the Python launcher."""
    sock = str(tmp_path / "nobody.sock")
    proc = cli("install", "--bin-dir", str(tmp_path / "bin"), "--worker-socket", sock)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(native launcher)") == 5, proc.stdout
    exe = tmp_path / "bin" / "loopback"
    assert exe.read_bytes()[:4] == b"\x7fELF"
    info = launcher_info(str(exe))
    assert os.path.realpath(info.pop("python")) == os.path.realpath(sys.executable)
    assert info == {"kind": "native", "socket": sock, "pythonpath": "",
                    "ref": "cni_skel_plugins.loopback:Loopback"}
    hostile = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(tmp_path / "evil"),
               "PYTHONHOME": "/nonexistent", "PYTHONWARNINGS": "error"}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "loopback"}
    run = run_plugin_raw(str(exe), "ADD", conf, netns=pod_netns.path, ifname="lo",
                         env=hostile, node=node_netns)  # no worker: one-shot through Python
    assert run.exit_code == 0, run
    version = run_plugin_raw(str(exe), "VERSION", b'{"cniVersion": "0.4.0"}', env=hostile)
    assert version.exit_code == 0 and version.doc["cniVersion"] == "0.4.0", version
    # Ours: replaced without --force; the Go plugin is not taken for a launcher.
    assert cli("install", "--bin-dir", str(tmp_path / "bin"), "loopback").returncode == 0
    assert launcher_info("/usr/lib/cni/loopback") is None
    assert launcher_info(str(tmp_path / "nothing")) is None


def test_launcher_kind_without_a_compiler(tmp_path):
    env = {**os.environ, "CC": "/nonexistent/cc"}

    def install(*args):
        return subprocess.run([CLI, "install", "--bin-dir", str(tmp_path), *args, "loopback"],
                              capture_output=True, text=True, env=env, check=False)

    auto = install()
    assert auto.returncode == 0 and "(python launcher)" in auto.stdout, auto
    native = install("--launcher", "native")
    assert native.returncode != 0 and "needs a C compiler" in native.stderr, native
    assert launcher_info(str(tmp_path / "loopback"))["kind"] == "python", "left as it was"
    shot = install("--one-shot")
    assert shot.returncode == 0 and "(one-shot)" in shot.stdout, shot
