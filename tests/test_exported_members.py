"""The public surface: what `cni_skel` exports is pinned here, so adding or
dropping a name is a decision a reviewer sees (as httpx's
test_exported_members.py). Every ``__all__`` of the SDK's modules names
something that exists."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import pydoc

import cni_skel

PUBLIC = [
    "ALL_VERSIONS", "CNIArgs", "CNIError", "CURRENT_VERSION", "CmdArgs", "DNS", "Exec",
    "GCAttachment", "IPAMConf", "IPConfig", "Interface", "K8sArgs", "Link", "NetConf", "NetNS",
    "Plugin", "Result", "Rollback", "Route", "SubprocessExec", "check_ip_masq", "delegate_add",
    "delegate_check", "delegate_del", "delegate_gc", "delegate_status", "dispatch",
    "enable_forward", "gc_ip_masq", "ipam_add", "load_args", "open_netns", "parse_result",
    "rollback", "setup_ip_masq", "setup_veth", "teardown_ip_masq",
]


def test_public_names_are_pinned():
    assert sorted(cni_skel.PUBLIC) == sorted(PUBLIC)


def test_type_checkers_see_the_same_names():
    # py.typed: the TYPE_CHECKING block re-exports (``X as X``) every lazy name.
    tree = ast.parse(inspect.getsource(cni_skel))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    seen = {alias.asname for node in block.body if isinstance(node, ast.ImportFrom)
            and node.level == 1 for alias in node.names}
    assert seen == set(PUBLIC) - {"Rollback", "rollback"}


def test_help_is_a_map_not_a_dump():
    # With __all__, help() rendered each pydantic model with all of
    # BaseModel's methods: 5,000 lines.
    text = pydoc.render_doc(cni_skel, renderer=pydoc.plaintext)
    assert len(text.splitlines()) < 150
    assert "help(cni_skel.Plugin)" in text


def test_every_exported_name_resolves_to_the_sdk():
    for name in cni_skel.PUBLIC:
        value = getattr(cni_skel, name)
        module = getattr(value, "__module__", None)
        assert module is None or module.startswith("cni_skel"), (name, module)
        assert name in dir(cni_skel)


def test_rollback_is_the_function_not_the_module():
    assert callable(cni_skel.rollback) and not isinstance(cni_skel.rollback, type(cni_skel))


def test_every_module_all_names_what_exists():
    names = [m.name for m in pkgutil.walk_packages(cni_skel.__path__, "cni_skel.")
             if not m.name.endswith("__main__")]
    assert "cni_skel.warm.protocol" in names and "cni_skel.runtime.api" in names
    for name in names:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            assert hasattr(module, attr), f"{name}.__all__ names {attr}, which it lacks"
