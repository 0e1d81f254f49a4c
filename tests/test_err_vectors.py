"""Every err-* vector of the Go reference plugins, replayed on our executables.

Same code and same meaning of msg; where Go answers 999 we answer the spec
code that fits (documented per case). The range-exhaustion vector belongs to
host-local (issue 3) and is replayed by its own tests.
"""

from __future__ import annotations

import os

import pytest
from conftest import THIRDPARTY, load_vector

from cni_skel.harness import install_plugin, run_plugin_raw

# vector -> (our code, predicate on our msg/details, why it differs from Go if it does)
EXPECT = {
    "err-bad-containerid": (4, lambda m, d: m == "invalid characters in containerID"
                            and d == "-bad!", ""),
    "err-bad-json": (6, lambda m, d: m.startswith("error unmarshall network config: "), ""),
    "err-bad-name": (7, lambda m, d: m == "invalid characters found in network name"
                     and d == "-bad name", ""),
    "err-missing-name": (7, lambda m, d: m == "missing network name", ""),
    "err-ifname-dotdot": (4, lambda m, d: m == "interface name is . or ..", ""),
    "err-ifname-slash": (4, lambda m, d: m == "interface name contains / or : or whitespace "
                         "characters", ""),
    "err-ifname-too-long": (4, lambda m, d: m == "interface name is too long"
                            and "16" in d, ""),
    # Spec table: ADD requires CONTAINERID, NETNS, IFNAME; the Go skel also
    # demands CNI_PATH. Same code, the list names what the spec requires.
    "err-missing-all-add": (4, lambda m, d: m == "required env variables "
                            "[CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing", "spec list"),
    "err-missing-containerid-add": (4, lambda m, d: m == "required env variables "
                                    "[CNI_CONTAINERID] missing", ""),
    "err-missing-netns-add": (4, lambda m, d: m == "required env variables [CNI_NETNS] missing",
                              ""),
    "err-unknown-command": (4, lambda m, d: m == "unknown CNI_COMMAND: FROB", ""),
    "err-unsupported-version": (1, lambda m, d: m == "incompatible CNI versions"
                                and d.startswith('config is "9.9.9", plugin supports ["0.1.0"'),
                                ""),
    # Go: 999 "failed to Statfs". Spec code 3: the container's netns does
    # not exist (nothing was created, nothing to clean up).
    "err-netns-missing": (3, lambda m, d: "/var/run/netns/does-not-exist" in m + d, "999 -> 3"),
    # Go: 999 "ARGS: unknown args". CNI_ARGS is an environment variable:
    # spec code 4, and the message names the variable.
    "err-cni-args-unknown": (4, lambda m, d: m == 'CNI_ARGS: unknown args ["FOO=bar"]',
                             "999 -> 4"),
}


@pytest.fixture(scope="module")
def args_echo(tmp_path_factory: pytest.TempPathFactory, cni_worker_socket: str) -> str:
    d = tmp_path_factory.mktemp("tp-bin")
    return install_plugin(d, "args-echo", "thirdparty.argsplugin:ArgsEcho",
                          pythonpath=[str(THIRDPARTY.parent)], worker_socket=cni_worker_socket)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_err_vector(name, loopback, args_echo, node_netns):
    vec = load_vector(name)
    go = vec["stdout"]
    code, check, why = EXPECT[name]
    if not why:
        assert go["code"] == code, "the table must follow Go where no reason is given"
    exe = args_echo if vec["plugin"] == "host-local" else loopback
    env = {"PATH": os.environ["PATH"], **vec["env"]}
    run = run_plugin_raw(exe, "", vec["stdin"], env=env, replace_env=True, node=node_netns)
    assert run.exit_code == 1, run
    doc = run.doc
    assert doc["code"] == code, doc
    assert check(doc["msg"], doc.get("details", "")), doc
    assert set(doc) <= {"cniVersion", "code", "msg", "details"}


def test_about_text_without_command(loopback):
    vec = load_vector("about-no-command")
    run = run_plugin_raw(loopback, "", vec["stdin"], env={"PATH": os.environ["PATH"]},
                         replace_env=True)
    assert run.exit_code == 0 and run.stdout == b""
    assert "loopback" in run.stderr
    assert ("CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
            in run.stderr)


@pytest.mark.parametrize("name", ["version", "version-empty-stdin"])
def test_version_vectors(name, loopback):
    vec = load_vector(name)
    run = run_plugin_raw(loopback, "", vec["stdin"], env={"PATH": os.environ["PATH"],
                         **vec["env"]}, replace_env=True)
    assert run.exit_code == 0
    # Go lists up to 1.0.0; we also speak 1.1.0.
    assert run.doc["supportedVersions"] == [*vec["stdout"]["supportedVersions"], "1.1.0"]
    # Spec: echo the requested cniVersion (Go answers its newest); with
    # nothing asked, our newest.
    assert run.doc["cniVersion"] == ("0.4.0" if name == "version" else "1.1.0")


def test_cni_args_vector_ignore_unknown(args_echo, node_netns):
    """cni-args-ignoreunknown-ip: IgnoreUnknown=1 lets K8S_POD_NAME through
    and the typed IP key is parsed."""
    vec = load_vector("cni-args-ignoreunknown-ip")
    env = {"PATH": os.environ["PATH"], **vec["env"]}
    run = run_plugin_raw(args_echo, "", vec["stdin"], env=env, replace_env=True,
                         node=node_netns)
    assert run.exit_code == 0, run
    assert run.doc["ips"] == [{"address": "10.68.0.77/32"}]


@pytest.mark.parametrize("cni_args,fragment", [
    ("IP=10.68.0.300", "IP=10.68.0.300"),
    ("MAC=zz:zz", "MAC=zz:zz"),
    ("IgnoreUnknown=yes;X=1", "IgnoreUnknown=yes"),
    ("IP=10.0.0.1;", 'invalid pair ""'),
    ("IP=a=b", 'invalid pair "IP=a=b"'),
])
def test_cni_args_typed_values_are_validated(args_echo, node_netns, cni_args, fragment):
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "args-echo"}
    run = run_plugin_raw(args_echo, "ADD", conf, netns="/run/netns/cnsk-unused",
                         cni_args=cni_args, node=node_netns)
    assert run.exit_code == 1 and run.doc["code"] == 4, run.doc
    assert fragment in run.doc["msg"] and "CNI_ARGS" in run.doc["msg"]
