"""The plugin skeleton: (environment, stdin) -> (stdout, exit code).

Source: CNI spec 1.1.0 sections "Protocol parameters", "Operations",
"Result types" and the Go skel (pkg/skel): validation order, error codes,
version checks per verb. `dispatch` keeps no state between calls, so a
long-lived worker can serve many invocations in one process.

Start-up matters (every call pays it, and podman runs VERSION before every
command): this module imports only the stdlib; pydantic and the result models
load on the first verb that needs a config.
"""

from __future__ import annotations

import json
import os
import sys

from . import __version__
from .env import CmdArgs, handed_netns_fd, parse_env, validate_network_name
from .errors import (
    ERR_DECODING_FAILURE,
    ERR_INCOMPATIBLE_CNI_VERSION,
    ERR_INTERNAL,
    ERR_INVALID_NETNS,
    ERR_IO_FAILURE,
    CNIError,
)
from .version import (
    ALL_VERSIONS,
    CURRENT_VERSION,
    check_supported,
    config_version,
    parse_version,
    version_at_least,
)
from .warm.protocol import MAX_STDIN_BYTES, WARNINGS_ENV, go_field

TYPE_CHECKING = False  # typing/collections.abc stay out of the VERSION path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO, Any, ClassVar


__all__ = ["Plugin", "decode_config", "dispatch", "error_answer", "load_config", "resolve_ref",
           "run_plugin_main", "version_answer"]

# Minimum config version per verb (spec: CHECK 0.4.0, STATUS and GC 1.1.0).
_MIN_VERSION = {"CHECK": "0.4.0", "STATUS": "1.1.0", "GC": "1.1.0"}
_HANDLERS = {"ADD": "add", "CHECK": "check", "DEL": "delete", "STATUS": "status", "GC": "gc"}


def resolve_ref(ref: Any) -> Any:
    """``ref`` itself, or the object a ``"package.module:Name"`` string names
    (imported now). Raises ImportError/AttributeError when it names nothing."""
    if isinstance(ref, str):
        import importlib

        module, _, attr = ref.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    return ref


class Plugin:
    """Base class of a CNI plugin (Go: the functions given to
    ``skel.PluginMain``). Subclass it, set the models and override the verbs.

    Class attributes:
        name: plugin name for the about text (CNI_COMMAND unset).
        about: the about text's first line (default ``"CNI <name> plugin
            (cni-skel <version>)"``, as Go's ``bv.BuildString``).
        config_model: the `cni_skel.config.NetConf` subclass stdin is parsed
            into (default NetConf itself).
        args_model: the `cni_skel.args.CNIArgs` subclass CNI_ARGS is parsed
            into (``CmdArgs.typed_args``); None leaves CNI_ARGS unparsed.
        supported_versions: spec versions accepted in ``cniVersion``.
        service: a `cni_skel.keeper.Service` subclass the worker's keeper
            runs for this plugin, for what must outlive a call (the dhcp
            plugin's leases); its verbs reach it with
            `cni_skel.keeper.call`. None (default): no service.

    Escape hatch: ``config_model``, ``args_model`` and ``service`` may also be a
    ``"package.module:Class"`` string, imported on the first verb that needs
    it (`resolve_ref`), for a plugin module that must not import pydantic.

    Each verb gets the validated `CmdArgs` and the config model instance:
        add(args, conf) -> Result: the result in the current (1.1.0) model;
            the skel converts it to the config's cniVersion. Return
            ``conf.prev_result`` to pass a chain's result through. Check
            everything before the first side effect, including that the
            result can be expressed in the config's version
            (`cni_skel.types.check_expressible`: before 0.3.0 a result
            needs an IP), and undo what you made if a later step fails
            (`cni_skel.rollback.rollback`). Default: code 999.
        check(args, conf), delete(args, conf): return None on success.
            Default: code 999.
        status(args, conf), gc(args, conf): default: passed on to the IPAM
            plugin the config names (``ipam.type``), else success. A GC
            takes its keep-list from `cni_skel.config.NetConf.gc_keep`.
        validate_config(args, conf): the config checks ADD makes beyond the
            config model that need nothing but the config (no netns, no
            prevResult, nothing written); `cni-skel validate` runs them after
            the model. Default: none.
    Raise `CNIError` to choose the error code; anything else becomes 999.

    An IPAM plugin is a Plugin too (docs/ipam-plugins.md). Its config names
    itself in ``ipam.type``, so the STATUS/GC defaults above pass nothing
    on and answer success: override `status` and `gc` to make them mean
    something (host-local's GC releases what the keep-list lacks).

    Deprecated since 0.2.0 (gone in 0.3.0): ``verbs = "package.module"``,
    0.1.0's way of giving the verbs as module-level functions ``add``,
    ``check``, ``delete``, ``status``, ``gc``, ``validate_config`` (same
    signatures, imported on first use). It still works, for the verbs the
    class does not define itself, and warns once per class, at its creation.
    """

    name: ClassVar[str] = "cni-skel"
    about: ClassVar[str | None] = None
    config_model: ClassVar[Any] = "cni_skel.config:NetConf"
    args_model: ClassVar[Any] = None
    supported_versions: ClassVar[tuple[str, ...]] = ALL_VERSIONS
    service: ClassVar[Any] = None
    #: Deprecated (0.2.0): a ``"package.module"`` of verb functions; see above.
    verbs: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("verbs") is not None:
            from .compat import warn  # only for a 0.1.0-style class: VERSION stays lean

            warn("cni_skel.skel.Plugin.verbs", stacklevel=2)  # at the class statement

    def _verb(self, name: str) -> Callable[[CmdArgs, Any], Any] | None:
        # The function of the deprecated `verbs` module, if any.
        if self.verbs is None:
            return None
        import importlib

        return getattr(importlib.import_module(self.verbs), name, None)

    def _missing(self, verb: str, method: str) -> CNIError:
        return CNIError(
            ERR_INTERNAL,
            f"{self.name}: {verb} is not implemented: {type(self).__qualname__} "
            f"(a cni_skel.Plugin) defines no {method}(self, args, conf) method; "
            f"define it on the class")

    def add(self, args: CmdArgs, conf: Any) -> Any:
        """ADD; see the class docstring. Raises code 999, naming the method
        to define, unless overridden."""
        if (fn := self._verb("add")) is None:
            raise self._missing("ADD", "add")
        return fn(args, conf)

    def check(self, args: CmdArgs, conf: Any) -> None:
        """CHECK; see the class docstring. Raises code 999, naming the method
        to define, unless overridden."""
        if (fn := self._verb("check")) is None:
            raise self._missing("CHECK", "check")
        fn(args, conf)

    def delete(self, args: CmdArgs, conf: Any) -> None:
        """DEL; see the class docstring. Raises code 999, naming the method
        to define, unless overridden."""
        if (fn := self._verb("delete")) is None:
            raise self._missing("DEL", "delete")
        fn(args, conf)

    def status(self, args: CmdArgs, conf: Any) -> None:
        """STATUS (1.1.0). Unless overridden: the IPAM plugin's STATUS when
        the config names one other than this plugin (spec: a plugin passes
        STATUS on to its IPAM), else success. Raises the IPAM plugin's
        `CNIError`."""
        if (fn := self._verb("status")) is not None:
            fn(args, conf)
            return
        _pass_to_ipam("STATUS", self, args, conf)

    def gc(self, args: CmdArgs, conf: Any) -> None:
        """GC (1.1.0). Unless overridden: the IPAM plugin's GC when the
        config names one other than this plugin (spec: a plugin passes GC on
        to its IPAM), else success. Raises the IPAM plugin's `CNIError`."""
        if (fn := self._verb("gc")) is not None:
            fn(args, conf)
            return
        _pass_to_ipam("GC", self, args, conf)

    def validate_config(self, args: CmdArgs, conf: Any) -> None:
        """Config checks beyond the model (`cni-skel validate`); none unless
        overridden."""
        if (fn := self._verb("validate_config")) is not None:
            fn(args, conf)

    @classmethod
    def node_state(cls) -> list[str]:
        """What this plugin keeps on the node in its default places (files,
        nftables tables), one line each, for ``cni-skel uninstall`` to
        report: it stays for the pods still attached, and a DEL or GC of
        theirs removes it. Nothing unless overridden."""
        return []

    @classmethod
    def hand_over_to_go(cls, conf: Any, handover: Any, *,
                        dry_run: bool = False) -> list[str]:
        """``cni-skel migrate --to-go``, for one attachment that stays
        running while the node goes back to the Go plugins: make what the Go
        plugin of the same name needs to serve its later CHECK and DEL (and
        keep the pod's connectivity), then remove this plugin's node-side
        entries of the attachment. ``conf``: the request config (ADD's,
        ``prevResult`` the cached result) parsed by `load_config`; ``handover``: a
        `cni_skel.gorules.GoHandOver` (container ID, ifname, netns,
        ``run_go(verb)`` running the Go plugin with ``conf``). With
        ``dry_run`` nothing is changed. Returns one line per thing done (or
        to do, in a dry run) and what the operator must do by hand. Nothing
        unless overridden (a plugin with no node-side state).

        Raises:
            CNIError: what failed; what was done before stays done.
        """
        return []

    @classmethod
    def release_node_state(cls, *, dry_run: bool = False) -> list[str]:
        """After `hand_over_to_go` of every attachment: remove what this
        plugin keeps on the node that no attachment uses any more (empty
        nftables tables); one line per thing removed. Nothing unless
        overridden."""
        return []

    @classmethod
    def about_text(cls) -> str:
        head = cls.about or f"CNI {cls.name} plugin (cni-skel {__version__})"
        return f"{head}\nCNI protocol versions supported: {', '.join(cls.supported_versions)}\n"

    @classmethod
    def dispatch(cls, env: Mapping[str, str], stdin_data: bytes,
                 stderr: IO[str] | None = None, *, exec: Any = None) -> tuple[bytes, int]:
        """See `dispatch`."""
        return dispatch(cls, env, stdin_data, stderr, exec=exec)

    @classmethod
    def main(cls) -> None:
        """Entry point of the plugin executable: env + stdin in, JSON out, exit."""
        sys.exit(_main(cls))


#: Set (to the caller's name) in the environment of an IPAM plugin that the
#: default `Plugin.status` / `Plugin.gc` run: that plugin's own defaults then
#: pass nothing on. An IPAM plugin's config names itself in ``ipam.type``,
#: possibly under another name than its class's ``name``.
IPAM_OF_ENV = "CNI_SKEL_IPAM_OF"


def _pass_to_ipam(verb: str, plugin: Plugin, args: CmdArgs, conf: Any) -> None:
    ipam_type = getattr(getattr(conf, "ipam", None), "type", "") or ""
    if not ipam_type or ipam_type == plugin.name or args.env.get(IPAM_OF_ENV):
        return
    from .invoke import delegate_gc, delegate_status  # STATUS/GC only, never VERSION

    run = delegate_status if verb == "STATUS" else delegate_gc
    run(ipam_type, args.stdin_data, args, env={**args.env, IPAM_OF_ENV: plugin.name})


def _dumps(obj: Any) -> bytes:
    # Indented like the Go plugins' output, which eases diffing against them.
    return json.dumps(obj, indent=4).encode()


def error_answer(exc: CNIError, version: str | None) -> tuple[bytes, int]:
    """``(stdout, exit code)`` answering ``exc``: its Error object in
    ``version``'s shape (default the newest), exit 1."""
    return _dumps(exc.to_dict(version or CURRENT_VERSION)), 1


def version_answer(plugin: type[Plugin], stdin_data: bytes) -> bytes:
    """The VersionResult ``plugin`` prints for VERSION with ``stdin_data``."""
    # Spec: echo the cniVersion asked for; Go answers its newest. We echo a
    # well-formed request and answer our newest otherwise.
    asked = CURRENT_VERSION
    try:
        req = json.loads(stdin_data) if stdin_data.strip() else {}
        v = go_field(req, "cniVersion")
        if isinstance(v, str):
            parse_version(v)
            asked = v
    except (ValueError, CNIError):
        pass
    return _dumps({"cniVersion": asked, "supportedVersions": list(plugin.supported_versions)})


def _same_netns_as_ours(path: str) -> bool:
    handed = handed_netns_fd(path)
    try:
        a = os.stat(path) if handed is None else os.fstat(handed)
        b = os.stat("/proc/self/ns/net")
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def dispatch(plugin: type[Plugin], env: Mapping[str, str], stdin_data: bytes,
             stderr: IO[str] | None = None, *, exec: Any = None) -> tuple[bytes, int]:
    """Run one CNI invocation of ``plugin`` and return (stdout bytes, exit code).

    Pure with respect to the process: reads only ``env`` and ``stdin_data``,
    writes diagnostics (about text, tracebacks) to ``stderr`` (default
    sys.stderr). stdout is always empty or exactly one JSON document: a
    Result, a VersionResult, or an Error object (exit 1). A config over
    ``MAX_STDIN_BYTES`` (16 MiB) is answered with code 5. With
    ``CNI_SKEL_TRACE`` in ``env`` the call is also appended to that file
    (`cni_skel.trace`). ``exec``: the `cni_skel.invoke.Exec` the plugin's
    delegations run through (`CmdArgs.exec`; default: each its own process).
    """
    out, code = _dispatch(plugin, env, stdin_data, stderr, exec)
    if env.get("CNI_SKEL_TRACE"):
        from .trace import record

        record(plugin.name, env, stdin_data, out, code)
    return out, code


def _dispatch(plugin: type[Plugin], env: Mapping[str, str], stdin_data: bytes,
              stderr: IO[str] | None, exec: Any) -> tuple[bytes, int]:
    err_out = stderr if stderr is not None else sys.stderr
    version: str | None = None
    try:
        if not env.get("CNI_COMMAND"):
            # Go skel: no command means a human ran us; print the about text.
            err_out.write(plugin.about_text())
            return b"", 0
        args = parse_env(env, stdin_data)
        args.exec = exec
        cmd = args.command
        if cmd == "VERSION":
            return version_answer(plugin, stdin_data), 0
        if len(stdin_data) > MAX_STDIN_BYTES:
            raise CNIError(ERR_IO_FAILURE, "error reading from stdin: the network configuration "
                           f"is larger than {MAX_STDIN_BYTES} bytes")

        raw = decode_config(stdin_data)
        name = go_field(raw, "name")
        if name is None:
            name = ""
        if not isinstance(name, str):
            raise CNIError(ERR_DECODING_FAILURE, "error unmarshall network config: "
                           f"name must be a string, got {name!r}")
        validate_network_name(name)
        conf_version = config_version(raw)
        if conf_version in ALL_VERSIONS:
            version = conf_version

        minimum = _MIN_VERSION.get(cmd)
        if minimum is not None and not version_at_least(conf_version, minimum):
            raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, f"config version does not allow {cmd}")
        check_supported(conf_version, plugin.supported_versions)
        if cmd == "DEL" and args.identity_error() is not None:
            return b"", 0  # ADD refuses this container ID or ifname: nothing of it exists

        if cmd in ("ADD", "CHECK", "DEL") and args.netns \
                and env.get("CNI_NETNS_OVERRIDE", "").lower() not in ("1", "true") \
                and _same_netns_as_ours(args.netns):
            raise CNIError(ERR_INVALID_NETNS,
                           "plugin's netns and netns from CNI_NETNS should not be the same",
                           args.netns)

        if plugin.args_model is not None:
            from .args import load_args

            model = resolve_ref(plugin.args_model)
            try:
                typed = load_args(args.args, model)
            except CNIError:
                if cmd not in ("DEL", "GC"):
                    raise
                typed = load_args("", model)  # a cleanup must not fail for good on CNI_ARGS
            args = args.replace(typed_args=typed)

        conf = load_config(plugin, raw)
        handler: Callable[[CmdArgs, Any], Any] = getattr(plugin(), _HANDLERS[cmd])
        result = handler(args, conf)
        if cmd != "ADD":
            return b"", 0
        return _result_bytes(result, conf_version), 0
    except CNIError as exc:
        return error_answer(exc, version)
    except Exception as exc:  # any bug becomes code 999; details go to stderr only
        import traceback

        traceback.print_exc(file=err_out)
        msg = str(exc) or type(exc).__name__
        return error_answer(CNIError(ERR_INTERNAL, msg), version)


def decode_config(stdin_data: bytes | str) -> dict:
    """The config on stdin as the JSON object it must be (bytes in any of
    JSON's encodings, as `json.loads` reads them).

    Raises:
        CNIError: code 6 ``error unmarshall network config: ...`` (Go's text)
            for anything else: not JSON, nested too deeply, not an object.
    """
    try:
        raw = json.loads(stdin_data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CNIError(ERR_DECODING_FAILURE, f"error unmarshall network config: {exc}") \
            from None
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise CNIError(ERR_DECODING_FAILURE, "error unmarshall network config: nested "
                       "too deeply") from None
    if not isinstance(raw, dict):
        raise CNIError(ERR_DECODING_FAILURE, "error unmarshall network config: "
                       f"expected a JSON object, got {type(raw).__name__}")
    return raw


def load_config(plugin: type[Plugin], raw: dict) -> Any:
    """``raw`` (a decoded config object) validated by ``plugin.config_model``.

    Raises:
        CNIError: code 7 (or 2 for an unsupported value) naming the key
            (`cni_skel.config.config_error`).
    """
    from pydantic import ValidationError

    from .config import config_error

    model = resolve_ref(plugin.config_model)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc) from None


def _result_bytes(result: Any, version: str) -> bytes:
    from .types import Result, parse_result

    if result is None:
        raise CNIError(ERR_INTERNAL, "plugin returned no result for ADD")
    if isinstance(result, dict):
        result = parse_result(result, version)
    if not isinstance(result, Result):
        raise CNIError(ERR_INTERNAL, f"plugin returned {type(result).__name__}, not a Result")
    return _dumps(result.to_version(version))


def _prepare_process(cmd: str) -> None:
    # One call in a fresh process: pyroute2's package init and pydantic's
    # plugin lookup are skipped where that changes nothing (cni_skel.startup).
    if cmd not in ("", "VERSION"):
        from .startup import prepare

        prepare()


def _main(plugin: type[Plugin]) -> int:
    env = os.environ
    cmd = env.get("CNI_COMMAND", "")
    _prepare_process(cmd)
    data = b""
    read_error = None
    # Go skips stdin for VERSION; we read it (to echo cniVersion) unless a
    # human is at a terminal, where reading would block.
    if cmd and not (cmd == "VERSION" and sys.stdin is not None and sys.stdin.isatty()):
        try:
            # One byte past the limit is enough for dispatch to refuse it.
            data = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1) if sys.stdin is not None else b""
        except (OSError, ValueError) as exc:
            read_error = CNIError(ERR_IO_FAILURE, f"error reading from stdin: {exc}")
    # Nothing but our one JSON document may reach fd 1: point fd 1 (and
    # sys.stdout, and so any child process) at stderr while the plugin runs.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        if read_error is not None:
            out, code = error_answer(read_error, None)
        else:
            out, code = dispatch(plugin, env, data)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    if out:
        with os.fdopen(os.dup(1), "wb") as fp:
            fp.write(out)
    return code


def run_plugin_main(ref: str) -> None:
    """Entry of an installed executable: import ``"module:Class"`` and run it.

    With ``CNI_SKEL_WARNINGS`` set (`cni_skel.warm.protocol.WARNINGS_ENV`:
    the test helpers set it), the warnings the plugin raises, from its
    import on, are appended to that file instead of stderr."""
    _prepare_process(os.environ.get("CNI_COMMAND", ""))  # before the plugin's own imports
    if os.environ.get(WARNINGS_ENV):
        _record_warnings(os.environ[WARNINGS_ENV])
    resolve_ref(ref).main()


def _record_warnings(path: str) -> None:
    # A plugin process runs `python -I`, deaf to a test's -W or filters:
    # deprecations go to the test (harness.run_plugin_raw) through this file.
    import warnings

    def record(message: Any, category: type[Warning], filename: str, lineno: int,
               file: Any = None, line: Any = None) -> None:
        module = next((name for name, mod in list(sys.modules.items())
                       if getattr(mod, "__file__", None) == filename), None)
        entry = {"category": category.__name__, "message": str(message),
                 "filename": filename, "lineno": lineno, "module": module}
        with open(path, "a", encoding="utf-8") as fp:
            fp.write(json.dumps(entry) + "\n")

    warnings.showwarning = record
    warnings.filterwarnings("default", category=DeprecationWarning)
    warnings.filterwarnings("default", category=PendingDeprecationWarning)
