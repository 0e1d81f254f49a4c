"""cni_skel.gorules on listed rules (no kernel): Go's comment and chain name
formats, which chains go with a container's rules, the host ports Go's
portmap holds, the masquerade commands of the way back. The kernel side is
in test_go_migration.py, against the Go binaries."""

from __future__ import annotations

import ipaddress

from cni_skel.gorules import (
    GoRule,
    chain_name,
    find,
    host_ports,
    ipmasq_commands,
    owner_comment,
    parse_owner,
)


def rule(chain, handle, comment=None, jump=None, expr=(), family="ip"):
    e = list(expr) + ([{"jump": {"target": jump}}] if jump else [])
    return GoRule(family, "nat", chain, handle, comment, e)


def test_comment_and_chain_name_formats():
    # What the Debian Go binaries wrote in test_go_migration.py's first experiment.
    assert owner_comment("gonet", "cid-go-1") == 'name: "gonet" id: "cid-go-1"'
    assert owner_comment("gonet", "c", "dnat") == 'dnat name: "gonet" id: "c"'
    assert chain_name("gonet", "cid-go-1") == "CNI-d63caf0a4e8e62b0d7ad8ba4"
    assert chain_name("gonet", "cid-go-1", "CNI-DN-", 21) == "CNI-DN-d63caf0a4e8e62b0d7ad8"
    for net, cid, prefix in (("n", "c", ""), ('we"ird\\', "id\n1\x01\u2028", "dnat")):
        assert parse_owner(owner_comment(net, cid, prefix)) == (prefix, net, cid)
    assert parse_owner("CNI portfwd masquerade mark") is None
    assert parse_owner(None) is None


def test_find_takes_private_chains_and_leaves_shared_ones():
    mine, other = owner_comment("n", "a"), owner_comment("n", "b")
    rules = [
        rule("POSTROUTING", 1, mine, "CNI-aaa"),
        rule("CNI-aaa", 2, mine),
        rule("POSTROUTING", 3, other, "CNI-bbb"),
        rule("CNI-HOSTPORT-DNAT", 4, "dnat " + mine, "CNI-DN-aaa"),
        rule("CNI-DN-aaa", 5, None, "CNI-HOSTPORT-SETMARK"),  # shared target
        rule("CNI-DN-bbb", 6, None, "CNI-HOSTPORT-SETMARK"),
        rule("PREROUTING", 7, "CNI portfwd", "CNI-HOSTPORT-DNAT"),
    ]
    found = find(rules, lambda c: c.endswith(mine))
    assert [r.handle for r in found.rules] == [1, 4]
    assert found.chains == [("ip", "nat", "CNI-DN-aaa"), ("ip", "nat", "CNI-aaa")]
    cmds = found.delete_cmds()
    assert cmds[0] == {"delete": {"rule": {"family": "ip", "table": "nat",
                                           "chain": "POSTROUTING", "handle": 1}}}
    assert {"delete": {"chain": {"family": "ip", "table": "nat", "name": "CNI-aaa"}}} in cmds
    # a chain another container's rule also jumps to stays
    rules.append(rule("POSTROUTING", 8, other, "CNI-aaa"))
    assert ("ip", "nat", "CNI-aaa") not in find(rules, lambda c: c == mine).chains
    assert not find(rules, lambda c: c == "nobody")


def test_host_ports_name_the_holder():
    dnat = [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                       "right": 8080}}, {"xt": {"type": "target", "name": "DNAT"}}]
    setmark = [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp",
                                                           "field": "dport"}}, "right": 8080}}]
    rules = [rule("CNI-HOSTPORT-DNAT", 1, owner_comment("n", "a", "dnat"), "CNI-DN-aaa"),
             rule("CNI-DN-aaa", 2, None, "CNI-HOSTPORT-SETMARK", setmark),
             rule("CNI-DN-aaa", 3, None, None, dnat)]
    [hp] = host_ports(rules)
    assert (hp.family, hp.protocol, hp.port, hp.host_ip, hp.network, hp.container_id) == \
        ("ip", "tcp", 8080, None, "n", "a")


def test_ipmasq_commands_are_go_bridges():
    cmds = ipmasq_commands("gonet", "cid-go-1", [ipaddress.ip_interface("10.77.0.2/24"),
                                                 ipaddress.ip_interface("fd00:77::2/64")])
    chain, comment = "CNI-d63caf0a4e8e62b0d7ad8ba4", 'name: "gonet" id: "cid-go-1"'
    assert cmds[:4] == [
        ["iptables", "-t", "nat", "-N", chain, "--wait"],
        ["iptables", "-t", "nat", "-A", chain, "-d", "10.77.0.0/24", "-j", "ACCEPT",
         "-m", "comment", "--comment", comment, "--wait"],
        ["iptables", "-t", "nat", "-A", chain, "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE",
         "-m", "comment", "--comment", comment, "--wait"],
        ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.77.0.2", "-j", chain,
         "-m", "comment", "--comment", comment, "--wait"]]
    assert cmds[4][0] == "ip6tables" and "ff00::/8" in cmds[6]
