"""Test helpers for plugin authors (a pytest plugin, auto-loaded when
cni-skel is installed).

Run a plugin executable exactly as a runtime does (environment + stdin in,
one JSON document out) inside throw-away network namespaces:

    def test_add(netns_factory, tmp_path):
        node, pod = netns_factory("node"), netns_factory("pod")
        exe = install_plugin(tmp_path, "my-plugin", "my_pkg.plugin:MyPlugin")
        result = run_plugin(exe, "ADD", {"cniVersion": "1.1.0", "name": "n",
                            "type": "my-plugin"}, netns=pod.path, node=node)

Assert on what the kernel holds: ``icmp_ping`` (ICMP echo from inside a
namespace, bounded), ``nft_table`` (an nftables table listed in one).

Fixtures: ``netns_factory`` (make named namespaces, removed at teardown),
``node_netns`` and ``pod_netns`` (one each). All of them need root; without
it they skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import (
    PluginRun,
    TestNetNS,
    create_netns,
    icmp_ping,
    install_plugin,
    nft_table,
    remove_netns,
    run_plugin,
    run_plugin_raw,
)

__all__ = [
    "PluginRun",
    "TestNetNS",
    "create_netns",
    "icmp_ping",
    "install_plugin",
    "netns_factory",
    "nft_table",
    "node_netns",
    "pod_netns",
    "remove_netns",
    "run_plugin",
    "run_plugin_raw",
]


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")


@pytest.fixture
def netns_factory() -> Iterator[Any]:
    """Call it to get a fresh `TestNetNS`; all are removed after the test."""
    _need_root()
    made: list[TestNetNS] = []

    def make(prefix: str = "cnsk") -> TestNetNS:
        ns = create_netns(prefix)
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        remove_netns(ns)


@pytest.fixture
def node_netns(netns_factory: Any) -> TestNetNS:
    """A namespace standing in for the node (host) a runtime runs plugins on."""
    return netns_factory("cnsk-node")


@pytest.fixture
def pod_netns(netns_factory: Any) -> TestNetNS:
    """A namespace standing in for a pod sandbox (CNI_NETNS)."""
    return netns_factory("cnsk-pod")
