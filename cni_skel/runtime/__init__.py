"""The runtime side of CNI: what containerd, CRI-O and kubelet do through libcni.

Load a network configuration list from a config directory, derive each
plugin's request config, run the plugins for ADD / CHECK / DEL / GC / STATUS,
and keep the final ADD result in libcni's on-disk cache so that a node's cache
is shared with containerd and cnitool. As in libcni, the runtime object is
``cni`` and ``rt`` is the attachment's `RuntimeConf`::

    from cni_skel.runtime import Runtime, RuntimeConf

    cni = Runtime(conf_dir="/etc/cni/net.d", bin_dirs=["/opt/cni/bin"])
    net = cni.load_conflist("mynet")
    rt = RuntimeConf("ctr1", "/run/netns/pod1", "eth0",
                     capability_args={"portMappings": [...]})
    result = cni.add(net, rt)
    cni.check(net, rt)
    cni.delete(net, rt)

The package is cut as libcni is:

* `cni_skel.runtime.conf` (``conf.go``): config files, lists, version choice;
* `cni_skel.runtime.api` (``api.go``): `Runtime`, `RuntimeConf`,
  `NetworkAttachment`, `derive_request_config`, cnitool's conventions;
* `cni_skel.runtime.cache`: the ``cniCacheV1`` result cache;
* `cni_skel.runtime.errors`: `NetworkNotFound`, `PluginError`, `GCError`,
  and `describe_error` for people.

Sources: CNI spec 1.1.0 sections 1 and 3; libcni for what the spec leaves
open (each module says where). Where we follow the spec rather than libcni,
the docstring says so. Nothing here is imported by a plugin executable.
"""

from __future__ import annotations

from ..config import GCAttachment
from .api import (
    DEFAULT_BIN_DIRS,
    CapabilityArgs,
    NetworkAttachment,
    Runtime,
    RuntimeConf,
    ValidAttachment,
    cnitool_container_id,
    derive_request_config,
    resolve_netns,
)
from .cache import CACHE_KIND, DEFAULT_CACHE_DIR, CachedInfo, ResultCache
from .conf import (
    CONF_EXTENSIONS,
    DEFAULT_CONF_DIR,
    NetworkConfigList,
    PluginConfig,
    conf_files,
    load_conflist,
    load_file,
    network_config_list_from_bytes,
    plugin_config_from_bytes,
    select_version,
)
from .errors import GCError, NetworkNotFound, PluginError, describe_error, error_hint

__all__ = [
    "CACHE_KIND",
    "CONF_EXTENSIONS",
    "DEFAULT_BIN_DIRS",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_CONF_DIR",
    "CachedInfo",
    "CapabilityArgs",
    "GCAttachment",
    "GCError",
    "NetworkAttachment",
    "NetworkConfigList",
    "NetworkNotFound",
    "PluginConfig",
    "PluginError",
    "ResultCache",
    "Runtime",
    "RuntimeConf",
    "ValidAttachment",
    "cnitool_container_id",
    "conf_files",
    "derive_request_config",
    "describe_error",
    "error_hint",
    "load_conflist",
    "load_file",
    "network_config_list_from_bytes",
    "plugin_config_from_bytes",
    "resolve_netns",
    "select_version",
]
