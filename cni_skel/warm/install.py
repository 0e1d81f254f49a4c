"""Writing CNI plugin executables into a runtime's bin dir (``cni-skel install``).

Three kinds, all marked as ours so a later install may replace them:

* ``native`` launcher (default when a C compiler is found): ``launcher.c``
  compiled with the plugin's ref, the worker socket and the interpreter baked
  in, and `cni_skel.warm.protocol`'s values in a generated
  ``launcher_protocol.h`` (`protocol_header`). It serves the warm path
  (connect to ``cni-skel worker``, send, relay) without starting Python, and
  execs the Python launcher code for everything else (VERSION, no worker,
  faults).
* ``python`` launcher: ``#!<python> -IS`` plus a few lines running
  `cni_skel.warm.client` (see there); the same behaviour, ~8 ms more a call.
* one-shot script: the plugin runs in a fresh interpreter each call; VERSION
  is answered from the versions baked in (`cni_skel.warm.client.answer_version`),
  without importing the plugin's module.

Both launchers end with an info block naming their plugin, socket and
interpreter, followed by a fixed-size trailer (``# CNI-SKEL-LAUNCHER
<length>``): `launcher_info` reads them back with two preads (the worker
does so on each delegated call, to run an IPAM plugin of its own
in-process).

Errors are `InstallError` (the CLI shows its message).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import py_compile
import shlex
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import entry_points

from .. import __version__
from ..skel import resolve_ref
from ..state import atomic_write
from ..version import ALL_VERSIONS, CURRENT_VERSION
from . import protocol

__all__ = [
    "DEFAULT_SYSTEMD_DIR",
    "DEFAULT_WORKER_SOCKET",
    "LAUNCHERS",
    "MARKER",
    "SERVICE_UNIT",
    "SOCKET_UNIT",
    "InstallError",
    "find_cc",
    "launcher_info",
    "node_state",
    "plugin_registry",
    "protocol_header",
    "python_argv",
    "remove_ours",
    "systemctl",
    "systemd_running",
    "systemd_units",
    "worker_argv",
    "write_executable",
    "write_units",
]

MARKER = "written by `cni-skel install`"
DEFAULT_WORKER_SOCKET = protocol.DEFAULT_SOCKET
#: ``--launcher`` choices: auto = native when a C compiler works, else python.
LAUNCHERS = ("auto", "native", "python")
#: Names the info block and its trailer at the end of every launcher.
INFO_MAGIC = "CNI-SKEL-LAUNCHER"
_TRAILER_HEAD = f"# {INFO_MAGIC} ".encode()
#: The trailer: ``# CNI-SKEL-LAUNCHER <info block length, 8 digits>\n``.
TRAILER_SIZE = len(_TRAILER_HEAD) + 8 + 1
_MAX_INFO = 1 << 20  # an info block of ours is far smaller; a longer "length" is not ours
_INFO_KEYS = ("kind", "ref", "socket", "python", "pythonpath")
# Absent in launchers written before them: their values then.
_INFO_OPTIONAL = {"fallback": protocol.FALLBACK_ONESHOT, "protocol": "1", "version": ""}
_info_cache: dict[str, tuple[tuple[int, int, int, int], dict[str, str] | None]] = {}
_INFO_CACHE_MAX = 256


class InstallError(Exception):
    """An executable cannot be written (the message says why, for the user)."""


def plugin_registry() -> dict[str, str]:
    """Installed plugins: executable name -> ``"module:Class"``."""
    return {ep.name: ep.value for ep in entry_points(group="cni_skel.plugins")}


def _script(ref: str, name: str, python: str, pythonpath: list[str] | None = None) -> str:
    """The one-shot executable: the plugin runs in a fresh interpreter each
    call; VERSION is answered from the versions baked in here when the
    plugin could be imported at install time."""
    lines = ["import os, sys"]
    if pythonpath:
        lines.append(f"sys.path[:0] = {pythonpath!r}")
    supported, about = _baked(ref, pythonpath)
    if supported is not None:
        lines += ['if os.environ.get("CNI_COMMAND") == "VERSION":  # without the plugin\'s module',
                  "    from cni_skel.warm.client import answer_version",
                  f"    answer_version({supported!r}, {CURRENT_VERSION!r})",
                  'if not os.environ.get("CNI_COMMAND"):  # a human asking: the about text',
                  f"    sys.stderr.write({about!r})",
                  "    sys.exit(0)"]
    lines += ["from cni_skel.skel import run_plugin_main", f"run_plugin_main({ref!r})"]
    code = "\n".join(lines) + "\n"
    head = f"# CNI plugin {name!r}, {MARKER} (cni-skel {__version__}).\n"
    # -I (isolated): the runtime's PYTHONPATH, PYTHONHOME, user site and the
    # script's directory never reach the plugin's imports.
    return f"#!/bin/sh\n{head}{_sh_prelude(name, ref, python, '-I')}{code}"


def _sh_prelude(name: str, ref: str, python: str, flags: str) -> str:
    """The line that makes a script both sh and Python: sh runs it (exec the
    interpreter on this file, or, when the interpreter is gone, print a spec
    Error naming it and the fix: code 5, STATUS 50; never an empty stdout);
    Python reads it as a string literal. One sh exec more a call (~1 ms),
    for scripts only."""
    q3 = "'" * 3
    marker = "@CODE@"
    err = json.dumps({
        "cniVersion": CURRENT_VERSION, "code": marker,
        "msg": f"cni-skel: {name}: the interpreter {python} is missing",
        "details": f"plugin {ref} was installed for a virtualenv or Python that is gone: "
                   "run `cni-skel install` again"})
    head, tail = err.split(f'"{marker}"')
    py = shlex.quote(python)
    line = (f"'{q3}[ -x {py} ] && exec {py} {flags} \"$0\" \"$@\"; "
            f"[ \"$CNI_COMMAND\" = STATUS ] && c={protocol.ERR_NOT_AVAILABLE} "
            f"|| c={protocol.ERR_IO}; "
            f"printf %s {shlex.quote(head)} \"$c\" {shlex.quote(tail)}; exit 1 # {q3}\n")
    if line.count(q3) != 2 or "\n" in line[:-1]:
        raise InstallError(f"interpreter path {python!r} cannot be written into a script")
    return line


_baked_cache: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], str]] = {}


def _baked(ref: str, pythonpath: list[str] | None) -> tuple[tuple[str, ...] | None, str | None]:
    """See `_baked_for`; an answer is kept per ref and pythonpath (a native
    launcher asks twice: for launcher.c and for the Python code it execs)."""
    key = (ref, tuple(pythonpath or ()))
    if key not in _baked_cache:
        supported, about = _baked_for(*key)
        if supported is None or about is None:
            return None, None
        _baked_cache[key] = supported, about
    return _baked_cache[key]


def _baked_for(ref: str, pythonpath: tuple[str, ...]) -> tuple[tuple[str, ...] | None,
                                                                 str | None]:
    """The plugin's ``supported_versions`` and about text, for the
    executable's local answers to VERSION and to a call without
    CNI_COMMAND; ``(None, None)`` when it cannot be imported here (the
    executable then runs the plugin for them)."""
    saved = list(sys.path)
    sys.path[:0] = pythonpath
    try:
        plugin = resolve_ref(ref)
        return tuple(plugin.supported_versions), plugin.about_text()
    except Exception:
        return None, None
    finally:
        sys.path[:] = saved


def _info_trailer(kind: str, ref: str, worker_socket: str, python: str,
                  pythonpath: list[str] | None, fallback: str) -> bytes:
    """The info block (``# key=value`` lines) and the trailer after it, for
    the end of a launcher; see `launcher_info`."""
    pp = os.pathsep.join(pythonpath or [])
    for what, value in (("plugin ref", ref), ("worker socket", worker_socket),
                        ("interpreter", python), ("pythonpath", pp)):
        if "\n" in value or "\0" in value:
            raise InstallError(f"{what} {value!r} contains a newline or NUL")
    block = os.fsencode(
        f"# {INFO_MAGIC}\n# kind={kind}\n# ref={ref}\n# socket={worker_socket}\n"
        f"# python={python}\n# pythonpath={pp}\n# fallback={fallback}\n"
        f"# protocol={protocol.PROTOCOL_VERSION}\n# version={__version__}\n"
        f"# {MARKER} (cni-skel {__version__})\n")
    if len(block) > _MAX_INFO:
        raise InstallError(f"launcher info of {len(block)} bytes is over {_MAX_INFO} bytes")
    return block + _TRAILER_HEAD + b"%08d\n" % len(block)


def _launcher_body(ref: str, pythonpath: list[str] | None, worker_socket: str,
                   native: bool, fallback: str = protocol.FALLBACK_ONESHOT) -> str:
    """Python code that loads `cni_skel.warm.protocol` and
    `cni_skel.warm.client` (from their cached bytecode when fresh: compiling
    the sources costs ~5 ms a call) and calls ``launch``. Only builtin
    modules are imported (no site, no importlib): protocol's code runs in a
    module object registered in ``sys.modules`` under its own name, where
    client's ``from .protocol import ...`` (and later the skel's, in a
    one-shot fallback) finds it. When those files are gone (the virtualenv
    moved), it prints a spec Error naming them and the fix. ``native``: run
    by launcher.c as ``python -IS -c <code> MODE DETAIL``."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("protocol", "client"):
        with contextlib.suppress(OSError, py_compile.PyCompileError):
            py_compile.compile(os.path.join(here, f"{name}.py"), doraise=True)
    tail = ", native=sys.argv[1:]" if native else ""
    supported, about = _baked(ref, pythonpath)
    return f"""import marshal, os, sys
def _code(name, d={here!r}):  # the cached bytecode, if it is the current source's
    src = os.path.join(d, name + ".py")
    try:
        with open(os.path.join(d, "__pycache__", name + "." + sys.implementation.cache_tag
                               + ".pyc"), "rb") as f:
            data = f.read()
        st = os.stat(src)
        if data[:16] != sys.modules["_frozen_importlib_external"].MAGIC_NUMBER + bytes(4) \\
                + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") \\
                + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little"):
            raise ValueError("stale")
        return marshal.loads(data[16:]), src
    except (OSError, ValueError, EOFError, TypeError, KeyError):
        with open(src, "rb") as f:
            return compile(f.read(), src, "exec"), src
try:
    _proto = type(sys)("cni_skel.warm.protocol")
    _c, _proto.__file__ = _code("protocol")
    exec(_c, _proto.__dict__)
    sys.modules[_proto.__name__] = _proto
    _launcher = {{"__name__": "cni_skel_launcher", "__package__": "cni_skel.warm"}}
    _c, _launcher["__file__"] = _code("client")
    exec(_c, _launcher)
except Exception as _exc:  # the launcher code is gone: say so in the spec's format
    import json
    try:
        _d = json.loads(sys.stdin.buffer.read())  # protocol.go_field's rule, inline:
        _v = [v for k, v in _d.items() if isinstance(k, str) and k.lower() == "cniversion"][-1]
    except Exception:
        _v = None
    sys.stdout.write(json.dumps({{
        "cniVersion": _v if _v in {ALL_VERSIONS!r} else {CURRENT_VERSION!r},
        "code": 50 if os.environ.get("CNI_COMMAND") == "STATUS" else 5,
        "msg": "cni-skel launcher: cannot load its code from " + {here!r} + ": "
               + type(_exc).__name__ + ": " + str(_exc),
        "details": "plugin " + {ref!r} + " was installed from a virtualenv that moved or is "
                   "gone: run `cni-skel install` again"}}, indent=4))
    sys.exit(1)
_launcher["launch"]({ref!r}, {worker_socket!r}, {supported!r},
                    {list(pythonpath or [])!r}, {ALL_VERSIONS!r}, {CURRENT_VERSION!r},
                    about={about!r}, fallback={fallback!r}{tail})
"""


def _launcher_script(ref: str, name: str, python: str, pythonpath: list[str] | None,
                     worker_socket: str, fallback: str) -> str:
    """The Python launcher executable (see the module docstring)."""
    head = (f"# CNI plugin {name!r}, {MARKER}: a launcher for `cni-skel worker`\n"
            f"# (fallback {fallback} without it).\n")
    body = _launcher_body(ref, pythonpath, worker_socket, native=False, fallback=fallback)
    info = os.fsdecode(_info_trailer("python", ref, worker_socket, python, pythonpath, fallback))
    # -S: site (the venv's .pth files) costs ~13 ms a call; the one-shot
    # fallback loads it when it is needed.
    return f"#!/bin/sh\n{head}{_sh_prelude(name, ref, python, '-IS')}{body}{info}"


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


def protocol_header() -> str:
    """``launcher_protocol.h``: `cni_skel.warm.protocol`'s wire format,
    statuses, limits and environment names as ``CSK_*`` macros, the only
    place launcher.c gets them from."""
    p = protocol
    names = ", ".join(_c_string(n.encode()) for n in p.STATUS_NAMES)
    values = {
        "CSK_REQUEST_MAGIC": _c_string(p.REQUEST_MAGIC),
        "CSK_REPLY_MAGIC": _c_string(p.REPLY_MAGIC),
        "CSK_MAGIC_LEN": str(len(p.REQUEST_MAGIC)),
        "CSK_REQUEST_HEADER": str(p.REQUEST_HEADER),
        "CSK_KIND_RUN": _c_string(p.KIND_RUN),
        "CSK_ST_DONE": str(p.ST_DONE),
        "CSK_ST_VERSION": str(p.ST_VERSION),
        "CSK_PROTOCOL_VERSION": str(p.PROTOCOL_VERSION),
        "CSK_ERR_IO": str(p.ERR_IO),
        "CSK_ERR_TRY_AGAIN_LATER": str(p.ERR_TRY_AGAIN_LATER),
        "CSK_ERR_NOT_AVAILABLE": str(p.ERR_NOT_AVAILABLE),
        "CSK_FALLBACK_LOG": _c_string(p.FALLBACK_LOG.encode()),
        "CSK_FALLBACK_LOG_MAX": str(p.FALLBACK_LOG_MAX),
        "CSK_STATUS_NAMES": f"{{{names}}}",
        "CSK_STATUS_COUNT": str(len(p.STATUS_NAMES)),
        "CSK_REPLY_STATUS_AT": str(p.REPLY_STATUS_AT),
        "CSK_REPLY_CODE_AT": str(p.REPLY_CODE_AT),
        "CSK_REPLY_LENGTH_AT": str(p.REPLY_LENGTH_AT),
        "CSK_REPLY_HEADER": str(p.REPLY_HEADER),
        "CSK_MAX_STDIN": f"{p.MAX_STDIN_BYTES}u",
        "CSK_REPLY_TIMEOUT": str(p.REPLY_TIMEOUT),
        "CSK_HANDOVER_LAUNCH": _c_string(p.HANDOVER_LAUNCH.encode()),
        "CSK_HANDOVER_NOT_SERVED": _c_string(p.HANDOVER_NOT_SERVED.encode()),
        "CSK_SOCKET_ENV": _c_string(p.SOCKET_ENV.encode()),
        "CSK_REQUIRED_ENV": _c_string(p.REQUIRED_ENV.encode()),
    }
    return ("/* Generated by cni_skel.warm.install from cni_skel/warm/protocol.py. */\n"
            + "".join(f"#define {k} {v}\n" for k, v in values.items()))


_native_cache: dict[str, bytes] = {}


def _native_launcher(ref: str, name: str, python: str, pythonpath: list[str] | None,
                     worker_socket: str, fallback: str, cc: str) -> bytes:
    """Compile launcher.c for this plugin; the executable's bytes (the info
    trailer not included).

    Raises:
        InstallError: the compiler failed (its output attached); ``fallback``
            "none" for a plugin whose VERSION answer cannot be baked (it does
            not import here).
    """
    pp = b"\0".join(os.fsencode(p) for p in pythonpath or [])
    supported, about = _baked(ref, pythonpath)
    if fallback == protocol.FALLBACK_NONE and supported is None:
        raise InstallError(f"plugin {ref} does not import here, so its VERSION answer cannot be "
                           "baked into a launcher that never runs Python (--fallback none)")
    listed = "[]" if not supported else (
        "[\n" + ",\n".join("        " + json.dumps(v) for v in supported) + "\n    ]")
    config = "".join(f"#define {k} {v}\n" for k, v in (
        ("CSK_PYTHON", _c_string(os.fsencode(python))),
        ("CSK_SCRIPT", _c_string(_launcher_body(ref, pythonpath, worker_socket, True,
                                                fallback).encode())),
        ("CSK_REF", _c_string(ref.encode())),
        ("CSK_NAME", _c_string(name.encode())),
        ("CSK_SOCKET", _c_string(os.fsencode(worker_socket))),
        ("CSK_PYTHONPATH", _c_string(pp)),
        ("CSK_PYTHONPATH_LEN", str(len(pp))),
        ("CSK_CNI_VERSION", _c_string(CURRENT_VERSION.encode())),
        ("CSK_ALL_VERSIONS", "{" + ", ".join(_c_string(v.encode()) for v in ALL_VERSIONS) + "}"),
        ("CSK_SUPPORTED_JSON", "NULL" if supported is None else _c_string(listed.encode())),
        ("CSK_ABOUT", "NULL" if about is None else _c_string(about.encode())),
        ("CSK_FALLBACK_NONE", "1" if fallback == protocol.FALLBACK_NONE else "0"),
        ("CSK_LAUNCHER_DESC", _c_string(f"native {fallback}".encode())),
    ))
    header = protocol_header()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")
    with open(src, "rb") as fp:
        source = fp.read()
    key = hashlib.sha256(b"\0".join([cc.encode(), config.encode(), header.encode(),
                                     source])).hexdigest()
    if key in _native_cache:
        return _native_cache[key]
    with tempfile.TemporaryDirectory(prefix="cni-skel-cc-") as tmp:
        cfg = os.path.join(tmp, "launcher_config.h")
        with open(cfg, "w") as fp:
            fp.write(config)
        with open(os.path.join(tmp, "launcher_protocol.h"), "w") as fp:
            fp.write(header)
        out = os.path.join(tmp, "launcher")
        errors = []
        # Static first: no dynamic loader at each exec (~0.3 ms less a call).
        for extra in (["-static"], []):
            proc = subprocess.run([cc, "-O2", "-s", *extra, "-iquote", tmp, "-include", cfg,
                                   "-o", out, src],
                                  capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                break
            errors.append(proc.stderr.strip()[-2000:])
        else:
            raise InstallError(f"compiling the native launcher with {cc} failed:\n"
                               + "\n".join(errors))
        with open(out, "rb") as fp:
            data = fp.read()
    _native_cache[key] = data
    return data


def launcher_info(path: str) -> dict[str, str] | None:
    """``{"kind": "native"|"python", "ref", "socket", "python", "pythonpath"
    (os.pathsep-joined), "fallback": "oneshot"|"none", "protocol" (its
    request protocol version), "version" (cni-skel's, "" when older)}`` for a launcher
    `write_executable` wrote; None for anything else (a one-shot script, a
    Go plugin, an unreadable file).

    Cheap enough for every delegated call: one stat when the answer for
    this path's (device, inode, mtime, size) is cached in this process,
    else an open and two preads at the file's end (trailer, info block).
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _info_cache.get(path)
    if hit is None or hit[0] != key:
        try:
            key, info = _read_info(path)
        except OSError:
            return None
        if len(_info_cache) >= _INFO_CACHE_MAX:
            _info_cache.clear()
        hit = _info_cache[path] = (key, info)
    return dict(hit[1]) if hit[1] is not None else None


def _read_info(path: str) -> tuple[tuple[int, int, int, int], dict[str, str] | None]:
    """(the opened file's cache key, its info or None); OSError if unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if st.st_size < TRAILER_SIZE:
            return key, None
        trailer = os.pread(fd, TRAILER_SIZE, st.st_size - TRAILER_SIZE)
        digits = trailer[len(_TRAILER_HEAD):-1]
        if not trailer.startswith(_TRAILER_HEAD) or not trailer.endswith(b"\n") \
                or not digits.isdigit():
            return key, None
        n = int(digits)
        if n > min(_MAX_INFO, st.st_size - TRAILER_SIZE):
            return key, None
        block = os.pread(fd, n, st.st_size - TRAILER_SIZE - n)
    finally:
        os.close(fd)
    lines = os.fsdecode(block).split("\n")
    if lines[0] != f"# {INFO_MAGIC}":
        return key, None
    info = {}
    for line in lines[1:]:
        k, _, value = line.removeprefix("# ").partition("=")
        if k in _INFO_KEYS or k in _INFO_OPTIONAL:
            info[k] = value
    if any(k not in info for k in _INFO_KEYS) or info["kind"] not in ("native", "python"):
        return key, None
    return key, {**_INFO_OPTIONAL, **info}


def python_argv(path: str, options: tuple[str, ...] = ()) -> list[str]:
    """The interpreter command line equivalent to running executable
    ``path`` with no worker, with extra interpreter ``options`` (e.g.
    ``("-X", "importtime")``): for tracing what a call imports. A native
    launcher gives the Python code it execs; a Python launcher, its
    interpreter with ``-IS``; a script, its shebang's interpreter and flags
    (``sys.executable -I`` when it goes through sh)."""
    info = launcher_info(path)
    if info is not None and info["kind"] == "native":
        pp = [p for p in info["pythonpath"].split(os.pathsep) if p]
        code = _launcher_body(info["ref"], pp, info["socket"], native=True,
                              fallback=info["fallback"])
        return [info["python"], "-IS", *options, "-c", code, protocol.HANDOVER_LAUNCH, ""]
    if info is not None:
        return [info["python"], "-IS", *options, path]
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
                     launcher: str = "auto", fallback: str = protocol.FALLBACK_ONESHOT) -> str:
    """Write ``bin_dir/name`` running plugin ``ref`` with interpreter ``python``
    (default: this one, absolute, so no venv activation is needed). Atomic
    (temp file + rename), mode 0755. ``pythonpath``: directories put first on
    sys.path (for plugins that are not installed packages, e.g. in tests).

    ``worker_socket``: the executable is a launcher (`cni_skel.warm.client`)
    that hands each call to ``cni-skel worker`` on this unix socket (env
    ``CNI_SKEL_WORKER_SOCKET`` overrides it at run time), answers VERSION
    itself, and runs the plugin in-process when no worker answers. None: a
    plain one-shot script (which answers VERSION itself too).

    ``launcher``: ``native`` (compiled launcher.c; needs a C compiler,
    `find_cc`), ``python``, or ``auto`` (native when it compiles, else python).

    ``fallback``: what a launcher does when the worker cannot serve a call
    (`cni_skel.warm.protocol.FALLBACKS`): ``oneshot`` runs the plugin in its
    own process with ``python`` and a warning; ``none`` answers spec error
    11 (STATUS: 50) naming the socket, and a native launcher then never
    runs Python at all (VERSION and the about text are baked in).

    Raises:
        InstallError: when a file that is not ours is in the way and
            ``force`` is false; ``native`` without a working C compiler;
            a ref, socket or path with a newline or NUL; ``fallback`` none
            for a plugin that does not import here.
    """
    python = os.path.abspath(python or sys.executable)
    target = os.path.join(bin_dir, name)
    if os.path.lexists(target) and not force and not _ours(target):
        raise InstallError(
                f"{target} exists and was not written by cni-skel (use --force to replace it)")
    if launcher not in LAUNCHERS:
        raise InstallError(f"unknown launcher kind {launcher!r}: one of {', '.join(LAUNCHERS)}")
    if fallback not in protocol.FALLBACKS:
        raise InstallError(f"unknown fallback {fallback!r}: one of "
                           f"{', '.join(protocol.FALLBACKS)}")
    data: bytes | None = None
    if worker_socket is not None and launcher != "python":
        cc = find_cc()
        if cc is None and launcher == "native":
            raise InstallError("a native launcher needs a C compiler (cc, gcc or $CC); "
                               "none found (install gcc, or use --launcher python)")
        if cc is not None:
            try:
                data = _native_launcher(ref, name, python, pythonpath, worker_socket, fallback,
                                        cc) \
                    + _info_trailer("native", ref, worker_socket, python, pythonpath, fallback)
            except InstallError:
                if launcher == "native":
                    raise
    if data is None:
        text = (_script(ref, name, python, pythonpath) if worker_socket is None
                else _launcher_script(ref, name, python, pythonpath, worker_socket, fallback))
        data = os.fsencode(text)
    os.makedirs(bin_dir, exist_ok=True)
    atomic_write(target, data, 0o755)
    return target


# --------------------------------------------------------------------------
# systemd: a socket unit that exists from boot, a service it starts

SOCKET_UNIT, SERVICE_UNIT = "cni-skel-worker.socket", "cni-skel-worker.service"
DEFAULT_SYSTEMD_DIR = "/etc/systemd/system"
#: What the worker needs, and nothing more: entering namespaces (SYS_ADMIN,
#: SYS_CHROOT for a mount namespace), configuring them (NET_ADMIN, NET_RAW for
#: delegated Go plugins' iptables), and dropping a child's bounding set to a
#: caller's smaller one (SETPCAP).
WORKER_CAPABILITIES = ("CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_ADMIN", "CAP_SYS_CHROOT",
                       "CAP_SETPCAP")


def worker_argv(python: str, worker_socket: str, idle_exit: float | None) -> list[str]:
    """The worker's command line for ``python`` (the launchers' interpreter)."""
    argv = [python, "-m", "cni_skel.cli", "worker", "--socket", worker_socket]
    if idle_exit:
        argv += ["--idle-exit", f"{idle_exit:g}"]
    return argv


def systemd_units(python: str, worker_socket: str, idle_exit: float | None) -> dict[str, str]:
    """``{unit file name: text}`` for `SOCKET_UNIT` and `SERVICE_UNIT`: the
    socket exists from boot (systemd listens, mode 0600), the first call
    starts the worker with it (``LISTEN_FDS``), ``idle_exit`` lets it exit
    when idle. The service is hardened as far as its job allows: it must
    enter and configure other network and mount namespaces as root.

    Raises:
        InstallError: a path systemd cannot take (whitespace or control
            characters, not absolute).
    """
    for what, value in (("interpreter", python), ("worker socket", worker_socket)):
        if not os.path.isabs(value) or any(c.isspace() or not c.isprintable() for c in value):
            raise InstallError(f"{what} {value!r}: systemd units need an absolute path without "
                               "whitespace")
    exec_start = " ".join(worker_argv(python, worker_socket, idle_exit))
    head = f"# {MARKER} (cni-skel {__version__}); `cni-skel uninstall` removes it.\n"
    socket_text = f"""{head}[Unit]
Description=cni-skel worker socket (warm CNI plugins)

[Socket]
ListenStream={worker_socket}
SocketMode=0600
DirectoryMode=0755
# The worker serves one request per connection, from its own pool of processes.
Accept=no

[Install]
WantedBy=sockets.target
"""
    service_text = f"""{head}[Unit]
Description=cni-skel worker (warm CNI plugins for {worker_socket})
Requires={SOCKET_UNIT}
After={SOCKET_UNIT}

[Service]
Type=simple
ExecStart={exec_start}
# SIGTERM: stop accepting, let requests in flight finish (--drain-timeout);
# children keep their own connections.
KillMode=mixed
TimeoutStopSec=40
Restart=on-failure
RestartSec=1
UMask=0022
SyslogIdentifier=cni-skel-worker
# Hardening, as far as its job allows (it enters pods' network namespaces and
# the runtime's mount namespace, as root, and configures them).
CapabilityBoundingSet={' '.join(WORKER_CAPABILITIES)}
NoNewPrivileges=yes
RestrictNamespaces=net mnt
RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_INET AF_INET6 AF_PACKET
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
ProtectClock=yes
ProtectKernelLogs=yes
ProtectKernelModules=yes
ProtectControlGroups=yes

[Install]
Also={SOCKET_UNIT}
"""
    return {SOCKET_UNIT: socket_text, SERVICE_UNIT: service_text}


def write_units(systemd_dir: str, units: dict[str, str], *, force: bool = False) -> list[str]:
    """Write ``units`` (`systemd_units`) into ``systemd_dir`` atomically;
    their paths.

    Raises:
        InstallError: a unit file not written by cni-skel is in the way and
            ``force`` is false.
    """
    os.makedirs(systemd_dir, exist_ok=True)
    paths = []
    for name, text in units.items():
        path = os.path.join(systemd_dir, name)
        if os.path.lexists(path) and not force and not _ours(path):
            raise InstallError(f"{path} exists and was not written by cni-skel "
                               "(use --force to replace it)")
        atomic_write(path, text.encode(), 0o644)
        paths.append(path)
    return paths


def _ours(path: str) -> bool:
    try:
        with open(path, "rb") as fp:
            head = fp.read(512)
    except OSError:
        return False
    return MARKER.encode() in head or launcher_info(path) is not None


#: Unit directories systemd reads (systemd.unit(5), system instance).
SYSTEMD_UNIT_PATH = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                     "/usr/lib/systemd/system", "/lib/systemd/system")


def systemd_running(unit_dir: str | None = None) -> bool:
    """Whether systemd is this machine's init (sd_booted(3): /run/systemd/system
    exists) and, given ``unit_dir``, reads units from it."""
    if not os.path.isdir("/run/systemd/system"):
        return False
    return unit_dir is None or os.path.realpath(unit_dir) in {
        os.path.realpath(d) for d in SYSTEMD_UNIT_PATH}


def systemctl(*args: str) -> tuple[bool, str]:
    """Run ``systemctl ARGS``; (succeeded, its output or why not)."""
    exe = shutil.which("systemctl")
    if exe is None:
        return False, "systemctl not found"
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def remove_ours(directory: str, name: str) -> str | None:
    """Remove ``directory/name`` (an executable, a unit) if cni-skel wrote
    it; its path, or None when there is nothing of ours (missing, or another
    program's: left alone)."""
    path = os.path.join(directory, name)
    if not os.path.lexists(path) or not _ours(path):
        return None
    os.unlink(path)
    return path


def node_state(refs: list[str]) -> list[str]:
    """What the plugins ``refs`` keep on this node (`cni_skel.skel.Plugin.node_state`),
    one line each, prefixed by the plugin's name; a plugin that does not
    import says so."""
    lines = []
    for ref in refs:
        try:
            plugin = resolve_ref(ref)
            lines += [f"{plugin.name}: {line}" for line in plugin.node_state()]
        except Exception as exc:
            lines.append(f"{ref}: cannot tell ({type(exc).__name__}: {exc})")
    return lines
