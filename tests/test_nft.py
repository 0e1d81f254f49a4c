"""cni_skel.nft: the libnftables JSON layer, against the kernel in a test
namespace, and its failure modes (STATUS code 50 without libnftables)."""

from __future__ import annotations

import errno
import json

import pytest

from cni_skel.errors import ERR_PLUGIN_NOT_AVAILABLE
from cni_skel.netns import NetNS
from cni_skel.nft import COMMENT_MAX, Nft, NftError, attachment_tag, nft_status
from cni_skel.skel import dispatch


def test_attachment_tag_fits_a_comment():
    assert attachment_tag("abc", "eth0") == "abc/eth0"
    long_id = "f" * 300
    tag = attachment_tag(long_id, "eth0")
    assert tag.startswith("sha256:") and len(tag) <= COMMENT_MAX
    assert tag == attachment_tag(long_id, "eth0") != attachment_tag(long_id, "eth1")


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


def test_status_is_50_without_libnftables(monkeypatch):
    import nftables

    def broken(*a, **k):
        raise OSError("libnftables.so.1: cannot open shared object file")

    monkeypatch.setattr(nftables, "Nftables", broken)
    with pytest.raises(NftError) as e:
        nft_status()
    assert e.value.code == ERR_PLUGIN_NOT_AVAILABLE

    from cni_skel_plugins.bridge import Bridge

    conf = {"cniVersion": "1.1.0", "name": "n", "type": "bridge", "ipMasq": True}
    out, code = dispatch(Bridge, {"CNI_COMMAND": "STATUS", "CNI_PATH": "/nonexistent"},
                         json.dumps(conf).encode())
    assert code != 0 and json.loads(out)["code"] == ERR_PLUGIN_NOT_AVAILABLE
