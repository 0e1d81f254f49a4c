"""Writing CNI plugin executables into a runtime's bin dir (``cni-skel install``).

Three kinds, all marked as ours so a later install may replace them:

* ``native`` launcher (default when a C compiler is found): ``launcher.c``
  compiled with the plugin's ref, the worker socket and the interpreter baked
  in. It serves the warm path (connect to ``cni-skel worker``, send, relay)
  without starting Python, and execs the Python launcher code for
  everything else (VERSION, no worker, faults).
* ``python`` launcher: ``#!<python> -IS`` plus a few lines running
  `cni_skel.warm.client` (see there); the same behaviour, ~8 ms more a call.
* one-shot script: the plugin runs in a fresh interpreter each call.

`launcher_info` reads back which plugin and socket a launcher serves (the
worker uses it to run a delegated IPAM plugin of its own in-process).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import click

from .client import MAX_STDIN_BYTES

__all__ = ["DEFAULT_WORKER_SOCKET", "LAUNCHERS", "MARKER", "find_cc", "launcher_info",
           "plugin_registry", "python_argv", "write_executable"]

MARKER = "written by `cni-skel install`"
DEFAULT_WORKER_SOCKET = "/run/cni-skel/worker.sock"  # = cni_skel.warm.client.DEFAULT_SOCKET
#: ``--launcher`` choices: auto = native when a C compiler works, else python.
LAUNCHERS = ("auto", "native", "python")
#: First line of the block naming a launcher's plugin and socket (`launcher_info`).
INFO_MAGIC = "CNI-SKEL-LAUNCHER"
#: Launchers are small (a static native one ~0.7 MiB); anything bigger is not ours.
_MAX_LAUNCHER_SIZE = 2 << 20



def plugin_registry() -> dict[str, str]:
    """Installed plugins: executable name -> ``"module:Class"``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="cni_skel.plugins")}


def _script(ref: str, name: str, python: str, pythonpath: list[str] | None = None) -> str:
    """The one-shot executable: the plugin runs in a fresh interpreter each call."""
    from .. import __version__

    prefix = f"import sys; sys.path[:0] = {pythonpath!r}; " if pythonpath else ""
    body = (f"# CNI plugin {name!r}, {MARKER} (cni-skel {__version__}).\n"
            f"{prefix}from cni_skel.skel import run_plugin_main\n"
            f"run_plugin_main({ref!r})\n")
    if _needs_sh(python):
        code = f"{prefix}from cni_skel.skel import run_plugin_main; run_plugin_main({ref!r})"
        return (f"#!/bin/sh\n# CNI plugin {name!r}, {MARKER} (cni-skel {__version__}).\n"
                f"exec {shlex.quote(python)} -I -c {shlex.quote(code)} \"$@\"\n")
    # -I (isolated): the runtime's PYTHONPATH, PYTHONHOME, user site and the
    # script's directory never reach the plugin's imports.
    return f"#!{python} -I\n{body}"


def _needs_sh(python: str) -> bool:
    # A shebang cannot carry such a path; go through sh (one extra exec).
    return any(c.isspace() for c in python) or len(python) > 120


def _supported_versions(ref: str, pythonpath: list[str] | None) -> tuple[str, ...] | None:
    """The plugin's ``supported_versions``, for the launcher's local VERSION
    answer; None when it cannot be imported here (VERSION then runs it)."""
    from ..skel import resolve_ref

    saved = list(sys.path)
    sys.path[:0] = pythonpath or []
    try:
        return tuple(resolve_ref(ref).supported_versions)
    except Exception:
        return None
    finally:
        sys.path[:] = saved


def _info_block(ref: str, worker_socket: str, python: str,
                pythonpath: list[str] | None) -> str:
    from .. import __version__

    pp = os.pathsep.join(pythonpath or [])
    for what, value in (("plugin ref", ref), ("worker socket", worker_socket),
                        ("interpreter", python), ("pythonpath", pp)):
        if "\n" in value or "\0" in value:
            raise click.ClickException(f"{what} {value!r} contains a newline or NUL")
    return (f"{INFO_MAGIC}\nref={ref}\nsocket={worker_socket}\npython={python}\n"
            f"pythonpath={pp}\n{MARKER} (cni-skel {__version__})\n")


def _launcher_body(ref: str, pythonpath: list[str] | None, worker_socket: str,
                   native: bool) -> str:
    """Python code that loads `cni_skel.warm.client` (from its cached bytecode
    when fresh: compiling the source costs ~5 ms a call) and calls ``launch``.
    Only builtin modules are imported (no site, no importlib). ``native``: run
    by launcher.c as ``python -IS -c <code> MODE DETAIL``."""
    import py_compile

    from ..version import ALL_VERSIONS, CURRENT_VERSION

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.py")
    with contextlib.suppress(OSError, py_compile.PyCompileError):
        py_compile.compile(src, doraise=True)  # the bytecode the executable loads
    tail = ", native=sys.argv[1:]" if native else ""
    return f"""import marshal, os, sys
_src = {src!r}
try:  # the cached bytecode, if it is the current source's (timestamp pyc)
    _pyc = os.path.join(os.path.dirname(_src), "__pycache__",
                        "client." + sys.implementation.cache_tag + ".pyc")
    with open(_pyc, "rb") as _f:
        _data = _f.read()
    _st = os.stat(_src)
    if _data[:8] != sys.modules["_frozen_importlib_external"].MAGIC_NUMBER + bytes(4) or \\
            _data[8:16] != ((int(_st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                            + (_st.st_size & 0xFFFFFFFF).to_bytes(4, "little")):
        raise ValueError("stale")
    _code = marshal.loads(_data[16:])
except (OSError, ValueError, EOFError, TypeError, KeyError):
    with open(_src, "rb") as _f:
        _code = compile(_f.read(), _src, "exec")
_launcher = {{"__name__": "cni_skel_launcher"}}
exec(_code, _launcher)
_launcher["launch"]({ref!r}, {worker_socket!r}, {_supported_versions(ref, pythonpath)!r},
                    {list(pythonpath or [])!r}, {ALL_VERSIONS!r}, {CURRENT_VERSION!r}{tail})
"""


def _launcher_script(ref: str, name: str, python: str, pythonpath: list[str] | None,
                     worker_socket: str) -> str:
    """The Python launcher executable (see the module docstring)."""
    info = "".join(f"# {line}\n"
                   for line in _info_block(ref, worker_socket, python, pythonpath).splitlines())
    head = (f"# CNI plugin {name!r}, {MARKER}: a launcher for `cni-skel worker`\n"
            f"# (one-shot in-process without it).\n{info}")
    body = _launcher_body(ref, pythonpath, worker_socket, native=False)
    if _needs_sh(python):
        # sh runs the exec line; Python reads it as a string literal.
        q3 = "'" * 3
        return (f"#!/bin/sh\n{head}'{q3}exec {shlex.quote(python)} -IS \"$0\" \"$@\" # {q3}\n"
                f"{body}")
    # -S: site (the venv's .pth files) costs ~13 ms a call; the one-shot
    # fallback loads it when it is needed.
    return f"#!{python} -IS\n{head}{body}"


def find_cc() -> str | None:
    """The C compiler for native launchers: ``$CC``, else ``cc`` or ``gcc`` on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if os.access(cc, os.X_OK) else None)
    return shutil.which("cc") or shutil.which("gcc")


def _c_string(data: bytes) -> str:
    # Octal escapes for everything but plain characters; "?" too (trigraphs).
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-./:=,;+*%#@!()[]{}<>"
    out = "".join(chr(b) if b in safe else f"\\{b:03o}" for b in data)
    return f'"{out}"'


_native_cache: dict[str, bytes] = {}


def _native_launcher(ref: str, python: str, pythonpath: list[str] | None, worker_socket: str,
                     cc: str) -> bytes:
    """Compile launcher.c for this plugin; the executable's bytes.

    Raises:
        click.ClickException: the compiler failed (its output attached).
    """
    pp = b"\0".join(os.fsencode(p) for p in pythonpath or [])
    config = "".join(f"#define {k} {v}\n" for k, v in (
        ("CSK_PYTHON", _c_string(os.fsencode(python))),
        ("CSK_SCRIPT", _c_string(_launcher_body(ref, pythonpath, worker_socket, True).encode())),
        ("CSK_REF", _c_string(ref.encode())),
        ("CSK_SOCKET", _c_string(os.fsencode(worker_socket))),
        ("CSK_PYTHONPATH", _c_string(pp)),
        ("CSK_PYTHONPATH_LEN", str(len(pp))),
        ("CSK_MAX_STDIN", f"{MAX_STDIN_BYTES}u"),
        ("CSK_INFO", _c_string(_info_block(ref, worker_socket, python, pythonpath).encode())),
    ))
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")
    with open(src, "rb") as fp:
        source = fp.read()
    key = hashlib.sha256(b"\0".join([cc.encode(), config.encode(), source])).hexdigest()
    if key in _native_cache:
        return _native_cache[key]
    with tempfile.TemporaryDirectory(prefix="cni-skel-cc-") as tmp:
        cfg = os.path.join(tmp, "launcher_config.h")
        with open(cfg, "w") as fp:
            fp.write(config)
        out = os.path.join(tmp, "launcher")
        errors = []
        # Static first: no dynamic loader at each exec (~0.3 ms less a call).
        for extra in (["-static"], []):
            proc = subprocess.run([cc, "-O2", "-s", *extra, "-include", cfg, "-o", out, src],
                                  capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                break
            errors.append(proc.stderr.strip()[-2000:])
        else:
            raise click.ClickException(f"compiling the native launcher with {cc} failed:\n"
                                       + "\n".join(errors))
        with open(out, "rb") as fp:
            data = fp.read()
    _native_cache[key] = data
    return data


def launcher_info(path: str) -> dict[str, str] | None:
    """``{"kind": "native"|"python", "ref", "socket", "python", "pythonpath"
    (os.pathsep-joined)}`` for a launcher `write_executable` wrote; None for
    anything else (a one-shot script, a Go plugin, an unreadable file)."""
    try:
        with open(path, "rb") as fp:
            if os.fstat(fp.fileno()).st_size > _MAX_LAUNCHER_SIZE:
                return None  # e.g. a Go plugin: not read at all
            data = fp.read(_MAX_LAUNCHER_SIZE + 1)
    except OSError:
        return None
    at = data.find(INFO_MAGIC.encode() + b"\n")
    if at < 0:
        return None
    kind = "native" if data.startswith(b"\x7fELF") else "python"
    info = {"kind": kind}
    for raw in data[at:at + 8192].split(b"\n")[1:5]:
        line = os.fsdecode(raw)
        key, _, value = line.removeprefix("# ").partition("=")
        if key in ("ref", "socket", "python", "pythonpath"):
            info[key] = value
    return info if len(info) == 5 else None


def python_argv(path: str, options: tuple[str, ...] = ()) -> list[str]:
    """The interpreter command line equivalent to running executable
    ``path`` with no worker, with extra interpreter ``options`` (e.g.
    ``("-X", "importtime")``): for tracing what a call imports. A native
    launcher gives the Python code it execs; a script, its shebang's
    interpreter and flags (``sys.executable -I`` when it goes through sh)."""
    info = launcher_info(path)
    if info is not None and info["kind"] == "native":
        pp = [p for p in info["pythonpath"].split(os.pathsep) if p]
        code = _launcher_body(info["ref"], pp, info["socket"], native=True)
        return [info["python"], "-IS", *options, "-c", code, "launch", ""]
    try:
        with open(path, "rb") as fp:
            line = fp.readline().decode("utf-8", "replace")
    except OSError:
        line = ""
    parts = line[2:].split() if line.startswith("#!") else []
    if not parts or os.path.basename(parts[0]) == "sh":
        parts = [sys.executable, "-I"]
    return [*parts, *options, path]


def write_executable(bin_dir: str, name: str, ref: str, *, python: str | None = None,
                     force: bool = False, pythonpath: list[str] | None = None,
                     worker_socket: str | None = DEFAULT_WORKER_SOCKET,
                     launcher: str = "auto") -> str:
    """Write ``bin_dir/name`` running plugin ``ref`` with interpreter ``python``
    (default: this one, absolute, so no venv activation is needed). Atomic
    (temp file + rename), mode 0755. ``pythonpath``: directories put first on
    sys.path (for plugins that are not installed packages, e.g. in tests).

    ``worker_socket``: the executable is a launcher (`cni_skel.warm.client`)
    that hands each call to ``cni-skel worker`` on this unix socket (env
    ``CNI_SKEL_WORKER_SOCKET`` overrides it at run time), answers VERSION
    itself, and runs the plugin in-process when no worker answers. None: a
    plain one-shot script.

    ``launcher``: ``native`` (compiled launcher.c; needs a C compiler,
    `find_cc`), ``python``, or ``auto`` (native when it compiles, else python).

    Raises:
        click.ClickException: when a file that is not ours is in the way and
            ``force`` is false; ``native`` without a working C compiler.
    """
    python = os.path.abspath(python or sys.executable)
    target = os.path.join(bin_dir, name)
    if os.path.lexists(target) and not force:
        try:
            with open(target, "rb") as fp:
                head = fp.read(512)
        except OSError:
            head = b""
        if MARKER.encode() not in head and launcher_info(target) is None:
            raise click.ClickException(
                f"{target} exists and was not written by cni-skel (use --force to replace it)")
    if launcher not in LAUNCHERS:
        raise click.ClickException(f"unknown launcher kind {launcher!r}: "
                                   f"one of {', '.join(LAUNCHERS)}")
    data: bytes | None = None
    if worker_socket is not None and launcher != "python":
        cc = find_cc()
        if cc is None and launcher == "native":
            raise click.ClickException("a native launcher needs a C compiler (cc, gcc or $CC); "
                                       "none found (install gcc, or use --launcher python)")
        if cc is not None:
            try:
                data = _native_launcher(ref, python, pythonpath, worker_socket, cc)
            except click.ClickException:
                if launcher == "native":
                    raise
    if data is None:
        text = (_script(ref, name, python, pythonpath) if worker_socket is None
                else _launcher_script(ref, name, python, pythonpath, worker_socket))
        data = text.encode()
    os.makedirs(bin_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=bin_dir)
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


