"""host-local through the real executable, run inside a node namespace the
way a runtime runs it: every config form, dual stack, requested addresses,
exhaustion, result shapes per version against the Go vectors, DEL, CHECK,
GC, STATUS, safety, crash recovery. Interop with the Go plugin is in
test_host_local_interop.py, concurrency in test_host_local_concurrency.py."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest
from cni_skel_plugins.host_local.store import Store
from conftest import load_vector
from yardsticks import printed

from cni_skel.errors import CNIError
from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.version import ALL_VERSIONS
from cni_skel.warm.install import python_argv

NETNS = "/run/netns/cnsk-hl-unused"  # host-local never enters it
NET = "hlnet"


@pytest.fixture(scope="session")
def hl(cni_bin: str) -> str:
    return os.path.join(cni_bin, "host-local")


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "ipam"


def conf(data_dir, version="1.1.0", name=NET, top=None, **ipam) -> dict:
    c = {"cniVersion": version, "name": name, "type": "bridge",
         "ipam": {"type": "host-local", "dataDir": str(data_dir), **ipam}}
    c.update(top or {})
    return c


def add(exe, c, node, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "ADD", c, container_id=cid, ifname=ifname, netns=NETNS, node=node,
                      **kw)


def delete(exe, c, node, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "DEL", c, container_id=cid, ifname=ifname, netns=NETNS, node=node,
                      **kw)


def check(exe, c, node, cid="c1", ifname="eth0", **kw):
    return run_plugin(exe, "CHECK", c, container_id=cid, ifname=ifname, netns=NETNS, node=node,
                      **kw)


def verb(exe, cmd, c, node, **kw):
    """STATUS/GC: no container, no netns, no ifname."""
    return run_plugin(exe, cmd, c, container_id="", ifname="", netns="", node=node, **kw)


def fails(fn, *a, **kw) -> CNIError:
    with pytest.raises(CNIError) as ei:
        fn(*a, **kw)
    return ei.value


def addrs(result) -> list[str]:
    return [ip["address"] for ip in result["ips"]]


def allocated(data_dir, name=NET) -> dict[str, bytes]:
    """The address files of a network: name -> content."""
    d = data_dir / name
    out = {}
    if d.is_dir():
        for p in d.iterdir():
            try:
                ipaddress.ip_address(p.name)
            except ValueError:
                continue
            out[p.name] = p.read_bytes() if p.is_file() else b"<not a file>"
    return out


# --- config forms ---------------------------------------------------------------


def test_legacy_single_range_defaults(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.60.0.0/24")
    result = add(hl, c, node_netns)
    assert result == {"cniVersion": "1.1.0",
                      "ips": [{"address": "10.60.0.2/24", "gateway": "10.60.0.1"}]}
    assert allocated(data_dir) == {"10.60.0.2": b"c1\r\neth0"}
    assert (data_dir / NET / "last_reserved_ip.0").read_bytes() == b"10.60.0.2"
    assert oct((data_dir / NET / "10.60.0.2").stat().st_mode & 0o777) == "0o600"
    assert (data_dir / NET / "lock").exists()


def test_legacy_range_bounds_and_gateway(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.60.0.0/24", rangeStart="10.60.0.100", rangeEnd="10.60.0.102",
             gateway="10.60.0.101")
    got = [addrs(add(hl, c, node_netns, cid=f"c{i}"))[0] for i in range(2)]
    assert got == ["10.60.0.100/24", "10.60.0.102/24"], "the gateway inside the range is skipped"
    err = fails(add, hl, c, node_netns, cid="c9")
    assert err.code == 50


def test_keys_match_case_insensitively(hl, data_dir, node_netns):
    # Go's JSON decoding folds case; runtimes rely on it.
    c = {"cniVersion": "1.0.0", "name": NET, "IPAM": {
        "Type": "host-local", "DataDir": str(data_dir),
        "Ranges": [[{"Subnet": "10.61.0.0/24", "RangeStart": "10.61.0.9"}]]}}
    assert addrs(add(hl, c, node_netns)) == ["10.61.0.9/24"]


def test_range_set_spans_several_subnets(hl, data_dir, node_netns):
    c = conf(data_dir, ranges=[[{"subnet": "10.62.0.0/30"}, {"subnet": "10.62.1.0/30"}]])
    got = [addrs(add(hl, c, node_netns, cid=f"c{i}"))[0] for i in range(2)]
    assert got == ["10.62.0.2/30", "10.62.1.2/30"]
    assert fails(add, hl, c, node_netns, cid="c3").code == 50


def test_legacy_range_comes_first_then_ranges(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.63.0.0/24", ranges=[[{"subnet": "fd63::/64"}]])
    assert addrs(add(hl, c, node_netns)) == ["10.63.0.2/24", "fd63::2/64"]


def test_routes_and_resolv_conf(hl, data_dir, node_netns, tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# generated\n; also a comment\nnameserver 10.0.0.53\nnameserver fd00::53 x\n"
                      "domain example.test\nsearch a.test b.test\nsearch c.test\n"
                      "options ndots:5 edns0\nlonely\n\n")
    routes = [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.64.0.254"}]
    c = conf(data_dir, subnet="10.64.0.0/24", routes=routes, resolvConf=str(resolv))
    result = add(hl, c, node_netns)
    assert result["routes"] == routes
    assert result["dns"] == {"nameservers": ["10.0.0.53", "fd00::53"], "domain": "example.test",
                             "search": ["a.test", "b.test", "c.test"],
                             "options": ["ndots:5", "edns0"]}
    missing = conf(data_dir, subnet="10.64.0.0/24", resolvConf=str(tmp_path / "nope"))
    err = fails(add, hl, missing, node_netns, cid="c2")
    assert err.code == 7 and "resolvConf" in err.msg
    assert list(allocated(data_dir)) == ["10.64.0.2"], "a failed ADD allocates nothing"


# --- defaults and validation ----------------------------------------------------


def test_ipv4_network_broadcast_and_gateway_never_allocated(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.65.0.0/29", rangeStart="10.65.0.0", rangeEnd="10.65.0.7",
             gateway="10.65.0.4")
    got = []
    for i in range(10):
        run = run_plugin_raw(hl, "ADD", c, container_id=f"c{i}", netns=NETNS, node=node_netns)
        if run.exit_code:
            assert run.doc["code"] == 50
            break
        got.append(addrs(run.doc)[0].split("/")[0])
    assert got == ["10.65.0.1", "10.65.0.2", "10.65.0.3", "10.65.0.5", "10.65.0.6"]


def test_ipv6_range_end_defaults_to_last_address(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="fd65::/126")
    got = [addrs(add(hl, c, node_netns, cid=f"c{i}"))[0] for i in range(2)]
    assert got == ["fd65::2/126", "fd65::3/126"]


BAD_CONFIGS = [
    ({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.1.0.0/25"}]]},
     "range set 0 overlaps with 1: 10.1.0.1-10.1.0.254 and 10.1.0.1-10.1.0.126"),
    ({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.1.0.0/24",
                                               "rangeStart": "10.1.0.100"}]]},
     "invalid range set 0: subnets 10.1.0.1-10.1.0.254 and 10.1.0.100-10.1.0.254 overlap"),
    ({"subnet": "10.1.0.0/24", "gateway": "10.2.0.1"},
     "invalid range set 0: Gateway 10.2.0.1 not in network 10.1.0.0/24"),
    ({"subnet": "10.1.0.0/24", "rangeStart": "10.3.0.1"},
     "invalid range set 0: RangeStart 10.3.0.1 not in network 10.1.0.0/24"),
    ({"ranges": [[{"subnet": "fd01::/64"}], [{"subnet": "10.1.0.0/24", "rangeEnd": "fd01::9"}]]},
     "invalid range set 1: RangeEnd fd01::9 not in network 10.1.0.0/24"),
    ({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.9", "rangeEnd": "10.1.0.8"},
     "invalid range set 0: RangeStart 10.1.0.9 is after RangeEnd 10.1.0.8 in network "
     "10.1.0.0/24"),
    ({"subnet": "10.1.0.0/31"}, "invalid range set 0: Network 10.1.0.0/31 too small to "
                                "allocate from"),
    ({"subnet": "10.1.0.7/32"}, "invalid range set 0: Network 10.1.0.7/32 too small to "
                                "allocate from"),
    ({"subnet": "fd01::/127"}, "invalid range set 0: Network fd01::/127 too small to "
                               "allocate from"),
    ({"subnet": "10.1.0.5/24"}, "invalid range set 0: Network has host bits set. For a subnet "
                                "mask of length 24 the network address is 10.1.0.0"),
    ({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "fd01::/64"}]]},
     "invalid range set 0: mixed address families"),
    ({"ranges": [[]]}, "invalid range set 0: empty range set"),
    ({"ranges": [[{"rangeStart": "10.1.0.4"}]]}, "invalid range set 0: missing subnet"),
    ({"subnet": "10.1.0.0/30", "gateway": "10.1.0.2", "rangeStart": "10.1.0.2"},
     "invalid range set 0: no allocatable address in 10.1.0.2-10.1.0.2"),
    ({}, "no IP ranges specified"),
    ({"subnet": "10.1.0.0/33"}, "invalid network config: ipam.subnet"),
]


@pytest.mark.parametrize("ipam,message", BAD_CONFIGS, ids=[m[:40] for _, m in BAD_CONFIGS])
def test_invalid_ranges_are_code_7(hl, data_dir, node_netns, ipam, message):
    err = fails(add, hl, conf(data_dir, **ipam), node_netns)
    assert err.code == 7
    assert err.msg.startswith(message), err


def test_missing_ipam_and_too_many_sets_for_old_versions(hl, data_dir, node_netns):
    err = fails(add, hl, {"cniVersion": "1.0.0", "name": NET, "type": "x"}, node_netns)
    assert (err.code, err.msg) == (7, "IPAM config missing 'ipam' key")
    two_v4 = conf(data_dir, "0.2.0", ranges=[[{"subnet": "10.1.0.0/24"}],
                                              [{"subnet": "10.2.0.0/24"}]])
    err = fails(add, hl, two_v4, node_netns)
    assert (err.code, err.msg) == (7, "CNI version 0.2.0 does not support more than 1 address "
                                      "per family")
    assert not (data_dir / NET).exists()


# --- dual stack and result shape per version -------------------------------------


def shape(doc):
    """The document with every address replaced by its family and prefix."""
    if isinstance(doc, dict):
        return {k: shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [shape(v) for v in doc]
    if isinstance(doc, str) and "/" in doc:
        try:
            iface = ipaddress.ip_interface(doc)
        except ValueError:
            return doc
        return f"<v{iface.version}/{iface.network.prefixlen}>"
    return doc


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_dual_stack_result_shape_matches_go(hl, data_dir, node_netns, version):
    # Go 1.1.1 speaks up to 1.0.0: 1.1.0 has the 1.0.0 shape.
    vec = load_vector(f"host-local-add-dualstack-{'1.0.0' if version == '1.1.0' else version}")
    stdin = json.loads(vec["stdin"])
    stdin["cniVersion"] = version
    stdin["ipam"]["dataDir"] = str(data_dir)
    env = {"PATH": os.environ["PATH"], **vec["env"]}
    run = run_plugin_raw(hl, "", stdin, env=env, replace_env=True, node=node_netns)
    assert run.exit_code == 0, run
    # Go 1.1.1's document as Go >= 1.6 (and ours) print it: no empty dns in 1.x
    expected = printed(dict(vec["stdout"], cniVersion=version))
    assert shape(run.doc) == shape(expected)
    assert list(run.doc) == list(expected), "same key order as Go"
    ips = [v for k, v in run.doc.items() if k in ("ip4", "ip6")] or run.doc["ips"]
    got = [ipaddress.ip_interface(ip.get("ip") or ip.get("address")) for ip in ips]
    assert [str(i.network) for i in got] == ["10.67.0.0/24", "fd67::/64"]
    assert all(i.ip != i.network.network_address + 1 for i in got), "never the gateway"


def test_slash30_vector_then_exhaustion_vector(hl, data_dir, node_netns):
    """host-local-slash30-first-add and err-range-exhausted replayed. Ours
    answers 50 where Go answers 999 (see HostLocal's docstring)."""
    for name, code in (("host-local-slash30-first-add", 0), ("err-range-exhausted", 50)):
        vec = load_vector(name)
        stdin = json.loads(vec["stdin"])
        stdin["ipam"]["dataDir"] = str(data_dir)
        env = {"PATH": os.environ["PATH"], **vec["env"]}
        run = run_plugin_raw(hl, "", stdin, env=env, replace_env=True, node=node_netns)
        if code == 0:
            assert run.exit_code == 0 and run.doc == printed(vec["stdout"])
        else:
            assert vec["stdout"]["code"] == 999
            assert run.exit_code == 1 and run.doc["code"] == code
            assert run.doc["msg"] == vec["stdout"]["msg"]
    assert allocated(data_dir, "n30") == {"10.69.0.2": b"c9\r\neth0"}


def test_cni_args_unknown_vector_is_code_4(hl, data_dir, node_netns):
    vec = load_vector("err-cni-args-unknown")
    stdin = json.loads(vec["stdin"])
    stdin["ipam"]["dataDir"] = str(data_dir)
    env = {"PATH": os.environ["PATH"], **vec["env"]}
    run = run_plugin_raw(hl, "", stdin, env=env, replace_env=True, node=node_netns)
    assert vec["stdout"]["code"] == 999
    assert run.exit_code == 1
    assert (run.doc["code"], run.doc["msg"]) == (4, 'CNI_ARGS: unknown args ["FOO=bar"]')
    assert not data_dir.exists()


def test_cni_args_ignore_unknown_vector(hl, data_dir, node_netns):
    vec = load_vector("cni-args-ignoreunknown-ip")
    stdin = json.loads(vec["stdin"])
    stdin["ipam"]["dataDir"] = str(data_dir)
    env = {"PATH": os.environ["PATH"], **vec["env"]}
    run = run_plugin_raw(hl, "", stdin, env=env, replace_env=True, node=node_netns)
    assert run.exit_code == 0 and run.doc == printed(vec["stdout"])


# --- requested addresses --------------------------------------------------------

DUAL = {"ranges": [[{"subnet": "10.70.0.0/24"}], [{"subnet": "fd70::/64"}]]}


@pytest.mark.parametrize("source", ["runtimeConfig", "args", "CNI_ARGS"])
def test_requested_addresses_from_each_source(hl, data_dir, node_netns, source):
    wanted = ["10.70.0.50/24", "fd70::50"]  # with and without a prefix
    top, cni_args = {}, ""
    if source == "runtimeConfig":
        top = {"runtimeConfig": {"ips": wanted}}
    elif source == "args":
        top = {"args": {"cni": {"ips": wanted}}}
    else:
        cni_args = "IgnoreUnknown=1;K8S_POD_NAME=p;IP=" + ",".join(wanted)
    result = add(hl, conf(data_dir, top=top, **DUAL), node_netns, cni_args=cni_args)
    assert addrs(result) == ["10.70.0.50/24", "fd70::50/64"]
    assert sorted(allocated(data_dir)) == ["10.70.0.50", "fd70::50"]


def test_requested_in_one_set_allocated_in_the_other(hl, data_dir, node_netns):
    c = conf(data_dir, top={"runtimeConfig": {"ips": ["fd70::77"]}}, **DUAL)
    assert addrs(add(hl, c, node_netns)) == ["10.70.0.2/24", "fd70::77/64"]


def test_cni_args_ip_ignored_when_args_ips_given(hl, data_dir, node_netns):
    # CONVENTIONS.md: a plugin that understands args.cni.ips must ignore CNI_ARGS IP.
    c = conf(data_dir, top={"args": {"cni": {"ips": ["10.70.0.60"]}}}, **DUAL)
    result = add(hl, c, node_netns, cni_args="IP=10.70.0.61,fd70::61")
    assert addrs(result) == ["10.70.0.60/24", "fd70::2/64"]


@pytest.mark.parametrize("top,cni_args,code,fragment", [
    ({"runtimeConfig": {"ips": ["10.70.0.50", "10.99.0.1"]}}, "", 7,
     "failed to allocate all requested IPs: 10.99.0.1"),
    ({"args": {"cni": {"ips": ["10.70.0.50", "10.70.0.51"]}}}, "", 7,
     "failed to allocate all requested IPs: 10.70.0.51"),
    ({}, "IP=10.70.0.1", 4, "requested ip 10.70.0.1 is subnet's gateway"),
    ({}, "IP=10.70.0.255", 4, "failed to allocate all requested IPs: 10.70.0.255"),
    ({}, "IP=fd70::5,10.99.0.1", 4, "failed to allocate all requested IPs: 10.99.0.1"),
    ({}, "IP=10.70.0.300", 4, "CNI_ARGS"),
    ({"runtimeConfig": {"ips": ["not-an-ip"]}}, "", 7, "runtimeConfig.ips"),
])
def test_requests_are_all_or_nothing(hl, data_dir, node_netns, top, cni_args, code, fragment):
    err = fails(add, hl, conf(data_dir, top=top, **DUAL), node_netns, cni_args=cni_args)
    assert err.code == code and fragment in err.msg, err
    assert allocated(data_dir) == {}, "nothing allocated"
    assert not (data_dir / NET / "last_reserved_ip.0").exists()


def test_requested_network_or_broadcast_address(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.70.0.0/24", rangeStart="10.70.0.0", rangeEnd="10.70.0.255")
    for ip in ("10.70.0.0", "10.70.0.255"):
        err = fails(add, hl, c, node_netns, cni_args=f"IP={ip}")
        assert err.code == 4
        assert err.msg == (f"failed to allocate for range 0: requested ip {ip} is the network "
                           "or broadcast address of 10.70.0.0/24")
    assert allocated(data_dir) == {}


def test_requested_address_held_by_another(hl, data_dir, node_netns):
    c = conf(data_dir, top={"runtimeConfig": {"ips": ["10.70.0.50"]}}, **DUAL)
    add(hl, c, node_netns, cid="first")
    err = fails(add, hl, c, node_netns, cid="second")
    assert err.code == 7
    assert err.msg == ("failed to allocate for range 0: requested IP address 10.70.0.50 is not "
                       "available in range set 10.70.0.1-10.70.0.254")
    assert sorted(allocated(data_dir)) == ["10.70.0.50", "fd70::2"]


def test_ip_ranges_capability_comes_first(hl, data_dir, node_netns):
    # As Go's LoadIPAMConfig: runtimeConfig.ipRanges are prepended to the
    # configured range sets (checked against Debian's Go host-local).
    top = {"capabilities": {"ipRanges": True},
           "runtimeConfig": {"ipRanges": [[{"subnet": "10.71.0.0/24", "rangeStart": "10.71.0.10"}],
                                          [{"subnet": "fd71::/64"}]]}}
    result = add(hl, conf(data_dir, top=top, subnet="10.72.0.0/24"), node_netns)
    assert addrs(result) == ["10.71.0.10/24", "fd71::2/64", "10.72.0.2/24"]


# --- allocation order, duplicates, exhaustion -------------------------------------


def test_round_robin_after_last_reserved(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.73.0.0/29")  # .2 .. .6 allocatable
    assert addrs(add(hl, c, node_netns, cid="a")) == ["10.73.0.2/29"]
    assert addrs(add(hl, c, node_netns, cid="b")) == ["10.73.0.3/29"]
    delete(hl, c, node_netns, cid="a")
    assert addrs(add(hl, c, node_netns, cid="c")) == ["10.73.0.4/29"], "not the freed .2"
    assert addrs(add(hl, c, node_netns, cid="d")) == ["10.73.0.5/29"]
    assert addrs(add(hl, c, node_netns, cid="e")) == ["10.73.0.6/29"]
    assert addrs(add(hl, c, node_netns, cid="f")) == ["10.73.0.2/29"], "wraps around"
    err = fails(add, hl, c, node_netns, cid="g")
    assert err.code == 50
    assert err.msg == ("failed to allocate for range 0: no IP addresses available in range "
                       "set: 10.73.0.1-10.73.0.6")
    # A last_reserved_ip outside the set (config changed) starts from rangeStart.
    (data_dir / NET / "last_reserved_ip.0").write_text("192.0.2.1")
    delete(hl, c, node_netns, cid="d")
    delete(hl, c, node_netns, cid="b")
    assert addrs(add(hl, c, node_netns, cid="h")) == ["10.73.0.3/29"]


def test_second_add_for_same_attachment_is_refused(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    add(hl, c, node_netns)
    before = allocated(data_dir)
    err = fails(add, hl, c, node_netns)
    assert err.code == 4
    assert err.msg == ("failed to allocate for range 0: 10.70.0.2 has been allocated to c1, "
                       "duplicate allocation is not allowed")
    assert allocated(data_dir) == before
    assert len(addrs(add(hl, c, node_netns, ifname="net1"))) == 2, "another ifname is fine"


# --- DEL --------------------------------------------------------------------------


def test_del_releases_every_set_and_is_idempotent(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    add(hl, c, node_netns, cid="keep")
    add(hl, c, node_netns, cid="c1")
    add(hl, c, node_netns, cid="c1", ifname="net1")
    for _ in range(2):
        assert delete(hl, c, node_netns) is None
    assert sorted(allocated(data_dir).values()) == [b"c1\r\nnet1"] * 2 + [b"keep\r\neth0"] * 2
    # DEL after the config lost its ranges still finds the store.
    assert delete(hl, conf(data_dir), node_netns, ifname="net1") is None
    assert sorted(allocated(data_dir).values()) == [b"keep\r\neth0"] * 2


def test_del_with_missing_data_dir(hl, data_dir, node_netns):
    assert delete(hl, conf(data_dir, **DUAL), node_netns) is None
    assert not data_dir.exists(), "DEL creates nothing"


def test_old_go_files_hold_the_container_id_only(hl, data_dir, node_netns):
    c = conf(data_dir, subnet="10.74.0.0/24")
    (data_dir / NET).mkdir(parents=True)
    (data_dir / NET / "10.74.0.9").write_bytes(b"oldctr\n")
    check(hl, c, node_netns, cid="oldctr", ifname="eth7")
    err = fails(add, hl, c, node_netns, cid="oldctr", ifname="eth7")
    assert err.code == 4 and "10.74.0.9 has been allocated to oldctr" in err.msg
    delete(hl, c, node_netns, cid="oldctr", ifname="eth7")
    assert allocated(data_dir) == {}


# --- CHECK ------------------------------------------------------------------------


def test_check(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    result = add(hl, c, node_netns)
    assert check(hl, {**c, "prevResult": result}, node_netns) is None
    err = fails(check, hl, c, node_netns, cid="other")
    assert (err.code, err.msg) == (3, "host-local: Failed to find address added by container "
                                      "other")
    (data_dir / NET / "fd70::2").unlink()
    err = fails(check, hl, c, node_netns)
    assert err.code == 999 and "no address in range set 1: fd70::1-" in err.msg
    err = fails(check, hl, conf(data_dir, "0.3.1", **DUAL), node_netns)
    assert err.code == 1, "CHECK needs 0.4.0"


# --- GC ---------------------------------------------------------------------------


def gc_conf(data_dir, valid, **kw):
    c = conf(data_dir, **DUAL, **kw)
    if valid is not ...:
        c["cni.dev/valid-attachments"] = valid
    return c


def test_gc_removes_exactly_the_unlisted(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    for cid, ifname in [("a", "eth0"), ("a", "net1"), ("b", "eth0"), ("c", "eth0")]:
        add(hl, c, node_netns, cid=cid, ifname=ifname)
    other = conf(data_dir, name="othernet", subnet="10.75.0.0/24")
    add(hl, other, node_netns, cid="zzz")
    (data_dir / NET / "10.70.0.200").write_bytes(b"legacy")  # old Go file, listed ID
    (data_dir / NET / "10.70.0.201").write_bytes(b"gone")    # old Go file, unlisted ID
    valid = [{"containerID": "a", "ifname": "net1"}, {"containerID": "c", "ifname": "eth0"},
             {"containerID": "legacy", "ifname": "eth3"}]
    assert verb(hl, "GC", gc_conf(data_dir, valid), node_netns) is None
    owners = sorted(allocated(data_dir).values())
    assert owners == [b"a\r\nnet1"] * 2 + [b"c\r\neth0"] * 2 + [b"legacy"]
    assert list(allocated(data_dir, "othernet").values()) == [b"zzz\r\neth0"]
    # The ifname matters: a listed container with another ifname is released.
    valid = [{"containerID": "a", "ifname": "eth9"}]
    verb(hl, "GC", gc_conf(data_dir, valid), node_netns)
    assert allocated(data_dir) == {}
    assert list(allocated(data_dir, "othernet").values()) == [b"zzz\r\neth0"]


def test_gc_null_means_none_valid_and_missing_key_releases_nothing(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    add(hl, c, node_netns)
    err = fails(verb, hl, "GC", gc_conf(data_dir, ...), node_netns)
    assert err.code == 7 and "valid-attachments" in err.msg
    assert len(allocated(data_dir)) == 2
    # libcni's second key (cni.dev/attachments) is read too.
    c2 = gc_conf(data_dir, ...)
    c2["cni.dev/attachments"] = [{"containerID": "c1", "ifname": "eth0"}]
    verb(hl, "GC", c2, node_netns)
    assert len(allocated(data_dir)) == 2
    verb(hl, "GC", gc_conf(data_dir, None), node_netns)
    assert allocated(data_dir) == {}
    absent = data_dir / "absent"
    assert verb(hl, "GC", gc_conf(absent, []), node_netns) is None
    assert not absent.exists()
    err = fails(verb, hl, "GC", gc_conf(data_dir, [], version="1.0.0"), node_netns)
    assert err.code == 1, "GC needs 1.1.0"


def test_gc_keeps_going_past_bad_files(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    add(hl, c, node_netns, cid="stale")
    d = data_dir / NET
    (d / "10.70.0.90").mkdir()                       # not a file
    (d / "10.70.0.91").symlink_to("/etc/hostname")   # never followed
    (d / "10.70.0.92").write_bytes(b"")              # names nobody: a crashed writer's
    (d / "10.70.0.93").write_bytes(b"\xff\xfe\r\n\x00")
    (d / ".tmp-crashed").write_bytes(b"half")        # atomic_write leftover
    (d / "notes.txt").write_text("not ours to judge")
    err = fails(verb, hl, "GC", gc_conf(data_dir, []), node_netns)
    assert err.code == 5 and "2 entries" in err.msg
    assert "10.70.0.90" in err.details and "10.70.0.91" in err.details
    assert sorted(p.name for p in d.iterdir()) == [
        ".cni-skel-index", "10.70.0.90", "10.70.0.91", "last_reserved_ip.0",
        "last_reserved_ip.1", "lock", "notes.txt"]
    assert os.path.exists("/etc/hostname")


# --- STATUS -----------------------------------------------------------------------


def test_status(hl, data_dir, node_netns, tmp_path):
    c = conf(data_dir, ranges=[[{"subnet": "10.76.0.0/30"}], [{"subnet": "fd76::/64"}]])
    assert verb(hl, "STATUS", c, node_netns) is None
    assert [p.name for p in (data_dir / NET).iterdir()] == ["lock"], "no probe left behind"
    add(hl, c, node_netns)
    err = fails(verb, hl, "STATUS", c, node_netns)
    assert err.code == 50
    assert err.msg == "host-local: no IP addresses available in range set 0: 10.76.0.1-10.76.0.2"
    delete(hl, c, node_netns)
    assert verb(hl, "STATUS", c, node_netns) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = fails(verb, hl, "STATUS", conf(blocker / "sub", subnet="10.76.0.0/24"), node_netns)
    assert err.code == 50 and "not writable" in err.msg
    err = fails(verb, hl, "STATUS", {**c, "cniVersion": "1.0.0"}, node_netns)
    assert err.code == 1


# --- safety -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", "../escape", "a/b", "/abs", ".hidden", ""])
def test_network_name_cannot_escape_data_dir(hl, data_dir, node_netns, name):
    err = fails(add, hl, conf(data_dir, name=name, subnet="10.77.0.0/24"), node_netns)
    assert err.code == 7
    assert not data_dir.exists() and not (data_dir.parent / "escape").exists()


@pytest.mark.parametrize("cid", ["../../x", "a/b", ".x", "a\r\nb"])
def test_container_id_cannot_escape_or_forge_records(hl, data_dir, node_netns, cid):
    c = conf(data_dir, subnet="10.77.0.0/24")
    for fn in (add, check):
        assert fails(fn, hl, c, node_netns, cid=cid).code == 4
    # DEL of an attachment ADD refuses succeeds and touches nothing (test_del_bytes.py)
    assert delete(hl, c, node_netns, cid=cid) is None
    assert not data_dir.exists()


def test_store_rejects_path_names():
    for name in ("..", "../x", "a/b", "", "."):
        with pytest.raises(ValueError):
            Store("/tmp/unused", name)


CRASH = """
import os, sys
from cni_skel_plugins.host_local import HostLocal, store
def crash(*a, **k):
    os._exit(137)   # killed after the address files, before last_reserved_ip and the result
store.Store.set_last_reserved = crash
env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": sys.argv[2], "CNI_IFNAME": "eth0",
       "CNI_NETNS": "/x", "CNI_PATH": "/x"}
HostLocal.dispatch(env, sys.argv[1].encode())
"""


def test_crash_after_allocation_is_cleaned_by_del_or_gc(hl, data_dir, node_netns):
    c = conf(data_dir, **DUAL)
    for cid in ("crash1", "crash2"):
        proc = subprocess.run([sys.executable, "-c", CRASH, json.dumps(c), cid],
                              capture_output=True, check=False)
        assert proc.returncode == 137 and proc.stdout == b""
    assert sorted(allocated(data_dir).values()) == [b"crash1\r\neth0"] * 2 + \
        [b"crash2\r\neth0"] * 2
    delete(hl, c, node_netns, cid="crash1")
    verb(hl, "GC", gc_conf(data_dir, []), node_netns)
    assert allocated(data_dir) == {}
    # The lock was released with the dead process: the next ADD goes through.
    assert addrs(add(hl, c, node_netns)) == ["10.70.0.2/24", "fd70::2/64"]


def test_host_local_never_imports_pyroute2(data_dir):
    code = """
import sys
from cni_skel_plugins.host_local import HostLocal
env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
       "CNI_NETNS": "/x", "CNI_PATH": "/x"}
out, rc = HostLocal.dispatch(env, sys.argv[1].encode())
assert rc == 0, out
for cmd in ("CHECK", "DEL"):
    env["CNI_COMMAND"] = cmd
    assert HostLocal.dispatch(env, sys.argv[1].encode())[1] == 0
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pyroute2", "cni_skel")))
"""
    c = json.dumps(conf(data_dir, **DUAL))
    out = subprocess.run([sys.executable, "-I", "-c", code, c], capture_output=True, text=True,
                         check=True).stdout
    modules = json.loads(out.replace("'", '"'))
    assert "cni_skel.netlink" not in modules and "cni_skel.netns" not in modules
    assert not any(m.startswith("pyroute2") for m in modules)


def test_version_and_about_stay_light(hl):
    """podman runs VERSION before every command: no pydantic, no pyroute2."""
    for command in ("VERSION", ""):
        env = {"PATH": os.environ["PATH"], **({"CNI_COMMAND": command} if command else {})}
        proc = subprocess.run(python_argv(hl, ("-X", "importtime")),
                              input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True,
                              check=False)
        assert proc.returncode == 0
        imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                    if line.startswith("import time:")}
        assert not {m for m in imported if m.split(".")[0] in ("pydantic", "pyroute2")}
        if command:
            assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"
        else:
            assert "host-local" in proc.stderr.decode()
