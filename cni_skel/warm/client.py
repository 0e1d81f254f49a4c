"""The thin client an installed plugin executable runs (warm worker mode).

The native launcher (``launcher.c``, the default where a C compiler exists)
does the common path -- connect, send, relay -- itself and execs the code
below for everything else (``launch(..., native=[mode, detail])``).

Each executable ``cni-skel install`` writes is ``#!<python> -IS`` plus a few
lines that load this file (its cached bytecode via ``marshal`` when fresh)
into a fresh namespace and call ``launch(...)`` with the plugin's ref and the
values baked in at install time. It imports nothing beyond ``os``, ``sys``
and ``_socket`` (already loaded, or a C module): ``site``, ``socket`` (enum)
and ``json`` would cost 8-13 ms each on every call.

* VERSION is answered here, from the versions baked in at install time, with
  the same bytes as the plugin's skel (``cni_skel.skel.version_answer``).
* Any other verb connects to the worker's unix socket (``CNI_SKEL_WORKER_SOCKET``
  or the path baked in; default ``/run/cni-skel/worker.sock``), sends the
  request with this process's netns, mount ns and stderr as fds (SCM_RIGHTS)
  and relays the answer: stdout, exit code.
* No worker (no socket, connection refused), or an answer meaning "not run"
  (unknown plugin, refused, bad request): by the fallback chosen at install
  (``cni-skel install --fallback``), the plugin runs in this process exactly
  as a one-shot executable does (``run_plugin_main``), after a warning on
  stderr naming the socket and a line in the socket directory's fallback log
  (``oneshot``); or nothing runs here and the answer is spec error 11 (STATUS:
  50) saying why the worker could not serve (``none``, or
  ``CNI_SKEL_WORKER_REQUIRED`` set: not empty, not ``0``; VERSION and the
  about text stay local).
* The worker went away after taking the request (EOF, timeout): spec error
  11 (try again later) on stdout, exit 1; we never guess whether it ran.
* The worker does not speak this launcher's protocol version: spec error 11
  naming both.

The wire format, limits and environment names are `cni_skel.warm.protocol`'s;
the Python launcher loads that module's bytecode the same way, first, and
registers it in ``sys.modules``, where the import below finds it.

The one-shot script (``cni-skel install --one-shot``) answers VERSION with
`answer_version` too: no executable imports the plugin's module for VERSION.
"""

import os
import sys

from .protocol import (
    DEFAULT_SOCKET,
    ERR_IO,
    ERR_NOT_AVAILABLE,
    ERR_TRY_AGAIN_LATER,
    FALLBACK_FROM_ENV,
    FALLBACK_LOG_MAX,
    FALLBACK_NONE,
    FALLBACK_ONESHOT,
    HANDOVER_GONE,
    HANDOVER_LAUNCH,
    HANDOVER_NOT_SERVED,
    KIND_PING,
    KIND_RUN,
    MAX_STDIN_BYTES,
    PING_HELD,
    PROTOCOL_VERSION,
    REPLY_HEADER,
    REPLY_TIMEOUT,
    REQUIRED_ENV,
    SOCKET_ENV,
    ST_DONE,
    ST_PONG,
    ST_REFUSED,
    ST_VERSION,
    decode_reply_header,
    encode_request,
    fallback_log,
    go_field,
    status_name,
)


class WorkerGone(Exception):
    """The worker took the request but no complete answer came back."""


class _NotRun(Exception):
    """The worker certainly did not run the request (safe to run it here)."""


def connect(path, timeout=REPLY_TIMEOUT):
    """A connected ``_socket.socket`` to the worker at ``path``; raises OSError."""
    import _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        s.connect(path)
    except BaseException:
        s.close()
        raise
    return s


def send_request(sock, message, fds=()):
    """Send ``message``, passing ``fds`` with its first bytes (SCM_RIGHTS)."""
    import _socket

    anc = []
    if fds:
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds))]
    sent = sock.sendmsg([message], anc)
    while sent < len(message):
        sent += sock.send(message[sent:])


def _recv_exact(sock, n, got_any):
    chunks, have = [], 0
    while have < n:
        try:
            chunk = sock.recv(min(n - have, 1 << 20))
        except ConnectionResetError:
            # Unix sockets reset only when the server closed without reading
            # all we sent (or never accepted): the request cannot have run.
            if got_any or have:
                raise WorkerGone("connection reset in the middle of the answer") from None
            raise _NotRun("connection reset before the request was read") from None
        except TimeoutError:
            raise WorkerGone(f"no answer within {sock.gettimeout():.0f} s") from None
        except OSError as exc:
            raise WorkerGone(f"reading the answer failed: {exc}") from None
        if not chunk:
            raise WorkerGone("the worker closed the connection without an answer")
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def read_reply(sock):
    """``(status, exit_code, stdout)`` from the worker.

    Raises:
        WorkerGone: EOF, timeout or garbage after the request was taken.
        _NotRun: connection reset before the worker read the request.
    """
    try:
        status, code, length = decode_reply_header(_recv_exact(sock, REPLY_HEADER, False))
    except ValueError as exc:
        raise WorkerGone(str(exc)) from None
    body = _recv_exact(sock, length, True) if length else b""
    return status, code, body


def exchange(sock, message, fds=()):
    """Send one request and read its reply: ``(status, code, body)``.

    A worker that refuses a client (not root) answers and closes without
    reading the request, so the send may fail (EPIPE) after the answer is
    already waiting: it is read all the same. With no answer either, the
    request cannot have run: `_NotRun`."""
    try:
        send_request(sock, message, fds)
    except OSError as exc:
        try:
            return read_reply(sock)
        except (WorkerGone, _NotRun):
            raise _NotRun(f"sending the request failed: {exc}") from None
    return read_reply(sock)


def ping(path, timeout=5.0, held=False):
    """Ask the worker at ``path`` whether it serves: ``(True, its description)``
    or ``(False, why not)``; with ``held``, the description also lists what
    the keeper's services hold (one more round trip, to the keeper)."""
    try:
        sock = connect(path, timeout)
    except OSError as exc:
        return False, f"cannot connect: {exc.strerror or exc}"
    try:
        fields = [KIND_PING, PING_HELD] if held else [KIND_PING]
        status, _, body = exchange(sock, encode_request(fields))
    except (OSError, WorkerGone, _NotRun) as exc:
        return False, str(exc)
    finally:
        sock.close()
    if status == ST_PONG:
        return True, body.decode("utf-8", "replace")
    if status == ST_REFUSED:
        return False, "refused: " + body.decode("utf-8", "replace")
    return False, f"unexpected answer status {status}"


# --------------------------------------------------------------------------
# VERSION and errors without the json module (it costs ~8 ms to import)

class _Slow(Exception):
    """Input the small parser leaves to the json module (escapes, non-ASCII)."""


_WS = b" \t\n\r"
_DIGITS = b"0123456789"


def _ws(b, i):
    while i < len(b) and b[i] in _WS:
        i += 1
    return i


def _value(b, i):
    """Parse one JSON value at ``b[i]`` (json.loads' grammar, ASCII input
    without backslashes); returns (value, next index). Numbers come back as None."""
    if i >= len(b):
        raise ValueError("expecting value")
    c = b[i]
    if c == 0x22:  # "
        j = i + 1
        while j < len(b) and b[j] != 0x22:
            if b[j] < 0x20:
                raise ValueError("control character in string")
            j += 1
        if j >= len(b):
            raise ValueError("unterminated string")
        return b[i + 1:j].decode("ascii"), j + 1
    if c == 0x7B or c == 0x5B:  # { [
        is_obj, out, i = c == 0x7B, ({} if c == 0x7B else []), _ws(b, i + 1)
        close = 0x7D if is_obj else 0x5D
        if i < len(b) and b[i] == close:
            return out, i + 1
        while True:
            if is_obj:
                if i >= len(b) or b[i] != 0x22:
                    raise ValueError("expecting property name")
                key, i = _value(b, i)
                i = _ws(b, i)
                if i >= len(b) or b[i] != 0x3A:
                    raise ValueError("expecting ':'")
                val, i = _value(b, _ws(b, i + 1))
                out[key] = val
            else:
                val, i = _value(b, i)
                out.append(val)
            i = _ws(b, i)
            if i < len(b) and b[i] == close:
                return out, i + 1
            if i >= len(b) or b[i] != 0x2C:
                raise ValueError("expecting ',' delimiter")
            i = _ws(b, i + 1)
    for lit, val in ((b"null", None), (b"true", True), (b"false", False),
                     (b"NaN", None), (b"Infinity", None), (b"-Infinity", None)):
        if b.startswith(lit, i):
            return val, i + len(lit)
    j = i + 1 if c == 0x2D else i  # -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?
    if j >= len(b) or b[j] not in _DIGITS:
        raise ValueError("expecting value")
    j = j + 1 if b[j] == 0x30 else _digits(b, j)
    if j < len(b) and b[j] == 0x2E and j + 1 < len(b) and b[j + 1] in _DIGITS:
        j = _digits(b, j + 1)
    if j < len(b) and b[j] in b"eE":
        k = j + 1 + (j + 1 < len(b) and b[j + 1] in b"+-")
        if k < len(b) and b[k] in _DIGITS:
            j = _digits(b, k)
    return None, j


def _digits(b, j):
    while j < len(b) and b[j] in _DIGITS:
        j += 1
    return j


def loads_light(data):
    """``json.loads(data)`` for bytes, exact where it answers; numbers are None.

    Raises:
        ValueError: not one JSON document (as json.loads would).
        _Slow: escapes, non-ASCII or NUL bytes: use the json module.
    """
    if b"\\" in data or not data.isascii() or b"\x00" in data:
        raise _Slow
    value, i = _value(data, _ws(data, 0))
    if _ws(data, i) != len(data):
        raise ValueError("extra data")
    return value


def _loads(data):
    try:
        return loads_light(data)
    except _Slow:
        import json

        return json.loads(data)


def _jstr(s):
    """A str as json.dumps writes it (ensure_ascii)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif ch in "\n\r\t\b\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}[ch])
        elif o > 0xFFFF:
            o -= 0x10000
            out.append(f"\\u{0xD800 | (o >> 10):04x}\\u{0xDC00 | (o & 0x3FF):04x}")
        else:
            out.append(f"\\u{o:04x}")
    out.append('"')
    return "".join(out)


def _is_version(v):
    # skel's parse_version: re.match(r"^(\d+)\.(\d+)\.(\d+)$"); "$" also
    # matches before one final newline.
    parts = (v[:-1] if v.endswith("\n") else v).split(".")
    return len(parts) == 3 and all(p.isdecimal() for p in parts)


def version_answer(stdin_data, supported, current):
    """The bytes skel's VERSION prints: the asked cniVersion echoed when
    well-formed (else ``current``), and ``supported``."""
    asked = current
    if stdin_data.strip():
        try:
            doc = _loads(stdin_data)
        except ValueError:
            doc = None
        v = go_field(doc, "cniVersion")
        if isinstance(v, str) and _is_version(v):
            asked = v
    items = ",\n".join("        " + _jstr(v) for v in supported)
    listed = f"[\n{items}\n    ]" if supported else "[]"
    return (f'{{\n    "cniVersion": {_jstr(asked)},\n    "supportedVersions": {listed}\n}}'
            ).encode()


def error_answer(code, msg, details, stdin_data, all_versions, current):
    """A spec Error object as skel prints it, in the config's cniVersion."""
    version = current
    try:
        doc = _loads(stdin_data)
        v = go_field(doc, "cniVersion")
        if v in all_versions:
            version = v
    except (ValueError, RecursionError):
        pass
    lines = [f'    "cniVersion": {_jstr(version)}', f'    "code": {int(code)}',
             f'    "msg": {_jstr(msg)}']
    if details:
        lines.append(f'    "details": {_jstr(details)}')
    return ("{\n" + ",\n".join(lines) + "\n}").encode()


# --------------------------------------------------------------------------


def _read_stdin():
    # One byte past the limit is enough for the skel to refuse it.
    chunks, have = [], 0
    while have <= MAX_STDIN_BYTES:
        chunk = os.read(0, min(1 << 16, MAX_STDIN_BYTES + 1 - have))
        if not chunk:
            break
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def _write_stdout(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _context_fds():
    """[netns, mntns, stderr] of this process, and the pod's network
    namespace when CNI_NETNS names a regular file (nsfs inodes are; a FIFO
    or a device is never opened here)."""
    fds = [os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC),
           os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)]
    try:
        os.fstat(2)
        fds.append(2)
    except OSError:  # no stderr: give the plugin /dev/null, as it would have
        fds.append(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
    pod = os.environ.get("CNI_NETNS", "")
    try:
        if pod and os.stat(pod).st_mode & 0o170000 == 0o100000:
            fds.append(os.open(pod, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK))
    except OSError:
        pass
    return fds


def _close_context_fds(fds):
    for i, fd in enumerate(fds):
        if i != 2 or fd != 2:
            os.close(fd)


def _run_request(sock, ref, pythonpath, data, fallback=FALLBACK_ONESHOT):
    """Send one ``run`` request and wait: ``(status, exit code, stdout)``."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    mask = os.umask(0o022)
    os.umask(mask)
    env = b"\0".join(k + b"=" + v for k, v in os.environb.items())
    msg = encode_request([KIND_RUN, ref.encode(), b"\0".join(os.fsencode(p) for p in pythonpath),
                          os.fsencode(cwd), str(mask).encode(), env, data,
                          f"python {fallback}".encode()])
    fds = _context_fds()
    try:
        return exchange(sock, msg, fds)
    finally:
        _close_context_fds(fds)


def one_shot(ref, pythonpath, data=None, all_versions=(), current="1.1.0"):
    """Run the plugin in this process, as the one-shot executable does
    (``cni_skel.skel.run_plugin_main``); ``data``: stdin already read. When
    the SDK cannot be imported (the virtualenv moved or lost packages): spec
    error 5 (STATUS: 50) naming what is missing and the fix."""
    try:
        if sys.flags.no_site:
            import site

            site.main()
        if pythonpath:
            sys.path[:0] = pythonpath
        from cni_skel.skel import run_plugin_main
    except ImportError as exc:
        if data is None:
            try:
                data = b"" if os.isatty(0) else _read_stdin()
            except OSError:
                data = b""
        code = ERR_NOT_AVAILABLE if os.environ.get("CNI_COMMAND") == "STATUS" else ERR_IO
        _write_stdout(error_answer(
            code, f"cni-skel launcher: cannot import {exc.name or 'the plugin SDK'}: {exc}",
            f"plugin {ref} runs with {sys.executable}, whose packages are gone or moved: run "
            "`cni-skel install` again", data or b"", all_versions, current))
        sys.exit(1)
    if data is not None:
        import io

        sys.stdin = io.TextIOWrapper(io.BytesIO(data))
    run_plugin_main(ref)


def _worker_required(fallback=FALLBACK_ONESHOT):
    return fallback == FALLBACK_NONE or os.environ.get(REQUIRED_ENV, "") not in ("", "0")


def _try_again_later(msg, details, data, all_versions, current):
    """Answer spec error 11 (STATUS: 50, not available) on stdout and exit 1
    (nothing ran here)."""
    code = ERR_NOT_AVAILABLE if os.environ.get("CNI_COMMAND") == "STATUS" \
        else ERR_TRY_AGAIN_LATER
    _write_stdout(error_answer(code, msg, details, data, all_versions, current))
    sys.exit(1)


def record_fallback(socket_path, ref, why):
    """Note a one-shot fallback: a warning on stderr naming the socket, and
    a line in the fallback log beside the socket (`fallback_log`) when its
    directory exists and the log is under `FALLBACK_LOG_MAX` bytes."""
    import contextlib
    import time

    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else ref
    cmd = os.environ.get("CNI_COMMAND", "") or "-"
    with contextlib.suppress(OSError):
        os.write(2, f"cni-skel: {name}: worker not reachable ({why}, socket {socket_path}); "
                    "running it one-shot\n".encode("utf-8", "replace"))
    path = fallback_log(socket_path)
    if not path:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o600)
        try:
            st = os.fstat(fd)
            if st.st_mode & 0o170000 == 0o100000 and st.st_size < FALLBACK_LOG_MAX:
                cid = os.environ.get("CNI_CONTAINERID", "")[:128] or "-"
                line = f"{int(time.time())} {cmd} {ref} {cid} {why}".replace("\n", " ")
                os.write(fd, (line[:1000] + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)


def _not_served(ref, pythonpath, why, data, path, all_versions, current,
                fallback=FALLBACK_ONESHOT, recorded=False):
    """The worker certainly did not run the request: run it here (after
    `record_fallback`, unless the native launcher did), or (fallback none,
    worker required) refuse to with code 11 (STATUS: 50)."""
    if not _worker_required(fallback):
        if not recorded:
            record_fallback(path, ref, why)
        os.environ[FALLBACK_FROM_ENV] = path
        return one_shot(ref, pythonpath, data, all_versions, current)
    reason = ("this launcher was installed with --fallback none" if fallback == FALLBACK_NONE
              else f"{REQUIRED_ENV} is set")
    _try_again_later(
        "cni-skel worker not reachable" if why.startswith("cannot connect")
        else "cni-skel worker did not serve the request",
        f"{why} (socket {path}); {reason}, so the plugin was not run in the launcher's "
        "process: start the worker (systemctl start cni-skel-worker.socket, or the "
        "DaemonSet) and try again", data or b"", all_versions, current)


def _gone(why, path, data, all_versions, current):
    """The worker took the request and no whole answer came: code 11."""
    _try_again_later(
        "cni-skel worker went away during the request",
        f"{why} (socket {path}); the plugin may or may not have run: try again later",
        data, all_versions, current)


def _version_mismatch(body, path, data, all_versions, current):
    """The worker does not serve this launcher's protocol: code 11."""
    _try_again_later(
        "cni-skel launcher and worker speak different protocol versions",
        f"this launcher speaks protocol {PROTOCOL_VERSION}; {body} (socket {path}); run "
        "`cni-skel install` with the worker's version, or restart the worker of this "
        "launcher's version", data, all_versions, current)


def answer_version(supported, current):
    """Answer this process's VERSION call from ``supported`` (the plugin's
    ``supported_versions``, baked in at install) and exit 0, with the bytes
    the plugin's skel would print (stdin read unless it is a terminal, as
    ``cni_skel.skel`` does). Returns, having written nothing, when stdin
    cannot be read or parsed here: the caller runs the plugin instead."""
    try:
        data = b"" if os.isatty(0) else _read_stdin()
        answer = version_answer(data, supported, current)
    except (OSError, RecursionError):
        return
    _write_stdout(answer)
    sys.exit(0)


def launch(ref, socket_path=DEFAULT_SOCKET, supported=None, pythonpath=(),
           all_versions=(), current="1.1.0", native=None, about=None,
           fallback=FALLBACK_ONESHOT):
    """Entry point of an installed executable for plugin ``ref``
    (``"module:Class"``); exits the process with the plugin's exit code.

    ``supported``: the plugin's ``supported_versions`` (None: ask the plugin);
    ``about``: its about text, printed on stderr for a call without
    CNI_COMMAND (None: ask the plugin);
    ``all_versions``/``current``: ``cni_skel.version`` values, for the
    cniVersion of the errors the launcher answers itself.
    ``fallback``: `FALLBACK_ONESHOT` or `FALLBACK_NONE`, chosen at install
    (see the module docstring).
    ``native``: ``[mode, detail]`` when the native launcher (launcher.c)
    hands over: ``HANDOVER_LAUNCH`` (do everything as usual: the launcher
    found its VERSION config beyond its small JSON reader, or has no baked
    answer) or ``HANDOVER_NOT_SERVED`` (the worker certainly did not run it:
    ``detail`` says why; the launcher warned and logged it, run one-shot);
    ``HANDOVER_GONE`` (from launchers before protocol 2: no whole answer
    came). stdin is then the request's, replayed.
    """
    pythonpath = list(pythonpath or ())
    mode, detail = [*(native or ()), HANDOVER_LAUNCH, ""][:2]
    if mode in (HANDOVER_NOT_SERVED, HANDOVER_GONE):
        path = os.environ.get(SOCKET_ENV) or socket_path
        try:
            data = _read_stdin()
        except OSError:
            data = None  # unreadable: a one-shot run reports it (code 5)
        if mode == HANDOVER_GONE:
            _gone(detail, path, data or b"", all_versions, current)
        return _not_served(ref, pythonpath, detail, data, path, all_versions, current,
                           fallback, recorded=True)
    cmd = os.environ.get("CNI_COMMAND", "")
    if cmd == "VERSION" and supported is not None:
        answer_version(supported, current)
        return one_shot(ref, pythonpath, None, all_versions, current)  # stdin unreadable
    if not cmd:  # a human asking for the about text
        if about is None:
            return one_shot(ref, pythonpath, None, all_versions, current)
        os.write(2, about.encode())
        sys.exit(0)
    path = os.environ.get(SOCKET_ENV) or socket_path
    required = _worker_required(fallback)

    def not_served(why, data):
        return _not_served(ref, pythonpath, why, data, path, all_versions, current, fallback)

    try:
        sock = connect(path)
    except OSError as exc:
        why = f"cannot connect: {exc.strerror or exc}"
        if not required:
            record_fallback(path, ref, why)
            os.environ[FALLBACK_FROM_ENV] = path
            return one_shot(ref, pythonpath, None, all_versions, current)  # stdin unread
        try:
            data = _read_stdin()
        except OSError:
            data = b""
        return not_served(why, data)
    try:
        data = _read_stdin()
    except OSError as exc:
        sock.close()
        if not required:
            return one_shot(ref, pythonpath, None, all_versions, current)  # it reports it
        _write_stdout(error_answer(ERR_IO, "cni-skel launcher: reading stdin failed", str(exc),
                                   b"", all_versions, current))
        sys.exit(1)
    try:
        status, code, out = _run_request(sock, ref, pythonpath, data, fallback)
    except _NotRun as exc:
        return not_served(str(exc), data)
    except WorkerGone as exc:
        _gone(str(exc), path, data, all_versions, current)
    finally:
        sock.close()
    if status == ST_VERSION:
        _version_mismatch(out.decode("utf-8", "replace"), path, data, all_versions, current)
    if status != ST_DONE:  # unknown plugin, refused, bad request: nothing ran
        return not_served(f"{status_name(status)}: {out.decode('utf-8', 'replace')}", data)
    _write_stdout(out)
    sys.exit(code)
