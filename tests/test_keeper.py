"""The worker's keeper (`cni_skel.keeper`, `cni_skel.warm.keeper`) with a
test plugin whose service holds one item per container
(tests/worker_plugins/holder.py), on a worker of the test's own: calls
reach the service across serving processes, ``cni-skel worker --check``
lists what it holds, the worker stays up past ``--idle-exit`` while it
holds anything, a keeper that dies is forked again and reloads its state,
a stopping worker stops the service and keeps its state, and without a
worker the plugin answers code 11 naming the socket."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SuiteWorker, worker_command

from cni_skel.harness import run_plugin_raw
from cni_skel.warm.install import write_executable

HERE = Path(__file__).parent
HOLDER = "worker_plugins.holder:WorkerHolder"


class HolderNode:
    def __init__(self, tmp_path: Path, pod: Any, *args: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="cnsk-kp-")  # short: sun_path holds 108 bytes
        self.sock = os.path.join(self.dir, "w.sock")
        self.worker = SuiteWorker(self.sock, str(tmp_path / "worker.log"), preload=(HOLDER,),
                                  pythonpath=(str(HERE),), args=args)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        self.exe = write_executable(str(bin_dir), "worker-holder", HOLDER,
                                    worker_socket=self.sock, pythonpath=[str(HERE)])
        self.pod = pod

    def call(self, verb: str, cid: str = "kp-c1", **conf: Any) -> Any:
        return run_plugin_raw(self.exe, verb, {"cniVersion": "1.1.0", "name": "kpnet",
                                               "type": "worker-holder", **conf},
                              container_id=cid, netns=self.pod.path)

    def check_output(self) -> str:
        proc = subprocess.run([*worker_command(), "worker", "--check", "--socket", self.sock],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc
        return proc.stdout

    def close(self) -> None:
        self.worker.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def holder_node(tmp_path: Path, netns_factory: Any) -> Iterator[Any]:
    made: list[HolderNode] = []

    def make(*args: str) -> HolderNode:
        node = HolderNode(tmp_path, netns_factory("cnsk-kp"), *args)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def wait_until(what: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_service_holds_across_calls_and_check_lists_it(holder_node: Any) -> None:
    node = holder_node()
    assert json.loads(node.worker.description)["services"] == ["dhcp", "holder"]
    for cid in ("kp-c1", "kp-c2"):
        run = node.call("ADD", cid)
        assert run.exit_code == 0, run
    out = node.check_output()
    assert "  holder: 2 held" in out
    assert "key=kp-c1" in out and "key=kp-c2" in out
    assert node.call("DEL", "kp-c1").exit_code == 0
    assert node.call("DEL", "kp-c1").exit_code == 0  # nothing held: no error
    out = node.check_output()
    assert "  holder: 1 held" in out and "key=kp-c1" not in out
    assert "keeper running: dhcp, holder" in node.worker.log()


def test_worker_outlives_idle_exit_while_anything_is_held(holder_node: Any) -> None:
    node = holder_node("--idle-exit", "1")
    assert node.call("ADD").exit_code == 0
    time.sleep(3)
    assert node.worker.alive(), node.worker.log()
    assert node.call("DEL").exit_code == 0
    assert wait_until(lambda: not node.worker.alive(), 15), node.worker.log()
    assert "idle for 1 s: exiting" in node.worker.log()


def test_dead_keeper_is_forked_again_and_reloads(holder_node: Any) -> None:
    node = holder_node()
    assert node.call("ADD").exit_code == 0
    first = node.call("STATUS", "")
    assert first.exit_code == 0, first
    run = node.call("CHECK", die=True)
    assert run.exit_code == 1 and run.doc["code"] == 11, run
    assert "ended before answering" in run.doc["msg"]
    assert wait_until(lambda: "forked again in 1 s" in node.worker.log()), node.worker.log()
    assert wait_until(lambda: node.call("STATUS", "").exit_code == 0), node.worker.log()
    out = node.check_output()
    assert "key=kp-c1" in out and "reloaded=True" in out, out
    assert node.worker.alive()


def test_stopping_worker_stops_the_service_and_keeps_its_state(holder_node: Any) -> None:
    node = holder_node()
    assert node.call("ADD").exit_code == 0
    state = os.path.join(node.dir, "holder")
    assert node.worker.stop() == 0
    assert os.path.exists(os.path.join(state, "stopped"))
    assert os.path.exists(os.path.join(state, "kp-c1.json"))
    assert "keeper stopped" in node.worker.log()


def test_without_a_worker_the_call_is_code_11_naming_the_socket(tmp_path: Path,
                                                                 netns_factory: Any) -> None:
    sock = str(tmp_path / "nobody.sock")
    exe = write_executable(str(tmp_path), "worker-holder", HOLDER, worker_socket=sock,
                           pythonpath=[str(HERE)])
    run = run_plugin_raw(exe, "ADD", {"cniVersion": "1.1.0", "name": "kpnet",
                                      "type": "worker-holder"},
                         container_id="kp-c1", netns=netns_factory("cnsk-kp").path)
    assert run.exit_code == 1 and run.doc["code"] == 11, run
    assert sock in run.doc["details"] and "cni-skel worker" in run.doc["msg"]
