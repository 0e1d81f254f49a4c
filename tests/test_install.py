"""`cni-skel install`: executables named like the Go plugins that run from
any environment (absolute interpreter, isolated mode), and a VERSION path
that imports neither pydantic nor pyroute2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import click
import pytest

import cni_skel
from cni_skel import errors
from cni_skel.harness import run_plugin_raw
from cni_skel.skel import version_answer
from cni_skel.warm import install as warm_install
from cni_skel.warm import protocol
from cni_skel.warm.install import (
    InstallError,
    find_cc,
    launcher_info,
    plugin_registry,
    python_argv,
    write_executable,
)

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")


def cli(*args):
    if args[0] == "install" and "--systemd-dir" not in args:
        args = (*args, "--no-systemd")  # never this machine's /etc/systemd/system
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=False)


def test_install_writes_isolated_executables(tmp_path, node_netns, pod_netns):
    proc = cli("install", "--bin-dir", str(tmp_path), "--launcher", "python")
    assert proc.returncode == 0, proc.stderr
    assert "(python launcher, fallback oneshot)" in proc.stdout
    exe = tmp_path / "loopback"
    assert os.access(exe, os.X_OK)
    lines = exe.read_text().splitlines()
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    # sh first (a missing interpreter still gets a spec Error), then -IS:
    # isolated, and no site (the launcher needs only the stdlib; its
    # one-shot fallback loads site itself).
    assert lines[0] == "#!/bin/sh", lines[0]
    assert f"exec {venv_bin}/python -IS \"$0\"" in lines[3], lines[3]
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
    exe = write_executable(str(tmp_path), "loopback", "cni_skel_plugins.loopback:Loopback",
                           python=str(py), launcher="python")
    with open(exe) as fp:
        assert fp.readline() == "#!/bin/sh\n"
    run = run_plugin_raw(exe, "VERSION", b'{"cniVersion": "1.0.0"}', replace_env=True,
                         env={"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]})
    # The symlinked interpreter is not in the venv, so it may lack pydantic;
    # VERSION needs only the stdlib and cni_skel.
    assert run.exit_code == 0 or "No module named 'cni_skel'" in run.stderr


def test_version_path_stays_light(loopback):
    """podman runs VERSION before every command: no pydantic, no pyroute2,
    not even the plugin's module (its supported versions are baked in)."""
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "VERSION"}
    proc = subprocess.run(python_argv(loopback, ("-X", "importtime")),
                          input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    heavy = {m for m in imported if m.split(".")[0] in ("pydantic", "pyroute2", "pydantic_core")
             or m.startswith(("cni_skel_plugins", "cni_skel.skel"))}
    assert not heavy, heavy
    assert json.loads(proc.stdout)["cniVersion"] == "1.0.0"


def test_about_text_without_a_command(loopback):
    """No CNI_COMMAND: a human asking; the plugin's about text on stderr."""
    proc = subprocess.run([loopback], input=b"", env={"PATH": os.environ["PATH"]},
                          capture_output=True, check=False)
    assert proc.returncode == 0 and proc.stdout == b"", proc
    assert b"CNI protocol versions supported: 0.1.0" in proc.stderr, proc.stderr
    assert f"CNI loopback plugin (cni-skel {cni_skel.__version__})".encode() in proc.stderr


PLUGIN_THAT_SAYS_WHEN_IMPORTED = """
import os

if os.environ.get("IMPORT_LOG"):
    with open(os.environ["IMPORT_LOG"], "a") as fp:
        fp.write("imported\\n")

from cni_skel.skel import Plugin


class Told(Plugin):
    name = "told"
    supported_versions = ("0.4.0", "1.0.0", "1.1.0")
"""


@pytest.mark.parametrize("kind", ["script", "python", "native"])
def test_version_is_answered_without_importing_the_plugin(tmp_path, kind):
    """Every kind of executable answers VERSION from the versions baked in
    at install, with the skel's bytes; any other verb imports the plugin."""
    if kind == "native" and find_cc() is None:
        pytest.skip("no C compiler")
    (tmp_path / "told_plugin.py").write_text(PLUGIN_THAT_SAYS_WHEN_IMPORTED)
    exe = write_executable(str(tmp_path / "bin"), "told", "told_plugin:Told",
                           pythonpath=[str(tmp_path)], launcher="python" if kind == "script"
                           else kind,
                           worker_socket=None if kind == "script" else str(tmp_path / "no.sock"))
    assert (launcher_info(exe) or {"kind": "script"})["kind"] == kind
    log = tmp_path / "imports.log"
    env = {"PATH": os.environ["PATH"], "IMPORT_LOG": str(log)}
    sys.path.insert(0, str(tmp_path))
    try:
        from told_plugin import Told  # noqa: PLC0415 (written by the test, on sys.path only here)
    finally:
        sys.path.remove(str(tmp_path))
    log.unlink(missing_ok=True)
    for stdin in (b'{"cniVersion": "1.0.0"}', b"", b"  ", b'{"cniVersion": "0.4.0\\n"}',
                  b'{"cniVersion": "1.0"}', b"not json", b'{"cniVersion": "\\u0031.1.0"}',
                  b"[1, 2]", b'{"cniVersion": 1}'):
        run = run_plugin_raw(exe, "VERSION", stdin, replace_env=True,
                             env={**env, "CNI_COMMAND": "VERSION"})
        assert run.exit_code == 0, run
        assert run.stdout == version_answer(Told, stdin), (stdin, run.stdout)
    assert not log.exists(), "VERSION imported the plugin's module"
    run = run_plugin_raw(exe, "STATUS", b'{"cniVersion": "1.1.0", "name": "n", "type": "told"}',
                         replace_env=True, env={**env, "CNI_COMMAND": "STATUS"})
    assert run.exit_code == 0, run
    assert log.read_text() == "imported\n", "STATUS runs the plugin"


def test_native_launcher_is_the_default_with_a_compiler(tmp_path, node_netns, pod_netns):
    """auto = native when cc works: an ELF file that names its plugin and
    socket, run with the same hostile environment as the Python launcher."""
    sock = str(tmp_path / "nobody.sock")
    proc = cli("install", "--bin-dir", str(tmp_path / "bin"), "--worker-socket", sock)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(native launcher, fallback oneshot)") == len(plugin_registry()), \
        proc.stdout
    exe = tmp_path / "bin" / "loopback"
    assert exe.read_bytes()[:4] == b"\x7fELF"
    info = launcher_info(str(exe))
    assert os.path.realpath(info.pop("python")) == os.path.realpath(sys.executable)
    assert info == {"kind": "native", "socket": sock, "pythonpath": "",
                    "ref": "cni_skel_plugins.loopback:Loopback", "fallback": "oneshot",
                    "protocol": str(protocol.PROTOCOL_VERSION), "version": cni_skel.__version__}
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
        return subprocess.run([CLI, "install", "--no-systemd", "--bin-dir", str(tmp_path), *args,
                               "loopback"],
                              capture_output=True, text=True, env=env, check=False)

    auto = install()
    assert auto.returncode == 0 and "(python launcher" in auto.stdout, auto
    native = install("--launcher", "native")
    assert native.returncode != 0 and "needs a C compiler" in native.stderr, native
    assert launcher_info(str(tmp_path / "loopback"))["kind"] == "python", "left as it was"
    shot = install("--one-shot")
    assert shot.returncode == 0 and "(one-shot)" in shot.stdout, shot


def test_install_errors_are_not_click_exceptions(tmp_path):
    """`cni_skel.warm.install` does not depend on click: its refusals are
    InstallError, with the message the CLI shows."""
    (tmp_path / "loopback").write_bytes(b"\x7fELF a Go binary")
    with pytest.raises(InstallError, match="--force") as caught:
        write_executable(str(tmp_path), "loopback", "cni_skel_plugins.loopback:Loopback")
    assert not isinstance(caught.value, click.ClickException)
    with pytest.raises(InstallError, match="unknown launcher kind"):
        write_executable(str(tmp_path), "x", "m:C", launcher="rust")
    with pytest.raises(InstallError, match="newline"):
        write_executable(str(tmp_path), "x", "m:C", worker_socket="/run/a\nb", launcher="python")


def _code_of(c_source: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", c_source, flags=re.S)


def test_the_native_launcher_takes_the_protocol_from_protocol_py(tmp_path):
    """launcher_protocol.h, generated from `cni_skel.warm.protocol`, holds
    the same values (compiled and printed), and launcher.c writes none of
    them itself."""
    cc = warm_install.find_cc()
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "launcher_protocol.h").write_text(warm_install.protocol_header())
    (tmp_path / "dump.c").write_text(r"""
#include <stdio.h>
#include "launcher_protocol.h"
static const char *names[] = CSK_STATUS_NAMES;
int main(void) {
    printf("%s\n%s\n%s\n%s\n%s\n", CSK_REQUEST_MAGIC, CSK_REPLY_MAGIC, CSK_KIND_RUN,
           CSK_SOCKET_ENV, CSK_REQUIRED_ENV);
    printf("%s\n%s\n%s\n", CSK_HANDOVER_LAUNCH, CSK_HANDOVER_NOT_SERVED, CSK_FALLBACK_LOG);
    printf("%d %d %d %d %d %d %d\n", CSK_ST_VERSION, CSK_PROTOCOL_VERSION, CSK_ERR_IO,
           CSK_ERR_TRY_AGAIN_LATER, CSK_ERR_NOT_AVAILABLE, CSK_FALLBACK_LOG_MAX,
           (int)sizeof CSK_REQUEST_MAGIC - 1);
    printf("%d %d %d %d %d %d %d %d %u %d\n", CSK_MAGIC_LEN, CSK_REQUEST_HEADER, CSK_ST_DONE,
           CSK_STATUS_COUNT, CSK_REPLY_STATUS_AT, CSK_REPLY_CODE_AT, CSK_REPLY_LENGTH_AT,
           CSK_REPLY_HEADER, CSK_MAX_STDIN, CSK_REPLY_TIMEOUT);
    for (int i = 0; i < CSK_STATUS_COUNT; i++) printf("%s\n", names[i]);
    return 0;
}
""")
    exe = tmp_path / "dump"
    subprocess.run([cc, "-o", str(exe), str(tmp_path / "dump.c")], check=True)
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    p = protocol
    want = [p.REQUEST_MAGIC.decode(), p.REPLY_MAGIC.decode(), p.KIND_RUN.decode(), p.SOCKET_ENV,
            p.REQUIRED_ENV, p.HANDOVER_LAUNCH, p.HANDOVER_NOT_SERVED, p.FALLBACK_LOG,
            " ".join(str(v) for v in (p.ST_VERSION, p.PROTOCOL_VERSION, p.ERR_IO,
                                      p.ERR_TRY_AGAIN_LATER, p.ERR_NOT_AVAILABLE,
                                      p.FALLBACK_LOG_MAX, len(p.REQUEST_MAGIC))),
            " ".join(str(v) for v in (
                len(p.REQUEST_MAGIC), p.REQUEST_HEADER, p.ST_DONE, len(p.STATUS_NAMES),
                p.REPLY_STATUS_AT, p.REPLY_CODE_AT, p.REPLY_LENGTH_AT, p.REPLY_HEADER,
                p.MAX_STDIN_BYTES, p.REPLY_TIMEOUT)),
            *p.STATUS_NAMES]
    assert got.splitlines() == want

    with open(os.path.join(os.path.dirname(warm_install.__file__), "launcher.c")) as fp:
        code = _code_of(fp.read())
    strings = [p.REQUEST_MAGIC.decode(), p.REPLY_MAGIC.decode(), p.KIND_RUN.decode(),
               p.SOCKET_ENV, p.REQUIRED_ENV, p.HANDOVER_LAUNCH, p.HANDOVER_NOT_SERVED,
               p.FALLBACK_LOG, *p.STATUS_NAMES]
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', code)
    # (a word as short as "run" counts only as a whole literal: "cannot run %s" is prose)
    copied = [s for s in strings if s in literals or (len(s) > 3 and any(
        re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", lit) for lit in literals))]
    numbers = [p.MAX_STDIN_BYTES, p.MAX_REQUEST_BYTES, p.REPLY_TIMEOUT, p.REPLY_HEADER,
               p.FALLBACK_LOG_MAX, p.ERR_NOT_AVAILABLE]
    copied += [n for n in numbers if re.search(rf"\b{n}\b", code)]
    assert not copied, f"launcher.c has its own copy of {copied}"


@pytest.mark.parametrize("kind", ["python", "native"])
def test_launcher_info_reads_the_trailer_and_caches_by_inode_and_mtime(tmp_path, monkeypatch,
                                                                        kind):
    if kind == "native" and warm_install.find_cc() is None:
        pytest.skip("no C compiler")
    exe = warm_install.write_executable(str(tmp_path), "loopback",
                                        "cni_skel_plugins.loopback:Loopback",
                                        worker_socket=str(tmp_path / "w.sock"), launcher=kind)
    with open(exe, "rb") as fp:
        tail = fp.read()[-warm_install.TRAILER_SIZE:]
    assert re.fullmatch(rb"# CNI-SKEL-LAUNCHER \d{8}\n", tail), tail
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **kw: (opened.append(path),
                                                            real_open(path, *a, **kw))[1])
    info = warm_install.launcher_info(exe)
    assert info is not None and info["kind"] == kind and info["socket"] == str(tmp_path / "w.sock")
    assert opened == [exe]
    info["ref"] = "changed by the caller"
    assert warm_install.launcher_info(exe)["ref"] == "cni_skel_plugins.loopback:Loopback"
    assert opened == [exe], "a second look is one stat"
    with open(exe, "ab") as fp:
        fp.write(b"\n")  # no longer ends with the trailer
    assert warm_install.launcher_info(exe) is None and opened == [exe, exe]
    script = warm_install.write_executable(str(tmp_path), "one",
                                           "cni_skel_plugins.loopback:Loopback",
                                           worker_socket=None)
    assert warm_install.launcher_info(script) is None
    go = "/usr/lib/cni/loopback"
    if os.path.exists(go):
        assert warm_install.launcher_info(go) is None
        del opened[:]
        assert warm_install.launcher_info(go) is None and opened == [], "a Go binary: cached too"


def test_protocol_values_agree_with_the_rest_of_the_sdk():
    assert protocol.ERR_TRY_AGAIN_LATER == errors.ERR_TRY_AGAIN_LATER
    assert protocol.ERR_IO == errors.ERR_IO_FAILURE
    assert protocol.ERR_NOT_AVAILABLE == errors.ERR_PLUGIN_NOT_AVAILABLE
    assert warm_install.DEFAULT_WORKER_SOCKET == protocol.DEFAULT_SOCKET
    assert protocol.decode_reply_header(protocol.encode_reply(protocol.ST_REFUSED, 7, b"xy")) \
        == (protocol.ST_REFUSED, 7, 2)
    frame = protocol.encode_request([b"a", b"", b"bc"])
    assert protocol.request_header(frame[:protocol.REQUEST_HEADER]) \
        == (protocol.PROTOCOL_VERSION, len(frame) - protocol.REQUEST_HEADER)
    old = protocol.encode_request([b"a"], version=1)
    assert old[:4] == b"CSKQ" and protocol.request_header(old[:8]) == (1, len(old) - 8)
    assert protocol.request_header(protocol.encode_request([b"a"], version=3)[:8])[0] == 3
    assert protocol.decode_fields(frame[protocol.REQUEST_HEADER:]) == [b"a", b"", b"bc"]
