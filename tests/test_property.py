"""Property: whatever the environment and stdin, a plugin prints exactly one
valid JSON document (a Result, an Error or a VersionResult) or nothing, and
never a traceback on stdout.

Most examples go through `dispatch` in-process (the same code path the
executable runs, minus process start-up); a bounded number run the real
executable. CNI_NETNS only ever names paths made for the test or paths that
do not exist: a generated path must never reach a real namespace.
"""

from __future__ import annotations

import io
import json

from cni_skel_plugins.loopback import Loopback
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_skel.harness import run_plugin_raw
from cni_skel.types import parse_result

VERBS = ["ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC", "", "add", "FROB"]
VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "9.9.9", "", "x"]
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=20)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8)


@st.composite
def configs(draw):
    conf = {}
    if draw(st.booleans()):
        conf["cniVersion"] = draw(st.sampled_from(VERSIONS) | json_values)
    if draw(st.booleans()):
        conf["name"] = draw(st.sampled_from(["net", "lo", "-bad", ""]) | json_values)
    if draw(st.booleans()):
        conf["type"] = "loopback"
    if draw(st.booleans()):
        conf["prevResult"] = draw(st.sampled_from([
            {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]},
            {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}},
            {"ips": [{"address": "bogus"}]}]) | json_values)
    conf.update(draw(st.dictionaries(text, json_values, max_size=2)))
    return conf


@st.composite
def stdins(draw):
    kind = draw(st.sampled_from(["config", "config", "junk", "bytes"]))
    if kind == "config":
        return json.dumps(draw(configs())).encode()
    if kind == "junk":
        return draw(text).encode()
    return draw(st.binary(max_size=40))


def envs(netns_paths):
    return st.fixed_dictionaries({}, optional={
        "CNI_COMMAND": st.sampled_from(VERBS),
        "CNI_CONTAINERID": st.sampled_from(["c1", "-bad!", "", "a" * 80]) | text,
        "CNI_NETNS": st.sampled_from([*netns_paths, "", "/run/netns/cnsk-absent"]),
        "CNI_IFNAME": st.sampled_from(["lo", "eth0", "", "..", "a/b", "x" * 16]) | text,
        "CNI_ARGS": st.sampled_from(["", "IgnoreUnknown=1;K8S_POD_NAME=p", "FOO", "a=b=c"])
        | text,
        "CNI_PATH": st.sampled_from(["", "/nonexistent"]),
    })


def assert_one_valid_document(out: bytes, code: int) -> None:
    assert b"Traceback" not in out
    if not out:
        assert code == 0
        return
    doc = json.loads(out)  # exactly one document, or this raises
    assert isinstance(doc, dict)
    if code != 0:
        assert code == 1
        assert isinstance(doc["code"], int) and isinstance(doc["msg"], str)
        assert set(doc) <= {"cniVersion", "code", "msg", "details"}
    elif "supportedVersions" in doc:
        assert isinstance(doc["cniVersion"], str)
    else:
        parse_result(doc)


def test_dispatch_always_answers_one_document(pod_netns):
    @settings(max_examples=400, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(env=envs([pod_netns.path]), stdin=stdins())
    def check(env, stdin):
        out, code = Loopback.dispatch(env, stdin, io.StringIO())
        assert_one_valid_document(out, code)

    # The in-process run acts on the pod namespace only; the node here is the
    # test process's own namespace, which no generated CNI_NETNS names.
    check()


def test_executable_always_answers_one_document(loopback, node_netns, pod_netns):
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(env=envs([pod_netns.path]), stdin=stdins())
    def check(env, stdin):
        run = run_plugin_raw(loopback, "", stdin, env={"PATH": "/usr/bin:/bin", **env},
                             replace_env=True, node=node_netns, timeout=30)
        assert_one_valid_document(run.stdout, run.exit_code)

    check()
