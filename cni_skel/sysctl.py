"""Read and write sysctls under /proc/sys, safely.

Network sysctls (``net.*``) are per network namespace, and the kernel picks
the namespace of the *thread* that opens the file: to act on a container, call
these inside :meth:`cni_skel.netns.NetNS.enter`. Standard library only.

Keys are ``net.ipv4.ip_forward`` (dots become slashes) or
``net/ipv4/ip_forward`` (used as is). Interface names may contain dots
(``eth0.100``): use the slash form for those. Which keys a plugin may touch
(e.g. the tuning plugin's ``net.*``-only rule) is the caller's policy; this
module only guarantees the path stays inside /proc/sys. `read_sysctl` and
`write_sysctl` check where the file they opened resolves to (one readlink
of the open fd), not the path before opening it (a realpath walk, several
times the cost).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from typing import Any

from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError

__all__ = ["PROC_SYS", "enable_forward", "read_sysctl", "sysctl_path", "write_sysctl"]

PROC_SYS = "/proc/sys"


def _invalid(key: object, why: str) -> CNIError:
    return CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid sysctl key "{key}": {why}')


def sysctl_path(key: str) -> str:
    """The /proc/sys file for ``key``.

    A key containing ``/`` is a relative path as is; otherwise every ``.``
    separates components.

    Raises:
        CNIError: code 7 (naming the key) for a key that is not a string, is
            empty, absolute, contains NUL, empty / ``.`` / ``..`` components,
            or resolves (symlinks included) outside /proc/sys.
    """
    path = _lexical_path(key)
    if not _inside(os.path.realpath(path)):
        raise _invalid(key, "resolves outside /proc/sys")
    return path


def _inside(real: str) -> bool:
    return real != PROC_SYS and os.path.commonpath([real, PROC_SYS]) == PROC_SYS


def _lexical_path(key: str) -> str:
    """`sysctl_path` without resolving symlinks (code 7 as it)."""
    if not isinstance(key, str) or not key:
        raise _invalid(key, "empty")
    if "\0" in key:
        raise _invalid(key, "contains NUL")
    if key.startswith("/"):
        raise _invalid(key, "absolute paths are not allowed")
    parts = key.split("/") if "/" in key else key.split(".")
    for part in parts:
        if part in ("", ".", ".."):
            raise _invalid(key, "empty or relative path component")
    return os.path.join(PROC_SYS, *parts)


def _open(key: str, path: str, flags: int) -> int:
    """An fd on ``path``, checked to resolve inside /proc/sys (else closed,
    code 7). Raises OSError from open(2)."""
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)  # no /proc/self/fd: resolve the path
    if not _inside(real):
        os.close(fd)
        raise _invalid(key, "resolves outside /proc/sys")
    return fd


def _strerror(e: OSError) -> str:
    msg = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
    return msg[:1].lower() + msg[1:]


def read_sysctl(key: str) -> str:
    """The current value of ``key`` (whitespace-stripped), in this thread's netns.

    Raises:
        CNIError: 7 for an invalid key or EINVAL from the kernel; 999 for
            other errors (e.g. ENOENT: no such sysctl), naming the key.
    """
    path = _lexical_path(key)
    try:
        fd = _open(key, path, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
    except OSError as e:
        code = ERR_INVALID_NETWORK_CONFIG if e.errno == errno.EINVAL else ERR_INTERNAL
        raise CNIError(code, f'failed to read sysctl "{key}": {_strerror(e)}') from e
    return data.decode(errors="replace").strip()


def write_sysctl(key: str, value: str) -> None:
    """Write ``value`` (as is, one write(2)) to ``key``, in this thread's netns.

    Raises:
        CNIError: 7 for an invalid key or when the kernel rejects the value
            (EINVAL); 999 for other errors (ENOENT, EPERM, EACCES...), naming
            the key.
    """
    path = _lexical_path(key)
    data = str(value).encode()
    try:
        fd = _open(key, path, os.O_WRONLY)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CNIError(
                ERR_INVALID_NETWORK_CONFIG,
                f'failed to write sysctl "{key}" = "{value}": kernel rejected the value'
                f" ({_strerror(e)})",
            ) from e
        raise CNIError(
            ERR_INTERNAL, f'failed to write sysctl "{key}" = "{value}": {_strerror(e)}'
        ) from e
    if written != len(data):
        raise CNIError(
            ERR_INTERNAL,
            f'failed to write sysctl "{key}": short write ({written} of {len(data)} bytes)',
        )


FORWARD_KEYS = {4: "net/ipv4/ip_forward", 6: "net/ipv6/conf/all/forwarding"}


def _version(item: Any) -> int:
    if isinstance(item, int):
        return item
    address = getattr(item, "address", item)  # an IPConfig carries its address
    return int(address.version)


def enable_forward(ips: Iterable[Any]) -> None:
    """Turn on forwarding for each IP family present in ``ips``
    (``net.ipv4.ip_forward``, ``net.ipv6.conf.all.forwarding``), in this
    thread's netns: Go ``ip.EnableForward``. Items: a result's ``ips``
    (`cni_skel.types.IPConfig`), :mod:`ipaddress` addresses / interfaces /
    networks, or the versions 4 and 6. A knob already ``1`` is not written.

    Raises:
        CNIError: 999 naming the key when it can not be read or written
            (e.g. IPv6 disabled at boot: no such file); 7 for an item of
            another version than 4 or 6.
    """
    for version in sorted({_version(item) for item in ips}):
        key = FORWARD_KEYS.get(version)
        if key is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"no IP version {version} to forward")
        if read_sysctl(key) != "1":
            write_sysctl(key, "1")
