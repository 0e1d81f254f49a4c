"""`cni_skel.invoke.delegate_config`: a delegate's config built from the one
a plugin received. Units: what is kept (byte for byte), replaced, added and
dropped; the GC list; bad input. The IPAM plugin of docs/ipam-plugins.md, as
written, through every verb. For real, in both modes: a main plugin
(tests/thirdparty/poolpicker.py, public SDK only) fills in its IPAM's
``ipam.ranges`` with the helper and delegates to our host-local; a GC with a
valid-attachments list then reaches host-local intact (its files on disk).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from conftest import HERE

from cni_skel.config import GCAttachment, NetConf
from cni_skel.errors import CNIError
from cni_skel.harness import install_plugin, run_plugin
from cni_skel.invoke import delegate_config

GUIDE = HERE.parent / "docs" / "ipam-plugins.md"

RECEIVED = (
    b'{\n  "cniVersion": "1.1.0",\n  "name": "r\\u00e9seau",\n  "type": "main",\n'
    b'  "mtu": 1.50e3,\n  "big": 123456789012345678901234567890,\n'
    b'  "note": "caf\xc3\xa9 \\/ \\ud83d\\ude00",\n'
    b'  "ipam": {"type": "host-local", "subnet": "10.20.0.0/24"},\n'
    b'  "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80,'
    b' "protocol": "tcp"}]},\n'
    b'  "args": {"cni": {"ips": ["10.20.0.9"]}},\n'
    b'  "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.20.0.9/24"}]},\n'
    b'  "cni.dev/valid-attachments": [ {"containerID": "c1", "ifname": "eth0"},\n'
    b'      {"ifname": "net1", "containerID": "c\\u0032"} ],\n'
    b'  "cni.dev/attachments": [{"containerID": "c1", "ifname": "eth0"},'
    b' {"containerID": "c2", "ifname": "net1"}]\n}'
)
PROTOCOL = ("cniVersion", "name", "runtimeConfig", "args", "prevResult",
            "cni.dev/valid-attachments", "cni.dev/attachments")
# Each top-level value of RECEIVED as written there.
RAW = {
    "cniVersion": b'"1.1.0"', "name": b'"r\\u00e9seau"', "type": b'"main"', "mtu": b"1.50e3",
    "big": b"123456789012345678901234567890",
    "note": b'"caf\xc3\xa9 \\/ \\ud83d\\ude00"',
    "ipam": b'{"type": "host-local", "subnet": "10.20.0.0/24"}',
    "runtimeConfig": b'{"portMappings": [{"hostPort": 8080, "containerPort": 80,'
                     b' "protocol": "tcp"}]}',
    "args": b'{"cni": {"ips": ["10.20.0.9"]}}',
    "prevResult": b'{"cniVersion": "1.1.0", "ips": [{"address": "10.20.0.9/24"}]}',
    "cni.dev/valid-attachments": b'[ {"containerID": "c1", "ifname": "eth0"},\n'
                                 b'      {"ifname": "net1", "containerID": "c\\u0032"} ]',
    "cni.dev/attachments": b'[{"containerID": "c1", "ifname": "eth0"},'
                           b' {"containerID": "c2", "ifname": "net1"}]',
}


def members(*pairs: tuple[str, bytes]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in pairs) + b"}"


def test_unchanged_config_keeps_every_member_as_received():
    out = delegate_config(RECEIVED)
    assert out == members(*RAW.items())
    assert json.loads(out) == json.loads(RECEIVED)


def test_replace_in_place_append_and_drop():
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.21.0.0/24"}]], "note": "é"}
    out = delegate_config(RECEIVED, {"ipam": ipam, "type": "bridge", "isGateway": True},
                          drop=["mtu", "note", "absent"])
    order = ["cniVersion", "name", "type", "big", "ipam", *PROTOCOL[2:], "isGateway"]
    assert list(json.loads(out)) == order
    assert out == members(
        *((k, RAW[k]) for k in ("cniVersion", "name")), ("type", b'"bridge"'),
        ("big", RAW["big"]),
        ("ipam", '{"type":"host-local","ranges":[[{"subnet":"10.21.0.0/24"}]],"note":"é"}'
         .encode()),
        *((k, RAW[k]) for k in PROTOCOL[2:]), ("isGateway", b"true"))


def test_protocol_only_starts_from_what_the_runtime_sent():
    """A meta plugin's delegate (flannel -> bridge) sees none of the meta
    plugin's own keys, but everything the runtime put in."""
    out = delegate_config(RECEIVED, {"type": "bridge", "ipam": {"type": "host-local"}},
                          protocol_only=True)
    assert out == members(*((k, RAW[k]) for k in ("cniVersion", "name")),
                          ("type", b'"bridge"'), ("ipam", b'{"type":"host-local"}'),
                          *((k, RAW[k]) for k in PROTOCOL[2:]))


def test_keys_match_case_insensitively():
    received = b'{"cniVersion":"1.1.0","name":"n","IPAM":{"type":"a"},"Mtu":9000,"x":1}'
    out = delegate_config(received, {"ipam": {"type": "b"}}, drop=["MTU"])
    assert out == b'{"cniVersion":"1.1.0","name":"n","ipam":{"type":"b"},"x":1}'
    # protocol keys too: what a NetConf reads as cniVersion is kept
    out = delegate_config(b'{"CNIVersion":"1.0.0","Name":"n","mine":1}', protocol_only=True)
    assert out == b'{"CNIVersion":"1.0.0","Name":"n"}'


def test_repeated_key_counts_once_first_place_last_value():
    out = delegate_config(b'{"name":"a","type":"t","name":"b"}')
    assert out == b'{"name":"b","type":"t"}'


def test_gc_list_reaches_the_delegate_verbatim():
    gc = (b'{"cniVersion":"1.1.0","name":"n","type":"main","ipam":{"type":"x"},'
          b'"cni.dev/valid-attachments" : [\n {"containerID":"c\\u00e9","ifname":"eth0",'
          b'"extra":1.0}, {"ContainerID":"c2","IFNAME":"net1"} ],'
          b'"cni.dev/attachments":null}')
    out = delegate_config(gc, {"ipam": {"type": "y", "dataDir": "/x"}}, drop=["type"])
    assert (b'"cni.dev/valid-attachments":[\n {"containerID":"c\\u00e9","ifname":"eth0",'
            b'"extra":1.0}, {"ContainerID":"c2","IFNAME":"net1"} ]') in out
    assert out.endswith(b'"cni.dev/attachments":null}')
    conf = NetConf.model_validate(json.loads(out))
    assert conf.gc_keep() == [GCAttachment("c\u00e9", "eth0"), GCAttachment("c2", "net1")]
    # an empty list stays an empty list (release everything), not "no list"
    out = delegate_config(b'{"name":"n","cni.dev/valid-attachments":[]}', protocol_only=True)
    assert NetConf.model_validate(json.loads(out)).gc_keep() == []


def test_same_inputs_same_bytes_and_input_kinds():
    changes = {"ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]]}}
    first = delegate_config(RECEIVED, changes, drop=["note"])
    assert delegate_config(RECEIVED, dict(changes), drop=("note",)) == first
    assert delegate_config(RECEIVED.decode(), changes, drop=["note"]) == first
    assert delegate_config(bytearray(RECEIVED), changes, drop=["note"]) == first
    assert delegate_config(b"\xef\xbb\xbf" + RECEIVED, changes, drop=["note"]) == first
    # UTF-16 (json.loads, hence the skel, reads it): out as UTF-8, values equal
    utf16 = delegate_config(RECEIVED.decode().encode("utf-16"), changes, drop=["note"])
    assert json.loads(utf16) == json.loads(first)
    assert delegate_config(b' \r\n{ }\n', {"a": 1}) == b'{"a":1}'


@pytest.mark.parametrize("stdin", [b"", b"   ", b"[]", b"null", b'"x"', b"1", b"{",
                                   b'{"a":1} {}', b"\xff\xfe\xff", b"{'a': 1}",
                                   b"[" * 100000 + b"]" * 100000])
def test_stdin_not_a_json_object_is_code_6(stdin):
    with pytest.raises(CNIError) as ei:
        delegate_config(stdin, {"type": "x"})
    assert ei.value.code == 6
    assert ei.value.msg.startswith("error unmarshall network config")


@pytest.mark.parametrize(("changes", "drop", "error", "text"), [
    ({"ipam": {}}, ["IPAM"], ValueError, "both set and dropped"),
    ({"ipam": {}, "Ipam": {}}, (), ValueError, "set twice"),
    ({"mtu": float("nan")}, (), ValueError, "'mtu'"),
    ({"when": object()}, (), TypeError, "'when'"),
    ({1: "x"}, (), TypeError, "keys are strings"),
    ({}, "ipam", TypeError, "not a single string"),
    ({}, [None], TypeError, "keys are strings"),
])
def test_caller_mistakes_are_python_errors(changes, drop, error, text):
    with pytest.raises(error, match=text):
        delegate_config(b'{"name":"n"}', changes, drop=drop)


def test_new_values_stay_utf8():
    out = delegate_config(b'{}', {"k\u00e9": "\u00e9\U0001f600", "bad": "\udc80"})
    assert out == '{"k\u00e9":"\u00e9\U0001f600","bad":"\\udc80"}'.encode()
    out.decode("utf-8")  # never bytes that are not UTF-8


# --------------------------------------------------------------------------
# the guide's IPAM plugin, as written

def guide_plugin(tmp_path):
    text = GUIDE.read_text()
    m = re.search(r"<!-- example: tiny_pool.py -->\n```python\n(.*?)```", text, re.S)
    assert m, "docs/ipam-plugins.md lost its example plugin"
    path = tmp_path / "tiny_pool.py"
    path.write_text(m.group(1))
    spec = importlib.util.spec_from_file_location("tiny_pool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyPool


def test_guide_ipam_plugin_runs_as_written(tmp_path):
    """In-process (an IPAM plugin touches no namespace): ADD hands out
    addresses after the gateway, DEL is idempotent, CHECK, GC releases what
    the list does not name, STATUS and ADD answer 50 once the pool is used up."""
    plugin = guide_plugin(tmp_path)
    conf = {"cniVersion": "1.1.0", "name": "tiny", "type": "some-main-plugin",
            "ipam": {"type": "tiny-pool", "subnet": "10.124.0.0/29",
                     "dataDir": str(tmp_path / "leases")}}

    def call(verb, cid="", ifname="eth0", **extra):
        env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_IFNAME": ifname,
               "CNI_NETNS": "/run/netns/cnsk-not-entered", "CNI_PATH": str(tmp_path)}
        out, code = plugin.dispatch(env, json.dumps({**conf, **extra}).encode())
        doc = json.loads(out) if out.strip() else None
        return (doc["code"] if code else 0), doc

    assert call("ADD", "c1")[1]["ips"] == [{"address": "10.124.0.2/29", "gateway": "10.124.0.1"}]
    assert call("ADD", "c2")[1]["ips"][0]["address"] == "10.124.0.3/29"
    assert call("ADD", "c1")[1]["ips"][0]["address"] == "10.124.0.2/29"
    assert call("CHECK", "c1")[0] == 0 and call("CHECK", "c9")[0] == 3
    assert call("DEL", "c2") == (0, None) and call("DEL", "c2") == (0, None)
    for cid in ("c3", "c4", "c5", "c6"):
        assert call("ADD", cid)[0] == 0
    assert call("STATUS")[0] == 50 and call("ADD", "c7")[0] == 50
    assert call("GC")[0] == 7, "no list: nothing released"
    keep = [{"containerID": "c1", "ifname": "eth0"}]
    assert call("GC", **{"cni.dev/valid-attachments": keep}) == (0, None)
    leases = json.loads((tmp_path / "leases" / "tiny.json").read_text())
    assert leases == {"c1/eth0": "10.124.0.2"}
    assert call("STATUS") == (0, None)


# --------------------------------------------------------------------------
# for real: a main plugin -> host-local, both modes

PICKER = "thirdparty.poolpicker:PoolPicker"


@pytest.fixture
def picker_bin(cni_mode, cni_worker_socket, request, tmp_path):
    """pool-picker installed for this mode, and the suite's worker serving it
    in warm mode (None in oneshot mode; it is in conftest.SUITE_PLUGINS)."""
    d = tmp_path / "picker"
    install_plugin(d, "pool-picker", PICKER, pythonpath=[str(HERE)],
                   worker_socket=cni_worker_socket)
    worker = request.getfixturevalue("cni_worker") if cni_mode == "warm" else None
    return d, worker


def host_local_files(net_dir) -> dict[str, str]:
    """address -> "containerID ifname", as host-local wrote them."""
    return {p.name: p.read_bytes().decode().replace("\r\n", " ") for p in net_dir.iterdir()
            if p.name != "lock" and not p.name.startswith((".", "last_reserved_ip."))}


def traced(path, plugin, command) -> list[dict]:
    if not path.exists():
        return []
    calls = [json.loads(line) for line in path.read_text().splitlines()]
    return [c for c in calls if c["plugin"] == plugin and c["command"] == command]


def test_rewritten_ipam_reaches_host_local_then_gc(tmp_path, picker_bin, cni_bin, node_netns,
                                                   pod_netns):
    bin_dir, worker = picker_bin
    exe = str(bin_dir / "pool-picker")
    data = tmp_path / "ipam"
    trace = tmp_path / "trace.jsonl"
    # No ranges for host-local here: only pool-picker's rewrite gives it one.
    conf = {"cniVersion": "1.1.0", "name": "dcnet", "type": "pool-picker",
            "pool": "10.123.0.0/24", "ipam": {"type": "host-local", "dataDir": str(data)}}
    kw = dict(node=node_netns, cni_path=f"{bin_dir}:{cni_bin}",
              env={"CNI_SKEL_TRACE": str(trace)})
    attach = dict(kw, netns=pod_netns.path)

    got = {}
    for cid, ifname in (("dc-keep", "eth0"), ("dc-keep", "net1"), ("dc-gone", "eth0")):
        result = run_plugin(exe, "ADD", conf, container_id=cid, ifname=ifname, **attach)
        assert result["cniVersion"] == "1.1.0" and "interfaces" not in result
        [ip] = result["ips"]
        assert ip["address"].startswith("10.123.0.") and ip["gateway"] == "10.123.0.1"
        got[ip["address"].split("/")[0]] = f"{cid} {ifname}"
    net_dir = data / "dcnet"
    assert host_local_files(net_dir) == got

    # What host-local was given: the runtime's keys, the rewritten ipam, no pool.
    add = traced(trace, "host-local", "ADD")[0]["config"]
    assert add == {"cniVersion": "1.1.0", "name": "dcnet", "type": "pool-picker",
                   "ipam": {**conf["ipam"], "ranges": [[{"subnet": "10.123.0.0/24"}]]}}

    run_plugin(exe, "CHECK", conf, container_id="dc-keep", ifname="eth0", **attach)
    gc_kw = dict(kw, container_id="", netns="", ifname="")
    assert run_plugin(exe, "STATUS", conf, **gc_kw) is None

    keep = [{"containerID": "dc-keep", "ifname": "eth0"},
            {"containerID": "dc-other", "ifname": "eth0", "note": "not attached here"}]
    gc = {**conf, "cni.dev/valid-attachments": keep}
    assert run_plugin(exe, "GC", gc, **gc_kw) is None
    [seen] = traced(trace, "host-local", "GC")
    assert seen["exit"] == 0
    assert seen["config"]["cni.dev/valid-attachments"] == keep
    assert "pool" not in seen["config"] and "ranges" in seen["config"]["ipam"]
    # host-local released all but the listed attachment's address
    assert host_local_files(net_dir) == {ip: who for ip, who in got.items()
                                         if who == "dc-keep eth0"}

    run_plugin(exe, "DEL", conf, container_id="dc-keep", ifname="eth0", **attach)
    assert host_local_files(net_dir) == {}
    run_plugin(exe, "DEL", conf, container_id="dc-keep", ifname="eth0", **attach)  # idempotent

    if worker is not None:  # warm: pool-picker ran in the worker, not in its launcher
        assert [ln for ln in worker.served("dc-keep") if "exit=0" in ln]
