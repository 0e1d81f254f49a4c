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
"""

from __future__ import annotations

# Not lazy: the submodule cni_skel.rollback, once imported, would be what
# ``cni_skel.rollback`` names instead of the function (stdlib only, small).
from .rollback import Rollback as Rollback
from .rollback import rollback as rollback

TYPE_CHECKING = False  # typing stays out of the VERSION path of plain scripts
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

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

__all__ = sorted([*_EXPORTS, "Rollback", "rollback"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cni_skel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"cni_skel.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
