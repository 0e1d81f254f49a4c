"""What the project teaches raises no DeprecationWarning (issue 32): the
tutorial's plugin (the reference ptp, plugins/ptp/plugin.py, byte for byte
the one docs/tutorial.md writes) and the README's example plugin are
imported and run in-process (ADD, CHECK, DEL through
`cni_skel.skel.dispatch`, in the test's node namespace, IPAM by Go's
host-local) with every DeprecationWarning an error.
In-process because an installed executable runs ``python -I``, where a
warning filter from the test cannot reach it. (`cni-skel new-plugin`'s
output: tests/test_cli_new_plugin.py.)"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
import warnings

import pytest
from conftest import write_readme_example

from cni_skel.netns import NetNS
from cni_skel.skel import dispatch

GO_CNI = "/usr/lib/cni"


def fresh_import(monkeypatch, path: pathlib.Path, module: str, attr: str):
    """``module.attr`` imported anew from ``path`` with warnings as errors."""
    monkeypatch.syspath_prepend(str(path))
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return getattr(importlib.import_module(module), attr)


def run_verbs(plugin, conf: dict, node, pod, cid: str, *, check: bool = True) -> None:
    env = {"CNI_CONTAINERID": cid, "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": GO_CNI}
    stdin = json.dumps(conf).encode()
    with warnings.catch_warnings(), NetNS.open(node.path) as ns, ns.enter():
        warnings.simplefilter("error", DeprecationWarning)
        out, code = dispatch(plugin, {**env, "CNI_COMMAND": "ADD"}, stdin)
        assert code == 0, out
        result = json.loads(out)
        if check:
            out, code = dispatch(plugin, {**env, "CNI_COMMAND": "CHECK"},
                                 json.dumps({**conf, "prevResult": result}).encode())
            assert code == 0, out
        out, code = dispatch(plugin, {**env, "CNI_COMMAND": "DEL"}, stdin)
        assert code == 0, out


@pytest.mark.skipif(not pathlib.Path(GO_CNI, "host-local").exists(),
                    reason="Debian's containernetworking-plugins is not installed")
def test_tutorial_ptp_runs_without_deprecation_warnings(monkeypatch, tmp_path, node_netns,
                                                        pod_netns):
    ptp = fresh_import(monkeypatch, tmp_path, "cni_skel_plugins.ptp", "Ptp")
    conf = {"cniVersion": "1.0.0", "name": "ptp-nodep", "type": "ptp", "mtu": 1400,
            "ipam": {"type": "host-local", "subnet": "10.49.0.0/24",
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(tmp_path / "ipam")}}
    run_verbs(ptp, conf, node_netns, pod_netns, "nodep-ptp")


@pytest.mark.skipif(not pathlib.Path(GO_CNI, "host-local").exists(),
                    reason="Debian's containernetworking-plugins is not installed")
def test_readme_example_runs_without_deprecation_warnings(monkeypatch, tmp_path, node_netns,
                                                          pod_netns):
    write_readme_example(tmp_path)
    veth = fresh_import(monkeypatch, tmp_path, "veth_ipam", "VethPlugin")
    conf = {"cniVersion": "1.0.0", "name": "veth-nodep", "type": "veth-ipam",
            "ipam": {"type": "host-local", "subnet": "10.49.1.0/24",
                     "dataDir": str(tmp_path / "ipam")}}
    run_verbs(veth, conf, node_netns, pod_netns, "nodep-veth", check=False)  # it has no CHECK
