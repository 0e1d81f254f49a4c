"""The project ``cni-skel new-plugin NAME`` writes: a working chained plugin
(sets the MTU of the container's interface), its packaging with the
``cni_skel.plugins`` entry point, a pytest test using the cni_skel
fixtures that passes as generated (run it as root: it makes namespaces), and
a README that says how to install it and how to add a second plugin to the
project (a module, one entry-point line, reinstall, ``cni-skel install``).

The generated code uses only current, non-deprecated API (verbs as methods,
attribute access on `cni_skel.netlink.Link`, `cni_skel.rollback`), so that it
raises no DeprecationWarning (tests/test_cli_new_plugin.py).

Kept as Python strings so that it ships inside the ``cni_skel`` package.
"""

from __future__ import annotations

import keyword
import re

from . import __version__

__all__ = ["names_for", "render"]

_NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")

_PLUGIN = '''\
"""CNI plugin ``{name}``: sets the MTU of the container's interface.

A chained plugin: put it after the plugin that creates the interface (bridge,
ptp, ...). Written with cni-skel; the CNI protocol (environment, stdin,
versions, errors) is the SDK's job, this module only does networking.
"""

from __future__ import annotations

from cni_skel import CmdArgs, CNIError, Interface, NetConf, Plugin, Result, netlink
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG
from cni_skel.netns import NetNS
from cni_skel.types import check_expressible
from pydantic import Field

__all__ = ["{cls}", "{cls}Conf"]


class {cls}Conf(NetConf):
    """Our config: NetConf (cniVersion, name, type, prevResult, ...) plus ``mtu``
    (bytes, 68..65535, default 1400; out of range: code 7 naming the key)."""

    mtu: int = Field(1400, ge=68, le=65535)


def _link(ipr, args: CmdArgs) -> netlink.Link:
    """CNI_IFNAME in the pod; code 7 when it is not there."""
    link = netlink.find_link(ipr, args.ifname)
    if link is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"interface {{args.ifname!r}} not found",
                       "{name} configures an existing interface: chain it after the "
                       "plugin that creates it")
    return link


class {cls}(Plugin):
    """{name}: the MTU of CNI_IFNAME in CNI_NETNS."""

    name = "{name}"
    config_model = {cls}Conf

    def add(self, args: CmdArgs, conf: {cls}Conf) -> Result:
        """Set the MTU; return prevResult unchanged (or, run alone, a result
        naming the interface).

        Raises:
            CNIError: 7 when CNI_IFNAME is missing; 1 when the result cannot
                be written in the config's cniVersion (checked first).
        """
        # Fail before the first change when the result cannot be written in
        # the config's cniVersion (before 0.3.0 a result needs an IP).
        if conf.prev_result is not None:  # chained: the result is prevResult
            check_expressible(conf.cni_version, conf.prev_result)
        else:  # ours alone: an interface, no IP
            check_expressible(conf.cni_version, has_ip=False)
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr:
            link = _link(ipr, args)
            # One change, made last: nothing to undo if it fails. A plugin
            # that makes several registers each undo on cni_skel.rollback().
            netlink.link_set(ipr, link, mtu=conf.mtu)  # a Link: no second look-up
        if conf.prev_result is not None:
            return conf.prev_result           # a chained plugin passes the result on
        return Result(interfaces=[Interface(name=args.ifname, mac=link.mac,
                                            sandbox=args.netns)])

    def check(self, args: CmdArgs, conf: {cls}Conf) -> None:
        """The MTU is the configured one.

        Raises:
            CNIError: {check_code} when it differs or CNI_IFNAME is missing.
        """
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr:
            mtu = _link(ipr, args).mtu
        if mtu != conf.mtu:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"{{args.ifname}} has MTU {{mtu}}, expected {{conf.mtu}}")

    def delete(self, args: CmdArgs, conf: {cls}Conf) -> None:
        """Nothing to undo: the interface goes away with the container. A DEL
        must succeed even when everything is already gone."""


if __name__ == "__main__":
    {cls}.main()
'''

_INIT = '''\
"""The ``{name}`` CNI plugin."""

from .plugin import {cls}, {cls}Conf

__all__ = ["{cls}", "{cls}Conf"]
'''

_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "CNI plugin {name}: sets the MTU of the container's interface"
requires-python = ">=3.11"
# cni-skel is not on PyPI: pip finds it in the environment, or give it a
# wheel or a checkout (README.md, "Install").
dependencies = ["cni-skel>={skel_version}"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points."cni_skel.plugins"]
# Executable name -> plugin class: `cni-skel install --bin-dir /opt/cni/bin {name}`
# writes the executable once this package is installed (pip install .).
{name} = "{module}:{cls}"

[tool.setuptools]
packages = ["{module}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "-ra -p no:cacheprovider"
'''

_TEST = '''\
"""Tests for {name}, run the way a runtime runs the plugin: a real executable,
CNI_* environment, config on stdin, in throw-away network namespaces (root).
The fixtures (netns_factory, node_netns, pod_netns) come with cni-skel."""

from __future__ import annotations

import pathlib

import pytest
from cni_skel import CNIError, netlink
from cni_skel.netns import NetNS
from cni_skel.testing import install_plugin, install_reference_plugin, run_plugin

PROJECT = pathlib.Path(__file__).resolve().parent.parent
CONF = {{"cniVersion": "1.1.0", "name": "test-net", "type": "{name}", "mtu": 1280}}


@pytest.fixture
def exe(tmp_path):
    # The package is not installed while you develop it: give its directory.
    return install_plugin(tmp_path, "{name}", "{module}:{cls}",
                          pythonpath=[str(PROJECT)])


def _veth(pod, name="eth0"):
    """An interface to configure, as the plugin before ours would leave it."""
    with NetNS.open(pod.path) as ns, ns.rtnl() as ipr:
        ipr.link("add", ifname=name, kind="veth", peer="peer0")
        return netlink.find_link(ipr, name)


def _mtu(pod, name="eth0"):
    with NetNS.open(pod.path) as ns, ns.rtnl() as ipr:
        return netlink.find_link(ipr, name).mtu


def test_add_check_del(exe, node_netns, pod_netns):
    link = _veth(pod_netns)
    prev = {{"cniVersion": "1.1.0",
             "interfaces": [{{"name": "eth0", "mac": link.mac, "sandbox": pod_netns.path}}],
             "ips": [{{"address": "10.1.0.5/24", "interface": 0}}]}}
    result = run_plugin(exe, "ADD", {{**CONF, "prevResult": prev}}, netns=pod_netns.path,
                        node=node_netns)
    assert _mtu(pod_netns) == 1280
    assert result["ips"][0]["address"] == "10.1.0.5/24"     # prevResult passed on
    run_plugin(exe, "CHECK", {{**CONF, "prevResult": result}}, netns=pod_netns.path,
               node=node_netns)
    with pytest.raises(CNIError) as err:
        run_plugin(exe, "CHECK", {{**CONF, "mtu": 1400, "prevResult": result}},
                   netns=pod_netns.path, node=node_netns)
    assert "expected 1400" in err.value.msg
    run_plugin(exe, "DEL", CONF, netns=pod_netns.path, node=node_netns)


def test_missing_interface_is_a_config_error(exe, node_netns, pod_netns):
    with pytest.raises(CNIError) as err:
        run_plugin(exe, "ADD", CONF, netns=pod_netns.path, node=node_netns)
    assert err.value.code == 7 and "not found" in err.value.msg


def test_version_and_bad_config(exe, node_netns):
    assert "1.1.0" in run_plugin(exe, "VERSION", {{"cniVersion": "1.1.0"}})["supportedVersions"]
    with pytest.raises(CNIError) as err:
        run_plugin(exe, "ADD", {{**CONF, "mtu": 10}}, netns="/run/netns/none", node=node_netns)
    assert err.value.code == 7 and "mtu" in err.value.msg


def test_conformance(cni_conformance, tmp_path):
    """The CNI spec's rules, held by cni-skel's conformance kit (the checks of
    `cni-skel conformance`): {name} after cni-skel's ptp and host-local in a
    list, as a runtime runs it; a failed check fails with the kit's table."""
    install_plugin(tmp_path, "{name}", "{module}:{cls}", pythonpath=[str(PROJECT)])
    install_reference_plugin(tmp_path, "ptp")
    install_reference_plugin(tmp_path, "host-local")
    cni_conformance({{"cniVersion": "1.1.0", "name": "conformance-net", "plugins": [
        {{"type": "ptp", "ipam": {{"type": "host-local", "subnet": "10.9.0.0/24",
                                  "dataDir": str(tmp_path / "ipam")}}}},
        {{"type": "{name}", "mtu": 1280}}]}}, [tmp_path])
'''

_README = '''\
# {name}

A CNI plugin written with [cni-skel](https://pypi.org/project/cni-skel/): sets the
MTU of the container's interface (chain it after the plugin that creates the interface).

```sh
python -m pytest          # as root: the tests make their own network namespaces
pip install .             # registers the plugin (entry point cni_skel.plugins)
cni-skel install --bin-dir /opt/cni/bin {name}
```

## Install

cni-skel is not on PyPI. In an environment that already has it, `pip install .` is
enough; in a fresh one, give pip a cni-skel wheel or checkout along with this project:

```sh
pip install --find-links /path/to/wheels '.[test]'   # a directory holding cni_skel-*.whl
pip install /path/to/cni-skel '.[test]'              # or a cni-skel source checkout
```

In a conflist:

```json
{{"type": "{name}", "mtu": 1400}}
```

## Add a second plugin

One project can ship several plugins. Each is a `Plugin` subclass with an executable
name of its own, registered under the `cni_skel.plugins` entry point; `cni-skel install`
writes one executable per name. For a plugin `{name}-passthrough`:

1. Write it in a new module of the package, `{module}/passthrough.py` (every module in
   `{module}/` is packaged, see `[tool.setuptools]`):

   ```python
   """CNI plugin ``{name}-passthrough``: hands the chain's result on unchanged."""

   from __future__ import annotations

   from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result
   from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG


   class Passthrough(Plugin):
       """{name}-passthrough: returns prevResult; nothing to check or undo."""

       name = "{name}-passthrough"  # the about text; use the executable name
       config_model = NetConf  # or a NetConf subclass with your keys, as in plugin.py

       def add(self, args: CmdArgs, conf: NetConf) -> Result:
           if conf.prev_result is None:
               raise CNIError(ERR_INVALID_NETWORK_CONFIG, "chain it after another plugin")
           return conf.prev_result

       def check(self, args: CmdArgs, conf: NetConf) -> None:
           """Nothing of ours to check."""

       def delete(self, args: CmdArgs, conf: NetConf) -> None:
           """Nothing to undo."""
   ```

2. Register it: one more line in `pyproject.toml`, in the table that names `{name}`
   (executable name = `"module:Class"`):

   ```toml
   [project.entry-points."cni_skel.plugins"]
   {name} = "{module}:{cls}"
   {name}-passthrough = "{module}.passthrough:Passthrough"
   ```

3. Reinstall the project, `pip install .` (`pip install -e .` too): entry points are read
   from the installed package's metadata, so a new one counts only after a reinstall.

4. Write its executable: `cni-skel install --bin-dir /opt/cni/bin {name}-passthrough`
   (`cni-skel install` without names writes every registered plugin). It also restarts
   a running worker (systemd), which serves only the plugins it was started with.

Test it as `tests/test_plugin.py` tests `{name}`, with its own executable:
`install_plugin(tmp_path, "{name}-passthrough", "{module}.passthrough:Passthrough",
pythonpath=[str(PROJECT)])`.
'''


def names_for(name: str) -> tuple[str, str]:
    """``(module, class)`` for a plugin executable name: ``mtu-setter`` ->
    ``("cni_mtu_setter", "MtuSetter")``.

    Raises:
        ValueError: the name is not lower-case letters, digits and single
            ``-``/``_`` separators starting with a letter.
    """
    if not _NAME_RE.fullmatch(name) or len(name) > 64:
        raise ValueError(f"invalid plugin name {name!r}: use lower-case letters, digits and "
                         "single '-' or '_' between them, starting with a letter "
                         "(e.g. mtu-setter)")
    parts = re.split(r"[-_]", name)
    cls = "".join(p[:1].upper() + p[1:] for p in parts)
    if keyword.iskeyword(cls):
        cls += "Plugin"
    return "cni_" + "_".join(parts), cls


def render(name: str) -> dict[str, str]:
    """The files of the new project: relative path -> text."""
    module, cls = names_for(name)
    fmt = {"name": name, "module": module, "cls": cls, "check_code": 7,
           "skel_version": __version__}
    return {
        "pyproject.toml": _PYPROJECT.format(**fmt),
        "README.md": _README.format(**fmt),
        f"{module}/__init__.py": _INIT.format(**fmt),
        f"{module}/plugin.py": _PLUGIN.format(**fmt),
        "tests/test_plugin.py": _TEST.format(**fmt),
    }
