"""The Go reference plugins through the conformance kit (issue 50): Debian's
1.1.1 and upstream 1.9.1 (tests/yardsticks.py) on the configurations of
tests/conformance_targets.py, each list at the highest cniVersion its
plugins claim (``--cni-version auto``). What each fails is written down in
docs/conformance-go.md, one row per failing check with why; this test holds
the page to what the kit finds. CI runs `CI_NAMES` (the quick ones); `make
conformance` (CNI_SKEL_CONFORMANCE_ALL=1) runs every configuration.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from conformance_targets import targets
from test_conformance_reference import failed, run_kit

pytestmark = pytest.mark.root

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "conformance-go.md"
NAMES = ["ptp", "bridge", "macvlan", "host-device", "tap", "loopback", "host-local", "static",
         "portmap", "tuning", "bandwidth", "firewall", "sbr"]
CI_NAMES = ["bridge", "host-device", "loopback", "host-local", "static"]
RUN = NAMES if os.environ.get("CNI_SKEL_CONFORMANCE_ALL") == "1" else CI_NAMES
#: | 1.9.1 | bridge | `del.leaves-nothing` | why |
ROW = re.compile(r"^\| (1\.\d+\.\d+) \| ([a-z-]+) \| `([a-z.-]+)` \| (.+?) \|$", re.M)


def documented() -> dict[tuple[str, str], set[str]]:
    """(Go version, configuration) -> the checks docs/conformance-go.md says it fails."""
    out: dict[tuple[str, str], set[str]] = {}
    for m in ROW.finditer(DOC.read_text()):
        out.setdefault((m[1], m[2]), set()).add(m[3])
    return out


@pytest.mark.parametrize("name", RUN)
def test_go_fails_what_the_page_says(name, go_yardstick, tmp_path):
    doc = targets(str(tmp_path))[name].doc
    types = [p["type"] for p in doc.get("plugins", [doc])]
    if not all(go_yardstick.has(t) for t in types):
        # Not a skip: the set has no such plugin (1.1.1 has no tap), and the page says so.
        assert (go_yardstick.version, name) not in documented()
        return
    report = run_kit(name, go_yardstick.dir, str(tmp_path), {}, ["--cni-version", "auto"])
    assert report["errors"] == []
    got = failed(report)
    want = documented().get((go_yardstick.version, name), set())
    assert set(got) == want, {k: v[:3] for k, v in got.items()}
