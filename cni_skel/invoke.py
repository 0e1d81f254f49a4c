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
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

from .env import CmdArgs
from .errors import (
    ERR_DECODING_FAILURE,
    ERR_INTERNAL,
    ERR_INVALID_ENVIRONMENT_VARIABLES,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_TRY_AGAIN_LATER,
    CNIError,
)
from .rollback import Rollback
from .types import parse_result

__all__ = [
    "DEFAULT_EXEC",
    "DEFAULT_TIMEOUT",
    "Exec",
    "SubprocessExec",
    "delegate_add",
    "delegate_check",
    "delegate_del",
    "delegate_gc",
    "delegate_status",
    "exec_plugin",
    "find_plugin",
    "get_version_info",
    "ipam_add",
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
