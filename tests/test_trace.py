"""CNI_SKEL_TRACE: one JSON line per call, written by the real executables
(in both modes: the worker's children trace as the one-shot process does)."""

from __future__ import annotations

import json
import os
import stat

from cni_skel.harness import run_plugin_raw


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_each_call_is_traced(loopback, node_netns, pod_netns, tmp_path):
    trace = tmp_path / "trace.jsonl"
    conf = {"cniVersion": "0.3.1", "name": "lo-net", "type": "loopback"}
    env = {"CNI_SKEL_TRACE": str(trace)}
    add = run_plugin_raw(loopback, "ADD", conf, netns=pod_netns.path, ifname="lo",
                         cni_args="IgnoreUnknown=1;K8S_POD_NAME=p", node=node_netns, env=env)
    assert add.exit_code == 0
    bad = run_plugin_raw(loopback, "ADD", b"{not json", netns=pod_netns.path, ifname="lo",
                         node=node_netns, env=env)
    assert bad.exit_code == 1
    dele = run_plugin_raw(loopback, "DEL", conf, netns="", ifname="lo", node=node_netns,
                          env=env)
    assert dele.exit_code == 0

    first, second, third = _lines(trace)
    assert stat.S_IMODE(os.stat(trace).st_mode) == 0o600
    assert first["plugin"] == "loopback" and first["command"] == "ADD"
    assert first["netns"] == pod_netns.path and first["ifname"] == "lo"
    assert first["args"] == "IgnoreUnknown=1;K8S_POD_NAME=p"
    assert first["config"] == conf and first["exit"] == 0
    assert first["result"] == add.doc
    assert second["exit"] == 1 and second["config"] == "{not json"
    assert second["result"]["code"] == 6
    assert third["command"] == "DEL" and third["netns"] == "" and third["result"] is None


def test_an_unwritable_trace_never_fails_the_call(loopback, node_netns, pod_netns, tmp_path):
    conf = {"cniVersion": "1.0.0", "name": "lo-net", "type": "loopback"}
    run = run_plugin_raw(loopback, "ADD", conf, netns=pod_netns.path, ifname="lo",
                         node=node_netns,
                         env={"CNI_SKEL_TRACE": str(tmp_path / "missing-dir" / "t.jsonl")})
    assert run.exit_code == 0 and run.doc["ips"]
