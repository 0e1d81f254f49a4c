"""Who a serving process serves: the caller's credentials and capabilities.

Checked before anything of a request is acted on:

* root peers only (SO_PEERCRED, `_peer_cred`); the socket is mode 0600
  (`cni_skel.warm.pool`);
* holding CAP_NET_ADMIN and CAP_SYS_ADMIN (`REQUIRED_CAPS`, read from
  /proc/<peer pid>/status: a worker in a container needs the host's PID
  namespace), as the worker itself must; otherwise the worker does nothing
  and answers "refused" with the reason, and the launcher falls back as
  installed (one-shot in its own process with the caller's privileges: the
  same answer as without a worker; or code 11);
* capabilities: the child drops to the caller's sets within the worker's
  own (the ceiling an operator set: the unit's CapabilityBoundingSet, the
  DaemonSet's capabilities) right after entering its namespaces, before it
  reads anything from the caller's mount namespace: bounding, permitted,
  effective, inheritable and ambient sets, and no_new_privs.

A serving process (`cni_skel.warm.serving`) runs these checks and the drop;
nothing here keeps state.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

__all__ = ["REQUIRED_CAPS"]

#: Capabilities a caller must hold (effective) to be served: CAP_NET_ADMIN
#: and CAP_SYS_ADMIN (setns), without which no CNI plugin can do its work.
REQUIRED_CAPS = {12: "CAP_NET_ADMIN", 21: "CAP_SYS_ADMIN"}


def _peer_cred(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


# --------------------------------------------------------------------------
# capabilities: the child drops to the launcher's

_CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 24, 38, 47
_PR_CAP_AMBIENT_RAISE, _PR_CAP_AMBIENT_CLEAR_ALL = 2, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _caps(pid: int | str, status_fd: int | None = None) -> dict[str, int]:
    """The capability sets (bit masks) and no_new_privs of process ``pid``
    (``"self"``), from /proc/<pid>/status (``status_fd``: that file, kept
    open by the caller, read again from its start)."""
    if status_fd is not None:
        text = os.pread(status_fd, 65536, 0)
    else:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 65536)  # one read: the kernel renders it whole (~1.5 KiB)
        finally:
            os.close(fd)
    out: dict[str, int] = {}
    for key in _CAP_FIELDS:
        start = text.find(b"\n" + key.encode() + b":")
        if start < 0:
            raise OSError(f"/proc/{pid}/status lacks {key}")
        start += len(key) + 2
        end = text.find(b"\n", start)
        out[key] = int(text[start:end if end >= 0 else None], 16 if key[:3] == "Cap" else 10)
    return out


def _caps_within(peer: dict[str, int], own: dict[str, int]) -> dict[str, int]:
    """The sets a child runs a request with: the caller's, within the
    worker's own (each set ANDed; no_new_privs when either has it). The
    worker's sets are the ceiling an operator chose (a systemd
    CapabilityBoundingSet, the DaemonSet's capabilities)."""
    out = {key: peer[key] & own[key] for key in _CAP_FIELDS[:5]}
    out["NoNewPrivs"] = int(bool(peer["NoNewPrivs"] or own["NoNewPrivs"]))
    return out


def _drop_caps(peer: dict[str, int], own: dict[str, int]) -> None:
    """Make this process's capability sets ``peer``'s (a subset of ``own``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong)
    prctl.restype = ctypes.c_int

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    # The bounding set first: dropping from it needs CAP_SETPCAP, which capset may remove.
    for cap in range(64):
        if own["CapBnd"] >> cap & 1 and not peer["CapBnd"] >> cap & 1:
            check(prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} "
                                                         "from the bounding set")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    for i in range(2):
        shift = 32 * i
        data[i].effective = peer["CapEff"] >> shift & 0xFFFFFFFF
        data[i].permitted = peer["CapPrm"] >> shift & 0xFFFFFFFF
        data[i].inheritable = peer["CapInh"] >> shift & 0xFFFFFFFF
    header = Header(_LINUX_CAPABILITY_VERSION_3, 0)
    check(libc.capset(ctypes.byref(header), data), "capset")
    if own["CapAmb"] or peer["CapAmb"]:
        check(prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient")
        for cap in range(64):
            if peer["CapAmb"] >> cap & 1:
                check(prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap, 0, 0),
                      f"raising ambient capability {cap}")
    if peer["NoNewPrivs"] and not own["NoNewPrivs"]:
        check(prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


class _Refused(Exception):
    """The caller is not served by the worker (the message says why)."""


def _caller_caps(peer_pid: int, own: dict[str, int]) -> dict[str, int]:
    """The caller's capability sets (``peer_pid``: root by SO_PEERCRED),
    when it may be served by a process holding ``own``. Raises `_Refused`
    when we cannot read its sets (no shared PID namespace: a DaemonSet needs
    hostPID), or it or the worker lacks `REQUIRED_CAPS`."""
    try:
        peer = _caps(peer_pid)
    except (OSError, ValueError) as exc:
        raise _Refused(f"cannot read the caller's capabilities (pid {peer_pid}): {exc}") \
            from None
    missing = [name for bit, name in REQUIRED_CAPS.items() if not peer["CapEff"] >> bit & 1]
    if missing:
        raise _Refused(f"the caller (pid {peer_pid}) lacks {' and '.join(missing)}")
    missing = [name for bit, name in REQUIRED_CAPS.items() if not own["CapEff"] >> bit & 1]
    if missing:
        raise _Refused(f"this worker lacks {' and '.join(missing)}")
    return peer
