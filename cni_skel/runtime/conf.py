"""Network configuration files, as libcni's ``conf.go`` reads them.

A network configuration list (`NetworkConfigList`) is found by name in a
config directory (`load_conflist`), read from one file (`load_file`) or
parsed from bytes (`network_config_list_from_bytes`); a single plugin object
is `PluginConfig` (`plugin_config_from_bytes`). `select_version` picks the
protocol version a list runs with.

Sources: CNI spec 1.1.0 section 1 (configuration format, ``cniVersions``,
``loadOnlyInlinedPlugins``, plugin objects in ``<confdir>/<name>/``); libcni
``conf.go`` and containerd's go-cni for file discovery and the pre-1.0
single-plugin ``.conf``. Every parse error is a `CNIError` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..env import validate_network_name
from ..errors import (
    ERR_DECODING_FAILURE,
    ERR_INCOMPATIBLE_CNI_VERSION,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_IO_FAILURE,
    CNIError,
)
from ..version import ALL_VERSIONS, CURRENT_VERSION, parse_version
from .errors import NetworkNotFound

__all__ = [
    "CONF_EXTENSIONS",
    "DEFAULT_CONF_DIR",
    "NetworkConfigList",
    "PluginConfig",
    "conf_files",
    "load_conflist",
    "load_file",
    "network_config_list_from_bytes",
    "plugin_config_from_bytes",
    "select_version",
]

#: libcni's default: containerd's CRI plugin reads /etc/cni/net.d.
DEFAULT_CONF_DIR = "/etc/cni/net.d"
#: File name extensions of network configuration files, as containerd's go-cni.
CONF_EXTENSIONS: tuple[str, ...] = (".conf", ".conflist", ".json")

_BOOL_KEYS = (("disableCheck", "disable_check"), ("disableGC", "disable_gc"),
              ("loadOnlyInlinedPlugins", "load_only_inlined_plugins"))


@dataclass
class PluginConfig:
    """One plugin configuration object of a list (libcni ``PluginConfig``).

    Attributes:
        conf: the decoded JSON object as written (plugin-specific keys kept
            untouched).
        source: the file it came from (None when built in memory).
    """

    conf: dict[str, Any]
    source: str | None = None

    @property
    def type(self) -> str:
        """The ``type``: the plugin executable's name."""
        return self.conf.get("type", "")

    @property
    def capabilities(self) -> list[str]:
        """Capabilities the plugin declares ``true``, in config order."""
        caps = self.conf.get("capabilities") or {}
        return [name for name, on in caps.items() if on is True]


@dataclass
class NetworkConfigList:
    """A network configuration list (libcni ``NetworkConfigList``).

    Attributes:
        name: network name (the spec's name rule holds).
        cni_version: the protocol version selected for the list, see
            `select_version`; every plugin gets it as ``cniVersion``.
        plugins: the plugin objects, inlined first, then those loaded from
            ``<confdir>/<name>/*.conf`` unless ``load_only_inlined_plugins``.
        disable_check, disable_gc, load_only_inlined_plugins: the list's flags.
        cni_versions: ``cniVersions`` as declared (empty when absent).
        declared_version: ``cniVersion`` as declared ("" when absent).
        raw: the bytes of the list as loaded: what the result cache stores as
            ``config`` (for a single-plugin ``.conf``, the list it became).
        source: the file it came from (None when built from bytes).
    """

    name: str
    cni_version: str
    plugins: list[PluginConfig] = field(default_factory=list)
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    cni_versions: tuple[str, ...] = ()
    declared_version: str = ""
    raw: bytes = b""
    source: str | None = None

    def with_version(self, version: str) -> NetworkConfigList:
        """A copy with ``cni_version`` set to ``version`` (a spec version)."""
        parse_version(version)
        return dataclasses.replace(self, cni_version=version)

    @property
    def capabilities(self) -> list[str]:
        """Every capability some plugin of the list declares, sorted."""
        return sorted({c for p in self.plugins for c in p.capabilities})

    @property
    def candidate_versions(self) -> list[str]:
        """The versions the list declares (``cniVersions`` and ``cniVersion``)
        that this runtime knows, at most 1.1.0, highest first."""
        declared = list(self.cni_versions)
        if self.declared_version or not declared:
            declared.append(self.declared_version or "0.1.0")
        return sorted({v for v in declared if v in ALL_VERSIONS}, key=parse_version,
                      reverse=True)


def _err(code: int, source: str | None, msg: str, details: str = "") -> CNIError:
    where = f"{source}: " if source else ""
    return CNIError(code, f"{where}{msg}", details)


def _decode_object(data: bytes | str, source: str | None, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _err(ERR_DECODING_FAILURE, source, f"error parsing {what}: {exc}") from None
    if not isinstance(obj, dict):
        raise _err(ERR_DECODING_FAILURE, source,
                   f"error parsing {what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_plugin_object(obj: Any, source: str | None, where: str) -> PluginConfig:
    if not isinstance(obj, dict):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                   f"{where}: a plugin configuration must be a JSON object",
                   f"got {type(obj).__name__}")
    ptype = obj.get("type")
    if not isinstance(ptype, str) or not ptype:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: missing 'type'",
                   "every plugin object names its executable in 'type'")
    if "/" in ptype or "\\" in ptype or ptype in (".", ".."):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: invalid plugin type {ptype!r}",
                   "a plugin type is a file name without path separators")
    caps = obj.get("capabilities")
    if caps is not None and (not isinstance(caps, dict)
                             or not all(isinstance(v, bool) for v in caps.values())):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: invalid 'capabilities'",
                   f"expected an object of capability name -> true/false, got {caps!r}")
    return PluginConfig(obj, source)


def plugin_config_from_bytes(data: bytes | str, *, source: str | None = None) -> PluginConfig:
    """Parse one plugin configuration object (libcni
    ``NetworkPluginConfFromBytes``).

    Raises:
        CNIError: code 6 for bad JSON; code 7 for a missing or invalid
            ``type`` (empty, or with a path separator) or malformed
            ``capabilities``.
    """
    return _check_plugin_object(_decode_object(data, source, "plugin configuration"), source,
                                "plugin")


def _read_bool(obj: dict[str, Any], key: str, source: str | None) -> bool:
    # libcni accepts true/false and the strings "true"/"false" in any case.
    value = obj.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"invalid value {value!r} for {key}",
               "expected true or false")


def select_version(cni_version: str = "", cni_versions: Iterable[str] | None = None) -> str:
    """The protocol version a runtime uses for a list.

    Spec 1.1.0: with ``cniVersions``, the highest listed version the runtime
    supports (``cniVersion`` counts as one more entry); versions newer than
    1.1.0 are skipped, as libcni does. Without it, ``cniVersion``
    (``"0.1.0"`` when absent, as the spec's version rule says).

    Raises:
        CNIError: code 6 for a malformed version string; code 1 when no
            declared version is one this runtime speaks (`ALL_VERSIONS`).
    """
    versions = list(cni_versions or [])
    for v in [*versions, cni_version] if cni_version else versions:
        if not isinstance(v, str):
            raise CNIError(ERR_DECODING_FAILURE, f"invalid cniVersion entry {v!r}",
                           "versions are strings like \"1.1.0\"")
        parse_version(v)
    if not versions:
        chosen = cni_version or "0.1.0"
        if chosen not in ALL_VERSIONS:
            newer = parse_version(chosen) > parse_version(CURRENT_VERSION)
            raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                           f'cniVersion "{chosen}" is '
                           + (f"newer than this runtime supports ({CURRENT_VERSION})" if newer
                              else "not a CNI spec version")
                           + f"; supported: {', '.join(ALL_VERSIONS)}")
        return chosen
    pool = [*versions, cni_version] if cni_version else versions
    known = [v for v in pool if v in ALL_VERSIONS]
    if not known:
        raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                       f"none of the declared versions {pool} is supported by this runtime "
                       f"(it speaks {', '.join(ALL_VERSIONS)})")
    return max(known, key=parse_version)


def network_config_list_from_bytes(data: bytes | str, *,
                                   source: str | None = None) -> NetworkConfigList:
    """Parse a network configuration list (libcni ``NetworkConfFromBytes``).

    Only the inlined ``plugins`` are read here; `load_file` adds those from
    ``<confdir>/<name>/``. A list without ``plugins`` is accepted here (its
    plugins may all come from that directory).

    Raises:
        CNIError: code 6 for bad JSON or a malformed version string; code 7
            for a missing or invalid name (spec name rule), a non-boolean
            flag, ``loadOnlyInlinedPlugins`` without ``plugins``, an empty
            or malformed ``plugins``, a plugin without a valid ``type``;
            code 1 when no declared version is supported (`select_version`).
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    obj = _decode_object(raw, source, "configuration list")
    name = obj.get("name")
    if name is None:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "missing network name",
                   "a network configuration needs a 'name'")
    if not isinstance(name, str):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"invalid network name {name!r}",
                   "the name must be a string")
    try:
        validate_network_name(name)
    except CNIError as exc:
        raise _err(exc.code, source, exc.msg, exc.details or name) from None
    declared = obj.get("cniVersion", "")
    if declared is None:
        declared = ""
    if not isinstance(declared, str):
        raise _err(ERR_DECODING_FAILURE, source, f"invalid cniVersion {declared!r}",
                   "cniVersion must be a string")
    versions = obj.get("cniVersions")
    if versions is not None and (not isinstance(versions, list)
                                 or not all(isinstance(v, str) for v in versions)):
        raise _err(ERR_DECODING_FAILURE, source, f"invalid cniVersions {versions!r}",
                   "cniVersions must be a list of version strings")
    try:
        chosen = select_version(declared, versions)
    except CNIError as exc:
        raise _err(exc.code, source, exc.msg, exc.details) from None
    flags = {attr: _read_bool(obj, key, source) for key, attr in _BOOL_KEYS}
    netlist = NetworkConfigList(name=name, cni_version=chosen, raw=raw, source=source,
                                cni_versions=tuple(versions or ()), declared_version=declared,
                                **flags)
    if "plugins" not in obj:
        if netlist.load_only_inlined_plugins:
            raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                       "loadOnlyInlinedPlugins is true and there is no 'plugins' key")
        return netlist
    plugins = obj["plugins"]
    if not isinstance(plugins, list):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                   f"invalid 'plugins': expected a list, got {type(plugins).__name__}")
    if not plugins:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "no plugins in list")
    netlist.plugins = [_check_plugin_object(p, source, f"plugin {i + 1}")
                       for i, p in enumerate(plugins)]
    return netlist


def _conf_to_list(plugin: PluginConfig, source: str | None) -> NetworkConfigList:
    # libcni ConfListFromConf: a list of one, named and versioned as the
    # plugin object; its bytes are the list it became (Go map order: sorted).
    conf = plugin.conf
    if "name" not in conf:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "missing network name",
                   "a single-plugin configuration needs a 'name'")
    doc = {"cniVersion": conf.get("cniVersion", ""), "name": conf["name"], "plugins": [conf]}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    netlist = network_config_list_from_bytes(raw, source=source)
    netlist.raw = raw
    return netlist


def dir_names(path: str, what: str) -> list[str]:
    """The names in directory ``path``, sorted; none when it is missing.

    Raises:
        CNIError: code 5 ``cannot read <what> <path>: <strerror>`` otherwise.
    """
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"cannot read {what} {path}: {exc.strerror}") from None


def conf_files(conf_dir: str, extensions: Iterable[str] = CONF_EXTENSIONS) -> list[str]:
    """Configuration files of ``conf_dir`` with one of ``extensions``, in
    lexical order of their names (directories skipped). A missing directory
    has none.

    Raises:
        CNIError: code 5 when the directory cannot be read.
    """
    exts = tuple(extensions)
    out = []
    for name in dir_names(conf_dir, "config directory"):
        path = os.path.join(conf_dir, name)
        if os.path.splitext(name)[1] in exts and not os.path.isdir(path):
            out.append(path)
    return out


def _dir_plugins(conf_dir: str, name: str) -> list[PluginConfig]:
    plugins = []
    for path in conf_files(os.path.join(conf_dir, name), (".conf",)):
        plugins.append(plugin_config_from_bytes(_read(path), source=path))
    return plugins


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fp:
            return fp.read()
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"error reading {path}: {exc.strerror}") from None


def load_file(path: str) -> NetworkConfigList:
    """Load one configuration file as a list.

    ``.conflist``, and ``.conf``/``.json`` holding a ``plugins`` key, are
    lists; any other ``.conf``/``.json`` is a single plugin object (the
    pre-1.0 form) and becomes a list of one, named and versioned by it (libcni
    ``ConfListFromConf``). For a list file, unless ``loadOnlyInlinedPlugins``
    is true, the plugin objects of ``<dir>/<name>/*.conf`` (lexical order) are
    appended (spec 1.1.0).

    Raises:
        CNIError: code 5 when unreadable; otherwise as
            `network_config_list_from_bytes`, plus code 7 when the list ends
            up with no plugin at all.
    """
    data = _read(path)
    obj = _decode_object(data, path, "configuration")
    if path.endswith(".conflist") or "plugins" in obj:
        netlist = network_config_list_from_bytes(data, source=path)
        if not netlist.load_only_inlined_plugins:
            netlist.plugins.extend(_dir_plugins(os.path.dirname(path), netlist.name))
    else:
        netlist = _conf_to_list(_check_plugin_object(obj, path, "plugin"), path)
    if not netlist.plugins:
        raise _err(ERR_INVALID_NETWORK_CONFIG, path, f'no plugin configs found for network '
                   f'"{netlist.name}"', "give 'plugins' or put plugin objects in "
                   f"{os.path.join(os.path.dirname(path), netlist.name)}/*.conf")
    return netlist


def load_conflist(conf_dir: str, name: str) -> NetworkConfigList:
    """The network ``name`` from ``conf_dir``: the first file, in lexical
    order over ``.conf``, ``.conflist`` and ``.json``, that defines it (see
    `load_file` for the formats). This is containerd's order (go-cni);
    libcni's own ``LoadConfList`` tries every ``.conflist`` before the rest,
    which differs only when two files define the same network.

    Files that cannot be parsed are skipped while searching (libcni stops at
    the first broken ``.conflist``); if the network is not found, the error
    names them with their problem.

    Raises:
        NetworkNotFound: code 7, no file defines ``name``.
        CNIError: the matching file's own problem (see `load_file`).
    """
    found: list[str] = []
    problems: list[str] = []
    for path in conf_files(conf_dir):
        try:
            netlist = load_file(path)
        except CNIError as exc:
            # The file may still be the one asked for: report its problem
            # rather than "not found" when its name matches.
            if _declared_name(path) == name:
                raise
            problems.append(f"{os.path.basename(path)}: {exc}")
            continue
        if netlist.name == name:
            return netlist
        found.append(netlist.name)
    raise NetworkNotFound(conf_dir, name, found, problems)


def _declared_name(path: str) -> Any:
    try:
        with open(path, "rb") as fp:
            obj = json.load(fp)
        return obj.get("name") if isinstance(obj, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
