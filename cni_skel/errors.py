"""CNI error codes and the typed error every layer raises.

Source: CNI spec 1.1.0, section "Error"; the Go SDK (pkg/types) adds code 8
(invalid netns) and 999 (internal). Kept free of heavy imports: the error path
runs on every failed call, including before any config is parsed.
"""

from __future__ import annotations

__all__ = [
    "ERR_DECODING_FAILURE",
    "ERR_INCOMPATIBLE_CNI_VERSION",
    "ERR_INTERNAL",
    "ERR_INVALID_ENVIRONMENT_VARIABLES",
    "ERR_INVALID_NETNS",
    "ERR_INVALID_NETWORK_CONFIG",
    "ERR_IO_FAILURE",
    "ERR_LIMITED_CONNECTIVITY",
    "ERR_PLUGIN_NOT_AVAILABLE",
    "ERR_TRY_AGAIN_LATER",
    "ERR_UNKNOWN_CONTAINER",
    "ERR_UNSUPPORTED_FIELD",
    "CNIError",
]

ERR_INCOMPATIBLE_CNI_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENVIRONMENT_VARIABLES = 4
ERR_IO_FAILURE = 5
ERR_DECODING_FAILURE = 6
ERR_INVALID_NETWORK_CONFIG = 7
ERR_INVALID_NETNS = 8
ERR_TRY_AGAIN_LATER = 11
ERR_PLUGIN_NOT_AVAILABLE = 50
ERR_LIMITED_CONNECTIVITY = 51
ERR_INTERNAL = 999


class CNIError(Exception):
    """A CNI error: printed by the skel as the spec's Error object on stdout.

    Attributes:
        code: spec error code (0-99 reserved, 100+ plugin specific).
        msg: short message.
        details: longer explanation, "" when none.
        stderr: for errors raised by `cni_skel.invoke`, what the failing plugin
            wrote to stderr ("" otherwise).

    Raise it from plugin code to choose the code; any other exception becomes
    code 999 (as the Go skel does).
    """

    def __init__(self, code: int, msg: str, details: str = "", *, stderr: str = "") -> None:
        super().__init__(code, msg, details)
        self.code = int(code)
        self.msg = str(msg)
        self.details = str(details or "")
        self.stderr = stderr

    def __str__(self) -> str:
        return f"{self.msg}; {self.details}" if self.details else self.msg

    def __repr__(self) -> str:
        return f"CNIError(code={self.code}, msg={self.msg!r}, details={self.details!r})"

    def to_dict(self, cni_version: str | None = None) -> dict:
        """The spec Error object: ``{cniVersion?, code, msg, details?}``."""
        out: dict = {}
        if cni_version:
            out["cniVersion"] = cni_version
        out["code"] = self.code
        out["msg"] = self.msg
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_dict(cls, data: dict, *, stderr: str = "") -> CNIError:
        """Build from a decoded Error object (as a delegated plugin printed it)."""
        code = data.get("code")
        try:
            code = int(code)
        except (TypeError, ValueError):
            code = ERR_INTERNAL
        return cls(code, str(data.get("msg", "")), str(data.get("details", "") or ""),
                   stderr=stderr)
