"""What the tests of the docs' walk-throughs share (tests/test_tutorial.py:
docs/tutorial.md, tests/test_village.py: docs/village.md) and of the code
they show (tests/test_ptp_example.py): run a page as written, and hold code
to cni-skel's public names and to a third-party project's lint.

A page's fenced blocks with an info string are its steps: ```` ```sh run ````
runs the block with bash in the reader's directory, ```` ```python
file=PATH ```` writes the block to PATH there; the other blocks are prose.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import cni_skel

# A fence with an info string: ```sh run / ```python file=ptp/cni_ptp/plugin.py
FENCE = re.compile(r"^```(\w+)(?:[ \t]+([^\n]*))?\n(.*?)^```$", re.M | re.S)


def steps(page: pathlib.Path) -> list[tuple[str, str]]:
    """The page's steps in order: ``("run", script)`` or ``(path, text)``."""
    out = []
    for m in FENCE.finditer(page.read_text()):
        lang, info, body = m[1], (m[2] or "").strip(), m[3]
        if lang == "sh" and info == "run":
            out.append(("run", body))
        elif info.startswith("file="):
            out.append((info.removeprefix("file="), body))
    return out


def run_page(page: pathlib.Path, cwd: pathlib.Path) -> str:
    """Follow the page in ``cwd`` with the cni-skel of this checkout (its
    bin directory first on PATH); the last script's stdout. A failing
    script or a file written into a missing directory fails the test."""
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    last = ""
    for what, body in steps(page):
        if what == "run":
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
            assert proc.returncode == 0, f"$ {body}\n{proc.stdout}\n{proc.stderr}"
            last = proc.stdout
        else:
            path = cwd / what
            assert path.parent.is_dir(), f"{what}: {page.name} writes into a missing directory"
            path.write_text(body)
    return last


def imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(module, name)`` of each import in the file (``name`` "" for ``import module``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def non_public_imports(path: pathlib.Path) -> list[str]:
    """What the file imports from cni-skel beyond its public names
    (``cni_skel.PUBLIC``, the modules of ``cni_skel.PUBLIC_MODULES`` and
    their ``__all__``: docs/stability.md), or from the reference plugins."""
    public_modules = {f"cni_skel.{m}" for m in cni_skel.PUBLIC_MODULES}
    bad = []
    for module, name in imports(path):
        if module.startswith(("cni_skel_plugins", "plugins")):
            bad.append(module)
        elif module == "cni_skel":
            if name not in cni_skel.PUBLIC and name not in cni_skel.PUBLIC_MODULES:
                bad.append(f"cni_skel.{name}")
        elif module.startswith("cni_skel."):
            if module not in public_modules:
                bad.append(module)
            elif name and name not in __import__(module, fromlist=["_"]).__all__:
                bad.append(f"{module}.{name}")
    return bad


def third_party_lint(project: pathlib.Path) -> subprocess.CompletedProcess:
    """ruff over ``project`` as an author's own project would run it (its
    defaults, cni_skel a third-party package): the finished process."""
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    return subprocess.run([ruff, "check", "--isolated", "--no-cache", "--line-length", "100",
                           "--select", "E,F,W,I,B,UP", "."], cwd=project, capture_output=True,
                          text=True, check=False)
