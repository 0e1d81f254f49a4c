"""Shared fixtures: our plugins installed as real executables, the way
`cni-skel install` writes them, and the Go reference plugins beside them."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from cni_skel.cli import plugin_registry, write_executable

HERE = pathlib.Path(__file__).parent
VECTORS = HERE / "vectors" / "go-reference-1.1.1"
THIRDPARTY = HERE / "thirdparty"
GO_CNI_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins


def load_vector(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text())


def all_vectors() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(VECTORS.glob("*.json"))}


@pytest.fixture(scope="session")
def cni_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CNI bin dir holding every registered plugin of ours."""
    d = tmp_path_factory.mktemp("cni-bin")
    for name, ref in plugin_registry().items():
        write_executable(str(d), name, ref)
    return str(d)


@pytest.fixture(scope="session")
def loopback(cni_bin: str) -> str:
    return os.path.join(cni_bin, "loopback")


@pytest.fixture(scope="session")
def go_cni_dir() -> str:
    """The Go reference plugins (installed by `make test`)."""
    if not os.path.isfile(os.path.join(GO_CNI_DIR, "loopback")):
        pytest.fail(f"Go reference plugins missing in {GO_CNI_DIR}: run `make test`, which "
                    "installs Debian's containernetworking-plugins")
    return GO_CNI_DIR
