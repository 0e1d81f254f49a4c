"""static through the real executable, side by side with each Go yardstick
(Debian's 1.1.1, upstream 1.9.1 when built: tests/yardsticks.py, the
differences accepted named there) given the same environment and stdin: the same
result key for key at every version Go speaks, the address sources
(``ipam.addresses``, CNI_ARGS ``IP``/``GATEWAY``, ``args.cni.ips``,
``runtimeConfig.ips``) merged and overridden as Go does, Go's error texts
(with the spec's code where Go answers 999), CHECK, DEL, GC and STATUS;
then static as the IPAM of our ptp and bridge (against Go's ptp and bridge
with Go's static), in namespaces, the pod's addresses read back from the
kernel. Each test runs in both modes (oneshot, warm) through `cni_bin`."""

from __future__ import annotations

import os

import pytest
from test_bridge_go import GO_VERSIONS, masked
from test_ptp import kernel_state
from yardsticks import Yardstick, as_go, differs, key_order

from cni_skel import netlink
from cni_skel.harness import run_plugin, run_plugin_raw
from cni_skel.netns import NetNS

NETNS = "/run/netns/cnsk-st-unused"  # static never enters it
NET = "stnet"
DUAL = [{"address": "10.70.0.5/24", "gateway": "10.70.0.1"},
        {"address": "fd00:70::5/64", "gateway": "fd00:70::1"}]
ROUTES = [{"dst": "0.0.0.0/0"}, {"dst": "10.71.0.0/16", "gw": "10.70.0.254"},
          {"dst": "::/0", "gw": "fd00:70::1"}]
DNS = {"nameservers": ["10.70.0.53"], "domain": "st.test", "search": ["a.test"],
       "options": ["ndots:2"]}


class Impls(dict):
    """``ours`` and ``go``, the executables; ``y``, the yardstick of Go's."""

    y: Yardstick


@pytest.fixture(scope="session")
def impls(cni_bin: str, go_yardstick: Yardstick) -> Impls:
    i = Impls(ours=os.path.join(cni_bin, "static"), go=go_yardstick.exe("static"))
    i.y = go_yardstick
    return i


def conf(version="1.0.0", top=None, **ipam) -> dict:
    c = {"cniVersion": version, "name": NET, "type": "bridge", "ipam": {"type": "static", **ipam}}
    c.update(top or {})
    return c


def raw(exe, cmd, c, node, cni_args="", cid="st-c1"):
    return run_plugin_raw(exe, cmd, c, container_id=cid, netns=NETNS, cni_args=cni_args,
                          node=node)


def both(impls, cmd, c, node, cni_args="") -> tuple:
    """The same call to ours and to Go's: their `PluginRun`s."""
    return tuple(raw(impls[who], cmd, c, node, cni_args) for who in ("ours", "go"))


def same_success(impls, cmd, c, node, cni_args="") -> dict | None:
    """Both succeed with the same document (None for CHECK and DEL), ours
    read as Go's version prints it (`as_go`), keys in Go's order: ours."""
    ours, go = both(impls, cmd, c, node, cni_args)
    assert go.exit_code == 0, go
    assert ours.exit_code == 0, ours
    mine = as_go(impls.y, "static", ours.doc)
    assert mine == go.doc
    if mine is not None:
        assert key_order(impls.y, "static", mine) == list(go.doc), "same key order"
    return ours.doc


def verb(exe, cmd, c, node):
    """STATUS/GC: no container, no netns, no ifname."""
    return run_plugin(exe, cmd, c, container_id="", ifname="", netns="", node=node)


# --- results -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", GO_VERSIONS)
def test_result_equals_go(impls, node_netns, version):
    """Every version Go speaks: the same document, key for key and in order,
    for dual stack with gateways, routes of both families and dns (0.1.0 and
    0.2.0: ip4/ip6, each with its family's routes)."""
    doc = same_success(impls, "ADD", conf(version, addresses=DUAL, routes=ROUTES, dns=DNS),
                       node_netns)
    if version == "1.0.0":
        assert doc == {"cniVersion": "1.0.0", "ips": DUAL, "routes": ROUTES, "dns": DNS}
    elif version == "0.2.0":
        assert doc == {"cniVersion": "0.2.0",
                       "ip4": {"ip": "10.70.0.5/24", "gateway": "10.70.0.1",
                               "routes": ROUTES[:2]},
                       "ip6": {"ip": "fd00:70::5/64", "gateway": "fd00:70::1",
                               "routes": ROUTES[2:]},
                       "dns": DNS}


def test_result_at_110(impls, node_netns):
    """1.1.0, which Go 1.1.1 does not speak (code 1): the 1.0.0 document
    (later Go's too)."""
    c = conf("1.1.0", addresses=DUAL, routes=ROUTES, dns=DNS)
    if differs(impls.y, "static", "cniVersion 1.1.0"):
        doc = same_success(impls, "ADD", c, node_netns)
    else:
        ours, go = both(impls, "ADD", c, node_netns)
        assert go.doc["code"] == 1 and go.doc["msg"] == "incompatible CNI versions"
        doc = ours.doc
    assert doc == {"cniVersion": "1.1.0", "ips": DUAL, "routes": ROUTES, "dns": DNS}


@pytest.mark.parametrize("addresses,want", [
    # host bits kept; a gateway of any family, or none ("" and null: none)
    ([{"address": "10.70.0.5/16"}, {"address": "fd00:70::5/48", "gateway": ""},
      {"address": "10.70.9.9/8", "gateway": None}],
     [{"address": "10.70.0.5/16"}, {"address": "fd00:70::5/48"}, {"address": "10.70.9.9/8"}]),
    ([{"address": "10.70.0.5/24", "gateway": "fd00:70::1"}],
     [{"address": "10.70.0.5/24", "gateway": "fd00:70::1"}]),
    # the same address twice is no error
    ([{"address": "10.70.0.5/24"}, {"address": "10.70.0.5/24"}],
     [{"address": "10.70.0.5/24"}, {"address": "10.70.0.5/24"}]),
    # a leading zero in the prefix length is read, as Go's ParseCIDR does
    ([{"address": "10.70.0.5/024"}], [{"address": "10.70.0.5/24"}]),
    # IPv4-mapped: IPv4, the prefix less 96 (Go's canonicalizeIP and IPNet printing)
    ([{"address": "::ffff:10.70.0.5/120", "gateway": "::ffff:10.70.0.1"}],
     [{"address": "10.70.0.5/24", "gateway": "10.70.0.1"}]),
    ([{"address": "::ffff:10.70.0.5/64"}], [{"address": "10.70.0.5/0"}]),
    ([], None),
], ids=["no-gateway", "other-family-gateway", "twice", "prefix-zero", "v4-mapped",
        "v4-mapped-short", "none"])
def test_configured_addresses_as_go(impls, node_netns, addresses, want):
    doc = same_success(impls, "ADD", conf(addresses=addresses), node_netns)
    assert doc.get("ips") == want
    assert "dns" not in doc  # empty: left out of a 1.x result, as Go >= 1.6 (1.1.1: {})


def test_keys_match_case_insensitively(impls, node_netns):
    """Go's JSON decoding folds case (``IPAM``, ``Addresses``, ``Gateway``,
    ``RuntimeConfig.IPs``)."""
    c = {"cniVersion": "1.0.0", "name": NET, "IPAM": {
        "Type": "static", "Addresses": [{"address": "10.70.0.5/24", "Gateway": "10.70.0.1"}],
        "Routes": [{"Dst": "0.0.0.0/0"}], "DNS": {"Nameservers": ["10.70.0.53"]}}}
    doc = same_success(impls, "ADD", c, node_netns)
    assert doc == {"cniVersion": "1.0.0", "ips": [{"address": "10.70.0.5/24",
                                                   "gateway": "10.70.0.1"}],
                   "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.70.0.53"]}}
    c["RuntimeConfig"] = {"IPs": ["10.70.0.6/24"]}
    assert same_success(impls, "ADD", c, node_netns)["ips"] == [{"address": "10.70.0.6/24"}]


def test_address_key_capitalised(impls, node_netns):
    """Deliberate: ``"Address"`` (capitalised so) is the address, as every
    key matches case-insensitively; Go's decoder puts it in an internal
    ``Address`` field of its struct and fails (999)."""
    c = conf(addresses=[{"Address": "10.70.0.5/24"}])
    ours, go = both(impls, "ADD", c, node_netns)
    assert ours.doc["ips"] == [{"address": "10.70.0.5/24"}]
    assert go.doc["code"] == 999 and "net.IPNet" in go.doc["msg"]


# --- the address sources -------------------------------------------------------------------

CFG = [{"address": "10.70.0.5/24", "gateway": "10.70.0.1"}]
CNI_IPS = {"args": {"cni": {"ips": ["10.72.0.5/24", "fd00:72::5/64"]}}}
RT_IPS = {"runtimeConfig": {"ips": ["10.73.0.5/24"]}}


@pytest.mark.parametrize("cni_args,top,want", [
    # CNI_ARGS IP is added after the configured addresses; each GATEWAY goes
    # to every CNI_ARGS address whose subnet holds it, by family
    ("IP=10.71.0.5/24,fd00:71::5/64;GATEWAY=fd00:71::1,10.71.0.1", {},
     [CFG[0], {"address": "10.71.0.5/24", "gateway": "10.71.0.1"},
      {"address": "fd00:71::5/64", "gateway": "fd00:71::1"}]),
    # one gateway for two addresses; a later one of the same subnet wins
    ("IP=10.71.0.5/24,10.71.0.6/24;GATEWAY=10.71.0.1", {},
     [CFG[0], {"address": "10.71.0.5/24", "gateway": "10.71.0.1"},
      {"address": "10.71.0.6/24", "gateway": "10.71.0.1"}]),
    ("IP=10.71.0.5/24;GATEWAY=10.71.0.1,10.71.0.2", {},
     [CFG[0], {"address": "10.71.0.5/24", "gateway": "10.71.0.2"}]),
    # a GATEWAY no CNI_ARGS subnet holds is ignored, and it never changes a
    # configured address (Go tests those before it has parsed them)
    ("IP=10.71.0.5/24;GATEWAY=10.70.0.254,fd00:71::1", {},
     [CFG[0], {"address": "10.71.0.5/24"}]),
    ("GATEWAY=10.70.0.254", {}, CFG),
    # spaces around list items are dropped; an IPv4-mapped gateway is IPv4
    ("IP= 10.71.0.5/24 ;GATEWAY= ::ffff:10.71.0.1", {},
     [CFG[0], {"address": "10.71.0.5/24", "gateway": "10.71.0.1"}]),
    ("IP=", {}, CFG),
    ("IP=10.71.0.5/24;K8S_POD_NAME=p;IgnoreUnknown=1", {}, [CFG[0], {"address": "10.71.0.5/24"}]),
    # args.cni.ips replaces the configured and the CNI_ARGS addresses and
    # their gateways; runtimeConfig.ips replaces all of those
    ("IP=10.71.0.5/24;GATEWAY=10.71.0.1", CNI_IPS,
     [{"address": "10.72.0.5/24"}, {"address": "fd00:72::5/64"}]),
    ("IP=10.71.0.5/24", {**CNI_IPS, **RT_IPS}, [{"address": "10.73.0.5/24"}]),
    ("", RT_IPS, [{"address": "10.73.0.5/24"}]),
    # empty or null lists replace nothing; a null runtimeConfig or args is none
    ("IP=10.71.0.5/24", {"args": {"cni": {"ips": []}}, "runtimeConfig": {"ips": None}},
     [CFG[0], {"address": "10.71.0.5/24"}]),
    ("", {"args": None, "runtimeConfig": None}, CFG),
    ("", {"args": {"cni": None}}, CFG),
], ids=["ip-and-gateway-by-family", "one-gateway-two-addresses", "last-gateway-wins",
        "gateway-outside", "gateway-without-ip", "spaces-and-mapped", "empty-ip",
        "ignore-unknown", "args-cni-ips-win", "runtime-config-wins", "runtime-config",
        "empty-lists", "null-objects", "null-cni"])
def test_sources_and_precedence_as_go(impls, node_netns, cni_args, top, want):
    doc = same_success(impls, "ADD", conf(top=top, addresses=CFG), node_netns, cni_args)
    assert doc["ips"] == want


def test_replaced_addresses_are_not_checked(impls, node_netns):
    """A configured address that is no CIDR is no error once args.cni.ips or
    runtimeConfig.ips replaced it, as in Go (it is parsed after the merge);
    CNI_ARGS IP does not replace it."""
    bad = [{"address": "10.70.0.5"}]
    for top in (RT_IPS, CNI_IPS):
        same_success(impls, "ADD", conf(top=top, addresses=bad), node_netns)
    ours, go = both(impls, "ADD", conf(addresses=bad), node_netns, "IP=10.71.0.5/24")
    assert ours.doc["msg"] == go.doc["msg"] == \
        "the 'address' field is expected to be in CIDR notation, got: '10.70.0.5'"


# --- refusals --------------------------------------------------------------------------

# (ipam, top, CNI_ARGS) -> (our code, our msg: Go's text when True, else a fragment of ours)
# Go answers 999 to all of them: the codes are the spec's (config 7, CNI_ARGS 4).
BAD = {
    "address-no-prefix": (dict(addresses=[{"address": "10.70.0.5"}]), {}, "", 7, True),
    "address-missing": (dict(addresses=[{"gateway": "10.70.0.1"}]), {}, "", 7, True),
    "address-null": (dict(addresses=[None]), {}, "", 7, True),
    "address-netmask": (dict(addresses=[{"address": "10.70.0.5/255.255.255.0"}]), {}, "", 7,
                        True),
    "address-prefix-too-long": (dict(addresses=[{"address": "10.70.0.5/33"}]), {}, "", 7, True),
    "address-zone": (dict(addresses=[{"address": "fe80::1%eth0/64"}]), {}, "", 7, True),
    "address-space": (dict(addresses=[{"address": " 10.70.0.5/24"}]), {}, "", 7, True),
    "address-not-a-string": (dict(addresses=[{"address": 5}]), {}, "", 7,
                             "ipam.addresses.0.address"),
    "addresses-not-a-list": (dict(addresses="10.70.0.5/24"), {}, "", 7, "ipam.addresses"),
    "gateway-bad": (dict(addresses=[{"address": "10.70.0.5/24", "gateway": "10.70.0.300"}]), {},
                    "", 7, "ipam.addresses.0.gateway"),
    "gateway-zone": (dict(addresses=[{"address": "fd00::5/64", "gateway": "fe80::1%eth0"}]), {},
                     "", 7, "ipam.addresses.0.gateway"),
    "route-bad": (dict(routes=[{"dst": "10.70.0.0"}]), {}, "", 7, "ipam.routes.0.dst"),
    "ipam-missing": (None, {}, "", 7, True),
    "ipam-not-an-object": ("static", {}, "", 7, "ipam"),
    "cni-args-ip-bare": ({}, {}, "IP=10.71.0.5", 4, True),
    "cni-args-ip-empty-item": ({}, {}, "IP=10.71.0.5/24,", 4, True),
    "cni-args-gateway-bad": ({}, {}, "IP=10.71.0.5/24;GATEWAY=nope", 4, True),
    "cni-args-gateway-empty-item": ({}, {}, "IP=10.71.0.5/24;GATEWAY=10.71.0.1,", 4, True),
    "cni-args-unknown": ({}, {}, "IP=10.71.0.5/24;FOO=bar", 4,
                         'CNI_ARGS: unknown args ["FOO=bar"]'),
    "cni-args-lower-case-key": ({}, {}, "ip=10.71.0.5/24", 4, "unknown args"),
    "args-cni-ips-bare": ({}, {"args": {"cni": {"ips": ["10.72.0.5"]}}}, "", 7, True),
    "args-cni-ips-bad-before-good-runtime-config": (
        {}, {"args": {"cni": {"ips": ["bad"]}}, **RT_IPS}, "", 7, True),
    "runtime-config-ips-bare": ({}, {"runtimeConfig": {"ips": ["10.73.0.5"]}}, "", 7, True),
    "runtime-config-ips-null-item": ({}, {"runtimeConfig": {"ips": [None]}}, "", 7, True),
    "runtime-config-ips-not-a-list": ({}, {"runtimeConfig": {"ips": "10.73.0.5/24"}}, "", 7,
                                      "runtimeConfig.ips"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_refusals_as_go(impls, node_netns, name):
    ipam, top, cni_args, code, text = BAD[name]
    c = conf(top=top)
    if ipam is None:
        del c["ipam"]
    elif isinstance(ipam, dict):
        c["ipam"].update(ipam)
    else:
        c["ipam"] = ipam
    ours, go = both(impls, "ADD", c, node_netns, cni_args)
    assert go.exit_code == 1 and go.doc["code"] == 999, go
    assert ours.exit_code == 1 and ours.doc["code"] == code, ours
    if text is True:
        assert ours.doc["msg"] == go.doc["msg"], (ours.doc, go.doc)
    else:
        assert text in ours.doc["msg"], ours.doc


def test_go_texts(impls, node_netns):
    """What the texts say, for the record (the same as Go's, as
    `test_refusals_as_go` holds)."""
    cases = [
        (conf(addresses=[{"gateway": "10.70.0.1"}]), "",
         "the 'address' field is expected to be in CIDR notation, got: ''"),
        (conf(), "IP=10.71.0.5", "the 'ip' field is expected to be in CIDR notation, got: "
                                 "'10.71.0.5'"),
        (conf(), "GATEWAY=nope", "invalid gateway address: nope"),
        (conf(top={"runtimeConfig": {"ips": ["x"]}}), "",
         "an entry in the 'ips' field is NOT in CIDR notation, got: 'x'"),
        ({"cniVersion": "1.0.0", "name": NET}, "", "IPAM config missing 'ipam' key"),
    ]
    for c, cni_args, msg in cases:
        assert raw(impls["ours"], "ADD", c, node_netns, cni_args).doc["msg"] == msg


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_before_030_one_address_per_family(impls, node_netns, version):
    """0.1.0/0.2.0 results hold one address of each family: a second one is
    refused with Go's text, code 7 (Go: 999), wherever it came from; no
    address at all is code 1, the result cannot be written in the version
    (Go: 999 ``cannot convert: no valid IP addresses``); one of each is fine."""
    for c, cni_args in ((conf(version, addresses=CFG), "IP=10.71.0.5/24"),
                        (conf(version, top={"runtimeConfig": {"ips": ["10.73.0.5/24",
                                                                      "10.73.0.6/24"]}}), "")):
        ours, go = both(impls, "ADD", c, node_netns, cni_args)
        assert (ours.doc["code"], go.doc["code"]) == (7, 999)
        assert ours.doc["msg"] == go.doc["msg"] == \
            f"CNI version {version} does not support more than 1 address per family"
    ours, go = both(impls, "ADD", conf(version), node_netns)
    assert (ours.doc["code"], go.doc["code"]) == (1, 999)
    assert go.doc["msg"] == "cannot convert: no valid IP addresses"
    assert ours.doc["msg"] == f"cannot convert result to version {version}"
    # Go counts after the merge: two IPv4 addresses replaced by one are fine
    doc = same_success(impls, "ADD", conf(version, addresses=CFG, top=RT_IPS), node_netns,
                       "IP=10.71.0.5/24")
    assert doc["ip4"] == {"ip": "10.73.0.5/24"}


# --- CHECK ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_check_as_go(impls, node_netns, version):
    """Each configured address that prevResult holds (the first entry with
    that IP; the prefix length is not compared) has the configured gateway
    when one is configured; an address prevResult lacks passes, as in Go."""
    c = conf(version, addresses=DUAL, routes=ROUTES)
    result = same_success(impls, "ADD", c, node_netns)
    v = {"version": "4"} if version == "0.4.0" else {}
    v6 = {"version": "6"} if version == "0.4.0" else {}
    passing = [
        result,
        {"cniVersion": version, "ips": []},
        {"cniVersion": version, "ips": [{"address": "10.70.0.5/16", "gateway": "10.70.0.1", **v}]},
        {"cniVersion": version, "ips": [{"address": "10.99.0.5/24", **v}]},
    ]
    for prev in passing:
        assert same_success(impls, "CHECK", {**c, "prevResult": prev}, node_netns) is None
    failing = [
        ({"cniVersion": version, "ips": [{"address": "10.70.0.5/24", "gateway": "10.70.0.2",
                                          **v}]}, "10.70.0.5"),
        ({"cniVersion": version, "ips": [{"address": "fd00:70::5/64", **v6}]}, "fd00:70::5"),
        ({"cniVersion": version, "ips": [
            {"address": "10.70.0.5/24", "gateway": "10.70.0.2", **v},
            {"address": "10.70.0.5/24", "gateway": "10.70.0.1", **v}]}, "10.70.0.5"),
    ]
    for prev, addr in failing:
        ours, go = both(impls, "CHECK", {**c, "prevResult": prev}, node_netns)
        assert ours.doc["code"] == go.doc["code"] == 999
        assert ours.doc["msg"] == go.doc["msg"] == \
            f"static: Failed to match addr {addr} on interface eth0"


def test_check_with_the_cni_args_of_add(impls, node_netns):
    """CHECK merges the sources as ADD did: ADD's result passes with ADD's
    CNI_ARGS; without GATEWAY it passes too (no gateway configured)."""
    c = conf(addresses=CFG)
    cni_args = "IP=10.71.0.5/24;GATEWAY=10.71.0.1"
    result = same_success(impls, "ADD", c, node_netns, cni_args)
    for a in (cni_args, "IP=10.71.0.5/24", ""):
        assert same_success(impls, "CHECK", {**c, "prevResult": result}, node_netns, a) is None
    prev = {**result, "ips": [{"address": "10.71.0.5/24"}]}
    ours, go = both(impls, "CHECK", {**c, "prevResult": prev}, node_netns, cni_args)
    assert ours.doc["msg"] == go.doc["msg"] == \
        "static: Failed to match addr 10.71.0.5 on interface eth0"


def test_check_refusals(impls, node_netns):
    """No prevResult: code 7 (Go: 999, same text); a bad config first, as
    Go loads it first; before 0.4.0 CHECK is not allowed (code 1, both)."""
    ours, go = both(impls, "CHECK", conf(addresses=CFG), node_netns)
    assert (ours.doc["code"], go.doc["code"]) == (7, 999)
    assert ours.doc["msg"] == go.doc["msg"] == "Required prevResult missing"
    ours, go = both(impls, "CHECK", conf(addresses=[{"address": "x"}]), node_netns)
    assert (ours.doc["code"], go.doc["code"]) == (7, 999)
    assert ours.doc["msg"] == go.doc["msg"]
    c = conf("0.3.1", addresses=CFG, top={"prevResult": {"cniVersion": "0.3.1", "ips": []}})
    ours, go = both(impls, "CHECK", c, node_netns)
    assert ours.doc["code"] == go.doc["code"] == 1
    assert ours.doc["msg"] == go.doc["msg"] == "config version does not allow CHECK"


# --- DEL, GC, STATUS, nothing kept -------------------------------------------------------------


@pytest.mark.parametrize("c,cni_args", [
    (conf(addresses=DUAL), ""),
    (conf(addresses=DUAL), "IP=10.71.0.5/24"),
    # configs ADD refuses: a runtime DELs after a failed ADD
    (conf(addresses=[{"address": "bad", "gateway": "bad"}],
          top={"runtimeConfig": {"ips": "x"}, "args": {"cni": 5}}), ""),
    ({"cniVersion": "1.0.0", "name": NET, "type": "bridge", "ipam": "static"}, ""),
    ({"cniVersion": "1.0.0", "name": NET, "type": "bridge"}, ""),
    (conf(addresses=DUAL), "IP=bad;GATEWAY=bad;FOO=bar"),
], ids=["plain", "cni-args", "bad-config", "ipam-not-an-object", "no-ipam", "bad-cni-args"])
def test_del_succeeds_twice(impls, node_netns, c, cni_args):
    """DEL has nothing to release, whatever the config holds (Go's reads
    nothing); twice is fine."""
    for _ in range(2):
        assert same_success(impls, "DEL", c, node_netns, cni_args) is None


def test_gc_and_status_succeed(impls, node_netns):
    """GC and STATUS (1.1.0; Go 1.1.1's skel knows neither verb and fails
    them, later Go's succeeds): nothing held, always ready, with or
    without a keep-list."""
    c = conf("1.1.0", addresses=DUAL)
    assert verb(impls["ours"], "STATUS", c, node_netns) is None
    assert verb(impls["ours"], "GC", c, node_netns) is None
    keep = {**c, "cni.dev/valid-attachments": [{"containerID": "st-c1", "ifname": "eth0"}]}
    assert verb(impls["ours"], "GC", keep, node_netns) is None
    assert verb(impls["ours"], "STATUS", conf("1.1.0"), node_netns) is None
    for cmd in ("STATUS", "GC"):
        go = run_plugin_raw(impls["go"], cmd, c, container_id="", ifname="", node=node_netns)
        assert go.exit_code == (0 if differs(impls.y, "static", "GC and STATUS") else 1), go


def test_nothing_written_on_disk(impls, node_netns):
    """ADD, CHECK and DEL leave the usual IPAM stores as they were (static
    records nothing: host-local's store, /run/cni)."""
    def listing() -> dict[str, list[str]]:
        out = {}
        for d in ("/var/lib/cni", "/var/lib/cni/networks", "/run/cni"):
            out[d] = sorted(os.listdir(d)) if os.path.isdir(d) else []
        return out

    before = listing()
    c = conf(addresses=DUAL)
    result = run_plugin(impls["ours"], "ADD", c, container_id="st-disk", netns=NETNS,
                        node=node_netns)
    run_plugin(impls["ours"], "CHECK", {**c, "prevResult": result}, container_id="st-disk",
               netns=NETNS, node=node_netns)
    run_plugin(impls["ours"], "DEL", c, container_id="st-disk", netns=NETNS, node=node_netns)
    assert listing() == before
    assert not os.path.exists(f"/var/lib/cni/networks/{NET}")


# --- static as the IPAM of ptp and bridge --------------------------------------------------

POD4, POD6, GW4, GW6 = "10.74.0.5", "fd00:74::5", "10.74.0.1", "fd00:74::1"


def main_conf(kind: str, version: str = "1.0.0") -> dict:
    c = {"cniVersion": version, "name": f"st{kind}", "type": kind,
         "ipam": {"type": "static",
                  "addresses": [{"address": f"{POD4}/24", "gateway": GW4},
                                {"address": f"{POD6}/64", "gateway": GW6}],
                  "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                  "dns": {"nameservers": ["10.74.0.53"]}}}
    if kind == "bridge":
        # Go 1.1.1's bridge answers the config's dns, even none, over IPAM's;
        # ours (as later Go) keeps IPAM's unless the config has one: give it one.
        c.update(bridge="stbr0", isGateway=True, dns={"nameservers": ["10.74.0.1"]})
    return c


def pod_addresses(pod) -> list[str]:
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, "eth0")
        if link is None:
            return []
        return sorted(str(a) for a in netlink.addresses(ipr, link) if not a.ip.is_link_local)


@pytest.mark.parametrize("kind", ["ptp", "bridge"])
def test_ipam_of_ptp_and_bridge_equals_go(cni_bin, go_yardstick, netns_factory, kind):
    """Our ptp/bridge with our static and Go's with Go's static, each in a
    node of its own: the same result (MACs, veth names, sandbox masked), the
    pod holds exactly the configured addresses (read back from the kernel),
    the same kernel state in pod and node; CHECK passes; DEL twice leaves
    no pod link and no address."""
    seen = {}
    for who, bin_dir in (("ours", cni_bin), ("go", go_yardstick.dir)):
        node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
        exe, c = os.path.join(bin_dir, kind), main_conf(kind)

        def call(cmd, conf_, exe=exe, node=node, pod=pod, bin_dir=bin_dir):
            return run_plugin(exe, cmd, conf_, container_id=f"st-{kind}", netns=pod.path,
                              node=node, cni_path=bin_dir)

        result = call("ADD", c)
        assert pod_addresses(pod) == [f"{POD4}/24", f"{POD6}/64"], who
        seen[who] = (masked(result, pod.path), kernel_state(pod), kernel_state(node))
        assert call("CHECK", {**c, "prevResult": result}) is None
        for _ in range(2):
            assert call("DEL", c) is None
        with NetNS.open(pod.path) as n, n.rtnl() as ipr:
            assert [lk.name for lk in netlink.links(ipr)] == ["lo"], who
        with NetNS.open(node.path) as n, n.rtnl() as ipr:
            assert netlink.links(ipr, "veth") == [], who
    assert as_go(go_yardstick, kind, seen["ours"][0]) == seen["go"][0]
    ips = [{k: v for k, v in ip.items() if k != "interface"} for ip in seen["ours"][0]["ips"]]
    assert ips == main_conf(kind)["ipam"]["addresses"]
    assert seen["ours"][1] == seen["go"][1], "pod"
    assert seen["ours"][2] == seen["go"][2], "node"
