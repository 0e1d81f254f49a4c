"""The public API snapshot (.ci/api_surface.py, `make api-check`): api/cni_skel.txt
is what the code exports, and every change since the last release's snapshot
is named in CHANGELOG.md. Also the snapshot's format and the naming rules, on
a small package made here, so that what the check accepts is held down."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "api_surface.py"


def _load():
    spec = importlib.util.spec_from_file_location("api_surface", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_surface"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


api = _load()


def test_snapshot_and_changelog_hold_the_code():
    run = subprocess.run([sys.executable, str(SCRIPT), "check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def _package(tmp_path: pathlib.Path) -> pathlib.Path:
    pkg = tmp_path / "cni_skel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        from .rollback import rollback as rollback
        __version__ = "9.1.0"
        _EXPORTS = {"Thing": "mod", "helper": "mod"}
        PUBLIC = (*_EXPORTS, "rollback")
        PUBLIC_MODULES = ("mod", "rollback", "other")
    '''))
    (pkg / "rollback.py").write_text(textwrap.dedent('''
        __all__ = ["rollback"]
        def rollback(who: str = "x", /, *, quiet: bool = False) -> None: ...
    '''))
    (pkg / "_impl.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        class _Base:
            def shared(self) -> int: ...
        @dataclass(frozen=True)
        class Thing(_Base):
            name: str
            mtu: int | None = None
            def __getitem__(self, key: str) -> object: ...
            def __repr__(self) -> str: ...
            def _private(self) -> None: ...
            @property
            def label(self) -> str: ...
            @classmethod
            def make(cls, *args: str, **kw: int) -> "Thing": ...
    '''))
    (pkg / "mod.py").write_text(textwrap.dedent('''
        from ._impl import Thing
        __all__ = ["LIMIT", "Thing", "helper"]
        LIMIT: int = 4
        async def helper(thing: Thing, n: int = 1) -> list[Thing]: ...
        def internal() -> None: ...
    '''))
    (pkg / "other.py").write_text(textwrap.dedent('''
        from .mod import helper
        __all__ = ["helper"]
    '''))
    (pkg / "compat.py").write_text(textwrap.dedent('''
        DEPRECATED: dict[str, tuple[str, str, str]] = {
            "cni_skel.mod.old": ("cni_skel.mod.helper", "9.0.0", "9.2.0"),
        }
    '''))
    return tmp_path


EXPECTED = """\
# cni_skel 9.1.0 public API (docs/stability.md)
# cni_skel.PUBLIC, and the __all__ of each module in cni_skel.PUBLIC_MODULES.
# Written by .ci/api_surface.py (make api), checked by make api-check: do not edit.

cni_skel.Thing -> cni_skel.mod.Thing
cni_skel.helper -> cni_skel.mod.helper
module cni_skel.mod
cni_skel.mod.LIMIT: int = 4
class cni_skel.mod.Thing  [@dataclass(frozen=True)]
cni_skel.mod.Thing.__getitem__(self, key: str) -> object
cni_skel.mod.Thing.__init__(self, name: str, mtu: int | None = None) -> None
cni_skel.mod.Thing.label: str  [property]
cni_skel.mod.Thing.make(cls, *args: str, **kw: int) -> Thing  [@classmethod]
cni_skel.mod.Thing.mtu: int | None = None
cni_skel.mod.Thing.name: str
cni_skel.mod.Thing.shared(self) -> int
async cni_skel.mod.helper(thing: Thing, n: int = 1) -> list[Thing]
module cni_skel.other
cni_skel.other.helper -> cni_skel.mod.helper
cni_skel.rollback -> cni_skel.rollback.rollback
module cni_skel.rollback
cni_skel.rollback.rollback(who: str = 'x', /, *, quiet: bool = False) -> None

# Deprecated (cni_skel.compat.DEPRECATED): old name -> what replaces it
deprecated cni_skel.mod.old -> cni_skel.mod.helper  [deprecated in 9.0.0, removed in 9.2.0]
"""


def test_snapshot_format(tmp_path):
    source = _package(tmp_path)
    assert api.render(source, api.read_declared(source)) == EXPECTED


def test_write_is_deterministic(tmp_path):
    source = _package(tmp_path)
    out = tmp_path / "a.txt"
    assert api.main(["write", "--source", str(source), "--out", str(out)]) == 0
    assert out.read_text() == api.render(source, api.read_declared(source))


def test_naming_rules():
    modules = {"cni_skel.netlink", "cni_skel.runtime", "cni_skel.runtime.conf"}
    classes = {"cni_skel.skel.Plugin"}
    assert api.spellings("cni_skel.netlink.find_link", modules, classes) == {
        "netlink.find_link", "cni_skel.netlink.find_link"}
    assert api.spellings("cni_skel.skel.Plugin.verbs", modules, classes) == {
        "Plugin.verbs", "skel.Plugin.verbs", "cni_skel.skel.Plugin.verbs"}
    assert api.spellings("cni_skel.skel.Plugin.__init__", modules | {"cni_skel.skel"},
                         classes) == {
        "Plugin.__init__", "skel.Plugin.__init__", "cni_skel.skel.Plugin.__init__",
        "skel.Plugin", "cni_skel.skel.Plugin"}  # a class names its constructor
    assert api.spellings("cni_skel.ipam_add_guard", modules, classes) == {
        "cni_skel.ipam_add_guard"}
    assert api.spellings("cni_skel.runtime.conf", modules, classes) == {
        "conf", "runtime.conf", "cni_skel.runtime.conf"}
    assert api.named_in("`netlink.find_link(...)`, `Plugin.verbs()` and `a b` or ``x.y``") == {
        "netlink.find_link", "Plugin.verbs", "x.y"}


BASE = """\
# cni_skel 1.0.0 public API
module cni_skel.cli
cni_skel.cli.describe_error(exc: Exception) -> str
cni_skel.cli.gone() -> None
module cni_skel.old
cni_skel.old.f() -> None
module cni_skel.skel
class cni_skel.skel.Plugin
cni_skel.skel.Plugin.verbs: str | None = None
cni_skel.skel.Plugin.add(self) -> None
"""
CURRENT = """\
# cni_skel 1.1.0 public API
module cni_skel.cli
cni_skel.cli.describe_error -> cni_skel.runtime.describe_error
module cni_skel.runtime
cni_skel.runtime.describe_error(exc: Exception) -> str
module cni_skel.skel
class cni_skel.skel.Plugin
cni_skel.skel.Plugin.add(self, x: int = 0) -> None
module cni_skel.masq
cni_skel.masq.setup() -> None
cni_skel.masq.teardown() -> None

deprecated cni_skel.skel.Plugin.verbs -> methods  [deprecated in 1.1.0, removed in 1.2.0]
"""


def test_what_a_changelog_must_name():
    base = api.parse_snapshot(BASE, "base")
    current = api.parse_snapshot(CURRENT, "current")
    # cli.describe_error only became an alias of the same function: no change of its own.
    assert api.uncovered(base, current, "") == {
        "cni_skel.cli.gone": 0, "cni_skel.masq": 2, "cni_skel.old": 1,
        "cni_skel.runtime": 1, "cni_skel.skel.Plugin.add": 0, "cni_skel.skel.Plugin.verbs": 0}
    text = ("`masq` (new), `cni_skel.old`, `cli.gone()`, `Plugin.add(...)`, `skel.Plugin.verbs`, "
            "`runtime.describe_error`")
    assert api.uncovered(base, current, text) == {"cni_skel.runtime": 0}
    assert api.uncovered(base, current, text + ", `cni_skel.runtime`") == {}
    # A bare name is not enough, nor a class member without its class.
    assert "cni_skel.cli.gone" in api.uncovered(base, current, "`gone`")
    assert "cni_skel.skel.Plugin.add" in api.uncovered(base, current, "`add`")


def test_changelog_text_above_the_baseline():
    text = "# Changelog\n\n## [Unreleased]\n- `a.b`\n\n## [1.0.0] - 2025-01-01\n- `c.d`\n"
    above = api.changelog_above(text, "1.0.0")
    assert "`a.b`" in above and "`c.d`" not in above
    assert api.changelog_above(text, "0.9.0") is None
