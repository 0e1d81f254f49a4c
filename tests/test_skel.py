"""The skel's contract, through real executables: config parsing and errors,
version rules per verb, stdout discipline, crash handling, stdin failures."""

from __future__ import annotations

import io
import json
import os
import subprocess

import pytest
from conftest import THIRDPARTY
from thirdparty.probe import Probe

from cni_skel.harness import install_plugin, run_plugin_raw


@pytest.fixture(scope="module")
def probe(tmp_path_factory, cni_worker_socket):
    # A launcher for this run's mode (tests/conftest.py): the contract holds in both.
    d = tmp_path_factory.mktemp("probe-bin")
    return install_plugin(d, "probe", "thirdparty.probe:Probe", pythonpath=[str(THIRDPARTY.parent)],
                          worker_socket=cni_worker_socket)


def add(probe, conf, **kw):
    # These cases never touch a namespace: the probe does no networking.
    return run_plugin_raw(probe, kw.pop("command", "ADD"), conf,
                          netns=kw.pop("netns", "/run/netns/cnsk-unused"), **kw)


def seen(run) -> dict:
    assert run.exit_code == 0, run
    return json.loads(run.doc["dns"]["options"][0])


def test_keys_match_case_insensitively_as_containerd_sends_them(probe):
    # containerd 1.6 really sends capitalised portMappings keys (runtime-captures.md).
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "probe", "MTU": 1400,
            "runtimeConfig": {"portMappings": [{"HostPort": 8080, "ContainerPort": 80,
                                                "Protocol": "tcp", "HostIP": ""}]}}
    got = seen(add(probe, conf))
    assert got["mtu"] == 1400
    assert got["runtimeConfig"]["portMappings"] == [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}]


def test_unknown_keys_are_kept_and_ignored(probe):
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "probe", "keyA": ["some", "more"],
            "ipam": {"type": "x", "subnet": "10.1.0.0/16"}}
    got = seen(add(probe, conf))
    assert got["keyA"] == ["some", "more"]
    assert got["ipam"] == {"type": "x", "subnet": "10.1.0.0/16"}


@pytest.mark.parametrize("bad,path,value", [
    ({"mtu": 20}, "mtu", "20"),
    ({"mtu": "big"}, "mtu", "'big'"),
    ({"runtimeConfig": {"portMappings": [{"hostPort": 0, "containerPort": 80}]}},
     "runtimeConfig.portMappings.0.hostPort", "0"),
    ({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 80,
                                          "protocol": "icmp"}]}},
     "runtimeConfig.portMappings.0.protocol", "'icmp'"),
    ({"capabilities": {"portMappings": "yes please"}}, "capabilities.portMappings",
     "'yes please'"),
])
def test_invalid_config_is_code_7_naming_key_and_value(probe, bad, path, value):
    run = add(probe, {"cniVersion": "1.0.0", "name": "n", "type": "probe", **bad})
    assert run.exit_code == 1 and run.doc["code"] == 7, run.doc
    assert path in run.doc["msg"] and value in run.doc["msg"], run.doc


def test_unsupported_field_is_code_2(probe):
    run = add(probe, {"cniVersion": "1.0.0", "name": "n", "type": "probe",
                      "backend": "iptables"})
    assert run.doc["code"] == 2
    assert "backend" in run.doc["msg"] and "iptables" in run.doc["msg"]


def test_missing_required_key_names_it(tmp_path):
    # fake-ipam requires ipam.logFile
    exe = install_plugin(tmp_path, "fake-ipam", "thirdparty.fakeipam:FakeIPAMPlugin",
                         pythonpath=[str(THIRDPARTY.parent)])
    run = add(exe, {"cniVersion": "1.0.0", "name": "n", "type": "fake-ipam",
                    "ipam": {"type": "fake-ipam"}})
    assert run.doc["code"] == 7 and "ipam.logFile" in run.doc["msg"]


@pytest.mark.parametrize("stdin,code", [
    ("[1, 2]", 6), ('{"name": 5}', 6), ('{"name": "n", "cniVersion": 1}', 6),
    ('{"name": "n", "cniVersion": "one"}', 1), ("", 6), ("\xff", 6),
])
def test_stdin_decoding_errors(probe, stdin, code):
    run = add(probe, stdin.encode("latin-1"))
    assert run.exit_code == 1 and run.doc["code"] == code, run.doc


@pytest.mark.parametrize("verb,version,ok", [
    ("CHECK", "0.3.1", False), ("CHECK", "0.4.0", True),
    ("STATUS", "1.0.0", False), ("STATUS", "1.1.0", True),
    ("GC", "1.0.0", False), ("GC", "1.1.0", True),
])
def test_version_floor_per_verb(probe, verb, version, ok):
    conf = {"cniVersion": version, "name": "n", "type": "probe"}
    run = add(probe, conf, command=verb, env={"CNI_PATH": "/nonexistent"})
    if ok:
        assert run.exit_code == 0 and run.stdout == b""
    else:
        assert run.doc == {"cniVersion": version, "code": 1,
                           "msg": f"config version does not allow {verb}"}


def test_gc_requires_cni_path_status_does_not(probe):
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "probe"}
    env = {"PATH": os.environ["PATH"]}
    run = run_plugin_raw(probe, "", conf, env={**env, "CNI_COMMAND": "GC"}, replace_env=True)
    assert run.doc["code"] == 4 and run.doc["msg"] == "required env variables [CNI_PATH] missing"
    run = run_plugin_raw(probe, "", conf, env={**env, "CNI_COMMAND": "STATUS"},
                         replace_env=True)
    assert run.exit_code == 0 and run.stdout == b""


def test_del_needs_no_netns(probe):
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "probe"}
    run = add(probe, conf, command="DEL", netns="")
    assert run.exit_code == 0 and run.stdout == b""


def test_stdout_holds_only_the_result(probe):
    run = add(probe, {"cniVersion": "1.0.0", "name": "n", "type": "probe",
                      "mode": "print-stdout"})
    assert run.exit_code == 0 and run.doc["ips"] == [{"address": "10.0.0.9/24"}]
    assert "chatty plugin output" in run.stderr
    assert "child process output" in run.stderr


def test_a_bug_is_code_999_with_the_traceback_on_stderr(probe):
    run = add(probe, {"cniVersion": "1.0.0", "name": "n", "type": "probe", "mode": "crash"})
    assert run.exit_code == 1 and run.doc["code"] == 999
    assert run.doc["msg"] == "'no such key'"
    assert "Traceback (most recent call last)" in run.stderr
    assert b"Traceback" not in run.stdout


def test_stdin_read_failure_is_code_5(probe):
    env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c",
           "CNI_NETNS": "/x", "CNI_IFNAME": "eth0"}
    fd = os.open(os.devnull, os.O_WRONLY)  # read(2) on a write-only fd: EBADF
    try:
        proc = subprocess.run([probe], stdin=fd, env=env, capture_output=True, check=False)
    finally:
        os.close(fd)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["code"] == 5
    assert doc["msg"].startswith("error reading from stdin")


def test_prev_result_of_an_older_version_is_converted(probe):
    prev = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.7/24", "gateway": "10.0.0.1",
                                            "routes": [{"dst": "0.0.0.0/0"}]}}
    run = add(probe, {"cniVersion": "1.1.0", "name": "n", "type": "probe", "prevResult": prev})
    assert run.doc == {"cniVersion": "1.1.0",
                       "ips": [{"address": "10.0.0.7/24", "gateway": "10.0.0.1"}],
                       "routes": [{"dst": "0.0.0.0/0"}]}


def test_bad_prev_result_is_an_error(probe):
    run = add(probe, {"cniVersion": "1.0.0", "name": "n", "type": "probe",
                      "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "nope"}]}})
    assert run.exit_code == 1 and run.doc["code"] == 6 and "prevResult" in run.doc["msg"]


@pytest.mark.parametrize("where", ["top", "args", "prevResult"])
def test_deeply_nested_config_is_a_decoding_error(probe, where):
    """Found by the fuzz suite: nesting past Python's recursion limit is
    code 6 like any undecodable config, not 999 with a traceback."""
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    body = {"top": deep,
            "args": '{"cniVersion": "1.0.0", "name": "n", "type": "probe", "args": ' + deep + "}",
            "prevResult": '{"cniVersion": "1.0.0", "name": "n", "type": "probe", '
                          '"prevResult": ' + deep + "}"}[where]
    for command in ("ADD", "DEL"):
        run = add(probe, body.encode(), command=command)
        assert run.exit_code == 1 and run.doc["code"] == 6, (command, run)
        assert "Traceback" not in run.stderr


def test_dispatch_is_stateless_and_in_process():
    """The same dispatch a worker would call, many times in one process."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/nope",
           "CNI_IFNAME": "eth0"}
    conf = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "probe"}).encode()
    outs = {Probe.dispatch(env, conf, io.StringIO()) for _ in range(3)}
    assert len(outs) == 1
    out, code = outs.pop()
    assert code == 0 and json.loads(out)["ips"][0]["address"] == "10.0.0.9/24"
    out, code = Probe.dispatch({**env, "CNI_COMMAND": "VERSION"}, b"", io.StringIO())
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"
