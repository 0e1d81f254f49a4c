"""The warm path's wire format, limits and names: the one definition.

`cni_skel.warm.client` (the Python launcher), `cni_skel.warm.server` (the
worker), `cni_skel.warm.install` and `cni_skel.skel` take these from here;
the native launcher gets them from ``launcher_protocol.h``, which
`cni_skel.warm.install` generates from this module each time it compiles
``launcher.c``.

Every installed launcher runs this module on every call, VERSION included,
so it imports nothing (not even ``typing``): the Python launcher loads its
cached bytecode directly, without ``site`` or ``importlib``.

Wire format (all integers unsigned 32-bit big-endian), one request per
connection to the worker's unix stream socket:

    request: REQUEST_MAGIC len  then fields, each  len bytes:
             kind (KIND_RUN / KIND_PING); a run request has RUN_FIELDS:
             kind, ref, pythonpath (NUL-joined), cwd, umask (decimal),
             environment (NUL-joined K=V), stdin
             ancillary data on the first byte: fds [netns, mntns, stderr]
    reply:   REPLY_MAGIC status(1 byte) exit_code len  then stdout bytes
             (`REPLY_HEADER` bytes before stdout)

A reply's status says whether the plugin ran: `ST_DONE` (it ran, or the
worker answered for it with a spec error), `ST_PONG` (answer to a ping), or
one of `ST_UNKNOWN`, `ST_REFUSED`, `ST_BAD`: nothing ran, and the body says
why.

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

REQUEST_MAGIC = b"CSKQ"
REPLY_MAGIC = b"CSKR"
#: Request kinds (first field).
KIND_RUN, KIND_PING = b"run", b"ping"
#: Fields of a run request, kind included.
RUN_FIELDS = 7
#: Reply statuses.
ST_DONE, ST_UNKNOWN, ST_REFUSED, ST_BAD, ST_PONG = 0, 1, 2, 3, 4
#: What a status means, for the reason a launcher gives when nothing ran.
STATUS_NAMES = ("done", "unknown plugin", "refused", "bad request", "pong")
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


def _u32(n):
    return n.to_bytes(4, "big")


def encode_request(fields):
    """``fields`` (list of bytes) -> one framed request message (bytes)."""
    body = b"".join(_u32(len(f)) + f for f in fields)
    return REQUEST_MAGIC + _u32(len(body)) + body


def request_length(head):
    """The body length a `REQUEST_HEADER`-byte request header announces;
    ValueError if it is not one."""
    magic = head[:len(REQUEST_MAGIC)]
    if magic != REQUEST_MAGIC:
        raise ValueError(f"not a cni-skel request: {magic!r}")
    return int.from_bytes(head[len(REQUEST_MAGIC):REQUEST_HEADER], "big")


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

