"""docs/conformance.md runs as written (its ``sh run`` blocks in order, in a
fresh directory, as tests/test_tutorial.py runs the tutorial), and its table
of checks is the kit's own (`cni_skel.conformance.CHECKS`), row for row."""

from __future__ import annotations

import pathlib
import re

import pytest
from doc_runner import run_page

from cni_skel.conformance import CHECKS

pytestmark = pytest.mark.root

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "conformance.md"
ROW = re.compile(r"^\| `([a-z.-]+)` \| (.+?) \| (.+?) \|$", re.M)


def test_the_page_runs_as_written(tmp_path):
    last = run_page(DOC, tmp_path)
    assert last.strip() == f"{len(CHECKS)} checks, 0 failed", last
    report = (tmp_path / "report.txt").read_text()
    assert report.splitlines()[-1].startswith("OK: "), report


def test_the_table_is_the_kits():
    rows = [(m[1], m[2], m[3]) for m in ROW.finditer(DOC.read_text())]
    assert rows == [(c.name, c.section, c.rule) for c in CHECKS.values()]
