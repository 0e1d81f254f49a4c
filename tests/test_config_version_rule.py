"""One source of a config's version (issue 33, item 3): every reader of
``cniVersion`` (and of ``name``) matches the key as Go's encoding/json does,
case-insensitively with the last key winning, so the version a plugin checks
before its first side effect is the one its result is written in. Through
the executables: test_tuning.py (a ``CNIVERSION`` config answered at its
version) and test_launcher_policy.py (the native launcher's VERSION)."""

from __future__ import annotations

import json

import pytest

from cni_skel.config import NetConf
from cni_skel.skel import Plugin, version_answer
from cni_skel.version import config_version
from cni_skel.warm import client
from cni_skel.warm.protocol import go_field


@pytest.mark.parametrize(("doc", "want"), [
    ({"cniVersion": "1.0.0"}, "1.0.0"),
    ({"CNIVERSION": "1.0.0"}, "1.0.0"),
    ({"cniVersion": "1.0.0", "cniversion": "0.4.0"}, "0.4.0"),
    ({"CniVersion": "0.4.0", "cniVersion": "1.0.0"}, "1.0.0"),
    ({"cniVersions": ["1.0.0"]}, None),
    ({"a": {"cniVersion": "1.0.0"}}, None),
    ([{"cniVersion": "1.0.0"}], None),
])
def test_go_field(doc, want):
    assert go_field(doc, "cniVersion") == want


class TwoVersions(Plugin):
    supported_versions = ("0.4.0", "1.0.0")


@pytest.mark.parametrize("doc", [
    {"CNIVERSION": "1.0.0", "name": "n"},
    {"cniVersion": "0.4.0", "CNIVERSION": "1.0.0", "name": "n"},
    {"CNIVERSION": "0.4.0", "cniVersion": "1.0.0", "NAME": "n"},
])
def test_the_model_and_every_reader_agree(doc):
    version = NetConf.model_validate(doc).cni_version
    assert version == config_version(doc) == "1.0.0"
    stdin = json.dumps(doc).encode()
    assert json.loads(version_answer(TwoVersions, stdin))["cniVersion"] == version
    assert json.loads(client.version_answer(stdin, ["1.0.0"], "1.1.0"))["cniVersion"] == version
    err = client.error_answer(11, "m", "", stdin, ("0.4.0", "1.0.0"), "1.1.0")
    assert json.loads(err)["cniVersion"] == version


def test_the_name_is_read_the_same_way():
    assert NetConf.model_validate({"NAME": "n1", "name": "n2"}).name == "n2"
    assert go_field({"NAME": "n1", "name": "n2"}, "name") == "n2"
