"""`cni-skel new-plugin`: the project it writes works out of the box (its own
tests pass with pytest run in that directory), registers the entry point, and
its plugin runs in a list through the cni-skel runtime; its README's "Add a
second plugin", followed to the letter, gives a second installable plugin;
the generated code raises no DeprecationWarning."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import warnings

import pytest

import cni_skel
from cni_skel import CNIError, dispatch, netlink
from cni_skel.netns import NetNS
from cni_skel.plugin_template import names_for
from cni_skel.runtime import Runtime, RuntimeConf
from cni_skel.testing import install_plugin, run_plugin, run_plugin_raw

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


def _second_plugin_section(project):
    text = (project / "README.md").read_text()
    _, found, section = text.partition("\n## Add a second plugin\n")
    assert found, "the generated README lost its 'Add a second plugin' section"
    return section.split("\n## ", 1)[0]


def _blocks(section, lang):
    """The ```lang blocks of ``section``, dedented (they sit in list items)."""
    return [textwrap.dedent(body) for _indent, body in
            re.findall(rf"^( *)```{lang}\n(.*?)^\1```$", section, re.S | re.M)]


def _follow_second_plugin(project, module):
    """Do what the README says: the module, one more entry-point line."""
    section = _second_plugin_section(project)
    assert f"`{module}/passthrough.py`" in section
    [code] = _blocks(section, "python")
    (project / module / "passthrough.py").write_text(code)
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    [table] = _blocks(section, "toml")
    new = [line for line in table.splitlines() if line not in text.splitlines()]
    assert len(new) == 1, new                   # "one more line"
    header = '[project.entry-points."cni_skel.plugins"]\n'
    assert header in text and header.strip() in table
    name = project.name
    old = f'{name} = "{module}:{names_for(name)[1]}"\n'
    pyproject.write_text(text.replace(old, old + new[0] + "\n"))


@pytest.fixture(scope="module")
def duo(tmp_path_factory):
    """A project with the README's second plugin added, pip-installed (as
    `pip install .` does, into a directory of its own): that directory."""
    parent = tmp_path_factory.mktemp("duo")
    assert new_plugin("duo", "--dir", str(parent)).returncode == 0
    project = parent / "duo"
    _follow_second_plugin(project, "cni_duo")
    site = parent / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(site),
                           str(project)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return site


def test_readme_says_how_to_add_a_second_plugin(project):
    section = _second_plugin_section(project)
    for step in ("class Passthrough(Plugin):", "`cni_mtu_setter/passthrough.py`",
                 'mtu-setter-passthrough = "cni_mtu_setter.passthrough:Passthrough"',
                 "`pip install .`", "cni-skel install --bin-dir /opt/cni/bin "
                 "mtu-setter-passthrough"):
        assert step in section, step


def test_second_plugin_from_the_readme_installs(duo, tmp_path, node_netns, pod_netns):
    site = duo
    eps = {ep.name: ep.value for dist in importlib.metadata.distributions(path=[str(site)])
           for ep in dist.entry_points if ep.group == "cni_skel.plugins"}
    assert eps == {"duo": "cni_duo:Duo", "duo-passthrough": "cni_duo.passthrough:Passthrough"}
    assert (site / "cni_duo" / "passthrough.py").exists()      # packaged
    # `cni-skel install NAME` finds it through the entry point and imports it
    # (its VERSION answer and about text are baked in)
    bin_dir = tmp_path / "bin"
    proc = subprocess.run([CLI, "install", "--one-shot", "--bin-dir", str(bin_dir),
                           "duo-passthrough"], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(bin_dir) == ["duo-passthrough"]
    about = run_plugin_raw(str(bin_dir / "duo-passthrough"), "", node=node_netns)
    assert about.exit_code == 0 and "duo-passthrough" in about.stderr
    # the installed copy runs: prevResult passed on, a config error without one
    exe = install_plugin(tmp_path / "run", "duo-passthrough", eps["duo-passthrough"],
                         pythonpath=[str(site)])
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "duo-passthrough"}
    prev = {"cniVersion": "1.1.0", "ips": [{"address": "10.46.0.5/24"}]}
    result = run_plugin(exe, "ADD", {**conf, "prevResult": prev}, netns=pod_netns.path,
                        node=node_netns)
    assert result["ips"] == prev["ips"]
    with pytest.raises(CNIError) as err:
        run_plugin(exe, "ADD", conf, netns=pod_netns.path, node=node_netns)
    assert err.value.code == 7
    run_plugin(exe, "DEL", conf, netns=pod_netns.path, node=node_netns)


def test_generated_code_raises_no_deprecation_warning(duo, node_netns, pod_netns,
                                                       monkeypatch):
    """Both plugins, imported fresh (class creation can warn) and run in this
    process (each verb can warn) with every warning recorded."""
    monkeypatch.syspath_prepend(str(duo))
    with NetNS.open(pod_netns.path) as ns, ns.rtnl() as ipr:
        ipr.link("add", ifname="eth0", kind="veth", peer="peer0")
    mtu = {"cniVersion": "1.1.0", "name": "n", "type": "duo", "mtu": 1280}
    pas = {"cniVersion": "1.1.0", "name": "n", "type": "duo-passthrough",
           "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.46.0.5/24"}]}}
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": "/nonexistent"}
    try:
        with warnings.catch_warnings(record=True) as caught, NetNS.open(node_netns.path) as node:
            warnings.simplefilter("always")
            duo_cls = importlib.import_module("cni_duo").Duo
            pas_cls = importlib.import_module("cni_duo.passthrough").Passthrough

            def calls():
                return [dispatch(cls, {**env, "CNI_COMMAND": verb}, json.dumps(conf).encode())
                        for cls, conf in ((duo_cls, mtu), (pas_cls, pas))
                        for verb in ("ADD", "CHECK", "DEL")]
            answers = node.run(calls)
    finally:
        for name in [m for m in sys.modules if m == "cni_duo" or m.startswith("cni_duo.")]:
            del sys.modules[name]
    assert [code for _out, code in answers] == [0] * 6, answers
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == []


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
    # Its conformance test makes some 300 one-shot calls (ptp, host-local, the plugin).
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=project, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout


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
