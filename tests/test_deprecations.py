"""Every name 0.1.0 documented that moved or went still answers (issue 32):
a working alias that warns once per use (DeprecationWarning naming the
replacement, pointing at the caller's line), or, where no alias can work, an
error naming the replacement. The table is cni_skel.compat.DEPRECATED; a
0.1.0-style plugin run end to end is tests/test_compat_010.py."""

from __future__ import annotations

import importlib
import json
import pathlib
import warnings

import pytest
from test_rollback import FakeExec

import cni_skel
from cni_skel import compat, netlink
from cni_skel.config import GCAttachment
from cni_skel.env import CmdArgs
from cni_skel.errors import CNIError
from cni_skel.invoke import set_in_process_runner
from cni_skel.runtime import NetworkAttachment, RuntimeConf
from cni_skel.skel import Plugin, dispatch
from cni_skel.testing import install_plugin, run_plugin
from cni_skel.warm import install, server

THIS = __file__


def one_warning(record, name: str) -> str:
    """The single DeprecationWarning in ``record``: it names ``name``, the
    release that removes it, and points at this file."""
    dep = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert len(dep) == 1, [str(w.message) for w in dep]
    text = str(dep[0].message)
    assert name in text and "0.3.0" in text, text
    assert dep[0].filename == THIS, (dep[0].filename, text)
    return text


def test_every_entry_names_a_replacement_and_a_removal():
    for name, (replacement, since, until) in compat.DEPRECATED.items():
        assert name.startswith("cni_skel.") and replacement, name
        assert since == "0.2.0" and until in ("0.2.0", "0.3.0"), name
        assert name in compat.message(name)


def test_verbs_module_works_and_warns_once_per_class(tmp_path, monkeypatch, pod_netns):
    (tmp_path / "oldverbs.py").write_text(
        "from cni_skel import Result\n"
        "calls = []\n"
        "def add(args, conf):\n    calls.append('add')\n    return Result()\n"
        "def delete(args, conf):\n    calls.append('del')\n"
        "def gc(args, conf):\n    calls.append('gc')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(DeprecationWarning) as record:
        class Old(Plugin):
            name = "old"
            verbs = "oldverbs"

            def check(self, args, conf):  # a method wins over the module
                raise CNIError(7, "method check")
    text = one_warning(record, "Plugin.verbs")
    assert "methods add/check/delete" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        class Child(Old):  # inherits verbs: its class statement set nothing
            pass
    calls = importlib.import_module("oldverbs").calls
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "old"}
    env = {"CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent",
           "CNI_NETNS": pod_netns.path}
    stdin = json.dumps(conf).encode()
    out, code = dispatch(Child, {**env, "CNI_COMMAND": "ADD"}, stdin)
    assert code == 0 and json.loads(out)["cniVersion"] == "1.1.0"
    out, code = dispatch(Child, {**env, "CNI_COMMAND": "CHECK"}, stdin)
    assert (code, json.loads(out)["msg"]) == (1, "method check")
    for verb in ("DEL", "GC"):
        assert dispatch(Child, {**env, "CNI_COMMAND": verb}, stdin)[1] == 0
    # STATUS: the module has none, so the default (no IPAM named: success)
    assert dispatch(Child, {**env, "CNI_COMMAND": "STATUS"}, stdin)[1] == 0
    assert calls == ["add", "del", "gc"]


@pytest.mark.parametrize(("verb", "method"), [("ADD", "add"), ("CHECK", "check"),
                                              ("DEL", "delete")])
def test_a_plugin_without_the_verb_says_which_method_to_define(verb, method, pod_netns):
    class Bare(Plugin):
        name = "bare"

    conf = json.dumps({"cniVersion": "1.1.0", "name": "n", "type": "bare"}).encode()
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
           "CNI_PATH": "/nonexistent", "CNI_NETNS": pod_netns.path}
    out, code = dispatch(Bare, env, conf)
    err = json.loads(out)
    assert code == 1 and err["code"] == 999
    assert err["msg"] == (f"bare: {verb} is not implemented: {Bare.__qualname__} (a "
                          f"cni_skel.Plugin) defines no {method}(self, args, conf) method; "
                          "define it on the class")


def test_link_item_access_warns_and_answers_as_the_old_dict():
    link = netlink.Link(index=3, name="veth0", mac="aa:bb:cc:dd:ee:ff", mtu=1400,
                        peer_index=7, master=2)
    with pytest.warns(DeprecationWarning) as record:
        assert link["mac"] == "aa:bb:cc:dd:ee:ff"
    one_warning(record, "Link.__getitem__")
    with pytest.warns(DeprecationWarning) as record:
        assert link.get("link") == 7  # 0.1.0's key for IFLA_LINK
    one_warning(record, "Link.get")
    with pytest.warns(DeprecationWarning):
        assert [link[k] for k in ("index", "name", "mtu", "master", "up")] == \
            [3, "veth0", 1400, 2, False]
    with pytest.warns(DeprecationWarning):
        assert link.get("nosuchkey", "dflt") == "dflt"
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        link["nosuchkey"]


def _args(ex: FakeExec) -> CmdArgs:
    return CmdArgs("ADD", "c1", "/run/netns/x", "eth0", path="/fake",
                   stdin_data=b'{"cniVersion": "1.1.0"}', env={"CNI_PATH": "/fake"}, exec=ex)


def test_ipam_add_guard_releases_on_failure_and_warns():
    ex = FakeExec()
    with pytest.warns(DeprecationWarning) as record:
        guard = cni_skel.ipam_add_guard("host-local", b"{}", _args(ex))
    one_warning(record, "ipam_add_guard")
    with pytest.raises(CNIError, match="veth exploded"), guard as result:
        assert str(result.ips[0].address) == "10.1.2.3/24"
        raise CNIError(999, "veth exploded")
    assert ex.calls == ["ADD /fake/host-local", "DEL /fake/host-local"]
    ex = FakeExec()
    with pytest.warns(DeprecationWarning), \
            cni_skel.invoke.ipam_add_guard("host-local", b"{}", _args(ex)):
        pass
    assert ex.calls == ["ADD /fake/host-local"]


def test_set_in_process_runner_is_an_error_naming_the_exec_seam():
    with pytest.raises(RuntimeError, match=r"removed in cni-skel 0\.2\.0: no alias can work: "
                                           r"pass an Exec to dispatch\(exec=\.\.\.\)"):
        set_in_process_runner(None)


def test_renamed_attributes_warn_and_answer():
    args = CmdArgs("ADD", typed_args="typed")
    with pytest.warns(DeprecationWarning) as record:
        assert args.cni_args == "typed"
    one_warning(record, "CmdArgs.cni_args")
    with pytest.warns(DeprecationWarning) as record:
        assert RuntimeConf("c1", args=[("A", "1"), ("B", "2")]).cni_args == "A=1;B=2"
    one_warning(record, "RuntimeConf.cni_args")
    with pytest.warns(DeprecationWarning) as record:
        assert NetworkAttachment("c1", "net", "eth0", args=[("A", "1")]).cni_args == [("A", "1")]
    one_warning(record, "NetworkAttachment.cni_args")


def old_name(module: str, name: str):
    """``from <module> import <name>``, as 0.1.0-style code writes it."""
    return getattr(importlib.import_module(module), name)


def test_moved_names_warn_and_answer():
    with pytest.warns(DeprecationWarning) as record:
        assert old_name("cni_skel.config", "ValidAttachment") is GCAttachment
    one_warning(record, "config.ValidAttachment")
    with pytest.warns(DeprecationWarning) as record:
        assert old_name("cni_skel.install", "write_executable") is install.write_executable
    assert "cni_skel.cli.write_executable" in one_warning(record, "cni_skel.install")
    with pytest.warns(DeprecationWarning) as record:
        assert old_name("cni_skel.worker", "Worker") is server.Worker
    one_warning(record, "cni_skel.worker")
    with pytest.raises(AttributeError, match="NoSuchName"):
        old_name("cni_skel.worker", "NoSuchName")


def test_deprecated_names_stay_out_of_the_public_listing():
    assert "ipam_add_guard" not in cni_skel.PUBLIC
    assert "ipam_add_guard" not in dir(cni_skel)
    assert {"install", "worker"}.isdisjoint(cni_skel.PUBLIC_MODULES)


def test_a_one_shot_plugin_s_warnings_reach_the_test(tmp_path, node_netns, pod_netns):
    # An executable runs `python -I`: the harness carries its warnings back
    # (CNI_SKEL_WARNINGS), with the plugin's own file, line and module.
    (tmp_path / "warner.py").write_text(
        "from cni_skel import Plugin\n\n\n"
        "class Warner(Plugin):\n"
        "    name = 'warner'\n"
        "    verbs = 'warner_verbs'\n")
    (tmp_path / "warner_verbs.py").write_text(
        "from cni_skel import Result\n\n\n"
        "def add(args, conf):\n"
        "    assert args.cni_args is None\n"
        "    return Result()\n")
    with pytest.warns(DeprecationWarning, match="Plugin.verbs"):  # install imports it too
        exe = install_plugin(tmp_path / "bin", "warner", "warner:Warner",
                             pythonpath=[str(tmp_path)])
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "warner"}
    with pytest.warns(DeprecationWarning) as record:
        result = run_plugin(exe, "ADD", conf, netns=pod_netns.path, node=node_netns)
    assert result["cniVersion"] == "1.1.0"
    seen = sorted((pathlib.Path(w.filename).name, w.lineno, str(w.message).split(" ")[0])
                  for w in record)
    assert seen == [("warner.py", 4, "cni_skel.skel.Plugin.verbs"),
                    ("warner_verbs.py", 5, "cni_skel.env.CmdArgs.cni_args")]
