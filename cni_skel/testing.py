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
``node_netns`` and ``pod_netns`` (one each), ``cni_netns_prefix`` (the first
part of their names, ``cnsk`` unless your conftest overrides it), and
``cni_conformance`` (the conformance kit, `cni_skel.conformance`, on your
plugin). The namespace fixtures need root; without it they skip.

Hold your plugin to the CNI spec with the kit: every check of ``cni-skel
conformance``, in namespaces of its own; a failed check fails the test with
the kit's table. A chained plugin runs after one of ours
(`install_reference_plugin`):

    def test_conformance(cni_conformance, tmp_path):
        install_plugin(tmp_path, "my-plugin", "my_pkg.plugin:MyPlugin")
        install_reference_plugin(tmp_path, "ptp")
        install_reference_plugin(tmp_path, "host-local")
        cni_conformance({"cniVersion": "1.1.0", "name": "n", "plugins": [
            {"type": "ptp", "ipam": {"type": "host-local", "subnet": "10.9.0.0/24",
                                     "dataDir": str(tmp_path / "ipam")}},
            {"type": "my-plugin"}]}, [tmp_path])

Namespace names are ``<prefix>-<pid>-<tag>-<n>`` (`create_netns`): to find
what your suite left behind after a crash (``ip netns list``), give it a
prefix of its own in your ``conftest.py``:

    @pytest.fixture
    def cni_netns_prefix():
        return "mtu"       # node_netns: mtu-node-..., pod_netns: mtu-pod-...
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from .conformance import DEFAULT_CONCURRENCY, Report, Target, run_conformance
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
from .warm.install import plugin_registry

__all__ = [
    "PluginRun",
    "TestNetNS",
    "cni_conformance",
    "cni_netns_prefix",
    "create_netns",
    "icmp_ping",
    "install_plugin",
    "install_reference_plugin",
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
def cni_netns_prefix() -> str:
    """The first part of the names of the namespaces `netns_factory` makes
    when given no prefix, and of `node_netns` (``<prefix>-node-...``) and
    `pod_netns` (``<prefix>-pod-...``): ``"cnsk"``.

    Override it (a fixture of this name in your ``conftest.py``, a test
    module or class) to tell your suite's namespaces from others'. Keep it
    short and without ``/``: it becomes a file name under /run/netns.
    """
    return "cnsk"


@pytest.fixture
def netns_factory(cni_netns_prefix: str) -> Iterator[Any]:
    """A function ``make(prefix=None) -> TestNetNS``: each call creates a
    fresh, empty network namespace (``lo`` down) named
    ``<prefix>-<pid>-<tag>-<n>`` (`create_netns`; ``tag``: random per test
    process, ``n``: a counter), so names never clash between tests or
    between suites running at once. ``prefix`` defaults to
    `cni_netns_prefix` (``"cnsk"``). ``.path`` (``/run/netns/<name>``) is
    what CNI_NETNS gets. Every namespace made is removed at teardown, in
    reverse order, whether the test passed or not (one already removed is
    fine). Skips the test without root.
    """
    _need_root()
    made: list[TestNetNS] = []

    def make(prefix: str | None = None) -> TestNetNS:
        ns = create_netns(cni_netns_prefix if prefix is None else prefix)
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        remove_netns(ns)


@pytest.fixture
def node_netns(netns_factory: Any, cni_netns_prefix: str) -> TestNetNS:
    """A namespace standing in for the node (host) a runtime runs plugins
    on: named ``<cni_netns_prefix>-node-<pid>-<tag>-<n>`` (``cnsk-node-...``
    by default), removed at teardown."""
    return netns_factory(f"{cni_netns_prefix}-node")


@pytest.fixture
def pod_netns(netns_factory: Any, cni_netns_prefix: str) -> TestNetNS:
    """A namespace standing in for a pod sandbox (CNI_NETNS): named
    ``<cni_netns_prefix>-pod-<pid>-<tag>-<n>`` (``cnsk-pod-...`` by default),
    removed at teardown."""
    return netns_factory(f"{cni_netns_prefix}-pod")


def install_reference_plugin(bin_dir: str | os.PathLike, name: str) -> str:
    """Write cni-skel's reference plugin ``name`` (``ptp``, ``host-local``,
    ... : the Go plugins' names) into ``bin_dir`` as a one-shot executable,
    as `install_plugin` does; returns its path.

    Raises:
        KeyError: no reference plugin has that name.
    """
    return install_plugin(bin_dir, name, plugin_registry()[name])


@pytest.fixture
def cni_conformance(tmp_path_factory: pytest.TempPathFactory,
                    cni_netns_prefix: str) -> Callable[..., Report]:
    """A function ``check(config, plugin_dirs, *, checks=(), skip=(),
    concurrency=4, expect_ok=True, **target_options) -> Report`` running the
    conformance kit (`cni_skel.conformance.run_conformance`) on ``config``:
    a plugin object or a list (a dict with ``plugins``), or the path of a
    ``.conf``/``.conflist`` file, its plugins found in ``plugin_dirs``.
    ``checks``/``skip``: shell patterns over the check names;
    ``target_options``: the other fields of `cni_skel.conformance.Target`
    (``ifname``, ``state_dirs``, ``capability_args``, ``node_setup``,
    ``timeout``, ``env``). A failed check fails the test with the kit's
    table (``expect_ok=False``: the report is returned whatever it says).
    The kit's namespaces are named ``<cni_netns_prefix>-cf-...``. Skips the
    test without root.
    """
    _need_root()

    def check(config: Mapping[str, Any] | str | os.PathLike, plugin_dirs: Sequence[Any], *,
              checks: Sequence[str] = (), skip: Sequence[str] = (),
              concurrency: int = DEFAULT_CONCURRENCY, expect_ok: bool = True,
              **target_options: Any) -> Report:
        if isinstance(config, Mapping):
            suffix = ".conflist" if "plugins" in config else ".conf"
            path = tmp_path_factory.mktemp("conformance") / f"target{suffix}"
            path.write_text(json.dumps(config))
            config = path
        target = Target.from_file(os.fspath(config), [os.fspath(d) for d in plugin_dirs],
                                  **target_options)
        report = run_conformance(target, checks=checks, skip=skip, concurrency=concurrency,
                                 prefix=f"{cni_netns_prefix}-cf")
        if expect_ok and not report.ok:
            pytest.fail(f"conformance: {', '.join(report.failed)} failed\n"
                        + report.table(verbose=True), pytrace=False)
        return report

    return check
