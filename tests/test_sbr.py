"""sbr through the real executable, chained after our macvlan (which makes
the pod's interface and takes host-local's addresses), side by side with
Debian's Go sbr 1.1.1 on an identical pod. Rules and routing tables are read
back from the pod's namespace with netlink."""

from __future__ import annotations

import ipaddress
import os

import pytest
from cni_skel_plugins.sbr import ROUTE_PROTO
from podlink_common import call, call_raw, check_fails, host_local, link_of, make_lan
from test_bridge_go import masked
from yardsticks import as_go

from cni_skel import netlink
from cni_skel.harness import remove_netns
from cni_skel.netns import NetNS

NET = "sbrnet"
MAIN = netlink.RT_TABLE_MAIN


@pytest.fixture(scope="session")
def sbr(cni_bin: str) -> str:
    return os.path.join(cni_bin, "sbr")


@pytest.fixture(scope="session")
def macvlan(cni_bin: str) -> str:
    return os.path.join(cni_bin, "macvlan")


#: The interface plugin's routes: default routes and one more, through the
#: LAN's gateways.
IFACE_ROUTES = ({"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "10.66.0.0/16"})


def iface_conf(data_dir, version: str, routes=IFACE_ROUTES) -> dict:
    """The interface plugin's config: dual stack, ``routes`` through the
    LAN's gateways."""
    return {"cniVersion": version, "name": NET, "type": "macvlan", "master": "eth0",
            "ipam": host_local(data_dir, "10.55.0.0/24", "fd00:55::/64", routes=list(routes))}


def sbr_conf(version: str, prev: dict | None, **extra) -> dict:
    conf = {"cniVersion": version, "name": NET, "type": "sbr", **extra}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def pod_with_iface(macvlan: str, netns_factory, data_dir, version: str = "1.0.0",
                   routes=IFACE_ROUTES):
    """A node (its eth0 on a LAN), a pod with eth0 from our macvlan: the
    node, the pod and macvlan's result (sbr's prevResult)."""
    lan = make_lan(netns_factory, lan_ips=("10.55.0.1/24", "fd00:55::1/64"))
    pod = netns_factory("cnsk-pod")
    prev = call(macvlan, "ADD", iface_conf(data_dir, version, routes), lan.node, pod)
    return lan.node, pod, prev


def routing(pod) -> dict:
    """The pod's policy routing: rules with a source, the routes of every
    table they look up, and the main table's routes through eth0; routes as
    (dst, gateway, through eth0, scope, proto), prefsrc and metric."""
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        link = netlink.find_link(ipr, "eth0")

        def table(t: int) -> list[tuple]:
            return sorted((str(r["dst"]), str(r["gw"]), r["oif"] == link.index, r["scope"],
                           r["proto"], str(r["src"]), r["priority"])
                          for r in netlink.routes(ipr, table=t)
                          if link is None or r["oif"] in (link.index, None))

        rules = sorted((r.family, r.priority, str(r.src), r.table)
                       for r in netlink.rules(ipr) if r.src is not None)
        return {"rules": rules, "tables": {t: table(t) for _, _, _, t in rules},
                "main": table(MAIN)}


def everything(pod) -> dict:
    """Every rule and every route of every table in the pod, each as all
    that `netlink.routes` / `netlink.rules` read of it: what "the pod as
    sbr found it" means, route by route."""
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        return {"rules": sorted(map(repr, netlink.rules(ipr))),
                "routes": sorted(repr(sorted(r.items())) for r in netlink.routes(ipr, table=None))}


# --- the main job ------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_same_rules_and_tables_as_go(sbr, go_yardstick, macvlan, netns_factory, tmp_path, version):
    """Dual stack: each address gets a rule into a table of its own (100,
    101), holding a default route via its gateway and eth0's routes of its
    family, moved out of the main table; the result is prevResult. Go's sbr
    on an identical pod leaves the same rules and tables. CHECK passes; DEL
    (twice) removes the rules and empties the tables, the routes back in the
    main table as before ADD (Go's DEL leaves them in the tables), so that
    ADD works again."""
    state = {}
    for who, exe in (("ours", sbr), ("go", go_yardstick.exe("sbr"))):
        node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path / who, version)
        before = routing(pod)
        out = call(exe, "ADD", sbr_conf(version, prev), node, pod)
        passed = prev if who == "ours" else as_go(go_yardstick, "sbr", prev)
        assert masked(out, pod.path) == masked(passed, pod.path)
        state[who] = (node, pod, prev, before, routing(pod))
    assert state["ours"][4] == state["go"][4]

    node, pod, prev, before, after = state["ours"]
    assert [r[1:] for r in after["rules"]] == [(32765, "10.55.0.2/32", 100),
                                               (32765, "fd00:55::2/128", 101)]
    v4 = {(dst, gw) for dst, gw, *_ in after["tables"][100]}
    assert {("0.0.0.0/0", "10.55.0.1"), ("10.55.0.0/24", "None"),
            ("10.66.0.0/16", "10.55.0.1")} <= v4
    assert ("::/0", "fd00:55::1") in {(dst, gw) for dst, gw, *_ in after["tables"][101]}
    assert after["main"] == [] and before["main"]  # moved, not copied

    if version != "0.3.1":
        call(sbr, "CHECK", sbr_conf(version, prev), node, pod)
    for _ in range(2):
        assert call(sbr, "DEL", sbr_conf(version, None), node, pod) is None
    assert routing(pod) == {"rules": [], "tables": {}, "main": before["main"]}
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        assert netlink.routes(ipr, table=100) == netlink.routes(ipr, table=101) == []
    call(sbr, "ADD", sbr_conf(version, prev), node, pod)
    assert routing(pod) == after


def test_first_free_table(sbr, go_yardstick, macvlan, netns_factory, tmp_path):
    """Table 100 already has a rule and 101 a route: ours picks 102 and 103,
    the first tables with neither, as Go's sbr means to. Go 1.1.1 picks 101
    and 102: its route listing skips every table but main, so it adds the
    pod's routes to table 101 beside what was there."""
    picked = {}
    for who, exe in (("ours", sbr), ("go", go_yardstick.exe("sbr"))):
        node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path / who)
        with NetNS.open(pod.path) as n, n.rtnl() as ipr:
            netlink.add_rule(ipr, 100, src="10.77.0.1")
            netlink.add_route(ipr, "10.78.0.0/16", dev="eth0", table=101)
        call(exe, "ADD", sbr_conf("1.0.0", prev), node, pod)
        picked[who] = [r[3] for r in routing(pod)["rules"] if r[2] != "10.77.0.1/32"]
    assert picked == {"ours": [102, 103], "go": [101, 102]}


def test_table_key_adds_rules_only(sbr, macvlan, netns_factory, tmp_path):
    """``table`` (Go >= 1.3): the rules look up that table, the routes stay
    in the main table; DEL removes the rules of that table only."""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    before = routing(pod)
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:  # another table's rule, same source
        netlink.add_rule(ipr, 600, src="10.55.0.2", priority=100)
    call(sbr, "ADD", sbr_conf("1.0.0", prev, table=500), node, pod)
    after = routing(pod)
    assert sorted((r[2], r[3]) for r in after["rules"]) == [
        ("10.55.0.2/32", 500), ("10.55.0.2/32", 600), ("fd00:55::2/128", 500)]
    assert after["main"] == before["main"]
    call(sbr, "CHECK", sbr_conf("1.0.0", prev, table=500), node, pod)
    call(sbr, "DEL", sbr_conf("1.0.0", None, table=500), node, pod)
    assert [(r[2], r[3]) for r in routing(pod)["rules"]] == [("10.55.0.2/32", 600)]


def test_only_the_interfaces_addresses(sbr, macvlan, netns_factory, tmp_path):
    """prevResult IPs on another interface are left alone (Go's getIPCfgs):
    a second attachment's address gets no rule."""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    prev = dict(prev, interfaces=[*prev["interfaces"], {"name": "net1", "sandbox": pod.path}],
                ips=[*prev["ips"], {"address": "10.99.0.5/24", "interface": 1}])
    call(sbr, "ADD", sbr_conf("1.0.0", prev), node, pod)
    assert "10.99.0.5/32" not in {r[2] for r in routing(pod)["rules"]}


# --- CHECK, DEL -----------------------------------------------------------


def test_check_names_what_is_missing(sbr, go_yardstick, macvlan, netns_factory, tmp_path):
    """A rule or a table's default route gone: CHECK fails (999) naming it.
    (Go's CHECK passes without looking.)"""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    conf = sbr_conf("1.0.0", prev)
    call(sbr, "ADD", conf, node, pod)
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.del_route(ipr, "0.0.0.0/0", table=100)
    check_fails(sbr, conf, node, pod, "table 100", "default route via 10.55.0.1")
    call(go_yardstick.exe("sbr"), "CHECK", conf, node, pod)  # Go: no opinion
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.add_route(ipr, "0.0.0.0/0", gw="10.55.0.1", dev="eth0", table=100)
        for rule in netlink.rules(ipr, table=101):
            netlink.del_rule(ipr, rule)
    check_fails(sbr, conf, node, pod, "no rule from fd00:55::2")
    check_fails(sbr, sbr_conf("1.0.0", None), node, pod, "prevResult", code=7)


def test_del_with_the_pod_or_its_interface_gone(sbr, macvlan, netns_factory, tmp_path):
    """Nothing to tidy is success: eth0 deleted, then the namespace gone, then
    no CNI_NETNS at all."""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    call(sbr, "ADD", sbr_conf("1.0.0", prev), node, pod)
    call(macvlan, "DEL", iface_conf(tmp_path, "1.0.0"), node, pod)
    assert call(sbr, "DEL", sbr_conf("1.0.0", None), node, pod) is None
    remove_netns(pod)
    assert call(sbr, "DEL", sbr_conf("1.0.0", None), node, pod) is None
    assert call(sbr, "DEL", sbr_conf("1.0.0", None), node, None) is None


def test_gc_and_status_succeed(sbr, netns_factory):
    node = netns_factory("cnsk-node")
    conf = dict(sbr_conf("1.1.0", None), **{"cni.dev/valid-attachments": []})
    assert call(sbr, "GC", conf, node, None, cid="", ifname="") is None
    assert call(sbr, "STATUS", sbr_conf("1.1.0", None), node, None, cid="", ifname="") is None


# --- bad input and roll-back ------------------------------------------------


@pytest.mark.parametrize(("extra", "prev", "code", "text"), [
    ({}, None, 7, "must be called as chained plugin"),
    ({}, {"cniVersion": "1.0.0", "ips": []}, 7, "No IP addresses supplied on interface: eth0"),
    ({"table": 0}, "iface", 7, "table"),
    ({"table": "main"}, "iface", 7, "table"),
])
def test_bad_input_changes_nothing(sbr, macvlan, netns_factory, tmp_path, extra, prev, code,
                                   text):
    """Refused before any change, with the spec code naming the problem (Go:
    999 for the missing prevResult and for no IPs)."""
    node, pod, iface_prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    before = routing(pod)
    run = call_raw(sbr, "ADD", sbr_conf("1.0.0", iface_prev if prev == "iface" else prev,
                                        **extra), node, pod)
    assert run.exit_code == 1 and run.doc["code"] == code, run.doc
    assert text in run.doc["msg"] + run.doc.get("details", ""), run.doc
    assert routing(pod) == before


def test_missing_interface_is_999_and_changes_nothing(sbr, go_yardstick, macvlan, netns_factory,
                                                      tmp_path):
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    # addresses with no interface index count as on CNI_IFNAME (Go's getIPCfgs)
    prev = dict(prev, ips=[{k: v for k, v in ip.items() if k != "interface"}
                           for ip in prev["ips"]])
    before = routing(pod)
    for exe in (sbr, go_yardstick.exe("sbr")):
        run = call_raw(exe, "ADD", sbr_conf("1.0.0", prev), node, pod, ifname="net9")
        assert run.exit_code == 1 and run.doc["code"] == 999, run.doc
    assert "Cannot find network interface net9" in run.doc["msg"]
    assert routing(pod) == before


def test_failed_add_is_rolled_back(sbr, macvlan, netns_factory, tmp_path):
    """The second address's gateway is not on-link: the kernel refuses its
    default route after the first address's rule, table and moved routes
    were made. Everything is put back: no rule, the main table as before.
    (Go 1.1.1 leaves the first table and rules behind.)"""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    before = routing(pod)
    ips = [prev["ips"][0], dict(prev["ips"][1], gateway="fd00:99::1")]
    run = call_raw(sbr, "ADD", sbr_conf("1.0.0", dict(prev, ips=ips)), node, pod)
    assert run.exit_code == 1 and run.doc["code"] == 999, run.doc
    after = routing(pod)
    assert after["rules"] == [] and after["main"] == before["main"]
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        assert netlink.routes(ipr, table=100) == []
    assert link_of(pod, "eth0") is not None


def test_replies_leave_through_the_addresss_table(sbr, macvlan, netns_factory, tmp_path):
    """With the rules in place, the kernel routes traffic from the pod's
    address by its table: a lookup from 10.55.0.2 to an address off the LAN
    goes via the gateway on eth0; one without a source finds no route (the
    main table no longer has eth0's default route)."""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path)
    call(sbr, "ADD", sbr_conf("1.0.0", prev), node, pod)
    with NetNS.open(pod.path) as n, n.iproute() as ipr:
        link = netlink.find_link(ipr, "eth0")
        (via,) = ipr.route("get", dst="10.200.0.9", src="10.55.0.2")
        assert via.get_attr("RTA_GATEWAY") == "10.55.0.1"
        assert via.get_attr("RTA_OIF") == link.index
        assert netlink.route_get(ipr, ipaddress.ip_address("10.200.0.9")) is None


# --- what DEL restores, what ADD refuses (issue 48; docs/sbr.md) -------------


@pytest.mark.parametrize(("routes", "extra"), [
    ((), {}),                                      # gateways, no route at all in the main table
    (({"dst": "10.66.0.0/16"}, {"dst": "fd00:66::/48"}), {}),   # routes, no default
    (IFACE_ROUTES, {}),                            # the default routes too
    (({"dst": "10.66.0.0/16"},), {"table": 500}),
], ids=["no-routes", "no-default", "defaults", "table"])
def test_add_then_del_leaves_the_pod_as_found(sbr, go_yardstick, macvlan, netns_factory, tmp_path,
                                              routes, extra):
    """ADD then DEL leaves every table's routes and every rule as before
    ADD, route by route, both families. ADD's own default routes (via the
    prevResult gateways) are deleted, not moved to the main table (it had
    none before without ``defaults``: the fuzz found DEL adding them, 218
    times in 304). Go's DEL leaves the routes in the tables and the main
    table without them (shown on the same inputs)."""
    for who, exe in (("ours", sbr), ("go", go_yardstick.exe("sbr"))):
        node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path / who, routes=routes)
        assert all(ip.get("gateway") for ip in prev["ips"])
        before, main = everything(pod), routing(pod)["main"]
        call(exe, "ADD", sbr_conf("1.0.0", prev, **extra), node, pod)
        assert everything(pod) != before
        if who == "ours":  # table: the routes stay (Go 1.1.1 predates the key)
            assert (routing(pod)["main"] == main) == bool(extra)
        assert call(exe, "DEL", sbr_conf("1.0.0", prev, **extra), node, pod) is None
        if who == "ours":
            assert everything(pod) == before
        elif not extra:  # (with table, Go 1.1.1 predates the key, 1.9.1 moves nothing)
            assert everything(pod)["routes"] != before["routes"]  # Go: moved, not back
        assert everything(pod)["rules"] == before["rules"]


def test_del_puts_back_only_what_add_moved(sbr, macvlan, netns_factory, tmp_path):
    """The main table keeps what ADD did not move (a route through eth0 of
    no prevResult address's subnet; Go deletes it, copied nowhere), and a
    default route the main table had, with another metric than ADD's own,
    comes back while ADD's does not."""
    node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path, routes=())
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        netlink.add_route(ipr, "0.0.0.0/0", gw="10.55.0.1", dev="eth0", priority=50)
        netlink.add_route(ipr, "10.88.0.0/16", gw="10.55.0.9", dev="eth0", src="10.55.0.2")
        netlink.add_route(ipr, "fd00:88::/48", gw="fe80::9", dev="eth0")
    before = everything(pod)
    call(sbr, "ADD", sbr_conf("1.0.0", prev), node, pod)
    main = {(dst, gw) for dst, gw, *_ in routing(pod)["main"]}
    assert ("fd00:88::/48", "fe80::9") in main          # no address's: stays
    assert ("0.0.0.0/0", "10.55.0.1") not in main        # moved into table 100
    with NetNS.open(pod.path) as n, n.rtnl() as ipr:
        defaults = sorted((r["priority"], r["proto"]) for r in netlink.routes(ipr, table=100)
                          if r["dst"].prefixlen == 0)
    assert defaults == [(0, ROUTE_PROTO), (50, 3)]       # ADD's own, the main table's
    call(sbr, "DEL", sbr_conf("1.0.0", prev), node, pod)
    assert everything(pod) == before


@pytest.mark.parametrize("extra", [{}, {"table": 200}], ids=["tables", "table"])
@pytest.mark.parametrize("prev", [
    {"cniVersion": "0.2.0", "ip4": {"ip": "10.66.16.50/24"}},
    {"cniVersion": "1.0.0", "ips": [{"address": "10.55.0.2/24", "gateway": "10.55.0.1"},
                                    {"address": "10.55.0.77/24", "gateway": "10.55.0.1"}]},
], ids=["old-format", "second-not-held"])
def test_an_address_the_interface_lacks_is_refused(sbr, go_yardstick, macvlan, netns_factory,
                                                   tmp_path, prev, extra):
    """A prevResult address that eth0 does not hold: code 7 naming it and
    the interface, before any change (no rule, the main table intact).
    Go 1.1.1 takes it: its rule stays after its own DEL, which looks rules
    up by the interface's addresses."""
    version = prev["cniVersion"]
    for who, exe in (("ours", sbr), ("go", go_yardstick.exe("sbr"))):
        node, pod, _ = pod_with_iface(macvlan, netns_factory, tmp_path / who)
        before = everything(pod)
        run = call_raw(exe, "ADD", sbr_conf(version, prev, **extra), node, pod)
        if who == "go":
            if run.exit_code == 0:
                call(exe, "DEL", sbr_conf(version, prev, **extra), node, pod)
                assert everything(pod)["rules"] != before["rules"]  # Go leaks the rule
            continue
        assert run.exit_code == 1 and run.doc["code"] == 7, run.doc
        foreign = "10.66.16.50/24" if "ip4" in prev else "10.55.0.77/24"
        assert run.doc["msg"] == f"prevResult address {foreign} is not on interface eth0"
        assert everything(pod) == before
        call(sbr, "DEL", sbr_conf(version, prev, **extra), node, pod)
        assert everything(pod) == before


def test_no_address_on_the_interface_is_refused(sbr, go_yardstick, macvlan, netns_factory,
                                                tmp_path):
    """prevResult's addresses all on another interface: code 7 and nothing
    changed. Go 1.1.1 answers success having removed every main-table
    route of eth0 (its DEL brings none back)."""
    for who, exe in (("ours", sbr), ("go", go_yardstick.exe("sbr"))):
        node, pod, prev = pod_with_iface(macvlan, netns_factory, tmp_path / who)
        prev = dict(prev, interfaces=[{"name": "net1", "sandbox": pod.path}])
        before = everything(pod)
        run = call_raw(exe, "ADD", sbr_conf("1.0.0", prev), node, pod)
        if who == "go":
            assert run.exit_code == 0 and routing(pod)["main"] == []
            continue
        assert run.exit_code == 1 and run.doc["code"] == 7, run.doc
        assert run.doc["msg"] == "No IP addresses supplied on interface: eth0"
        assert "none on eth0" in run.doc["details"]
        assert everything(pod) == before
