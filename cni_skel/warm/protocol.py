"""The warm path's wire format, limits and names: the one definition.

`cni_skel.warm.client` (the Python launcher), `cni_skel.warm.serving` and
`cni_skel.warm.pool` (the worker), `cni_skel.warm.install` and `cni_skel.skel`
take these from here; the native launcher gets them from
``launcher_protocol.h``, which `cni_skel.warm.install` generates from this
module each time it compiles ``launcher.c``.

Every installed launcher runs this module on every call that reaches
Python, so it imports nothing (not even ``typing``): the Python launcher
loads its cached bytecode directly, without ``site`` or ``importlib``.

Wire format (all integers unsigned 32-bit big-endian), one request per
connection to the worker's unix stream socket:

    request: magic len  then fields, each  len bytes
             magic: b"CSK" + the launcher's protocol version as one ASCII
             digit (`REQUEST_MAGIC`, version `PROTOCOL_VERSION`); version 1
             launchers send b"CSKQ"
             fields: kind (KIND_RUN / KIND_PING); a ping may add `PING_HELD`
             (its answer then lists what the keeper holds); a run request has
             `RUN_FIELDS` fields: kind, ref, pythonpath (NUL-joined), cwd,
             umask (decimal), environment (NUL-joined K=V), stdin, launcher
             (its kind and fallback, e.g. b"native none"; version 1: absent)
             ancillary data on the first byte: fds [netns, mntns, stderr] and,
             when CNI_NETNS names a file the launcher could open, [pod netns]
    reply:   REPLY_MAGIC status(1 byte) exit_code len  then stdout bytes
             (`REPLY_HEADER` bytes before stdout)

What never changes between versions, so that launchers and workers of any
two versions understand each other well enough to say they do not: the
request header (b"CSK" + version, length) and the reply format. A worker
serves the versions in `SERVED_VERSIONS` (this one and the one before);
it answers any other with `ST_VERSION` and a text naming both, without
reading the body, and the launcher answers spec error 11 saying so.

A reply's status says whether the plugin ran: `ST_DONE` (it ran, or the
worker answered for it with a spec error), `ST_PONG` (answer to a ping), or
one of `ST_UNKNOWN`, `ST_REFUSED`, `ST_BAD`, `ST_VERSION`: nothing ran, and
the body says why.

Limits: a request frame's length is at most `MAX_REQUEST_BYTES` (20 MiB);
the worker answers a larger one with spec error 5 and closes, without
reading it. The config on stdin is at most `MAX_STDIN_BYTES` (16 MiB) in
both modes: launchers read one byte more than that and no further, and the
skel answers a larger one with spec error 5 (`cni_skel.skel.dispatch`).
Linux caps an exec's environment at a few MiB, so a launcher's frame always
fits.
"""

#: Where ``cni-skel worker`` listens and launchers connect, unless told otherwise.
DEFAULT_SOCKET = "/run/cni-skel/worker.sock"
#: Environment variable naming another socket at run time (launchers, delegation).
SOCKET_ENV = "CNI_SKEL_WORKER_SOCKET"
#: Set (not empty, not "0"): a launcher never falls back to running the
#: plugin in its own process; it answers spec error `ERR_TRY_AGAIN_LATER`
#: when the worker cannot serve the call.
REQUIRED_ENV = "CNI_SKEL_WORKER_REQUIRED"
#: Set by a launcher that runs the plugin in its own process because the
#: worker did not serve the call: the socket it tried (for messages of
#: plugins that need the worker, `cni_skel.keeper.not_in_worker`).
FALLBACK_FROM_ENV = "CNI_SKEL_FALLBACK_FROM"
#: Set by the test helpers (`cni_skel.harness.run_plugin_raw`) to a file
#: path: a one-shot plugin process appends there, one JSON object a line
#: (``category``, ``message``, ``filename``, ``lineno``, ``module``), each
#: warning it shows, its DeprecationWarnings included (Python hides those by
#: default), and the test process raises them again. Not read in warm mode.
WARNINGS_ENV = "CNI_SKEL_WARNINGS"



def go_field(doc, key):
    """The value a Go plugin decodes for the top-level ``key`` of the JSON
    object ``doc`` (a dict; anything else: None): Go's encoding/json matches
    object keys to a struct's fields case-insensitively (ASCII) and the last
    matching key wins, so ``{"CNIVERSION": "1.0.0"}`` is a config at 1.0.0.
    None when no key matches. The one rule every reader of a config's
    ``cniVersion`` and ``name`` follows (the skel, `cni_skel.model.CNIModel`,
    the launchers, the worker; launcher.c's scanner in C)."""
    found = None
    if isinstance(doc, dict):
        folded = key.lower()
        for name, value in doc.items():
            if isinstance(name, str) and len(name) == len(key) and name.lower() == folded:
                found = value
    return found


#: What launchers do when the worker cannot serve a call, chosen at install
#: (``cni-skel install --fallback``): run the plugin one-shot in the
#: launcher's process with a warning on stderr, or answer spec error 11
#: (STATUS: 50) naming the socket. Launchers that cannot run Python (the
#: image's) are "none".
FALLBACK_ONESHOT, FALLBACK_NONE = "oneshot", "none"
FALLBACKS = (FALLBACK_ONESHOT, FALLBACK_NONE)
#: Each one-shot fallback appends a line to this file, in the socket's
#: directory when it exists (``<unix time> <verb> <plugin ref> <container
#: ID> <reason>``), while the file is under `FALLBACK_LOG_MAX` bytes: the
#: worker's metrics and ``cni-skel status`` count them.
FALLBACK_LOG = "fallbacks.log"
FALLBACK_LOG_MAX = 1 << 20


def fallback_log(socket_path):
    """The fallback log beside ``socket_path`` ("" for a socket named
    without a directory: no log)."""
    directory = socket_path.rpartition("/")[0]
    return f"{directory}/{FALLBACK_LOG}" if directory else ""

#: The request protocol this code speaks, and the ones a worker serves.
PROTOCOL_VERSION = 2
SERVED_VERSIONS = (1, 2)
_MAGIC_PREFIX = b"CSK"
_LEGACY_MAGIC = {b"CSKQ": 1}
REQUEST_MAGIC = _MAGIC_PREFIX + str(PROTOCOL_VERSION).encode()
REPLY_MAGIC = b"CSKR"
#: Request kinds (first field).
KIND_RUN, KIND_PING = b"run", b"ping"
#: A ping's optional second field: list what the keeper holds (workers that
#: predate it ignore it).
PING_HELD = b"held"
#: Fields of a run request, kind included, by protocol version.
RUN_FIELDS = 8
RUN_FIELDS_BY_VERSION = {1: 7, 2: 8}
#: Reply statuses.
ST_DONE, ST_UNKNOWN, ST_REFUSED, ST_BAD, ST_PONG, ST_VERSION = 0, 1, 2, 3, 4, 5
#: What a status means, for the reason a launcher gives when nothing ran.
STATUS_NAMES = ("done", "unknown plugin", "refused", "bad request", "pong",
                "unsupported protocol")
#: Bytes of a request before its fields (magic, length).
REQUEST_HEADER = len(REQUEST_MAGIC) + 4
#: Offsets in a reply header: status byte, exit code, stdout length.
REPLY_STATUS_AT = len(REPLY_MAGIC)
REPLY_CODE_AT, REPLY_LENGTH_AT = REPLY_STATUS_AT + 1, REPLY_STATUS_AT + 5
#: Bytes of a reply before its stdout.
REPLY_HEADER = REPLY_LENGTH_AT + 4
#: Largest config (stdin) a plugin accepts, in bytes, in both modes.
MAX_STDIN_BYTES = 16 << 20
#: Largest request frame the worker reads (stdin + environment + the rest).
MAX_REQUEST_BYTES = MAX_STDIN_BYTES + (4 << 20)
#: Seconds a launcher waits for the answer (and the worker lets a request
#: run); runtimes enforce their own, shorter deadline.
REPLY_TIMEOUT = 600
#: How the native launcher hands a call over to the Python launcher code
#: (its first argument; `cni_skel.warm.client.launch`): do everything as
#: usual; the worker certainly did not run it; it took the request and no
#: whole answer came.
HANDOVER_LAUNCH, HANDOVER_NOT_SERVED, HANDOVER_GONE = "launch", "notserved", "gone"
#: Spec error code "try again later" (= `cni_skel.errors.ERR_TRY_AGAIN_LATER`):
#: what a launcher answers when the worker went away during a request.
ERR_TRY_AGAIN_LATER = 11
#: Spec error codes launchers answer themselves: I/O failure (stdin
#: unreadable, the one-shot interpreter gone) and, for STATUS, plugin not
#: available (= `cni_skel.errors.ERR_IO_FAILURE`, `ERR_PLUGIN_NOT_AVAILABLE`).
ERR_IO, ERR_NOT_AVAILABLE = 5, 50


def _u32(n):
    return n.to_bytes(4, "big")


def request_magic(version=PROTOCOL_VERSION):
    """The 4 bytes a launcher of protocol ``version`` starts its request with."""
    for magic, v in _LEGACY_MAGIC.items():
        if v == version:
            return magic
    return _MAGIC_PREFIX + bytes([0x30 + version])


def encode_request(fields, version=PROTOCOL_VERSION):
    """``fields`` (list of bytes) -> one framed request message (bytes), in
    protocol ``version``'s header."""
    body = b"".join(_u32(len(f)) + f for f in fields)
    return request_magic(version) + _u32(len(body)) + body


def request_header(head):
    """``(protocol version, body length)`` from a `REQUEST_HEADER`-byte
    request header, whatever the version; ValueError if it is not one."""
    magic = head[:len(REQUEST_MAGIC)]
    if magic[:len(_MAGIC_PREFIX)] != _MAGIC_PREFIX or len(magic) != len(REQUEST_MAGIC):
        raise ValueError(f"not a cni-skel request: {magic!r}")
    version = _LEGACY_MAGIC.get(magic, magic[-1] - 0x30)
    return version, int.from_bytes(head[len(REQUEST_MAGIC):REQUEST_HEADER], "big")


def version_range():
    """The served versions in words, e.g. "1-2"."""
    return f"{SERVED_VERSIONS[0]}-{SERVED_VERSIONS[-1]}"


def decode_fields(body):
    """The fields `encode_request` framed (list of bytes); ValueError if malformed."""
    fields, i = [], 0
    while i < len(body):
        if i + 4 > len(body):
            raise ValueError("truncated field length")
        n = int.from_bytes(body[i:i + 4], "big")
        i += 4
        if i + n > len(body):
            raise ValueError("truncated field")
        fields.append(body[i:i + n])
        i += n
    return fields


def encode_reply(status, exit_code=0, stdout=b""):
    """One framed reply message (bytes)."""
    return REPLY_MAGIC + bytes([status]) + _u32(exit_code & 0xFFFFFFFF) + _u32(len(stdout)) \
        + stdout


def decode_reply_header(head):
    """``(status, exit code, stdout length)`` from a `REPLY_HEADER`-byte
    reply header; ValueError if it is not one."""
    magic = head[:REPLY_STATUS_AT]
    if magic != REPLY_MAGIC:
        raise ValueError(f"not a cni-skel worker answer: {magic!r}")
    return (head[REPLY_STATUS_AT],
            int.from_bytes(head[REPLY_CODE_AT:REPLY_LENGTH_AT], "big"),
            int.from_bytes(head[REPLY_LENGTH_AT:REPLY_HEADER], "big"))


def status_name(status):
    """What reply ``status`` means, in words."""
    if 0 <= status < len(STATUS_NAMES):
        return STATUS_NAMES[status]
    return f"answer status {status}"

