"""Delegation: run another plugin (IPAM) found through CNI_PATH.

Source: CNI spec 1.1.0 section "Delegated plugins (IPAM)" and Go pkg/invoke:
the delegate gets the same environment with CNI_COMMAND replaced and the
whole config we received on stdin; its stderr passes through to ours; its
Error object comes back as a `CNIError` with code, msg and details intact.
An ADD that fails after a successful IPAM ADD must run IPAM DEL
(`ipam_add` registers it on the ADD's `cni_skel.rollback`).

How a delegate is found and run is an `Exec` (Go ``invoke.Exec``, libcni's
``CNIConfig{exec}``): `SubprocessExec` by default; the warm worker passes its
own into `cni_skel.skel.dispatch`, which carries it on `CmdArgs.exec`, so a
delegate it serves itself runs without a new process. Tests may pass a fake.

A delegate that must see another config than ours (an ``ipam`` section with
a subnet filled in; a meta plugin's delegate) gets one built by
`delegate_config`, which carries over what the runtime put in ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from json.decoder import scanstring
from typing import IO, Any, Protocol

from . import compat
from .env import CmdArgs
from .errors import (
    ERR_DECODING_FAILURE,
    ERR_INTERNAL,
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_TRY_AGAIN_LATER,
    CNIError,
)
from .rollback import Rollback, rollback
from .skel import decode_config
from .types import parse_result

__all__ = [
    "DEFAULT_EXEC",
    "DEFAULT_TIMEOUT",
    "Exec",
    "SubprocessExec",
    "delegate_add",
    "delegate_check",
    "delegate_config",
    "delegate_del",
    "delegate_gc",
    "delegate_status",
    "exec_plugin",
    "find_plugin",
    "get_version_info",
    "ipam_add",
    "ipam_add_guard",
    "plugin_outcome",
]

#: Seconds a delegated plugin may run before it is killed (code 11 then).
DEFAULT_TIMEOUT = 120.0
# "text file busy": the binary is still being written (e.g. during an upgrade).
_ETXTBSY_RETRIES = 5


def find_plugin(plugin_type: str, paths: list[str] | str) -> str:
    """Absolute path of the executable ``plugin_type`` in CNI_PATH dirs, first match.

    Raises:
        CNIError: code 7 for an empty type or one with a path separator; code 4
            when CNI_PATH is empty; code 7 when no directory holds it.
    """
    if isinstance(paths, str):
        paths = [p for p in paths.split(":") if p]
    if not plugin_type or "/" in plugin_type or "\\" in plugin_type:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid plugin type {plugin_type!r}",
                       "a plugin type is a file name without path separators")
    if not paths:
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                       f'cannot find plugin "{plugin_type}": CNI_PATH is empty')
    for d in paths:
        candidate = os.path.join(d, plugin_type)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                   f'failed to find plugin "{plugin_type}" in path {paths}')


def exec_plugin(plugin_path: str, command: str, stdin_data: bytes, env: Mapping[str, str],
                *, timeout: float | None = None, stderr: IO[str] | None = None,
                extra_env: Mapping[str, str] | None = None) -> bytes:
    """Run a plugin executable for one verb and return its stdout.

    ``env`` is copied with CNI_COMMAND set to ``command`` (plus ``extra_env``).
    The plugin's stderr is written to ``stderr`` (default sys.stderr).

    Raises:
        CNIError: the plugin's own Error object (code/msg/details, ``stderr``
            attached) when it exits non-zero; code 999 when it exits non-zero
            without one or cannot be started; code 11 when it runs past
            ``timeout`` seconds and is killed.
    """
    child_env = dict(env)
    child_env["CNI_COMMAND"] = command
    if extra_env:
        child_env.update(extra_env)
    name = os.path.basename(plugin_path)
    limit = DEFAULT_TIMEOUT if timeout is None else timeout
    for attempt in range(_ETXTBSY_RETRIES + 1):
        try:
            proc = subprocess.run([plugin_path], input=stdin_data, env=child_env,
                                  capture_output=True, timeout=limit, check=False)
            break
        except subprocess.TimeoutExpired as exc:
            _pass_stderr(exc.stderr, stderr)
            raise CNIError(ERR_TRY_AGAIN_LATER, f'plugin "{name}" timed out after {limit:g}s',
                           f"{command} did not finish") from None
        except OSError as exc:
            if exc.errno == errno.ETXTBSY and attempt < _ETXTBSY_RETRIES:
                time.sleep(0.05 * (attempt + 1))
                continue
            raise CNIError(ERR_INTERNAL, f'failed to run plugin "{name}": {exc.strerror}',
                           plugin_path) from None
    return plugin_outcome(name, proc.returncode, proc.stdout, proc.stderr, stderr)


def plugin_outcome(name: str, returncode: int, out: bytes, err: bytes,
                   sink: IO[str] | None = None) -> bytes:
    """Judge a finished plugin run as libcni does: its stdout when it exited
    0; else its Error object as a `CNIError` (``err`` attached as stderr).
    ``err`` (its stderr bytes) is passed on to ``sink`` (default sys.stderr).
    An `Exec` that runs a plugin without a process uses this too, so its
    answers are judged byte for byte like an exec'd plugin's.

    Raises:
        CNIError: the plugin's Error object; code 999 when it exited non-zero
            without one.
    """
    err_text = err.decode("utf-8", "replace")
    _pass_stderr(err, sink)
    if returncode == 0:
        return out
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    if isinstance(data, dict) and "code" in data:
        raise CNIError.from_dict(data, stderr=err_text)
    tail = err_text.strip().splitlines()[-5:]
    raise CNIError(ERR_INTERNAL, f'plugin "{name}" failed with exit status {returncode}',
                   " | ".join(tail) or out.decode("utf-8", "replace")[:500],
                   stderr=err_text)


def _pass_stderr(data: bytes | None, sink: IO[str] | None) -> None:
    if data:
        out = sink if sink is not None else sys.stderr
        out.write(data.decode("utf-8", "replace"))
        out.flush()


class Exec(Protocol):
    """How a plugin executable is found and run (Go ``invoke.Exec``).

    Carried on `CmdArgs.exec` (None there means `DEFAULT_EXEC`) and used by
    every ``delegate_*``; `cni_skel.runtime.Runtime` takes one too.
    """

    def find(self, plugin_type: str, paths: Sequence[str] | str) -> str:
        """Absolute path of ``plugin_type`` in ``paths`` (see `find_plugin`)."""
        ...

    def run(self, plugin_path: str, command: str, stdin_data: bytes, env: Mapping[str, str], *,
            timeout: float | None = None, stderr: IO[str] | None = None) -> bytes:
        """Run it for ``command`` (set as CNI_COMMAND over ``env``) and return
        its stdout; a failure is a `CNIError` (see `exec_plugin`)."""
        ...


class SubprocessExec:
    """The default `Exec`: each plugin runs as its own process
    (`find_plugin`, `exec_plugin`)."""

    def find(self, plugin_type: str, paths: Sequence[str] | str) -> str:
        return find_plugin(plugin_type, paths if isinstance(paths, str) else list(paths))

    def run(self, plugin_path: str, command: str, stdin_data: bytes, env: Mapping[str, str], *,
            timeout: float | None = None, stderr: IO[str] | None = None) -> bytes:
        return exec_plugin(plugin_path, command, stdin_data, env, timeout=timeout, stderr=stderr)


#: The `Exec` a `CmdArgs` without one delegates through.
DEFAULT_EXEC: Exec = SubprocessExec()


def _delegate(command: str, plugin_type: str, stdin_data: bytes, args: CmdArgs,
              timeout: float | None, stderr: IO[str] | None,
              env: Mapping[str, str] | None = None) -> bytes:
    ex = args.exec if args.exec is not None else DEFAULT_EXEC
    path = ex.find(plugin_type, args.env.get("CNI_PATH", args.path))
    return ex.run(path, command, stdin_data, args.env if env is None else env,
                  timeout=timeout, stderr=stderr)


def delegate_add(plugin_type: str, stdin_data: bytes, args: CmdArgs, *,
                 version: str | None = None, timeout: float | None = None,
                 stderr: IO[str] | None = None) -> Any:
    """IPAM ADD: run ``plugin_type`` with the config bytes we got; return its
    result as a current-model `cni_skel.types.Result` (parsed by its own
    cniVersion, ``version`` when it has none).

    Raises:
        CNIError: the delegate's error, or code 6 when its output is not a result.
    """
    out = _delegate("ADD", plugin_type, stdin_data, args, timeout, stderr)
    if not out.strip():
        raise CNIError(ERR_DECODING_FAILURE, f'plugin "{plugin_type}" printed no result for ADD')
    return parse_result(out, version)


def delegate_check(plugin_type: str, stdin_data: bytes, args: CmdArgs, **kw: Any) -> None:
    """IPAM CHECK; raises the delegate's `CNIError`."""
    _delegate("CHECK", plugin_type, stdin_data, args, kw.get("timeout"), kw.get("stderr"))


def delegate_del(plugin_type: str, stdin_data: bytes, args: CmdArgs, **kw: Any) -> None:
    """IPAM DEL; raises the delegate's `CNIError`."""
    _delegate("DEL", plugin_type, stdin_data, args, kw.get("timeout"), kw.get("stderr"))


def delegate_status(plugin_type: str, stdin_data: bytes, args: CmdArgs, **kw: Any) -> None:
    """IPAM STATUS (spec: a plugin forwards STATUS to its IPAM). ``kw``:
    ``timeout``, ``stderr``, and ``env`` (the delegate's environment;
    default ``args.env``)."""
    _delegate("STATUS", plugin_type, stdin_data, args, kw.get("timeout"), kw.get("stderr"),
              kw.get("env"))


def delegate_gc(plugin_type: str, stdin_data: bytes, args: CmdArgs, **kw: Any) -> None:
    """IPAM GC (spec: a plugin forwards GC to its IPAM); ``kw`` as
    `delegate_status`."""
    _delegate("GC", plugin_type, stdin_data, args, kw.get("timeout"), kw.get("stderr"),
              kw.get("env"))


def ipam_add(undo: Rollback, plugin_type: str, stdin_data: bytes, args: CmdArgs, *,
             version: str | None = None, timeout: float | None = None,
             stderr: IO[str] | None = None) -> Any:
    """IPAM ADD (`delegate_add`) whose IPAM DEL is registered on ``undo``
    (a `cni_skel.rollback.Rollback`): if the ADD fails later, the address is
    released before the error goes out (Go: ``defer ipam.ExecDel`` when
    ``!success``). Returns the IPAM result as `delegate_add`.

    Raises:
        CNIError: as `delegate_add`; nothing is registered then.
    """
    result = delegate_add(plugin_type, stdin_data, args, version=version, timeout=timeout,
                          stderr=stderr)
    undo.callback(f"IPAM DEL ({plugin_type})", delegate_del, plugin_type, stdin_data, args,
                  timeout=timeout, stderr=stderr)
    return result


def ipam_add_guard(plugin_type: str, stdin_data: bytes, args: CmdArgs, *,
                   version: str | None = None, timeout: float | None = None,
                   stderr: IO[str] | None = None) -> contextlib.AbstractContextManager[Any]:
    """Deprecated since 0.2.0 (gone in 0.3.0): use `cni_skel.rollback.rollback`
    with `ipam_add`. 0.1.0's guard, kept working: a context manager that runs
    IPAM ADD (`delegate_add`) and yields its result; if the block raises,
    IPAM DEL runs before the error propagates (a failing DEL is reported on
    ``stderr``). Warns (DeprecationWarning) when called.

    Raises:
        CNIError: as `delegate_add`, on entering.
    """
    compat.warn("cni_skel.invoke.ipam_add_guard")
    return _ipam_add_guard(plugin_type, stdin_data, args, version=version, timeout=timeout,
                           stderr=stderr)


@contextlib.contextmanager
def _ipam_add_guard(plugin_type: str, stdin_data: bytes, args: CmdArgs, *,
                    version: str | None, timeout: float | None,
                    stderr: IO[str] | None) -> Iterator[Any]:
    with rollback(f"IPAM {plugin_type}", stderr=stderr) as undo:
        yield ipam_add(undo, plugin_type, stdin_data, args, version=version, timeout=timeout,
                       stderr=stderr)


#: Gone in 0.2.0 (the worker passes an `Exec` instead); calling it raises
#: RuntimeError naming the replacement.
set_in_process_runner = compat.removed("cni_skel.invoke.set_in_process_runner")


# What the runtime puts in a plugin's config, carried to a delegate by
# `delegate_config` whatever else it drops (compared case-folded).
_PROTOCOL_KEYS = frozenset(k.lower() for k in (
    "cniVersion", "name", "prevResult", "runtimeConfig", "args",
    "cni.dev/valid-attachments", "cni.dev/attachments"))
_WS = re.compile(r"[ \t\n\r]*")


def delegate_config(stdin_data: bytes | str, changes: Mapping[str, Any] | None = None, *,
                    drop: Iterable[str] = (), protocol_only: bool = False) -> bytes:
    """Config bytes for a delegate, built from the config this plugin
    received (``stdin_data``: `CmdArgs.stdin_data`); pass them to
    `ipam_add`, `delegate_add`, `delegate_del`... in its place.

    What the runtime put in our config reaches the delegate unchanged:
    ``cniVersion``, ``name``, ``prevResult``, ``runtimeConfig`` (the
    capability args), ``args``, and GC's ``cni.dev/valid-attachments`` (and
    libcni's older ``cni.dev/attachments``). Every other key is carried over
    too (the spec: a delegate gets the config we got), unless
    ``protocol_only``: then the delegate's config starts from those keys
    alone, for a meta plugin whose own keys mean nothing to its delegate
    (flannel delegating to bridge).

    ``changes``: keys to set, in order: a key we received is replaced in its
    place, a new one is appended. Values are JSON values (dict, list, str,
    int, float, bool, None); a `cni_skel.types.Result` goes in as
    ``result.to_version(conf.cni_version)``. ``drop``: keys to remove
    (absent ones are fine). Keys match case-insensitively, as a delegate's
    decoder matches them (Go's encoding/json, `cni_skel.model.CNIModel`):
    setting ``ipam`` replaces a received ``IPAM``, so the delegate never sees
    both.

    The bytes: every member kept is copied as received, text for text
    (numbers, string escapes, non-ASCII text, whitespace inside it), in the
    received order; only the whitespace between top-level members goes (the
    output is compact, as Go's ``json.Marshal``). New values are encoded by
    ``json.dumps`` (non-ASCII as is). A key received twice counts once, in
    its first place with its last value (what the plugin itself read). The
    same inputs always give the same bytes, so DEL, CHECK, STATUS and GC can
    rebuild the config ADD's delegate got.

    Source: CNI spec 1.1.0 "Delegated plugins (IPAM)"; libcni
    ``buildOneConfig`` (name, cniVersion, prevResult and runtimeConfig
    injected into each plugin's config) and ``GCNetworkList`` (the valid
    attachments); flannel-io/cni-plugin ``cmdAdd``/``doCmdAdd`` (the
    delegate gets flannel's name, cniVersion and runtimeConfig, then its own
    type and ipam); Multus ``CmdGC`` (each delegate's config gets name,
    cniVersion and the valid attachments). Go rebuilds such a config from a
    ``map[string]interface{}``, which sorts keys and sends numbers through
    float64; here nothing kept is re-encoded.

    Raises:
        CNIError: code 6 when ``stdin_data`` is not a JSON object (not JSON,
            not UTF-8/16/32, or another JSON value), as the skel answers it.
        TypeError: a key that is not a string, ``drop`` given as one string,
            or a value JSON cannot encode (its key named).
        ValueError: a key both set and dropped, or set twice (case-folded);
            NaN or an infinity in a value.
    """
    text = _config_text(stdin_data)
    sets = _encoded_changes(changes or {})
    if isinstance(drop, (str, bytes)):
        raise TypeError("drop takes an iterable of keys, not a single string")
    dropped = set()
    for key in drop:
        if not isinstance(key, str):
            raise TypeError(f"drop: keys are strings, got {key!r}")
        dropped.add(key.lower())
    both = dropped.intersection(sets)
    if both:
        raise ValueError(f"delegate_config: {sorted(both)} both set and dropped")

    received: dict[str, tuple[str, str]] = {}  # key -> (key text, value text)
    for key, key_text, value_text in _members(text):
        received[key] = (key_text, value_text)  # a repeated key: first place, last value
    out: dict[tuple[bool, str], tuple[str, str]] = {}
    for key, member in received.items():
        folded = key.lower()
        if folded in sets:
            out.setdefault((True, folded), sets[folded])  # in its first spelling's place
        elif folded not in dropped and (not protocol_only or folded in _PROTOCOL_KEYS):
            out[(False, key)] = member
    for folded, member in sets.items():
        out.setdefault((True, folded), member)
    body = ",".join(f"{key_text}:{value_text}" for key_text, value_text in out.values())
    # surrogatepass: what json.loads let through comes out as it came in
    return ("{" + body + "}").encode("utf-8", "surrogatepass")


def _config_text(stdin_data: bytes | str) -> str:
    """``stdin_data`` as text, decoded as `json.loads` decodes bytes (which
    is how the skel read it), once known to hold a JSON object.

    Raises:
        CNIError: code 6 otherwise (`cni_skel.skel.decode_config`).
    """
    text = stdin_data
    if not isinstance(text, str):
        data = bytes(stdin_data)
        try:
            text = data.decode(json.detect_encoding(data), "surrogatepass")
        except UnicodeDecodeError:
            decode_config(data)  # raises the skel's code 6 for these bytes
            raise
    decode_config(text)
    return text


def _members(text: str) -> list[tuple[str, str, str]]:
    """(key, key as written, value as written) of each member of the JSON
    object ``text`` (known valid), in order."""
    decoder = json.JSONDecoder()
    found = []
    idx = _WS.match(text, _WS.match(text).end() + 1).end()  # past "{"
    while text[idx] != "}":
        key, end = scanstring(text, idx + 1)
        key_text = text[idx:end]
        idx = _WS.match(text, _WS.match(text, end).end() + 1).end()  # past ":"
        _, end = decoder.raw_decode(text, idx)
        found.append((key, key_text, text[idx:end]))
        idx = _WS.match(text, end).end()
        if text[idx] == ",":
            idx = _WS.match(text, idx + 1).end()
    return found


def _encoded_changes(changes: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Case-folded key -> (key text, value text) of each change, as JSON."""
    encoded: dict[str, tuple[str, str]] = {}
    for key, value in changes.items():
        if not isinstance(key, str):
            raise TypeError(f"delegate_config: keys are strings, got {key!r}")
        if key.lower() in encoded:
            raise ValueError(f"delegate_config: {key!r} set twice (keys match "
                             "case-insensitively)")
        try:
            value_text = _dumps(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"delegate_config: value of {key!r}: {exc}") from None
        encoded[key.lower()] = (_dumps(key), value_text)
    return encoded


def _dumps(value: Any) -> str:
    # Compact; non-ASCII text as is, unless it holds a lone surrogate, which
    # is escaped rather than sent as bytes that are not UTF-8.
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text


def get_version_info(plugin_path: str, *, cni_version: str = "1.1.0",
                     env: Mapping[str, str] | None = None,
                     timeout: float | None = None, exec: Exec | None = None,
                     stderr: IO[str] | None = None) -> dict:
    """Ask a plugin executable VERSION through ``exec`` (default
    `DEFAULT_EXEC`); returns the decoded VersionResult (Go
    ``invoke.GetVersionInfo``).

    Raises:
        CNIError: its error, or code 6 when the answer is not a VersionResult.
    """
    out = (exec or DEFAULT_EXEC).run(
        plugin_path, "VERSION", json.dumps({"cniVersion": cni_version}).encode(),
        env if env is not None else os.environ, timeout=timeout, stderr=stderr)
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("supportedVersions"), list):
        raise CNIError(ERR_DECODING_FAILURE, "plugin VERSION answer has no supportedVersions",
                       out.decode("utf-8", "replace")[:500])
    return data
