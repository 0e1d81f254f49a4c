"""`cni_skel.runtime` running lists through real executables in namespaces
made by the test: ADD/CHECK/DEL/GC/STATUS order and inputs, the result cache
in libcni's format, plugin errors, timeouts, pre-flight; then real plugins
(ours and the Go reference ones) in one chain.

The fake plugin written here records what it got (config, CNI_* env, the
netns it ran in) and does what its config's ``fake`` key says, so the
runtime's side of the protocol can be checked exactly."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.netns import NetNS
from cni_skel.runtime import (
    CACHE_KIND,
    GCAttachment,
    GCError,
    PluginError,
    Runtime,
    RuntimeConf,
    load_conflist,
)
from cni_skel.version import ALL_VERSIONS

# The fake: stdlib only; answers in the config's version.
FAKE = r'''#!{python} -I
import json, os, sys, time
SUPPORTED = {supported!r}
name = os.path.basename(sys.argv[0])
cmd = os.environ.get("CNI_COMMAND", "")
raw = sys.stdin.read()
conf = json.loads(raw) if raw.strip() else {{}}
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": conf.get("cniVersion", "1.1.0"),
                      "supportedVersions": SUPPORTED}}))
    sys.exit(0)
fake = conf.get("fake", {{}})
if conf.get("record"):
    with open(conf["record"], "a") as fp:
        fp.write(json.dumps({{"plugin": name, "cmd": cmd, "conf": conf,
                             "env": {{k: v for k, v in os.environ.items()
                                     if k.startswith("CNI_")}},
                             "netns": os.readlink("/proc/self/ns/net")}}) + "\n")
if fake.get("stderr"):
    sys.stderr.write(fake["stderr"] + "\n")
if fake.get("sleep"):
    time.sleep(fake["sleep"])
if fake.get("exit"):
    sys.exit(fake["exit"])
err = fake.get(cmd)
if err:
    print(json.dumps({{"cniVersion": conf.get("cniVersion"), **err}}))
    sys.exit(1)
if cmd == "ADD":
    if "print" in fake:
        sys.stdout.write(fake["print"])
        sys.exit(0)
    version = conf.get("cniVersion", "0.1.0")
    result = conf.get("prevResult") or {{"ips": [{{"address": "10.1.2.3/24"}}]}}
    result["cniVersion"] = version
    result.setdefault("interfaces", []).append({{"name": conf.get("marker", name)}})
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        for ip in result.get("ips", []):
            ip["version"] = "4"
    print(json.dumps(result))
'''


def write_fake(bin_dir, name, supported=ALL_VERSIONS) -> str:
    """Write the recording fake plugin as ``bin_dir/name``; returns its path."""
    path = os.path.join(str(bin_dir), name)
    os.makedirs(str(bin_dir), exist_ok=True)
    with open(path, "w") as fp:
        fp.write(FAKE.format(python=sys.executable, supported=list(supported)))
    os.chmod(path, 0o755)
    return path


def records(path) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fp:
        return [json.loads(line) for line in fp]


def netns_id(path: str) -> str:
    return f"net:[{os.stat(path).st_ino}]"


@pytest.fixture
def env(tmp_path, node_netns, pod_netns):
    """A conf dir, a bin dir with fakes, a cache dir, a record file, and a
    Runtime that runs the plugins inside the node namespace."""

    class Env:
        pass

    e = Env()
    e.tmp = tmp_path
    e.conf_dir = tmp_path / "net.d"
    e.conf_dir.mkdir()
    e.bin = tmp_path / "bin"
    for name in ("fake-a", "fake-b", "fake-c"):
        write_fake(e.bin, name)
    write_fake(e.bin, "fake-old", ALL_VERSIONS[:-1])
    e.cache = tmp_path / "cache"
    e.record = str(tmp_path / "record.jsonl")
    e.node, e.pod = node_netns, pod_netns
    e.cni = Runtime(conf_dir=str(e.conf_dir), bin_dirs=[str(e.bin)], cache_dir=str(e.cache),
                    plugin_netns=node_netns.path, timeout=30)

    def write(name, plugins, version="1.1.0", filename=None, **extra):
        doc = {"cniVersion": version, "name": name, **extra,
               "plugins": [{"record": e.record, **p} for p in plugins]}
        (e.conf_dir / (filename or f"10-{name}.conflist")).write_text(json.dumps(doc))
        return e.cni.load_conflist(name)

    e.write = write
    e.records = lambda: records(e.record)
    return e


def three(env, version="1.1.0", **extra):
    return env.write("net", [{"type": "fake-a", "marker": "a"},
                             {"type": "fake-b", "marker": "b",
                              "capabilities": {"portMappings": True, "mac": False}},
                             {"type": "fake-c", "marker": "c"}], version, **extra)


def rtc(env, cid="ctr1", ifname="eth0", **kw):
    return RuntimeConf(cid, env.pod.path, ifname, **kw)


PORTS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]


# --- ADD ---------------------------------------------------------------------


def test_add_chains_prev_result_in_order_inside_the_node_netns(env):
    net = three(env)
    result = env.cni.add(net, rtc(env, args="K8S_POD_NAME=p1;IgnoreUnknown=1",
                                 capability_args={"portMappings": PORTS, "mac": "aa:bb"}))
    assert [i.name for i in result.interfaces] == ["a", "b", "c"]
    assert str(result.ips[0].address) == "10.1.2.3/24"
    assert result.cni_version == "1.1.0"
    recs = env.records()
    assert [(r["plugin"], r["cmd"]) for r in recs] == [
        ("fake-a", "ADD"), ("fake-b", "ADD"), ("fake-c", "ADD")]
    assert "prevResult" not in recs[0]["conf"]              # spec: not for the first ADD
    assert [i["name"] for i in recs[1]["conf"]["prevResult"]["interfaces"]] == ["a"]
    assert [i["name"] for i in recs[2]["conf"]["prevResult"]["interfaces"]] == ["a", "b"]
    for r in recs:
        assert r["conf"]["cniVersion"] == "1.1.0" and r["conf"]["name"] == "net"
        assert "capabilities" not in r["conf"]
        assert r["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1",
                            "CNI_NETNS": env.pod.path, "CNI_IFNAME": "eth0",
                            "CNI_ARGS": "K8S_POD_NAME=p1;IgnoreUnknown=1",
                            "CNI_PATH": str(env.bin)}
        assert r["netns"] == netns_id(env.node.path)          # ran as on the node
    # Only the plugin declaring the capability gets it, and only the declared one.
    assert recs[1]["conf"]["runtimeConfig"] == {"portMappings": PORTS}
    assert "runtimeConfig" not in recs[0]["conf"] and "runtimeConfig" not in recs[2]["conf"]


def test_add_converts_prev_result_to_the_list_version(env):
    net = three(env, "0.4.0")
    result = env.cni.add(net, rtc(env))
    recs = env.records()
    assert recs[1]["conf"]["prevResult"]["cniVersion"] == "0.4.0"
    assert recs[1]["conf"]["prevResult"]["ips"][0]["version"] == "4"   # 0.4.0 shape
    assert result.cni_version == "0.4.0"


def test_add_validates_the_attachment_before_running_anything(env):
    net = three(env)
    with pytest.raises(CNIError) as err:
        env.cni.add(net, RuntimeConf("bad/id", env.pod.path, "eth0"))
    assert err.value.code == 4 and "containerID" in err.value.msg
    with pytest.raises(CNIError) as err:
        env.cni.add(net, RuntimeConf("ctr1", env.pod.path, "a-very-long-ifname0"))
    assert err.value.code == 4
    assert env.records() == []


# --- the cache ----------------------------------------------------------------


def test_cache_file_is_libcnis_format(env):
    net = three(env)
    conf_bytes = (env.conf_dir / "10-net.conflist").read_bytes()
    rt = rtc(env, args=[("K8S_POD_NAME", "p1")], capability_args={"portMappings": PORTS})
    result = env.cni.add(net, rt)
    path = env.cache / "results" / "net-ctr1-eth0"
    assert env.cni.cache_path("net", rt) == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((env.cache / "results").stat().st_mode) == 0o700
    doc = json.loads(path.read_bytes())
    # libcni's cachedInfo JSON tags, in its field order (libcni/api.go).
    assert list(doc) == ["kind", "containerId", "config", "ifName", "networkName", "netns",
                         "cniArgs", "capabilityArgs", "result"]
    assert doc["kind"] == CACHE_KIND == "cniCacheV1"
    assert base64.b64decode(doc["config"]) == conf_bytes     # []byte -> base64
    assert doc["containerId"] == "ctr1" and doc["ifName"] == "eth0"
    assert doc["networkName"] == "net" and doc["netns"] == env.pod.path
    assert doc["cniArgs"] == [["K8S_POD_NAME", "p1"]]
    assert doc["capabilityArgs"] == {"portMappings": PORTS}
    assert doc["result"] == result.to_version("1.1.0")
    assert b"\n" not in path.read_bytes()                      # compact, as json.Marshal


def test_cache_omits_empty_fields_as_libcni(env):
    net = three(env)
    env.cni.add(net, RuntimeConf("ctr2", "", "eth0"))
    doc = json.loads((env.cache / "results" / "net-ctr2-eth0").read_bytes())
    assert list(doc) == ["kind", "containerId", "config", "ifName", "networkName", "result"]


def test_reads_cache_written_by_libcni(env):
    """A file as containerd writes it (Go's json.Marshal of cachedInfo)."""
    net = three(env, "1.0.0")
    results = env.cache / "results"
    results.mkdir(parents=True)
    go_doc = {"kind": "cniCacheV1", "containerId": "b467fd2e", "config":
              base64.b64encode(b'{"name":"net"}').decode(), "ifName": "eth0",
              "networkName": "net", "netns": "/var/run/netns/cni-1",
              "cniArgs": [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "demo-pod1"]],
              "capabilityArgs": {"portMappings": [{"hostPort": 18082, "containerPort": 8080,
                                                   "protocol": "tcp", "hostIP": ""}]},
              "result": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
                         "ips": [{"interface": 0, "address": "10.88.2.2/24",
                                  "gateway": "10.88.2.1"}], "dns": {}}}
    (results / "net-b467fd2e-eth0").write_text(json.dumps(go_doc))
    rt = RuntimeConf("b467fd2e", "", "eth0")
    cached = env.cni.get_cached_result(net, rt)
    assert str(cached.ips[0].address) == "10.88.2.2/24"
    config, cached_rt = env.cni.get_cached_config(net, rt)
    assert config == b'{"name":"net"}'
    assert cached_rt.args == [("IgnoreUnknown", "1"), ("K8S_POD_NAME", "demo-pod1")]
    assert cached_rt.capability_args["portMappings"][0]["hostPort"] == 18082
    [att] = env.cni.get_cached_attachments()
    assert (att.container_id, att.network, att.ifname, att.netns) == \
        ("b467fd2e", "net", "eth0", "/var/run/netns/cni-1")
    assert env.cni.get_cached_attachments("other") == []
    # A pre-cniCacheV1 file holding a bare result is still a cached result.
    (results / "net-old-eth0").write_text(json.dumps(go_doc["result"]))
    assert env.cni.get_cached_result(net, RuntimeConf("old", "", "eth0")).ips
    assert [a.container_id for a in env.cni.get_cached_attachments()] == ["b467fd2e"]


# --- DEL -------------------------------------------------------------------------


def test_del_reverse_order_with_cached_result_then_cache_gone(env):
    net = three(env)
    rt = rtc(env, capability_args={"portMappings": PORTS})
    result = env.cni.add(net, rt)
    os.unlink(env.record)
    env.cni.delete(net, rt)
    recs = env.records()
    assert [(r["plugin"], r["cmd"]) for r in recs] == [
        ("fake-c", "DEL"), ("fake-b", "DEL"), ("fake-a", "DEL")]
    for r in recs:
        assert r["conf"]["prevResult"] == result.to_version("1.1.0")
    assert recs[1]["conf"]["runtimeConfig"] == {"portMappings": PORTS}
    assert not (env.cache / "results" / "net-ctr1-eth0").exists()
    # Again, netns gone and no cache: plugins still get DEL, without prevResult.
    os.unlink(env.record)
    env.cni.delete(net, RuntimeConf("ctr1", "", "eth0"))
    recs = env.records()
    assert len(recs) == 3 and all("prevResult" not in r["conf"] for r in recs)
    assert recs[0]["env"]["CNI_NETNS"] == ""


def test_del_below_040_sends_no_prev_result(env):
    net = three(env, "0.3.1")
    env.cni.add(net, rtc(env))
    os.unlink(env.record)
    env.cni.delete(net, rtc(env))
    assert all("prevResult" not in r["conf"] for r in env.records())


def test_del_with_corrupt_cache_goes_on_without_it(env):
    net = three(env)
    results = env.cache / "results"
    results.mkdir(parents=True)
    (results / "net-ctr1-eth0").write_text('{"kind": "cniCacheV1", "result": {"ips": 5}}')
    env.cni.delete(net, rtc(env))
    assert all("prevResult" not in r["conf"] for r in env.records())
    assert not (results / "net-ctr1-eth0").exists()


def test_del_failure_stops_and_keeps_the_cache(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "fake-b", "fake": {
        "DEL": {"code": 11, "msg": "busy", "details": "try later"}}}, {"type": "fake-c"}])
    env.cni.add(net, rtc(env))
    os.unlink(env.record)
    with pytest.raises(PluginError) as err:
        env.cni.delete(net, rtc(env))
    assert (err.value.code, err.value.plugin_type, err.value.index) == (11, "fake-b", 2)
    assert [r["plugin"] for r in env.records()] == ["fake-c", "fake-b"]
    assert (env.cache / "results" / "net-ctr1-eth0").exists()


# --- CHECK -----------------------------------------------------------------------


def test_check_in_order_with_cached_result(env):
    net = three(env)
    result = env.cni.add(net, rtc(env))
    os.unlink(env.record)
    env.cni.check(net, rtc(env))
    recs = env.records()
    assert [r["plugin"] for r in recs] == ["fake-a", "fake-b", "fake-c"]
    assert all(r["conf"]["prevResult"] == result.to_version("1.1.0") for r in recs)
    assert all(r["env"]["CNI_COMMAND"] == "CHECK" for r in recs)


def test_check_honours_disable_check(env):
    net = three(env, disableCheck=True)
    assert net.disable_check
    env.cni.add(net, rtc(env))
    os.unlink(env.record)
    env.cni.check(net, rtc(env))
    assert env.records() == []


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0", "0.3.0", "0.3.1"])
def test_check_refused_below_040(env, version):
    for disable in (False, True):
        net = three(env, version, disableCheck=disable)
        with pytest.raises(CNIError) as err:
            env.cni.check(net, rtc(env))
        assert err.value.code == 1
        assert f'configuration version "{version}" does not support the CHECK command' \
            in err.value.msg
    assert env.records() == []


# --- GC --------------------------------------------------------------------------


def test_gc_deletes_stale_cached_attachments_then_gcs_every_plugin(env):
    net = three(env)
    other = env.write("other", [{"type": "fake-a"}])
    env.cni.add(net, rtc(env, "c1"))
    env.cni.add(net, rtc(env, "c2", args="A=1", capability_args={"portMappings": PORTS}))
    env.cni.add(net, rtc(env, "c1", "eth1"))
    env.cni.add(other, rtc(env, "c9"))
    os.unlink(env.record)
    removed = env.cni.gc(net, [GCAttachment("c1", "eth0"), ("c9", "eth0")])
    assert sorted((a.container_id, a.ifname) for a in removed) == [("c1", "eth1"), ("c2", "eth0")]
    recs = env.records()
    dels = [(r["plugin"], r["env"]["CNI_CONTAINERID"], r["env"]["CNI_IFNAME"])
            for r in recs if r["cmd"] == "DEL"]
    assert dels == [("fake-c", "c1", "eth1"), ("fake-b", "c1", "eth1"), ("fake-a", "c1", "eth1"),
                    ("fake-c", "c2", "eth0"), ("fake-b", "c2", "eth0"), ("fake-a", "c2", "eth0")]
    # The stale DEL uses what was cached at its ADD.
    c2 = next(r for r in recs if r["cmd"] == "DEL" and r["plugin"] == "fake-b"
              and r["env"]["CNI_CONTAINERID"] == "c2")
    assert c2["env"]["CNI_ARGS"] == "A=1" and c2["conf"]["runtimeConfig"] == {"portMappings": PORTS}
    assert c2["env"]["CNI_NETNS"] == env.pod.path
    gcs = [r for r in recs if r["cmd"] == "GC"]
    assert [r["plugin"] for r in gcs] == ["fake-a", "fake-b", "fake-c"]
    for r in gcs:
        assert r["conf"]["cni.dev/valid-attachments"] == [
            {"containerID": "c1", "ifname": "eth0"}, {"containerID": "c9", "ifname": "eth0"}]
        assert r["conf"]["cni.dev/attachments"] == r["conf"]["cni.dev/valid-attachments"]
        assert r["env"]["CNI_CONTAINERID"] == "" and r["env"]["CNI_PATH"] == str(env.bin)
        assert "runtimeConfig" not in r["conf"] and "prevResult" not in r["conf"]
    assert [a.container_id for a in env.cni.get_cached_attachments()] == ["c1", "c9"]


def test_gc_honours_disable_gc_and_skips_plugin_gc_below_110(env):
    net = three(env, disableGC=True)
    env.cni.add(net, rtc(env, "c1"))
    os.unlink(env.record)
    assert env.cni.gc(net, []) == []
    assert env.records() == []
    old = three(env, "1.0.0")
    assert [a.container_id for a in env.cni.gc(old, [])] == ["c1"]
    assert {r["cmd"] for r in env.records()} == {"DEL"}            # no GC verb in 1.0.0


def test_gc_without_valid_list_sends_no_key_as_libcni(env):
    net = three(env)
    env.cni.gc(net)
    recs = env.records()
    assert [r["cmd"] for r in recs] == ["GC"] * 3
    assert all("cni.dev/valid-attachments" not in r["conf"] for r in recs)


def test_gc_goes_on_past_errors_and_reports_them_all(env):
    net = env.write("net", [{"type": "fake-a", "fake": {"GC": {"code": 5, "msg": "disk"}}},
                            {"type": "fake-b", "fake": {"DEL": {"code": 7, "msg": "nope"}}},
                            {"type": "fake-c"}])
    env.cni.add(net, rtc(env, "c1"))
    os.unlink(env.record)
    with pytest.raises(GCError) as err:
        env.cni.gc(net, [])
    assert len(err.value.errors) == 2 and err.value.code == 7
    assert "stale attachment c1 eth0" in str(err.value.errors[0])
    assert isinstance(err.value.errors[1], PluginError) and err.value.errors[1].msg == "disk"
    assert [r["plugin"] for r in env.records() if r["cmd"] == "GC"] == \
        ["fake-a", "fake-b", "fake-c"]


def test_gc_with_our_host_local_releases_what_nobody_uses(env, cni_bin):
    data = env.tmp / "ipam"
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.42.0.0/24"}]], "dataDir": str(data)}
    (env.conf_dir / "10-hl.conflist").write_text(json.dumps(
        {"cniVersion": "1.1.0", "name": "hl", "plugins": [{"type": "host-local", "ipam": ipam}]}))
    cni = Runtime(conf_dir=str(env.conf_dir), bin_dirs=[cni_bin], cache_dir=str(env.cache),
                  plugin_netns=env.node.path)
    net = cni.load_conflist("hl")
    for cid in ("keep", "stale", "lost"):
        cni.add(net, RuntimeConf(cid, env.pod.path, "eth0"))
    os.unlink(env.cache / "results" / "hl-lost-eth0")   # the runtime forgot it
    assert len(list((data / "hl").glob("10.42.0.*"))) == 3
    removed = cni.gc(net, [GCAttachment("keep", "eth0")])
    assert [a.container_id for a in removed] == ["stale"]          # DEL through the cache
    left = list((data / "hl").glob("10.42.0.*"))                  # plugin GC got "lost"
    assert len(left) == 1 and left[0].read_text().startswith("keep")


# --- STATUS ---------------------------------------------------------------------


def test_status_asks_every_plugin_in_order(env):
    net = three(env)
    assert env.cni.status(net) is True
    recs = env.records()
    assert [(r["plugin"], r["cmd"]) for r in recs] == [
        ("fake-a", "STATUS"), ("fake-b", "STATUS"), ("fake-c", "STATUS")]
    assert recs[0]["env"]["CNI_CONTAINERID"] == "" and recs[0]["conf"]["name"] == "net"


def test_status_stops_at_the_first_plugin_not_ready(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "fake-b", "fake": {
        "STATUS": {"code": 50, "msg": "no IPs left", "details": "range 10.0.0.0/30 full"}}},
        {"type": "fake-c"}])
    with pytest.raises(PluginError) as err:
        env.cni.status(net)
    assert (err.value.code, err.value.msg, err.value.details) == \
        (50, "no IPs left", "range 10.0.0.0/30 full")
    assert [r["plugin"] for r in env.records()] == ["fake-a", "fake-b"]


def test_status_below_110_asks_nobody(env):
    assert env.cni.status(three(env, "1.0.0")) is False
    assert env.records() == []


def test_status_of_our_host_local(env, cni_bin):
    (env.conf_dir / "10-hl.conflist").write_text(json.dumps(
        {"cniVersion": "1.1.0", "name": "hl", "plugins": [{"type": "host-local", "ipam": {
            "type": "host-local", "subnet": "10.43.0.0/24", "dataDir": str(env.tmp / "d")}}]}))
    cni = Runtime(conf_dir=str(env.conf_dir), bin_dirs=[cni_bin], cache_dir=str(env.cache),
                  plugin_netns=env.node.path)
    assert cni.status(cni.load_conflist("hl")) is True


# --- errors -------------------------------------------------------------------


def test_plugin_error_carries_code_msg_details_stderr_and_which_plugin(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "fake-b", "fake": {
        "stderr": "fake-b: the veth is gone",
        "ADD": {"code": 7, "msg": "invalid bridge", "details": "bridge cni0 is a dummy"}}},
        {"type": "fake-c"}])
    with pytest.raises(PluginError) as err:
        env.cni.add(net, rtc(env))
    e = err.value
    assert (e.code, e.msg, e.details) == (7, "invalid bridge", "bridge cni0 is a dummy")
    assert (e.plugin_type, e.index, e.count, e.command, e.network) == \
        ("fake-b", 2, 3, "ADD", "net")
    assert "fake-b: the veth is gone" in e.stderr
    assert str(e).startswith('plugin type="fake-b" (2 of 3) of network "net" failed (ADD): ')
    assert [r["plugin"] for r in env.records()] == ["fake-a", "fake-b"]
    assert not (env.cache / "results" / "net-ctr1-eth0").exists()   # failed ADD: no cache


@pytest.mark.parametrize("fake, code, text", [
    ({"exit": 3}, 999, "exit status 3"),
    ({"print": "not json"}, 6, ""),
    ({"print": ""}, 6, "no result"),
])
def test_bad_plugin_output(env, fake, code, text):
    net = env.write("net", [{"type": "fake-a", "fake": fake}])
    with pytest.raises(PluginError) as err:
        env.cni.add(net, rtc(env))
    assert err.value.code == code and text in str(err.value)


def test_missing_plugin_names_it(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "no-such-plugin"}])
    with pytest.raises(PluginError) as err:
        env.cni.add(net, rtc(env))
    assert err.value.code == 7 and err.value.plugin_type == "no-such-plugin"
    assert 'failed to find plugin "no-such-plugin"' in err.value.msg


def test_timeout_kills_the_plugin_with_code_11(env):
    net = env.write("net", [{"type": "fake-a", "fake": {"sleep": 20}}])
    cni = Runtime(conf_dir=str(env.conf_dir), bin_dirs=[str(env.bin)], cache_dir=str(env.cache),
                  plugin_netns=env.node.path, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(PluginError) as err:
        cni.add(net, rtc(env))
    assert time.monotonic() - started < 10
    assert err.value.code == 11 and "timed out" in err.value.msg


def test_text_file_busy_is_retried(env):
    net = env.write("net", [{"type": "fake-a"}])
    exe = env.bin / "fake-a"
    writer = open(exe, "ab")  # noqa: SIM115 - held open on purpose: exec gets ETXTBSY
    timer = threading.Timer(0.2, writer.close)
    timer.start()
    try:
        result = env.cni.add(net, rtc(env))
    finally:
        timer.join()
    assert [i.name for i in result.interfaces] == ["fake-a"]


# --- pre-flight and negotiation ------------------------------------------------


def test_preflight_refuses_a_version_a_plugin_lacks(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "fake-old",
                                                 "capabilities": {"mac": True}}])
    with pytest.raises(CNIError) as err:
        env.cni.validate(net)
    assert err.value.code == 1 and 'plugin "fake-old" does not support config version "1.1.0"' \
        in err.value.details
    cni = Runtime(conf_dir=str(env.conf_dir), bin_dirs=[str(env.bin)], cache_dir=str(env.cache),
                  plugin_netns=env.node.path, preflight=True)
    with pytest.raises(CNIError):
        cni.add(net, rtc(env))
    assert [r["cmd"] for r in env.records()] == []       # nothing ran
    assert env.cni.validate(net.with_version("1.0.0")) == ["mac"]


def test_negotiate_version_from_cni_versions(env):
    net = env.write("net", [{"type": "fake-a"}, {"type": "fake-old"}], version="0.4.0",
                    cniVersions=["1.0.0", "1.1.0"])
    assert net.cni_version == "1.1.0"
    assert env.cni.negotiate_version(net).cni_version == "1.0.0"
    with pytest.raises(CNIError) as err:
        env.cni.negotiate_version(net, ["1.1.0"])
    assert err.value.code == 1


# --- the executor seam -----------------------------------------------------------


class RecordingExec:
    """An `Exec` that starts no process: it records each lookup and call and
    answers canned bytes (VERSION: 1.0.0 and 1.1.0; ADD: the prevResult, or
    a first result, with one interface named after the plugin added)."""

    def __init__(self):
        self.found: list[tuple[str, list[str]]] = []
        self.calls: list[dict] = []

    def find(self, plugin_type, paths):
        self.found.append((plugin_type, list(paths)))
        return f"/fake-bin/{plugin_type}"

    def run(self, plugin_path, command, stdin_data, env, *, timeout=None, stderr=None):
        conf = json.loads(stdin_data)
        self.calls.append({"path": plugin_path, "command": command, "conf": conf,
                           "env": {k: v for k, v in env.items() if k.startswith("CNI_")},
                           "timeout": timeout})
        if command == "VERSION":
            return json.dumps({"cniVersion": conf["cniVersion"],
                               "supportedVersions": ["1.0.0", "1.1.0"]}).encode()
        if command != "ADD":
            return b""
        answer = json.loads(stdin_data)           # not the recorded copy
        result = answer.get("prevResult") or {"ips": [{"address": "10.1.2.3/24"}]}
        result["cniVersion"] = answer["cniVersion"]
        result.setdefault("interfaces", []).append({"name": answer["type"]})
        return json.dumps(result).encode()


def test_every_plugin_call_goes_through_the_runtimes_exec(tmp_path, monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-net.conflist").write_text(json.dumps({
        "cniVersion": "1.1.0", "name": "net",
        "plugins": [{"type": "first"}, {"type": "second", "capabilities": {"mac": True}}]}))
    fake = RecordingExec()
    cni = Runtime(conf_dir=str(conf_dir), bin_dirs=["/nowhere"], cache_dir=str(tmp_path / "c"),
                  timeout=7, preflight=True, exec=fake)
    net = cni.load_conflist("net")
    rt = RuntimeConf("ctr1", "/run/netns/p", "eth0", args="K=V",
                     capability_args={"mac": "0a:58:00:00:00:01"})

    result = cni.add(net, rt)
    assert [i.name for i in result.interfaces] == ["first", "second"]
    assert [(c["command"], c["path"]) for c in fake.calls] == [
        ("VERSION", "/fake-bin/first"), ("VERSION", "/fake-bin/second"),
        ("ADD", "/fake-bin/first"), ("ADD", "/fake-bin/second")]
    assert fake.found[0] == ("first", ["/nowhere"])
    add_first, add_second = fake.calls[2:]
    assert add_first["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1",
                                "CNI_NETNS": "/run/netns/p", "CNI_ARGS": "K=V",
                                "CNI_IFNAME": "eth0", "CNI_PATH": "/nowhere"}
    assert add_first["timeout"] == 7 and "prevResult" not in add_first["conf"]
    assert add_second["conf"]["prevResult"]["interfaces"] == [{"name": "first"}]
    assert add_second["conf"]["runtimeConfig"] == {"mac": "0a:58:00:00:00:01"}
    assert cni.get_cached_result(net, rt).interfaces[1].name == "second"

    fake.calls.clear()
    cni.check(net, rt)
    assert cni.status(net) is True
    cni.delete(net, rt)
    assert cni.gc(net, []) == []
    assert [(c["command"], c["conf"]["type"]) for c in fake.calls] == [
        ("CHECK", "first"), ("CHECK", "second"), ("STATUS", "first"), ("STATUS", "second"),
        ("DEL", "second"), ("DEL", "first"), ("GC", "first"), ("GC", "second")]
    assert fake.calls[4]["conf"]["prevResult"]["interfaces"][1] == {"name": "second"}
    assert cni.get_cached_attachments() == []


# --- real plugins, ours and Go's, in one chain -----------------------------------


def _link(ns_path, name):
    with NetNS.open(ns_path) as ns, ns.iproute() as ipr:
        return netlink.find_link(ipr, name)


def test_real_chain_go_bridge_go_tuning_our_loopback(env, cni_bin, go_cni_dir):
    """bridge + host-local + tuning (Go 1.1.1) then our loopback, at 1.0.0,
    plus our loopback alone as a single-plugin .conf network."""
    (env.conf_dir / "10-pods.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "pods", "plugins": [
            {"type": "bridge", "bridge": "cnsk-rt0", "isGateway": True,
             "ipam": {"type": "host-local", "subnet": "10.44.0.0/24",
                      "dataDir": str(env.tmp / "ipam")}},
            {"type": "tuning", "mtu": 1400, "dataDir": str(env.tmp / "tuning")},
            {"type": "loopback"}]}))
    (env.conf_dir / "99-lo.conf").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "lo-net", "type": "loopback"}))
    # Ours first in the path, holding only loopback; the rest are Go's.
    ours = env.tmp / "ours"
    ours.mkdir()
    (ours / "loopback").symlink_to(os.path.join(cni_bin, "loopback"))
    cni = Runtime(conf_dir=str(env.conf_dir), bin_dirs=[str(ours), go_cni_dir],
                  cache_dir=str(env.cache), plugin_netns=env.node.path)
    pods, lo_net = cni.load_conflist("pods"), cni.load_conflist("lo-net")
    assert [p.type for p in lo_net.plugins] == ["loopback"]
    r = RuntimeConf("ctr-real", env.pod.path, "eth0")
    result = cni.add(pods, r)
    cni.add(lo_net, RuntimeConf("ctr-real", env.pod.path, "lo"))
    assert str(result.ips[0].address).startswith("10.44.0.")
    assert [i.name for i in result.interfaces][-1] == "eth0"
    assert _link(env.pod.path, "eth0").mtu == 1400
    assert _link(env.pod.path, "lo").up
    assert _link(env.node.path, "cnsk-rt0") is not None           # the bridge is on the node
    cni.check(pods, r)
    cni.delete(pods, r)
    cni.delete(lo_net, RuntimeConf("ctr-real", env.pod.path, "lo"))
    assert _link(env.pod.path, "eth0") is None
    assert not _link(env.pod.path, "lo").up
    assert cni.get_cached_attachments() == []
    assert load_conflist(str(env.conf_dir), "pods").cni_version == "1.0.0"
