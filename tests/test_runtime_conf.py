"""`cni_skel.runtime` configuration side: discovery as libcni, the .conf ->
list upconversion, loadOnlyInlinedPlugins, validation errors with spec codes,
version selection, and the request config each plugin gets."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest

from cni_skel.errors import CNIError
from cni_skel.runtime import (
    GCAttachment,
    NetworkNotFound,
    Runtime,
    RuntimeConf,
    cnitool_container_id,
    conf_files,
    derive_request_config,
    load_conflist,
    load_file,
    network_config_list_from_bytes,
    plugin_config_from_bytes,
    resolve_netns,
    select_version,
)
from cni_skel.types import parse_result


def write(d, name, doc):
    path = d / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def lst(name="net", version="1.1.0", plugins=None, **extra):
    return {"cniVersion": version, "name": name, **extra,
            "plugins": plugins if plugins is not None else [{"type": "loopback"}]}


# --- discovery ----------------------------------------------------------------


def test_files_in_lexical_order_over_all_three_extensions(tmp_path):
    write(tmp_path, "20-b.conf", {"cniVersion": "1.0.0", "name": "net", "type": "from-conf"})
    write(tmp_path, "10-a.conflist", lst(plugins=[{"type": "from-conflist"}]))
    write(tmp_path, "05-z.json", {"cniVersion": "1.0.0", "name": "other", "type": "x"})
    write(tmp_path, "00-ignored.txt", lst())
    (tmp_path / "01-dir.conf").mkdir()                       # directories are not files
    assert [os.path.basename(p) for p in conf_files(str(tmp_path))] == \
        ["05-z.json", "10-a.conflist", "20-b.conf"]
    net = load_conflist(str(tmp_path), "net")
    assert net.plugins[0].type == "from-conflist" and net.source.endswith("10-a.conflist")
    write(tmp_path, "09-first.conf", {"cniVersion": "1.0.0", "name": "net", "type": "first"})
    assert load_conflist(str(tmp_path), "net").plugins[0].type == "first"
    assert load_conflist(str(tmp_path), "other").plugins[0].type == "x"   # .json too
    assert conf_files(str(tmp_path / "missing")) == []


def test_single_plugin_conf_becomes_a_list_of_one(tmp_path):
    conf = {"cniVersion": "0.3.1", "name": "lo", "type": "loopback", "custom": {"k": [1]}}
    net = load_file(str(write(tmp_path, "99-lo.conf", conf)))
    assert (net.name, net.cni_version, len(net.plugins)) == ("lo", "0.3.1", 1)
    assert net.plugins[0].conf == conf
    # The cached config is the list it became (libcni ConfListFromConf; Go sorts map keys).
    assert json.loads(net.raw) == {"cniVersion": "0.3.1", "name": "lo", "plugins": [conf]}
    assert net.raw.startswith(b'{"cniVersion":"0.3.1","name":"lo","plugins":[')


def test_conf_file_with_plugins_is_a_list(tmp_path):
    net = load_file(str(write(tmp_path, "10-x.conf", lst(plugins=[{"type": "a"},
                                                                   {"type": "b"}]))))
    assert [p.type for p in net.plugins] == ["a", "b"]
    assert net.raw == (tmp_path / "10-x.conf").read_bytes()     # a list keeps its bytes


def test_plugins_from_the_network_directory_are_appended(tmp_path):
    write(tmp_path, "10-net.conflist", lst(plugins=[{"type": "inline"}]))
    sub = tmp_path / "net"
    sub.mkdir()
    write(sub, "20-b.conf", {"type": "dir-b"})
    write(sub, "10-a.conf", {"type": "dir-a"})
    write(sub, "30-c.json", {"type": "not-a-conf"})           # only *.conf
    net = load_conflist(str(tmp_path), "net")
    assert [p.type for p in net.plugins] == ["inline", "dir-a", "dir-b"]
    assert net.plugins[1].source == str(sub / "10-a.conf")
    write(tmp_path, "10-net.conflist", lst(plugins=[{"type": "inline"}],
                                           loadOnlyInlinedPlugins=True))
    assert [p.type for p in load_conflist(str(tmp_path), "net").plugins] == ["inline"]
    # No inlined plugins at all: the directory provides them.
    write(tmp_path, "10-net.conflist", {"cniVersion": "1.1.0", "name": "net"})
    assert [p.type for p in load_conflist(str(tmp_path), "net").plugins] == ["dir-a", "dir-b"]


def test_load_only_inlined_needs_plugins_and_a_list_needs_some(tmp_path):
    write(tmp_path, "10-net.conflist", {"cniVersion": "1.1.0", "name": "net",
                                        "loadOnlyInlinedPlugins": True})
    with pytest.raises(CNIError) as err:
        load_conflist(str(tmp_path), "net")
    assert err.value.code == 7 and "loadOnlyInlinedPlugins" in err.value.msg
    write(tmp_path, "10-net.conflist", {"cniVersion": "1.1.0", "name": "net"})
    with pytest.raises(CNIError) as err:
        load_conflist(str(tmp_path), "net")
    assert err.value.code == 7 and "no plugin configs found" in err.value.msg
    sub = tmp_path / "net"
    sub.mkdir()
    write(sub, "1.conf", {"cniVersion": "1.1.0"})             # no type
    with pytest.raises(CNIError) as err:
        load_conflist(str(tmp_path), "net")
    assert err.value.code == 7 and "missing 'type'" in err.value.msg
    assert str(sub / "1.conf") in err.value.msg


def test_not_found_lists_what_is_there_and_what_was_skipped(tmp_path):
    with pytest.raises(NetworkNotFound) as err:
        load_conflist(str(tmp_path), "net")
    assert err.value.code == 7 and err.value.msg == f"no net configurations found in {tmp_path}"
    write(tmp_path, "10-a.conflist", lst("alpha"))
    write(tmp_path, "20-broken.conflist", "{not json")
    with pytest.raises(NetworkNotFound) as err:
        load_conflist(str(tmp_path), "net")
    assert err.value.msg == f'no net configuration with name "net" in {tmp_path}'
    assert "networks there: alpha" in err.value.details
    assert "20-broken.conflist" in err.value.details
    # A broken file that is the one asked for reports its own problem.
    write(tmp_path, "30-net.conflist", lst("net", plugins=[{"type": "a/b"}]))
    with pytest.raises(CNIError) as err:
        load_conflist(str(tmp_path), "net")
    assert not isinstance(err.value, NetworkNotFound) and "invalid plugin type" in err.value.msg


# --- validation ------------------------------------------------------------------


@pytest.mark.parametrize("doc, code, text", [
    ("{oops", 6, "error parsing"),
    ("[1, 2]", 6, "expected a JSON object"),
    ({"cniVersion": "1.0.0", "plugins": [{"type": "a"}]}, 7, "missing network name"),
    (lst("bad name"), 7, "invalid characters found in network name"),
    (lst("-dash"), 7, "invalid characters found in network name"),
    (lst("a/b"), 7, "invalid characters found in network name"),
    (lst(""), 7, "missing network name"),
    ({"cniVersion": "1.0.0", "name": 5, "plugins": [{"type": "a"}]}, 7, "invalid network name"),
    (lst(plugins={"type": "a"}), 7, "expected a list"),
    (lst(plugins=[]), 7, "no plugins in list"),
    (lst(plugins=["bridge"]), 7, "must be a JSON object"),
    (lst(plugins=[{"bridge": "cni0"}]), 7, "missing 'type'"),
    (lst(plugins=[{"type": ""}]), 7, "missing 'type'"),
    (lst(plugins=[{"type": "../bin/sh"}]), 7, "invalid plugin type"),
    (lst(plugins=[{"type": "a\\b"}]), 7, "invalid plugin type"),
    (lst(plugins=[{"type": "a", "capabilities": {"portMappings": "yes"}}]), 7,
     "invalid 'capabilities'"),
    (lst(plugins=[{"type": "a", "capabilities": ["portMappings"]}]), 7, "invalid 'capabilities'"),
    (lst(disableCheck="maybe"), 7, "invalid value 'maybe' for disableCheck"),
    (lst(disableGC=1), 7, "for disableGC"),
    (lst(loadOnlyInlinedPlugins=None), 7, "for loadOnlyInlinedPlugins"),
    (lst(version=1.0), 6, "invalid cniVersion"),
    (lst(cniVersions="1.0.0"), 6, "invalid cniVersions"),
    (lst(version="1.0"), 6, "invalid version"),
    (lst(version="2.0.0"), 1, "newer than this runtime supports"),
    (lst(version="0.5.0"), 1, "not a CNI spec version"),
    (lst(version="", cniVersions=["2.0.0", "3.1.0"]), 1, "none of the declared versions"),
])
def test_validation_errors(tmp_path, doc, code, text):
    path = write(tmp_path, "10-x.conflist", doc)
    with pytest.raises(CNIError) as err:
        load_file(str(path))
    assert err.value.code == code, err.value
    assert text in str(err.value)
    assert str(path) in err.value.msg                       # the file is named


def test_flags_accept_booleans_and_their_strings(tmp_path):
    net = network_config_list_from_bytes(json.dumps(lst(disableCheck="TRUE", disableGC=True,
                                                        loadOnlyInlinedPlugins="false")))
    assert (net.disable_check, net.disable_gc, net.load_only_inlined_plugins) == \
        (True, True, False)


def test_plugin_config_from_bytes():
    p = plugin_config_from_bytes(b'{"type": "portmap", "capabilities": '
                                 b'{"portMappings": true, "bandwidth": false}}')
    assert p.type == "portmap" and p.capabilities == ["portMappings"]
    with pytest.raises(CNIError) as err:
        plugin_config_from_bytes(b'{"type": "/usr/bin/x"}')
    assert err.value.code == 7


# --- version selection -----------------------------------------------------------


@pytest.mark.parametrize("version, versions, chosen", [
    ("1.0.0", None, "1.0.0"),
    ("", None, "0.1.0"),                                  # absent: 0.1.0
    ("0.4.0", ["1.0.0", "1.1.0", "2.0.0"], "1.1.0"),      # highest supported, at most 1.1.0
    ("1.1.0", ["0.3.1"], "1.1.0"),                        # cniVersion counts as an entry
    ("", ["0.3.1", "0.4.0"], "0.4.0"),
    ("9.9.9", ["1.0.0"], "1.0.0"),                        # too new: skipped, as libcni
    ("", ["0.5.0", "0.3.0"], "0.3.0"),                    # not a spec version: skipped
])
def test_select_version(version, versions, chosen):
    assert select_version(version, versions) == chosen


def test_list_version_and_candidates(tmp_path):
    net = network_config_list_from_bytes(json.dumps(lst(version="0.4.0",
                                                        cniVersions=["1.0.0", "1.1.0"])))
    assert net.cni_version == "1.1.0"
    assert (net.declared_version, net.cni_versions) == ("0.4.0", ("1.0.0", "1.1.0"))
    assert net.candidate_versions == ["1.1.0", "1.0.0", "0.4.0"]
    assert net.with_version("1.0.0").cni_version == "1.0.0" and net.cni_version == "1.1.0"
    bare = network_config_list_from_bytes(json.dumps({"name": "n", "plugins": [{"type": "a"}]}))
    assert bare.cni_version == "0.1.0" and bare.candidate_versions == ["0.1.0"]


# --- request configs -----------------------------------------------------------------


def _net(**extra):
    return network_config_list_from_bytes(json.dumps(lst(version="1.1.0", plugins=[
        {"type": "portmap", "cniVersion": "0.1.0", "name": "ignored", "snat": True,
         "nested": {"keep": ["me"]}, "capabilities": {"portMappings": True, "bandwidth": False,
                                                       "ips": True},
         "cni.dev/valid-attachments": [{"containerID": "forged", "ifname": "x"}]},
    ], **extra)))


def test_request_config_for_attachment_verbs():
    net = _net()
    plugin = net.plugins[0]
    before = copy.deepcopy(plugin.conf)
    caps = {"portMappings": [{"hostPort": 80}], "bandwidth": {"ingressRate": 1}, "mac": "x"}
    for command in ("ADD", "CHECK", "DEL"):
        conf = derive_request_config(net, plugin, command,
                                     rt=RuntimeConf("c", "/n", "eth0", capability_args=caps))
        assert conf == {"cniVersion": "1.1.0", "name": "net", "type": "portmap", "snat": True,
                        "nested": {"keep": ["me"]},
                        "runtimeConfig": {"portMappings": [{"hostPort": 80}]}}
    conf["nested"]["keep"].append("changed")
    assert plugin.conf == before                              # never mutated


def test_request_config_without_matching_capability_args_has_no_runtime_config():
    net = _net()
    conf = derive_request_config(net, net.plugins[0], "ADD",
                                 rt=RuntimeConf("c", "/n", "eth0", capability_args={"mac": "x"}))
    assert "runtimeConfig" not in conf and "capabilities" not in conf


def test_request_config_prev_result_in_the_list_version():
    net = _net().with_version("0.4.0")
    prev = parse_result({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]})
    conf = derive_request_config(net, net.plugins[0], "ADD", rt=RuntimeConf("c"),
                                 prev_result=prev)
    assert conf["prevResult"]["cniVersion"] == "0.4.0"
    assert conf["prevResult"]["ips"] == [{"version": "4", "address": "10.0.0.2/24"}]


def test_request_config_for_gc_and_status():
    net = _net()
    conf = derive_request_config(net, net.plugins[0], "GC",
                                 valid_attachments=[GCAttachment("c1", "eth0")])
    assert conf["cni.dev/valid-attachments"] == [{"containerID": "c1", "ifname": "eth0"}]
    assert conf["cni.dev/attachments"] == conf["cni.dev/valid-attachments"]
    assert "runtimeConfig" not in conf and conf["capabilities"]["portMappings"] is True
    conf = derive_request_config(net, net.plugins[0], "STATUS")
    assert not any(k.startswith("cni.dev/") for k in conf)
    assert (conf["cniVersion"], conf["name"]) == ("1.1.0", "net")


# --- RuntimeConf and cnitool conventions -------------------------------------------


def test_runtime_conf_args():
    rt = RuntimeConf("c", args="IgnoreUnknown=1;K8S_POD_NAME=p")
    assert rt.args == [("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p")]
    assert rt.args_string() == "IgnoreUnknown=1;K8S_POD_NAME=p"
    assert RuntimeConf("c").ifname == "eth0" and RuntimeConf("c").capability_args == {}
    with pytest.raises(CNIError) as err:
        RuntimeConf("c", args="novalue")
    assert err.value.code == 4
    with pytest.raises(CNIError):
        RuntimeConf("c", capability_args=["portMappings"])


def test_cnitool_container_id_and_netns_resolution(tmp_path, monkeypatch):
    # cnitool: "cnitool-" + hex(sha512(abs netns path)[:10]).
    digest = hashlib.sha512(b"/var/run/netns/pod1").hexdigest()[:20]
    assert cnitool_container_id("/var/run/netns/pod1") == f"cnitool-{digest}"
    assert len(cnitool_container_id("/x")) == len("cnitool-") + 20
    monkeypatch.chdir(tmp_path)
    assert resolve_netns("rel/ns/../ns") == str(tmp_path / "rel" / "ns")   # Abs + Clean
    assert resolve_netns("") == ""
    if os.path.isdir("/run/netns") and os.listdir("/run/netns"):
        name = sorted(os.listdir("/run/netns"))[0]
        assert resolve_netns(name) == f"/run/netns/{name}"


def test_runtime_defaults_are_libcnis():
    cni = Runtime()
    assert (cni.conf_dir, cni.bin_dirs, cni.cache_dir) == \
        ("/etc/cni/net.d", ["/opt/cni/bin"], "/var/lib/cni")
    assert Runtime(bin_dirs="/a::/b").bin_dirs == ["/a", "/b"]
    assert Runtime(plugin_netns="node1").plugin_netns == "/run/netns/node1"
    assert Runtime().cache_path("net", RuntimeConf("c1", "", "eth0")) == \
        "/var/lib/cni/results/net-c1-eth0"
    with pytest.raises(CNIError) as err:
        Runtime().cache_path("net", RuntimeConf("../../etc", "", "eth0"))
    assert err.value.code == 4
