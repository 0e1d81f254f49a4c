"""Shared fixtures: our plugins installed as real executables, the way
`cni-skel install` writes them, and the Go reference plugins beside them.

Every test that takes ``cni_bin`` (directly or through a fixture) runs once
per mode; its ID says which (``test_x[oneshot]``, ``test_x[warm]``):

* ``oneshot``: launchers whose socket is a path where no worker ever listens,
  so each call runs the plugin in the launcher's process (a node without a
  worker, the default install's fallback path);
* ``warm``: launchers pointing at one ``cni-skel worker`` started for the
  session (``cni_worker``); ``CNI_SKEL_WORKER_REQUIRED=1`` is set for those
  tests, so a call the worker does not serve fails with code 11 instead of
  quietly running one-shot.

``CNI_SKEL_TEST_MODES`` picks the modes (comma-separated; default
``oneshot,warm``), e.g. ``CNI_SKEL_TEST_MODES=warm pytest``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import kernelvm
import pytest
import yardsticks

from cni_skel.harness import SocketActivation
from cni_skel.warm import client as launcher
from cni_skel.warm import protocol
from cni_skel.warm.install import plugin_registry, write_executable
from cni_skel.warm.keeper import PROCESS_NAME as KEEPER_NAME

HERE = pathlib.Path(__file__).parent
VECTORS = HERE / "vectors" / "go-reference-1.1.1"
THIRDPARTY = HERE / "thirdparty"
README = HERE.parent / "README.md"
#: The suite's own third-party plugins (importable from HERE), the README's
#: example (`write_readme_example`), examples/village and the 0.1.0-style fixture
#: (tests/compat010): the suite worker serves them too, since a worker serves
#: only the plugins it was started with.
SUITE_PLUGINS = ("thirdparty.probe:Probe", "thirdparty.fakeipam:FakeIPAMPlugin",
                 "thirdparty.failafteripam:FailAfterIPAM", "thirdparty.argsplugin:ArgsEcho",
                 "worker_plugins.probe:WorkerProbe", "veth_ipam:VethPlugin",
                 "pyptp.plugin:PyPtp", "thirdparty.poolpicker:PoolPicker",
                 "cni_village:Village", "cni_village.ipam:VillageIPAM")
#: examples/village (package cni_village, tests/test_village.py), on the suite worker's path.
VILLAGE_EXAMPLE = HERE.parent / "examples" / "village"
#: tests/compat010 (package pyptp, tests/test_compat_010.py), on the suite worker's path.
COMPAT010 = HERE / "compat010"
GO_CNI_DIR = yardsticks.GO_DEBIAN_DIR  # Debian's containernetworking-plugins

MODES_ENV = "CNI_SKEL_TEST_MODES"
ALL_MODES = ("oneshot", "warm")
MODES = list(dict.fromkeys(
    m.strip() for m in os.environ.get(MODES_ENV, ",".join(ALL_MODES)).split(",") if m.strip()))

_WORKER_STATS = pytest.StashKey[dict]()
_LOG_OFFSET = pytest.StashKey[tuple]()


def write_readme_example(dest: pathlib.Path) -> pathlib.Path:
    """Write the README's example plugin to ``dest/veth_ipam.py`` (module
    ``veth_ipam``, class ``VethPlugin``); returns the file."""
    text = README.read_text()
    m = re.search(r"<!-- example: veth_ipam.py -->\n```python\n(.*?)```", text, re.S)
    assert m, "README lost its example plugin"
    path = dest / "veth_ipam.py"
    path.write_text(m.group(1))
    return path


def load_vector(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text())


def all_vectors() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(VECTORS.glob("*.json"))}


def pytest_report_header(config: pytest.Config) -> str:
    return yardsticks.header()


def pytest_configure(config: pytest.Config) -> None:
    bad = [m for m in MODES if m not in ALL_MODES]
    if bad or not MODES:
        raise pytest.UsageError(f"{MODES_ENV}={os.environ.get(MODES_ENV)!r}: give one or more "
                                f"of {', '.join(ALL_MODES)}, comma-separated")
    # Read (MODES) at import. Plugins must not see it: the runtime tests pass
    # os.environ on, and some compare the CNI_* variables a plugin got.
    os.environ.pop(MODES_ENV, None)
    # The suite chooses the sockets its launchers use; a value from the
    # caller's shell would redirect every launcher.
    os.environ.pop(protocol.SOCKET_ENV, None)
    os.environ.pop(protocol.REQUIRED_ENV, None)
    # Read by tests/yardsticks.py at import; a CNI_* variable would reach
    # plugins through the runtime tests (they pass CNI_* on).
    os.environ.pop(yardsticks.LATEST_ENV, None)
    # Tests marked kernel(...) the host's kernel can not run go to one VM
    # (tests/kernelvm.py), whose pytest runs them in the same modes.
    config.pluginmanager.register(kernelvm.KernelVM({MODES_ENV: ",".join(MODES)}), "kernelvm")


# --------------------------------------------------------------------------
# the suite's warm worker


def worker_command() -> list[str]:
    """argv prefix of the ``cni-skel`` CLI of this interpreter's environment."""
    cli = os.path.join(os.path.dirname(sys.executable), "cni-skel")
    if os.access(cli, os.X_OK):
        return [cli]
    return [sys.executable, "-m", "cni_skel.cli"]


def serving_processes(worker_pid: int) -> set[int]:
    """The worker's serving processes: its children but the keeper
    (`cni_skel.warm.keeper`, named `PROCESS_NAME` in /proc/<pid>/comm)."""
    with open(f"/proc/{worker_pid}/task/{worker_pid}/children") as fp:
        children = {int(p) for p in fp.read().split()}
    out = set()
    for child in children:
        try:
            with open(f"/proc/{child}/comm") as fp:
                if fp.read().strip() == KEEPER_NAME:
                    continue
        except OSError:
            continue  # gone
        out.add(child)
    return out


class SuiteWorker:
    """A ``cni-skel worker`` serving on ``sock``, its log in ``log_path``
    (one line per request, with the container ID). ``activated``: started
    the way the default install starts it, through the systemd units
    ``cni-skel install`` writes (`cni_skel.harness.SocketActivation`: the
    unit's own ExecStart, the socket as fd 3, on the first connection);
    otherwise a plain subprocess in its own session (killpg reaches its
    serving processes)."""

    def __init__(self, sock: str, log_path: str, timeout: float = 60.0,
                 preload: tuple[str, ...] = (), pythonpath: tuple[str, ...] = (),
                 args: tuple[str, ...] = (), activated: bool = False) -> None:
        self.sock, self.log_path = sock, log_path
        self._log_fp = open(log_path, "ab")  # noqa: SIM115 (closed in stop)
        env = {k: v for k, v in os.environ.items()
               if k not in (protocol.SOCKET_ENV, protocol.REQUIRED_ENV)}
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                [*pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
        extra = [arg for ref in preload for arg in ("--preload", ref)]
        self.activation: SocketActivation | None = None
        if activated:
            units = os.path.join(os.path.dirname(log_path), "units")
            self.activation = SocketActivation.install(units, sock, log_path, env=env, extra_args=(
                "--drain-timeout", "10", *extra, *args))
        else:
            self._proc = subprocess.Popen([*worker_command(), "worker", "--socket", sock,
                                           "--drain-timeout", "10", *extra, *args],
                                          stdin=subprocess.DEVNULL, stdout=self._log_fp,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                ok, why = launcher.ping(sock, 2.0)
                if ok:
                    self.description = why
                    break
                if self.proc.poll() is not None and self.activation is None:
                    raise RuntimeError(f"cni-skel worker exited {self.proc.returncode}:\n"
                                       + self.log())
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cni-skel worker not answering on {sock} ({why}):\n"
                                       + self.log())
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    @property
    def proc(self) -> subprocess.Popen:
        return self.activation.proc if self.activation is not None else self._proc

    def log(self, offset: int = 0) -> str:
        with open(self.log_path, "rb") as fp:
            fp.seek(offset)
            return fp.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return os.path.getsize(self.log_path)

    def served(self, cid: str) -> list[str]:
        """Log lines of requests for container ``cid`` (one per call the
        worker answered, or declined as an unknown plugin)."""
        return [ln for ln in self.log().splitlines() if f" cid={cid} " in ln]

    def requests(self) -> list[str]:
        """Log lines of every call the worker ran to the end (``... exit=N``)."""
        return [ln for ln in self.log().splitlines() if " exit=" in ln]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain, then SIGKILL whatever is left of its
        process group; returns the worker's exit status (None: killed)."""
        if self.activation is not None:
            status = self.activation.stop()
            self._log_fp.close()
            return status
        status = None
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = self.proc.wait(20)
        else:
            status = self.proc.returncode
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._log_fp.close()
        return status


@pytest.fixture(scope="session")
def cni_worker(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[SuiteWorker]:
    """One ``cni-skel worker`` for the session (started on first use), on a
    socket in a private temporary directory; stopped (SIGTERM, then SIGKILL
    of its process group) and its socket directory removed at the end. Its
    log stays in pytest's temporary directory. Fails the session's last test
    if the worker died before the end."""
    if os.geteuid() != 0:
        pytest.skip("the worker needs root")
    sock_dir = tempfile.mkdtemp(prefix="cnsk-suite-")  # short: sun_path holds 108 bytes
    log_path = str(tmp_path_factory.mktemp("cni-worker") / "worker.log")
    example = write_readme_example(tmp_path_factory.mktemp("readme-example"))
    try:
        # Started as the default install starts it: socket-activated by its unit.
        worker = SuiteWorker(os.path.join(sock_dir, "worker.sock"), log_path,
                             preload=SUITE_PLUGINS,
                             pythonpath=(str(HERE), str(example.parent),
                                         str(COMPAT010), str(VILLAGE_EXAMPLE)),
                             activated=True)
        try:
            yield worker
        finally:
            died = None if worker.alive() else worker.proc.returncode
            status = worker.stop()
            served = worker.requests()
            request.config.stash[_WORKER_STATS] = {
                "served": len(served), "log": log_path, "status": status, "died": died,
                "unusual": [ln for ln in worker.log().splitlines()
                            if any(w in ln for w in ("code=999", "child failed", "idle child",
                                                     "outcome=unknown-plugin", "outcome=crashed",
                                                     "launcher is gone", "left running"))]}
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert died is None, f"the suite's cni-skel worker died during the session " \
                         f"(status {died}); log: {log_path}"


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    stats = config.stash.get(_WORKER_STATS, None)
    if stats is None:
        return
    terminalreporter.write_sep("-", "cni-skel worker (warm mode)")
    terminalreporter.write_line(
        f"served {stats['served']} plugin calls; exit status {stats['status']}; "
        f"log {stats['log']}")
    for line in stats["unusual"][:20]:
        terminalreporter.write_line("  " + line)


# --------------------------------------------------------------------------
# our plugins, per mode


@pytest.fixture(scope="session", params=MODES)
def cni_mode(request: pytest.FixtureRequest) -> str:
    """``"oneshot"`` or ``"warm"``: how ``cni_bin``'s executables run."""
    return request.param


@pytest.fixture(scope="session")
def cni_worker_socket(cni_mode: str, request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> str:
    """The socket this mode's launchers point at (for tests that write their
    own with ``install_plugin(..., worker_socket=cni_worker_socket)``): the
    suite worker's in warm mode; in oneshot mode a path where nothing listens
    (not the default /run/cni-skel/worker.sock, which a real worker on this
    machine may serve)."""
    if cni_mode == "warm":
        return request.getfixturevalue("cni_worker").sock
    return str(tmp_path_factory.mktemp("no-worker") / "worker.sock")


@pytest.fixture(scope="session")
def cni_bin(cni_mode: str, cni_worker_socket: str,
            tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CNI bin dir holding every registered plugin of ours, as launchers
    (what ``cni-skel install`` writes) for this mode's socket."""
    d = tmp_path_factory.mktemp(f"cni-bin-{cni_mode}")
    for name, ref in plugin_registry().items():
        write_executable(str(d), name, ref, worker_socket=cni_worker_socket)
    return str(d)


@pytest.fixture(autouse=True)
def _cni_worker_required(request: pytest.FixtureRequest) -> Iterator[None]:
    """In warm mode, launchers must be served by the worker: a fallback to
    one-shot is answered with code 11 (`cni_skel.warm.protocol.REQUIRED_ENV`),
    so a broken worker fails tests instead of hiding behind the fallback.
    Set for the test's function-scoped fixtures and body; the runtime tests
    and `run_plugin_raw` pass it on to the plugins."""
    if "cni_mode" not in request.fixturenames or request.getfixturevalue("cni_mode") != "warm":
        yield
        return
    worker = request.getfixturevalue("cni_worker")
    request.node.stash[_LOG_OFFSET] = (worker, worker.log_size())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(protocol.REQUIRED_ENV, "1")
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and _LOG_OFFSET in item.stash:
        worker, offset = item.stash[_LOG_OFFSET]
        with contextlib.suppress(OSError):
            text = worker.log(offset)
            if text:
                report.sections.append(("cni-skel worker log", text[-20000:]))
    return report


@pytest.fixture(scope="session")
def loopback(cni_bin: str) -> str:
    return os.path.join(cni_bin, "loopback")


@pytest.fixture(scope="session", params=yardsticks.yardsticks(), ids=lambda y: y.id)
def go_yardstick(request: pytest.FixtureRequest) -> yardsticks.Yardstick:
    """Each set of Go plugins present (`yardsticks`): Debian's 1.1.1 and,
    when built, upstream 1.9.1; a test taking it runs once per set."""
    y = request.param
    if not y.has("loopback"):
        pytest.fail(f"Go reference plugins missing in {y.dir}: run `make test`, which "
                    "installs Debian's containernetworking-plugins")
    return y


@pytest.fixture(scope="session")
def go_cni_dir() -> str:
    """The Go reference plugins (installed by `make test`)."""
    if not os.path.isfile(os.path.join(GO_CNI_DIR, "loopback")):
        pytest.fail(f"Go reference plugins missing in {GO_CNI_DIR}: run `make test`, which "
                    "installs Debian's containernetworking-plugins")
    return GO_CNI_DIR
