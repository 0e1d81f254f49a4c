"""cni_skel: write CNI plugins in Python.

The public face. Names load lazily (PEP 562) so that a plugin's VERSION call
imports only what it needs; ``from cni_skel import Plugin`` costs the stdlib.

    Plugin, CmdArgs, dispatch        the skeleton (cni_skel.skel, cni_skel.env)
    CNIError                         errors with spec codes (cni_skel.errors)
    NetConf, IPAMConf, GCAttachment  config models (cni_skel.config)
    CNIArgs, K8sArgs, load_args      typed CNI_ARGS (cni_skel.args)
    Result, Interface, IPConfig,
    Route, DNS, parse_result         result models (cni_skel.types)
    NetNS, open_netns                network namespaces (cni_skel.netns)
    rollback, Rollback               undo a failed ADD (cni_skel.rollback)
    ipam_add, delegate_*,            IPAM delegation and how plugins are run
    Exec, SubprocessExec             (cni_skel.invoke; Go's invoke.Exec)
    Link                             a link as the kernel reports it (cni_skel.netlink)
    setup_veth                       a pod's veth pair (cni_skel.veth; Go's ip.SetupVeth)
    enable_forward                   IP forwarding on (cni_skel.sysctl; Go's ip.EnableForward)
    setup_ip_masq, teardown_ip_masq, masquerade per network, flat per pod
    gc_ip_masq, check_ip_masq        (cni_skel.masq; Go's ip.SetupIPMasq/TeardownIPMasq)

What is public (docs/stability.md): the names above (``PUBLIC``), and in
each submodule named in ``PUBLIC_MODULES`` the names in its ``__all__``
(``cni_skel.netlink.find_link``, ``cni_skel.runtime.Runtime``...). Anything
else (a name with a leading underscore, a name outside a module's
``__all__``, a module not listed: ``cni_skel.warm.*``, the ``cni_skel.cli``
commands' modules, ``cni_skel.startup``...) is internal and may change in any
release. A public name changes only with a CHANGELOG.md entry, and one that
goes away first warns (DeprecationWarning) for at least one minor release.

Each name's own help says more (``help(cni_skel.Plugin)``); docs/tutorial.md
walks through a plugin, and ``make docs`` builds the API reference.
"""

from __future__ import annotations

# Not lazy: the submodule cni_skel.rollback, once imported, would be what
# ``cni_skel.rollback`` names instead of the function (stdlib only, small).
from .rollback import Rollback as Rollback
from .rollback import rollback as rollback

TYPE_CHECKING = False  # typing stays out of the VERSION path of plain scripts
if TYPE_CHECKING:
    # What type checkers and IDEs see (py.typed): the same names the lazy
    # ``__getattr__`` hands out at run time, with their real types.
    from typing import Any

    from .args import CNIArgs as CNIArgs
    from .args import K8sArgs as K8sArgs
    from .args import load_args as load_args
    from .config import GCAttachment as GCAttachment
    from .config import IPAMConf as IPAMConf
    from .config import NetConf as NetConf
    from .env import CmdArgs as CmdArgs
    from .errors import CNIError as CNIError
    from .invoke import Exec as Exec
    from .invoke import SubprocessExec as SubprocessExec
    from .invoke import delegate_add as delegate_add
    from .invoke import delegate_check as delegate_check
    from .invoke import delegate_del as delegate_del
    from .invoke import delegate_gc as delegate_gc
    from .invoke import delegate_status as delegate_status
    from .invoke import ipam_add as ipam_add
    from .masq import check_ip_masq as check_ip_masq
    from .masq import gc_ip_masq as gc_ip_masq
    from .masq import setup_ip_masq as setup_ip_masq
    from .masq import teardown_ip_masq as teardown_ip_masq
    from .netlink import Link as Link
    from .netns import NetNS as NetNS
    from .netns import open_netns as open_netns
    from .skel import Plugin as Plugin
    from .skel import dispatch as dispatch
    from .sysctl import enable_forward as enable_forward
    from .types import DNS as DNS
    from .types import Interface as Interface
    from .types import IPConfig as IPConfig
    from .types import Result as Result
    from .types import Route as Route
    from .types import parse_result as parse_result
    from .version import ALL_VERSIONS as ALL_VERSIONS
    from .version import CURRENT_VERSION as CURRENT_VERSION
    from .veth import setup_veth as setup_veth
del TYPE_CHECKING

__version__ = "0.2.0"

_EXPORTS = {
    "Plugin": "skel", "dispatch": "skel",
    "CmdArgs": "env",
    "CNIError": "errors",
    "NetConf": "config", "IPAMConf": "config", "GCAttachment": "config",
    "CNIArgs": "args", "K8sArgs": "args", "load_args": "args",
    "Result": "types", "Interface": "types", "IPConfig": "types", "Route": "types",
    "DNS": "types", "parse_result": "types",
    "NetNS": "netns", "open_netns": "netns",
    "ipam_add": "invoke", "delegate_add": "invoke", "delegate_check": "invoke",
    "delegate_del": "invoke", "delegate_status": "invoke", "delegate_gc": "invoke",
    "Exec": "invoke", "SubprocessExec": "invoke",
    "Link": "netlink",
    "setup_veth": "veth", "enable_forward": "sysctl",
    "setup_ip_masq": "masq", "teardown_ip_masq": "masq", "gc_ip_masq": "masq",
    "check_ip_masq": "masq",
    "ALL_VERSIONS": "version", "CURRENT_VERSION": "version",
}

# No ``__all__``: with one, help(cni_skel) renders every exported pydantic
# model with all of BaseModel's methods (5,000 lines). The public names are
# _EXPORTS plus Rollback/rollback, pinned by tests/test_exported_members.py.
PUBLIC = (*_EXPORTS, "Rollback", "rollback")

#: The submodules whose ``__all__`` is public API, as dotted names below
#: ``cni_skel`` (docs/stability.md; the snapshot in api/ covers exactly these).
PUBLIC_MODULES = (
    "announce", "args", "cli", "config", "conformance", "conformance.contract",
    "conformance.snapshot", "conntrack", "env", "errors", "gomasq", "gorules",
    "harness", "invoke", "ipam", "ipset", "iptables", "keeper", "masq", "model", "netlink",
    "netns", "nft", "rollback", "rtnl", "runtime", "skel", "state", "sysctl", "tags", "tc",
    "testing", "types", "version", "veth",
)


# Deprecated top-level names (cni_skel.compat.DEPRECATED), served but not in
# PUBLIC or dir(); the function itself warns when called.
_OLD_EXPORTS = {"ipam_add_guard": "invoke"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name) or _OLD_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cni_skel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"cni_skel.{module}"), name)
    if name in _EXPORTS:
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})
