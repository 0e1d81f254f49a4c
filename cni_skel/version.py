"""CNI spec versions: the list we speak, parsing, comparison, negotiation.

Source: CNI spec 1.1.0 section "Version considerations"; Go pkg/version
(a config without cniVersion is 0.1.0; a plugin accepts a config only when it
lists that exact version). Stdlib only: the VERSION verb runs through here.
"""

from __future__ import annotations

import re

from .errors import ERR_DECODING_FAILURE, ERR_INCOMPATIBLE_CNI_VERSION, CNIError
from .warm.protocol import go_field

__all__ = [
    "ALL_VERSIONS",
    "CURRENT_VERSION",
    "check_supported",
    "config_version",
    "parse_version",
    "version_at_least",
]

#: Every spec version with a distinct wire contract, oldest first.
ALL_VERSIONS: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT_VERSION = "1.1.0"

_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def parse_version(version: str) -> tuple[int, int, int]:
    """``"1.0.0"`` -> ``(1, 0, 0)``.

    Raises:
        CNIError: code 6 (decoding failure) when the string is not ``X.Y.Z``.
    """
    m = _SEMVER.match(version) if isinstance(version, str) else None
    if m is None:
        raise CNIError(ERR_DECODING_FAILURE, f"invalid version {version!r}",
                       "a CNI version has the form MAJOR.MINOR.PATCH, e.g. \"1.1.0\"")
    return int(m[1]), int(m[2]), int(m[3])


def version_at_least(version: str, minimum: str) -> bool:
    """``version >= minimum``; code 6 if either is malformed."""
    return parse_version(version) >= parse_version(minimum)


def config_version(conf: dict) -> str:
    """The ``cniVersion`` of a decoded config: ``"0.1.0"`` when absent or empty.
    The key matches as Go and the config models match it (`go_field`:
    ``CNIVERSION`` too, the last one winning), so the version ADD checks is
    the one its result is written in.

    Raises:
        CNIError: code 6 when cniVersion is present but not a string.
    """
    v = go_field(conf, "cniVersion")  # CNIVERSION too, as the model and Go read it
    if v is None or v == "":
        return "0.1.0"
    if not isinstance(v, str):
        raise CNIError(ERR_DECODING_FAILURE, "decoding version from network config: "
                       f"cniVersion must be a string, got {v!r}")
    return v


def check_supported(version: str, supported: tuple[str, ...] | list[str]) -> None:
    """Reject a config version the plugin does not list (Go's reconciler).

    Raises:
        CNIError: code 1 ``incompatible CNI versions`` with details
            ``config is "X", plugin supports ["a" "b" ...]`` (Go's format).
    """
    if version not in supported:
        listed = " ".join(f'"{v}"' for v in supported)
        raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                       f'config is "{version}", plugin supports [{listed}]')
