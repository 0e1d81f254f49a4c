"""docs/tutorial.md runs as written: its ``sh run`` blocks are run in order in
a fresh directory (``cni-skel new-plugin ptp`` first, ``python -m pytest`` in
the project last) and its ``python file=PATH`` blocks are written to PATH in
between. The plugin it writes is cni-skel's reference ptp
(plugins/ptp/plugin.py, package cni_skel_plugins.ptp), byte for byte: one
copy of the code, which tests/test_ptp.py holds to Go's ptp. The tutorial's
own test ADDs a pod through the runtime, pings the gateway from the pod and
checks that DEL leaves nothing on the node."""

from __future__ import annotations

import pathlib
import re

import pytest
from doc_runner import run_page, steps

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
PLUGIN = ROOT / "plugins" / "ptp" / "plugin.py"  # the reference ptp: the tutorial's subject


def test_the_tutorial_writes_the_reference_plugin():
    files = dict(s for s in steps(TUTORIAL) if s[0] != "run")
    assert files["ptp/cni_ptp/plugin.py"] == PLUGIN.read_text()
    kinds = [s[0] if s[0] == "run" else "file" for s in steps(TUTORIAL)]
    assert kinds == ["run", "file", "file", "run"], kinds


def test_the_tutorial_runs_as_written(tmp_path):
    """From `cni-skel new-plugin ptp` to the pod pinging its gateway, with
    the cni-skel of this checkout (its bin directory first on PATH)."""
    last = run_page(TUTORIAL, tmp_path)
    assert re.search(r"\b1 passed\b", last), last   # the ping test ran, and passed
    project = tmp_path / "ptp"
    assert (project / "pyproject.toml").read_text().count('ptp = "cni_ptp:Ptp"') == 1


@pytest.mark.parametrize("name", ["Ptp", "PtpConf"])
def test_the_generated_package_exports_what_the_plugin_defines(name):
    """The tutorial drops plugin.py into what new-plugin wrote: its
    __init__ imports these names from it."""
    assert f"class {name}(" in PLUGIN.read_text()
