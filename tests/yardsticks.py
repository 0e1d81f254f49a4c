"""The Go reference plugins our plugins are compared with (issue 49).

Two sets, one place:

* ``1.1.1``: Debian's ``containernetworking-plugins`` in /usr/lib/cni
  (`make deps` installs it), always there;
* ``1.9.1``: upstream containernetworking/plugins v1.9.1, the newest
  release, which `make go-latest` builds from ``../shared/yardstick`` into
  a cache outside the repository, `GO_LATEST_DIR` (the env variable
  ``CNI_SKEL_GO_LATEST`` names another). A clone without ``../shared``
  has no such build: the suite compares with 1.1.1 alone and its header
  says so.

Tests take the ``go_yardstick`` fixture (tests/conftest.py), parametrized
over the sets present, or call `yardsticks` themselves.

Not a test module (tests/ is on sys.path through conftest.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Debian's Go plugins (1.1.1 in bookworm).
GO_DEBIAN_DIR = "/usr/lib/cni"
#: Where `make go-latest` builds upstream v1.9.1 (its VERSION file names the build).
GO_LATEST_DIR = os.environ.get("CNI_SKEL_GO_LATEST", "/var/cache/cni-skel/go-plugins-v1.9.1")


@dataclass(frozen=True)
class Yardstick:
    """One set of Go plugins: ``version`` (``"1.1.1"``, ``"1.9.1"``) and
    the directory holding its executables."""

    version: str
    dir: str

    def exe(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def has(self, name: str) -> bool:
        return os.access(self.exe(name), os.X_OK)

    @property
    def id(self) -> str:
        return f"go{self.version}"


DEBIAN = Yardstick("1.1.1", GO_DEBIAN_DIR)
LATEST = Yardstick("1.9.1", GO_LATEST_DIR)


def yardsticks() -> list[Yardstick]:
    """The sets present: Debian's always (its absence is the caller's
    failure to report), 1.9.1 when built."""
    return [DEBIAN, *([LATEST] if LATEST.has("loopback") else [])]


def header() -> str:
    """One line for pytest's header: which sets the run compares with."""
    if LATEST.has("loopback"):
        return f"Go yardsticks: 1.1.1 ({DEBIAN.dir}) and 1.9.1 ({LATEST.dir})"
    return (f"Go yardsticks: 1.1.1 ({DEBIAN.dir}) only; no 1.9.1 build in {LATEST.dir} "
            "(`make go-latest` builds it from ../shared/yardstick)")
