"""docs/tutorial.md runs as written: its ``sh run`` blocks are run in order in
a fresh directory (``cni-skel new-plugin ptp`` first, ``python -m pytest`` in
the project last) and its ``python file=PATH`` blocks are written to PATH in
between. The plugin it shows is examples/ptp's, byte for byte; its own test
ADDs a pod through the runtime, pings the gateway from the pod and checks
that DEL leaves nothing on the node."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
EXAMPLE = ROOT / "examples" / "ptp" / "cni_ptp" / "plugin.py"
# A fence with an info string: ```sh run / ```python file=ptp/cni_ptp/plugin.py
FENCE = re.compile(r"^```(\w+)(?:[ \t]+([^\n]*))?\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[str, str, str]]:
    """``(language, info, body)`` of every fenced block, in order."""
    return [(m[1], (m[2] or "").strip(), m[3]) for m in FENCE.finditer(TUTORIAL.read_text())]


def steps() -> list[tuple[str, str]]:
    """What the test does, in order: ``("run", script)`` or ``(path, text)``."""
    out = []
    for lang, info, body in blocks():
        if lang == "sh" and info == "run":
            out.append(("run", body))
        elif info.startswith("file="):
            out.append((info.removeprefix("file="), body))
    return out


def test_the_tutorial_shows_the_example_plugin():
    files = dict(s for s in steps() if s[0] != "run")
    assert files["ptp/cni_ptp/plugin.py"] == EXAMPLE.read_text()
    kinds = [s[0] if s[0] == "run" else "file" for s in steps()]
    assert kinds == ["run", "file", "file", "run"], kinds


def test_the_tutorial_runs_as_written(tmp_path):
    """From `cni-skel new-plugin ptp` to the pod pinging its gateway, with
    the cni-skel of this checkout (its bin directory first on PATH)."""
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    for what, body in steps():
        if what == "run":
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
            assert proc.returncode == 0, f"$ {body}\n{proc.stdout}\n{proc.stderr}"
            last = proc.stdout
        else:
            path = tmp_path / what
            assert path.parent.is_dir(), f"{what}: the tutorial writes into a missing directory"
            path.write_text(body)
    assert re.search(r"\b1 passed\b", last), last   # the ping test ran, and passed
    project = tmp_path / "ptp"
    assert (project / "pyproject.toml").read_text().count('ptp = "cni_ptp:Ptp"') == 1


@pytest.mark.parametrize("name", ["Ptp", "PtpConf"])
def test_the_generated_package_exports_what_the_plugin_defines(name):
    """The tutorial drops plugin.py into what new-plugin wrote: its
    __init__ imports these names from it."""
    assert f"class {name}(" in EXAMPLE.read_text()
