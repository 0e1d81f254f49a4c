"""`cni-skel new-plugin`: the project it writes works out of the box (its own
tests pass with pytest run in that directory), registers the entry point, and
its plugin runs in a list through the cni-skel runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

import cni_skel
from cni_skel import netlink
from cni_skel.netns import NetNS
from cni_skel.plugin_template import names_for
from cni_skel.runtime import Runtime, RuntimeConf
from cni_skel.testing import install_plugin

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")


def new_plugin(*args, cwd=None):
    return subprocess.run([CLI, "new-plugin", *args], capture_output=True, text=True,
                          cwd=cwd, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    parent = tmp_path_factory.mktemp("gen")
    proc = new_plugin("mtu-setter", "--dir", str(parent))
    assert proc.returncode == 0, proc.stderr
    return parent / "mtu-setter"


def test_writes_the_project(project):
    files = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert files == ["README.md", "cni_mtu_setter/__init__.py", "cni_mtu_setter/plugin.py",
                     "pyproject.toml", "tests/test_plugin.py"]
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["cni_skel.plugins"] == {
        "mtu-setter": "cni_mtu_setter:MtuSetter"}
    assert meta["project"]["dependencies"] == [f"cni-skel>={cni_skel.__version__}"]
    assert meta["project"]["optional-dependencies"]["test"] == ["pytest>=8"]


def test_generated_tests_pass_out_of_the_box(project):
    # As a plugin author runs them: pytest in the project directory; the
    # cni_skel fixtures come in through the pytest11 entry point.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=project, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


def test_generated_code_is_lint_clean(project):
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    proc = subprocess.run([ruff, "check", "--isolated", "--no-cache", "--line-length", "100",
                           "--select", "E,F,W,I,B,UP", "."], cwd=project, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_generated_plugin_runs_in_a_list(project, tmp_path, node_netns, pod_netns, go_cni_dir):
    """Chained after the Go bridge, through the runtime: the MTU is set."""
    bin_dir = tmp_path / "bin"
    install_plugin(bin_dir, "mtu-setter", "cni_mtu_setter:MtuSetter",
                   pythonpath=[str(project)])
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-n.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "n", "plugins": [
            {"type": "bridge", "bridge": "cnsk-np0",
             "ipam": {"type": "host-local", "subnet": "10.45.0.0/24",
                      "dataDir": str(tmp_path / "ipam")}},
            {"type": "mtu-setter", "mtu": 1300}]}))
    cni = Runtime(conf_dir=str(conf_dir), bin_dirs=[str(bin_dir), go_cni_dir],
                  cache_dir=str(tmp_path / "cache"), plugin_netns=node_netns.path)
    net = cni.load_conflist("n")
    rt = RuntimeConf("np1", pod_netns.path, "eth0")
    result = cni.add(net, rt)
    assert str(result.ips[0].address).startswith("10.45.0.")     # prevResult passed on
    with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
        assert netlink.find_link(ipr, "eth0").mtu == 1300
    cni.check(net, rt)
    cni.delete(net, rt)


@pytest.mark.parametrize("name, module, cls", [
    ("mtu-setter", "cni_mtu_setter", "MtuSetter"),
    ("vlan_tag", "cni_vlan_tag", "VlanTag"),
    ("x1", "cni_x1", "X1"),
])
def test_names(name, module, cls):
    assert names_for(name) == (module, cls)


@pytest.mark.parametrize("bad", ["Bad", "1abc", "a--b", "a-", "a/b", "a.b", ""])
def test_rejects_bad_names(tmp_path, bad):
    proc = new_plugin(bad, "--dir", str(tmp_path))
    assert proc.returncode == 2 and "invalid plugin name" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_non_empty_directory_without_force(tmp_path):
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "mine.txt").write_text("keep")
    proc = new_plugin("p1", "--dir", str(tmp_path))
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert new_plugin("p1", "--dir", str(tmp_path), "--force").returncode == 0
    assert (tmp_path / "p1" / "mine.txt").read_text() == "keep"
    assert (tmp_path / "p1" / "cni_p1" / "plugin.py").exists()
    assert new_plugin("p2", cwd=tmp_path).returncode == 0          # default: current dir
    assert (tmp_path / "p2" / "pyproject.toml").exists()
