"""The start-up shortcuts (`cni_skel.startup`) reach into pyroute2's and
pydantic's layout; they run only on the library versions they were checked
against. These tests fail loudly when an installed library leaves that range
or its layout moves: re-check the shortcut, then widen the range."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pydantic
import pyroute2

from cni_skel import startup


def test_installed_pyroute2_is_in_the_verified_range():
    version = startup.installed_version("pyroute2")
    assert version is not None
    assert ".".join(map(str, version)) == pyroute2.__version__.split("+")[0].split("-")[0]
    low, high = startup.PYROUTE2_VERIFIED
    assert low <= version < high, (
        f"pyroute2 {pyroute2.__version__} is outside {startup.PYROUTE2_VERIFIED}: check that "
        "PYROUTE2_NAMES still matches its __init__ and widen PYROUTE2_VERIFIED")


def test_installed_pydantic_is_in_the_verified_range():
    version = startup.installed_version("pydantic")
    assert version is not None
    assert ".".join(map(str, version)) == pydantic.VERSION
    low, high = startup.PYDANTIC_VERIFIED
    assert low <= version < high, (
        f"pydantic {pydantic.VERSION} is outside {startup.PYDANTIC_VERIFIED}: check "
        "pydantic.plugin._loader.get_plugins and widen PYDANTIC_VERIFIED")


def test_pydantic_private_loader_still_has_get_plugins():
    loader = importlib.import_module("pydantic.plugin._loader")
    assert callable(loader.get_plugins)
    assert startup._loader_has_get_plugins()


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_shortcuts_apply_on_the_verified_versions():
    out = _fresh("from cni_skel import startup as s\n"
                 "print(s.lazy_pyroute2(), s.skip_pydantic_plugin_scan())")
    assert out == "True True"


def test_shortcuts_stand_down_outside_the_verified_range():
    out = _fresh("from cni_skel import startup as s\n"
                 "s.PYROUTE2_VERIFIED = ((0, 0), (0, 1))\n"
                 "s.PYDANTIC_VERIFIED = ((0, 0), (0, 1))\n"
                 "print(s.lazy_pyroute2(), s.skip_pydantic_plugin_scan())\n"
                 "import sys, pyroute2, pydantic\n"
                 "print(type(sys.modules['pyroute2']).__name__)")
    assert out.splitlines() == ["False False", "module"]
