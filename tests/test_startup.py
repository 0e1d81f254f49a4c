"""cni_skel.startup: the import-time shortcuts of one-shot plugin processes
change when pyroute2 and pydantic do work, never what they give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cni_skel.harness import install_plugin, run_plugin_raw
from cni_skel.warm.install import python_argv


def py(code: str, *args: str, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh isolated interpreter; it prints one JSON document."""
    proc = subprocess.run([sys.executable, "-I", "-c", code, *args], capture_output=True,
                          text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_lazy_pyroute2_gives_the_same_objects_without_the_package_init():
    got = py("""
import json, sys
from cni_skel.startup import PYROUTE2_NAMES, lazy_pyroute2
assert lazy_pyroute2()
from pyroute2 import IPRoute, NetlinkError, netns
from pyroute2.netlink.exceptions import NetlinkDumpInterrupted
import pyroute2
import pyroute2.iproute.linux as linux
light = {
    "ipr_same": IPRoute is linux.IPRoute,
    "netns_is_module": netns is sys.modules["pyroute2.netns"],
    "ndb_loaded": "pyroute2.ndb.main" in sys.modules,
    "conntrack": pyroute2.Conntrack.__module__,
}
# anything else runs the real __init__, in the same module object
ndb = pyroute2.NDB
full = {
    "ndb_loaded": "pyroute2.ndb.main" in sys.modules,
    "ipr_same": pyroute2.IPRoute is IPRoute,
    "version": isinstance(pyroute2.__version__, str),
    "all": IPRoute in pyroute2.__all__,  # (pyroute2 lists objects there, not names)
    "plain_module": type(pyroute2) is type(sys),
    "same_module": sys.modules["pyroute2"] is pyroute2,
}
print(json.dumps({"light": light, "full": full}))
""")
    assert got["light"] == {"ipr_same": True, "netns_is_module": True, "ndb_loaded": False,
                            "conntrack": "pyroute2.conntrack"}
    assert all(got["full"].values()), got["full"]


def test_pyroute2_names_are_what_its_package_exports():
    got = py("""
import importlib, json
import pyroute2
from cni_skel.startup import PYROUTE2_NAMES, lazy_pyroute2
assert not lazy_pyroute2()  # already imported: left alone
print(json.dumps({n: getattr(pyroute2, n) is getattr(importlib.import_module(m), n)
                  for n, m in PYROUTE2_NAMES.items()}))
""")
    assert all(got.values()), got


def test_no_pydantic_plugin_scan_without_pydantic_plugins():
    got = py("""
import json, sys
from cni_skel.startup import skip_pydantic_plugin_scan
skipped = skip_pydantic_plugin_scan()
from cni_skel.types import Result
r = Result.model_validate({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]})
from pydantic.plugin._loader import get_plugins
print(json.dumps({"skipped": skipped, "metadata": "importlib.metadata" in sys.modules,
                  "plugins": list(get_plugins()), "ip": str(r.ips[0].address)}))
""")
    assert got == {"skipped": True, "metadata": False, "plugins": [], "ip": "10.0.0.2/24"}


def test_a_declared_pydantic_plugin_keeps_pydantics_own_lookup(tmp_path):
    dist = tmp_path / "some_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: some-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pydantic]\nsome = some_plugin_mod:plugin\n")
    got = py("""
import json, sys
sys.path.append(sys.argv[1])
from cni_skel.startup import skip_pydantic_plugin_scan
print(json.dumps({"skipped": skip_pydantic_plugin_scan()}))
""", str(tmp_path))
    assert got == {"skipped": False}


def test_the_loader_stub_hands_over_to_the_real_module_for_anything_else():
    got = py("""
import json, sys
from cni_skel.startup import skip_pydantic_plugin_scan
assert skip_pydantic_plugin_scan()
from pydantic.plugin import _loader as stub
assert stub.get_plugins() == ()
group = stub.PYDANTIC_ENTRY_POINT_GROUP  # not in the stub
print(json.dumps({"group": group, "real": sys.modules["pydantic.plugin._loader"] is not stub}))
""")
    assert got == {"group": "pydantic", "real": True}


@pytest.mark.parametrize("kind", ["launcher", "script"])
@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_a_one_shot_host_local_call_loads_neither_importlib_metadata_nor_pyroute2(
        tmp_path, command, kind):
    # A launcher with no worker on its socket runs the plugin in its own process.
    sock = str(tmp_path / "no-worker.sock") if kind == "launcher" else None
    exe = install_plugin(tmp_path / "bin", "host-local", "cni_skel_plugins.host_local:HostLocal",
                         worker_socket=sock)
    conf = {"cniVersion": "1.0.0", "name": "net1", "type": "bridge",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "store"),
                     "ranges": [[{"subnet": "10.71.0.0/24"}]]}}
    proc = subprocess.run(python_argv(exe, ("-X", "importtime")),
                          input=json.dumps(conf).encode(), capture_output=True, check=False,
                          env={"PATH": os.environ["PATH"], "CNI_COMMAND": command,
                               "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
                               "CNI_NETNS": "/proc/self/ns/uts", "CNI_PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "pydantic" in imported
    heavy = {m for m in imported
             if m.split(".")[0] in ("pyroute2", "nftables", "click", "pkg_resources")
             or m.startswith("importlib.metadata")}
    assert not heavy, heavy


def test_old_results_still_convert(tmp_path):
    """0.x results (the models in cni_skel.types.legacy) still convert in one-shot mode."""
    exe = install_plugin(tmp_path / "bin", "host-local", "cni_skel_plugins.host_local:HostLocal",
                         worker_socket=None)
    conf = {"cniVersion": "0.2.0", "name": "net1", "type": "bridge",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "store"),
                     "ranges": [[{"subnet": "10.72.0.0/24"}]]}}
    run = run_plugin_raw(exe, "ADD", conf, netns="/proc/self/ns/uts", container_id="c1")
    assert run.exit_code == 0, run
    assert run.doc["ip4"]["ip"] == "10.72.0.2/24"


def test_prepare_is_idempotent_and_collects_cycles_less_often():
    got = py("""
import gc, json, sys
from cni_skel.startup import _NoPluginsLoader, prepare
prepare()
prepare()
print(json.dumps({"gen0": gc.get_threshold()[0], "enabled": gc.isenabled(),
                  "finders": sys.meta_path.count(_NoPluginsLoader),
                  "lazy": type(sys.modules["pyroute2"]).__name__}))
""")
    assert got == {"gen0": 100_000, "enabled": True, "finders": 1, "lazy": "_LazyPackage"}
