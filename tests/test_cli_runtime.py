"""`cni-skel add|check|del|gc|status|validate` as a shell user runs them: the
cnitool environment (NETCONFPATH, CNI_PATH, CNI_IFNAME, CNI_ARGS, CAP_ARGS),
the container ID derived from the netns path, flags, exit codes and error
messages, and --help on every command. Plugins run inside a node namespace
made by the test (--plugin-netns); caches and configs live in tmp dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_runtime_ops import PORTS, records, write_fake

from cni_skel.runtime import cnitool_container_id
from cni_skel.version import ALL_VERSIONS

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")


@pytest.fixture
def setup(tmp_path, node_netns, pod_netns):
    class S:
        pass

    s = S()
    s.conf = tmp_path / "net.d"
    s.conf.mkdir()
    s.bin = tmp_path / "bin"
    for name in ("fake-a", "fake-b", "fake-c"):
        write_fake(s.bin, name)
    write_fake(s.bin, "fake-old", ALL_VERSIONS[:-1])
    s.cache = tmp_path / "cache"
    s.record = str(tmp_path / "record.jsonl")
    s.node, s.pod = node_netns, pod_netns
    s.env = {"PATH": os.environ["PATH"], "NETCONFPATH": str(s.conf), "CNI_PATH": str(s.bin),
             "CNI_SKEL_CACHE_DIR": str(s.cache)}

    def write(name="net", plugins=None, version="1.1.0", **extra):
        plugins = plugins or [{"type": "fake-a"},
                              {"type": "fake-b", "capabilities": {"portMappings": True}},
                              {"type": "fake-c"}]
        doc = {"cniVersion": version, "name": name, **extra,
               "plugins": [{"record": s.record, **p} for p in plugins]}
        path = s.conf / f"10-{name}.conflist"
        path.write_text(json.dumps(doc))
        return path

    def run(*args, env=None, node=True):
        full = {**s.env, **(env or {})}
        argv = [CLI, *args]
        if node and args and args[0] in ("add", "check", "del", "gc", "status"):
            argv[2:2] = ["--plugin-netns", s.node.path]
        proc = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120,
                              check=False)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    s.write, s.run = write, run
    s.records = lambda: records(s.record)
    return s


def test_add_check_del_with_cnitool_environment(setup):
    s = setup
    s.write()
    env = {"CNI_IFNAME": "net1", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=p1",
           "CAP_ARGS": json.dumps({"portMappings": PORTS, "bandwidth": {}})}
    proc = s.run("add", "net", s.pod.path, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["cniVersion"] == "1.1.0"
    assert [i["name"] for i in result["interfaces"]] == ["fake-a", "fake-b", "fake-c"]
    assert proc.stdout.startswith('{\n    "cniVersion"')          # indented like Go's Print
    cid = cnitool_container_id(s.pod.path)
    recs = s.records()
    assert {r["env"]["CNI_CONTAINERID"] for r in recs} == {cid}
    assert recs[0]["env"]["CNI_IFNAME"] == "net1"
    assert recs[0]["env"]["CNI_ARGS"] == "IgnoreUnknown=1;K8S_POD_NAME=p1"
    assert recs[0]["env"]["CNI_PATH"] == str(s.bin)
    assert recs[1]["conf"]["runtimeConfig"] == {"portMappings": PORTS}
    assert recs[0]["netns"] == f"net:[{os.stat(s.node.path).st_ino}]"
    cache = s.cache / "results" / f"net-{cid}-net1"
    assert json.loads(cache.read_text())["containerId"] == cid

    os.unlink(s.record)
    proc = s.run("check", "net", s.pod.path, env={"CNI_IFNAME": "net1"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert [r["cmd"] for r in s.records()] == ["CHECK"] * 3

    # DEL without CNI_ARGS/CAP_ARGS: the cached ones are used.
    os.unlink(s.record)
    proc = s.run("del", "net", s.pod.path, env={"CNI_IFNAME": "net1"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    recs = s.records()
    assert [r["plugin"] for r in recs] == ["fake-c", "fake-b", "fake-a"]
    assert recs[1]["conf"]["runtimeConfig"] == {"portMappings": PORTS}
    assert recs[0]["env"]["CNI_ARGS"] == "IgnoreUnknown=1;K8S_POD_NAME=p1"
    assert not cache.exists()
    assert s.run("del", "net", s.pod.path, env={"CNI_IFNAME": "net1"}).returncode == 0


def test_flags_override_the_environment_and_netns_names_resolve(setup):
    s = setup
    s.write()
    other = s.conf.parent / "other.d"
    other.mkdir()
    (s.conf / "10-net.conflist").rename(other / "10-net.conflist")
    proc = s.run("add", "--conf-dir", str(other), "-i", "eth7", "--args", "A=b",
                 "--cap-args", json.dumps({"portMappings": PORTS}),
                 "--container-id", "my-ctr", "net", s.pod.name,
                 env={"CNI_IFNAME": "ignored0", "CNI_ARGS": "X=y"})
    assert proc.returncode == 0, proc.stderr
    r = s.records()[1]
    assert (r["env"]["CNI_CONTAINERID"], r["env"]["CNI_IFNAME"], r["env"]["CNI_ARGS"]) == \
        ("my-ctr", "eth7", "A=b")
    assert r["env"]["CNI_NETNS"] == s.pod.path                 # a name from `ip netns`
    assert (s.cache / "results" / "net-my-ctr-eth7").exists()
    # The derived ID is the one of the absolute path, also for a name or a relative path.
    assert cnitool_container_id(s.pod.path) == cnitool_container_id(
        os.path.abspath(os.path.join("/run/netns", s.pod.name)))


def test_add_failure_says_which_plugin_and_what_to_do(setup):
    s = setup
    s.write(plugins=[{"type": "fake-a"}, {"type": "fake-b", "fake": {
        "stderr": "fake-b: cannot create veth", "ADD": {
            "code": 7, "msg": "invalid bridge", "details": "cni0 is not a bridge"}}},
        {"type": "fake-c"}])
    proc = s.run("add", "net", s.pod.path)
    assert proc.returncode == 1 and proc.stdout == ""
    err = proc.stderr
    assert 'ADD of network "net" failed in plugin "fake-b" (2 of 3 in the list)' in err
    assert "code 7: invalid bridge" in err and "details: cni0 is not a bridge" in err
    assert "| fake-b: cannot create veth" in err
    assert f"cni-skel del net {s.pod.path}" in err


@pytest.mark.parametrize("args, env, code, text", [
    (["add", "nope", "/run/netns/x"], {}, 1, 'no net configuration with name "nope"'),
    (["add", "net", "/run/netns/x"], {"CAP_ARGS": "{not json"}, 2, "CAP_ARGS"),
    (["add", "net", "/run/netns/x"], {"CAP_ARGS": "[1]"}, 2, "must be a JSON object"),
    (["add", "net", "/run/netns/x"], {"CNI_ARGS": "novalue"}, 2, "CNI_ARGS"),
    (["gc", "net", "--valid", "nocolon"], {}, 2, "CONTAINERID:IFNAME"),
    (["add", "net"], {}, 2, "Missing argument"),
])
def test_usage_and_lookup_errors(setup, args, env, code, text):
    setup.write()
    proc = setup.run(*args, env=env)
    assert proc.returncode == code, proc.stderr
    assert text in proc.stderr


def test_not_found_hints_and_lists_networks(setup):
    setup.write("alpha")
    proc = setup.run("add", "nope", setup.pod.path)
    assert "networks there: alpha" in proc.stderr and "NETCONFPATH" in proc.stderr


def test_missing_plugin_hints_cni_path(setup):
    setup.write(plugins=[{"type": "fake-a"}, {"type": "missing-plugin"}])
    proc = setup.run("add", "net", setup.pod.path)
    assert proc.returncode == 1
    assert 'plugin "missing-plugin" (2 of 2' in proc.stderr
    assert "CNI_PATH" in proc.stderr.split("hint:")[1]


def test_timeout_flag(setup):
    setup.write(plugins=[{"type": "fake-a", "fake": {"sleep": 30}}])
    proc = setup.run("add", "--timeout", "0.5", "net", setup.pod.path)
    assert proc.returncode == 1 and "code 11" in proc.stderr and "timed out" in proc.stderr


def test_check_below_040_is_refused(setup):
    setup.write(version="0.3.1")
    proc = setup.run("check", "net", setup.pod.path)
    assert proc.returncode == 1 and "code 1" in proc.stderr
    assert "does not support the CHECK command" in proc.stderr


def test_preflight_flag(setup):
    setup.write(plugins=[{"type": "fake-a"}, {"type": "fake-old"}])
    proc = setup.run("add", "--preflight", "net", setup.pod.path)
    assert proc.returncode == 1 and 'plugin "fake-old" does not support' in proc.stderr
    assert setup.records() == []


def test_gc_with_and_without_valid(setup):
    s = setup
    s.write()
    for cid in ("c1", "c2"):
        assert s.run("add", "--container-id", cid, "net", s.pod.path).returncode == 0
    os.unlink(s.record)
    proc = s.run("gc", "net", "--valid", "c1:eth0")
    assert proc.returncode == 0, proc.stderr
    assert "stale attachments deleted: c2:eth0" in proc.stderr
    gcs = [r for r in s.records() if r["cmd"] == "GC"]
    assert gcs[0]["conf"]["cni.dev/valid-attachments"] == [
        {"containerID": "c1", "ifname": "eth0"}]
    os.unlink(s.record)
    proc = s.run("gc", "--yes", "net", s.pod.path)               # cnitool form: all stale
    assert proc.returncode == 0 and "deleted: c1:eth0" in proc.stderr
    gcs = [r for r in s.records() if r["cmd"] == "GC"]
    assert gcs[0]["conf"]["cni.dev/valid-attachments"] == []
    assert list((s.cache / "results").iterdir()) == []


def test_gc_disabled(setup):
    setup.write(disableGC=True)
    proc = setup.run("gc", "net")
    assert proc.returncode == 0 and "disableGC" in proc.stderr and setup.records() == []


def test_status(setup):
    s = setup
    s.write()
    proc = s.run("status", "net")
    assert proc.returncode == 0 and "is ready" in proc.stderr
    s.write(plugins=[{"type": "fake-a", "fake": {"STATUS": {
        "code": 50, "msg": "no addresses left", "details": "10.0.0.0/30"}}}])
    proc = s.run("status", "net", s.pod.path)
    assert proc.returncode == 1
    assert 'STATUS of network "net" failed in plugin "fake-a"' in proc.stderr
    assert "code 50: no addresses left" in proc.stderr
    s.write(version="1.0.0")
    proc = s.run("status", "net")
    assert proc.returncode == 3 and "plugins were not asked" in proc.stderr


def test_validate_file_and_name(setup):
    s = setup
    path = s.write(version="0.4.0", cniVersions=["1.0.0", "1.1.0"])
    proc = s.run("validate", str(path))
    assert proc.returncode == 3, proc.stderr              # the fakes' configs: not checked
    out = proc.stdout
    assert 'network "net"' in out and "cniVersion 1.1.0" in out
    assert 'cniVersions ["1.0.0", "1.1.0"]' in out
    assert "capabilities: portMappings" in out and str(s.bin / "fake-a") in out
    assert "not fully checked" in out
    assert s.run("validate", "net").returncode == 3
    proc = s.run("validate", "--offline", "net", env={"CNI_PATH": "/nonexistent"})
    assert proc.returncode == 3 and "offline" in proc.stdout


def test_validate_reports_unusable_plugins_and_bad_files(setup):
    s = setup
    s.write(plugins=[{"type": "fake-old"}, {"type": "gone"}])
    proc = s.run("validate", "net")
    assert proc.returncode == 1
    assert 'plugin 1 "fake-old" does not support cniVersion 1.1.0' in proc.stderr
    assert 'plugin 2 "gone"' in proc.stderr and "failed to find plugin" in proc.stderr
    bad = s.conf / "20-bad.conflist"
    bad.write_text(json.dumps({"cniVersion": "1.1.0", "name": "bad name", "plugins": []}))
    proc = s.run("validate", str(bad))
    assert proc.returncode == 1 and "code 7" in proc.stderr and str(bad) in proc.stderr


COMMANDS = ["add", "check", "del", "gc", "status", "validate", "install", "uninstall", "doctor",
            "worker", "new-plugin", "demo"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_says_what_and_shows_an_example(command):
    args = [command, "--help"] if command else ["--help"]
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Example" in proc.stdout
    assert "cni-skel" in proc.stdout.split("Example")[1]
    if command is None:
        for name in COMMANDS:
            assert f"  {name} " in proc.stdout
