"""cni_skel.rollback: undo steps run only when the ADD fails, newest first;
a failing step is reported and never hides the ADD's own error; ipam_add
registers the IPAM DEL of a delegated ADD (with a fake `Exec`, no process)."""

from __future__ import annotations

import io
import json

import pytest

from cni_skel import CNIError, ipam_add, rollback
from cni_skel.env import CmdArgs
from cni_skel.rollback import Rollback


def test_success_undoes_nothing():
    done = []
    with rollback("p") as undo:
        undo.callback("one", done.append, 1)
        undo.callback("two", done.append, 2)
    assert done == []


def test_failure_runs_the_steps_newest_first_and_reraises_the_same_error():
    done = []
    err = CNIError(7, "boom")
    with pytest.raises(CNIError) as got, rollback("p") as undo:
        undo.callback("one", done.append, 1)
        undo.callback("two", done.append, 2)
        undo.callback("kw", lambda *, value: done.append(value), value=3)
        raise err
    assert got.value is err
    assert done == [3, 2, 1]


def test_a_failing_step_is_one_stderr_line_and_the_others_still_run():
    done, sink = [], io.StringIO()

    def broken():
        raise OSError(5, "Input/output error")

    with pytest.raises(ValueError, match="the first error"), \
            rollback("myplugin", stderr=sink) as undo:
        undo.callback("first step", done.append, 1)
        undo.callback("deleting veth0", broken)
        undo.callback("last step", done.append, 3)
        raise ValueError("the first error")
    assert done == [3, 1]
    assert sink.getvalue() == ("myplugin: rollback: deleting veth0 failed: "
                               "[Errno 5] Input/output error\n")


def test_base_exceptions_unwind_too():
    done = []
    with pytest.raises(KeyboardInterrupt), rollback() as undo:
        undo.callback("step", done.append, 1)
        raise KeyboardInterrupt
    assert done == [1]


def test_steps_run_once():
    done = []
    undo = Rollback()
    undo.callback("step", done.append, 1)
    assert len(undo) == 1
    undo.unwind("p")
    undo.unwind("p")
    assert done == [1] and len(undo) == 0


class FakeExec:
    """An `Exec` that answers IPAM ADD with one address and records calls."""

    def __init__(self, fail_del: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_del = fail_del

    def find(self, plugin_type, paths):
        return f"/fake/{plugin_type}"

    def run(self, plugin_path, command, stdin_data, env, *, timeout=None, stderr=None):
        self.calls.append(f"{command} {plugin_path}")
        if command == "DEL" and self.fail_del:
            raise CNIError(11, "store busy")
        if command == "ADD":
            return json.dumps({"cniVersion": "1.1.0",
                               "ips": [{"address": "10.1.2.3/24"}]}).encode()
        return b""


def _args(ex: FakeExec) -> CmdArgs:
    return CmdArgs("ADD", "c1", "/run/netns/x", "eth0", path="/fake",
                   stdin_data=b'{"cniVersion": "1.1.0"}', env={"CNI_PATH": "/fake"}, exec=ex)


def test_ipam_add_releases_the_address_when_the_add_fails():
    ex = FakeExec()
    with pytest.raises(CNIError, match="veth exploded"), rollback() as undo:
        result = ipam_add(undo, "host-local", b"{}", _args(ex))
        assert str(result.ips[0].address) == "10.1.2.3/24"
        raise CNIError(999, "veth exploded")
    assert ex.calls == ["ADD /fake/host-local", "DEL /fake/host-local"]


def test_ipam_add_keeps_the_address_when_the_add_succeeds():
    ex = FakeExec()
    with rollback() as undo:
        ipam_add(undo, "host-local", b"{}", _args(ex))
    assert ex.calls == ["ADD /fake/host-local"]


def test_a_failed_ipam_del_does_not_hide_the_add_error():
    ex, sink = FakeExec(fail_del=True), io.StringIO()
    with pytest.raises(CNIError, match="veth exploded"), rollback("br", stderr=sink) as undo:
        ipam_add(undo, "host-local", b"{}", _args(ex))
        raise CNIError(999, "veth exploded")
    assert sink.getvalue() == "br: rollback: IPAM DEL (host-local) failed: store busy\n"
