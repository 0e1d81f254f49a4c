"""cni_skel.nft: the libnftables JSON layer, against the kernel in a test
namespace, and its failure modes (STATUS code 50 without libnftables)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading

import nftables
import pytest
from cni_skel_plugins.bridge import Bridge
from cni_skel_plugins.bridge.rules import SpoofCheck, masquerade
from cni_skel_plugins.portmap.layout import group_id

from cni_skel.errors import ERR_PLUGIN_NOT_AVAILABLE
from cni_skel.masq import Masquerade
from cni_skel.netns import NetNS
from cni_skel.nft import (
    COMMENT_MAX,
    CONTEXTS_MAX,
    Element,
    GetChain,
    GetElement,
    GetSet,
    GetTable,
    Nft,
    NftError,
    attachment_tag,
    generation,
    kept_fds,
    lookup,
    network_tag,
    nft_status,
    release_contexts,
)
from cni_skel.skel import dispatch


def test_attachment_tag_fits_a_comment():
    assert attachment_tag("abc", "eth0") == "abc/eth0"
    long_id = "f" * 300
    tag = attachment_tag(long_id, "eth0")
    assert tag.startswith("sha256:") and len(tag) <= COMMENT_MAX
    assert tag == attachment_tag(long_id, "eth0") != attachment_tag(long_id, "eth1")


def test_network_tag_keeps_each_plugins_names_in_the_kernel():
    """Tables of live nodes hold these names: an upgrade must find them."""
    # portmap: "n" + 12 hex (its chains dnat_<tag>_<conditions>, maps <tag>_...)
    assert network_tag("dbnet") == "ndee66907ce05"
    assert network_tag("k8s-pod-network") == "n6c6f91f4c779"
    # bridge: "n_" + 16 hex (its chain <tag>, sets <tag>_pods4, <tag>_spoofchk_ports, ...)
    assert network_tag("dbnet", prefix="n_", width=16) == "n_dee66907ce05048a"
    assert network_tag("cni0-net", prefix="n_", width=16) == "n_727e6b21a043a1fd"


def test_plugins_name_their_objects_as_before():
    assert group_id("dbnet", [], []) == "ndee66907ce05_a6830960"
    masq, spoof = masquerade("dbnet", nft=object()), SpoofCheck("dbnet", nft=object())
    assert masq.id == spoof.id == "n_dee66907ce05048a"
    assert masq.set_names(4) == ("n_dee66907ce05048a_pods4", "n_dee66907ce05048a_local4")
    assert masq.table == "cni_skel_bridge"          # the bridge keeps its table
    assert {c["add"]["table"]["name"] for c in masq.layout() if "table" in c.get("add", {})} \
        == {"cni_skel_bridge"}
    # the SDK's (cni_skel.masq) is the same layout in its own table by default
    sdk = Masquerade("dbnet", nft=object())
    assert (sdk.id, sdk.table) == (masq.id, "cni_skel_masq")


def _in(ns, fn):
    with NetNS.open(ns.path) as n:
        return n.run(fn)


def test_transaction_is_atomic_and_listing_reads_back(node_netns):
    def work():
        nft = Nft()
        assert nft.table("inet", "t") is None
        nft.run([
            {"add": {"table": {"family": "inet", "name": "t"}}},
            {"add": {"set": {"family": "inet", "table": "t", "name": "s",
                             "type": "ipv4_addr"}}},
            {"add": {"element": {"family": "inet", "table": "t", "name": "s",
                                 "elem": [{"elem": {"val": "10.5.0.1", "comment": "a/eth0"}},
                                          {"elem": {"val": "10.5.0.2", "comment": "b/eth0"}}]}}},
        ])
        # a failing command makes the whole batch fail: nothing of it applies
        with pytest.raises(NftError) as e:
            nft.run([
                {"add": {"element": {"family": "inet", "table": "t", "name": "s",
                                     "elem": ["10.5.0.3"]}}},
                {"add": {"element": {"family": "inet", "table": "t", "name": "nope",
                                     "elem": ["10.5.0.4"]}}},
            ], what="test batch")
        assert e.value.errno == errno.ENOENT and e.value.msg.startswith("test batch:")
        with pytest.raises(NftError) as e:
            nft.run([{"create": {"table": {"family": "inet", "name": "t"}}}])
        assert e.value.errno == errno.EEXIST
        t = nft.table("inet", "t")
        assert sorted(t.elements("s")) == [("10.5.0.1", "a/eth0"), ("10.5.0.2", "b/eth0")]
        assert t.tagged("s", {"b/eth0"}) == ["10.5.0.2"]
        assert t.tagged("s", keep={"b/eth0"}) == ["10.5.0.1"]
        assert list(t.elements("missing")) == []
        assert nft.run([]) == []
        nft_status()

    _in(node_netns, work)


def test_lookup_reads_single_elements_and_generation_counts_commits(node_netns):
    T = {"family": "inet", "table": "t"}
    PP = ["inet_proto", "inet_service"]
    APP = ["ipv6_addr", "inet_proto", "inet_service"]

    def work():
        assert lookup("inet", "t", [GetTable(), GetChain("c"), GetSet("m"),
                                    GetElement("m", ["tcp", 80], PP, "ipv4_addr")]) == [
            False, False, False, None]
        g0 = generation()
        nft = Nft()
        nft.run([
            {"add": {"table": {"family": "inet", "name": "t"}}},
            {"add": {"chain": {**T, "name": "c"}}},
            {"add": {"map": {**T, "name": "m", "type": PP, "map": "ipv4_addr"}}},
            {"add": {"map": {**T, "name": "p", "type": PP, "map": "inet_service"}}},
            {"add": {"map": {**T, "name": "m6", "type": APP, "map": "ipv6_addr"}}},
            {"add": {"set": {**T, "name": "pair", "type": ["ipv4_addr", "ipv4_addr"]}}},
            {"add": {"set": {**T, "name": "one", "type": "ipv4_addr"}}},
            {"add": {"element": {**T, "name": "m", "elem": [
                [{"elem": {"val": {"concat": ["tcp", 80]}, "comment": "a/eth0"}}, "10.5.0.1"]]}}},
            {"add": {"element": {**T, "name": "p", "elem": [
                [{"elem": {"val": {"concat": ["sctp", 9]}}}, 8080]]}}},
            {"add": {"element": {**T, "name": "m6", "elem": [
                [{"elem": {"val": {"concat": ["fd00::1", "udp", 53]},
                           "comment": "x" * COMMENT_MAX}}, "fd00::5"]]}}},
            {"add": {"element": {**T, "name": "pair", "elem": [
                {"elem": {"val": {"concat": ["10.5.0.1", "10.5.0.1"]}, "comment": "h/eth0"}}]}}},
            {"add": {"element": {**T, "name": "one", "elem": ["10.5.0.9"]}}},
        ])
        assert generation() == g0 + 1, "one batch, one generation"
        got = lookup("inet", "t", [
            GetTable(), GetChain("c"), GetChain("nope"), GetSet("m"), GetSet("pair"), GetSet("no"),
            GetElement("m", ("tcp", 80), PP, "ipv4_addr"),
            GetElement("m", {"concat": ["tcp", 81]}, PP, "ipv4_addr"),
            GetElement("p", ["sctp", 9], PP, "inet_service"),
            GetElement("m6", ("fd00:0::1", "udp", 53), APP, "ipv6_addr"),
            GetElement("pair", ("10.5.0.1", "10.5.0.1"), ["ipv4_addr", "ipv4_addr"]),
            GetElement("one", "10.5.0.9", "ipv4_addr"),
            GetElement("nope", "10.5.0.9", "ipv4_addr"),
        ])
        assert got == [True, True, False, True, True, False,
                       Element("10.5.0.1", "a/eth0"), None, Element(8080, None),
                       Element("fd00::5", "x" * COMMENT_MAX), Element(None, "h/eth0"),
                       Element(None, None), None]
        # more queries than one send: answers stay in order
        many = [GetElement("m", ("tcp", 80 + i % 2), PP, "ipv4_addr") for i in range(150)]
        assert lookup("inet", "t", many) == [Element("10.5.0.1", "a/eth0"), None] * 75
        assert lookup("inet", "t", []) == []
        assert generation() == g0 + 1, "reads commit nothing"
        with pytest.raises(ValueError):
            lookup("inet", "t", [GetElement("m", ("tcp", 80), ["inet_proto"], "ipv4_addr")])

    _in(node_netns, work)


def test_lookup_without_cap_net_admin_fails_at_once(node_netns):
    """nfnetlink refuses a whole send without CAP_NET_ADMIN with one EPERM:
    lookup raises it (for all its queries) instead of waiting for the other
    answers; and importing cni_skel.nft loads no netlink library."""
    code = """
import json, sys, time
import cni_skel.nft as nft
light = not [m for m in sys.modules if m.split(".")[0] in ("pyroute2", "asyncio")]
out = {"light": light}
for name, fn in (("lookup", lambda: nft.lookup("inet", "t", [nft.GetTable(), nft.GetChain("c"),
                                                             nft.GetSet("s")] * 50)),
                 ("generation", nft.generation)):
    t = time.monotonic()
    try:
        fn()
    except nft.NftError as e:
        out[name] = [e.errno, time.monotonic() - t]
print(json.dumps(out))
"""
    proc = subprocess.run(["ip", "netns", "exec", node_netns.name, "setpriv",
                           "--inh-caps=-net_admin", "--bounding-set=-net_admin",
                           sys.executable, "-I", "-c", code],
                          capture_output=True, text=True, timeout=60, check=True)
    out = json.loads(proc.stdout)
    assert out["light"]
    for name in ("lookup", "generation"):
        err, took = out[name]
        assert err == errno.EPERM and took < 10, (name, out)


def in_forked_child(check) -> bool:
    """``check()`` run in a forked child of this process: what it returned."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.write(w, b"1" if check() else b"0")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    try:
        return os.read(r, 1) == b"1"
    finally:
        os.close(r)


def test_contexts_are_kept_per_namespace_thread_and_process(netns_factory):
    """One libnftables context per (namespace, thread), reused; never one of
    another namespace, another thread or the parent process; at most
    CONTEXTS_MAX kept; release_contexts drops them; Nft(keep=False) keeps
    none."""
    release_contexts()
    nss = [NetNS.open(netns_factory("cnsk-nf").path) for _ in range(CONTEXTS_MAX + 1)]
    a, b = nss[0], nss[1]
    try:
        ctx_a = a.run(lambda: Nft()._ctx)
        assert a.run(lambda: Nft()._ctx) is ctx_a
        # keep=False: a context of its own, never kept (nor handed out later)
        own = a.run(lambda: Nft(keep=False)._ctx)
        assert own is not ctx_a and a.run(lambda: Nft()._ctx) is ctx_a
        ctx_b = b.run(lambda: Nft()._ctx)
        assert ctx_b is not ctx_a
        # each context acts in its own namespace
        a.run(lambda: Nft().run([{"add": {"table": {"family": "inet", "name": "ta"}}}]))
        assert b.run(lambda: Nft().table("inet", "ta")) is None
        assert a.run(lambda: Nft().table("inet", "ta")) is not None
        # a context made in a keeps acting there after the thread left
        nft_a = a.run(Nft)
        assert nft_a.table("inet", "ta") is not None
        # another thread in the same namespace: its own
        other = []
        t = threading.Thread(target=lambda: other.append(a.run(lambda: Nft()._ctx)))
        t.start()
        t.join()
        assert other[0] is not ctx_a
        # a forked child makes its own (the parent's socket is not shared)
        assert in_forked_child(lambda: a.run(lambda: Nft()._ctx) is not ctx_a and
                               a.run(lambda: Nft().table("inet", "ta")) is not None)
        assert a.run(lambda: Nft()._ctx) is ctx_a
        # bounded: the least recently used goes
        for ns in nss[1:]:
            ns.run(Nft)
        assert a.run(lambda: Nft()._ctx) is not ctx_a
        ctx_a = a.run(lambda: Nft()._ctx)
        release_contexts()
        assert a.run(lambda: Nft()._ctx) is not ctx_a
    finally:
        release_contexts()
        for ns in nss:
            ns.close()


def test_lookup_keeps_its_socket_per_namespace(netns_factory):
    """lookup's nfnetlink socket is kept per namespace and thread (closing
    one waits for the kernel, ~3.5 ms, which a DEL paid per lookup), counted
    in kept_fds, never shared with a forked child, closed by
    release_contexts."""
    release_contexts()
    a, b = (NetNS.open(netns_factory("cnsk-nl").path) for _ in range(2))
    try:
        def fds() -> set[int]:
            return set(kept_fds())

        assert a.run(lambda: lookup("ip", "nat", [GetTable(), GetChain("x")])) == [False, False]
        first = fds()
        assert len(first) == 1
        assert a.run(lambda: lookup("ip6", "nat", [GetChain("y")])) == [False]
        assert fds() == first  # reused, whatever the family
        b.run(lambda: lookup("inet", "t", [GetTable()]))
        assert len(fds()) == 2 and first < fds()
        assert in_forked_child(lambda: not kept_fds() and a.run(
            lambda: lookup("ip", "nat", [GetTable()])) == [False] and len(kept_fds()) == 1)
        release_contexts()
        assert not fds()
    finally:
        release_contexts()
        a.close()
        b.close()


def test_status_is_50_without_libnftables(monkeypatch):
    def broken(*a, **k):
        raise OSError("libnftables.so.1: cannot open shared object file")

    release_contexts()  # a kept context would answer without loading the library
    monkeypatch.setattr(nftables, "Nftables", broken)
    with pytest.raises(NftError) as e:
        nft_status()
    assert e.value.code == ERR_PLUGIN_NOT_AVAILABLE

    conf = {"cniVersion": "1.1.0", "name": "n", "type": "bridge", "ipMasq": True}
    out, code = dispatch(Bridge, {"CNI_COMMAND": "STATUS", "CNI_PATH": "/nonexistent"},
                         json.dumps(conf).encode())
    assert code != 0 and json.loads(out)["code"] == ERR_PLUGIN_NOT_AVAILABLE
