"""CNI result types and their conversion between spec versions.

`Result` (with `Interface`, `IPConfig`, `Route`, `DNS`) is the current shape
(spec 1.1.0, also 1.0.0). `parse_result` reads a result of any version in
`SUPPORTED_VERSIONS`; `Result.to_version` / `Result.to_json` write any of them.
`ErrorResult` and `VersionResult` read the other answers a plugin prints.
`check_expressible` tells an ADD, before it changes anything, whether its
result can be written in the config's cniVersion (no IP: not in 0.1.0/0.2.0).

Loading this package loads `convert`, which registers the writers of every
version in `registry` (Go's pkg/types/internal/convert.go), where
`Result.to_version` finds them: no module here imports one that imports it.
"""

from __future__ import annotations

from .convert import (
    SUPPORTED_VERSIONS,
    ErrorResult,
    VersionResult,
    check_expressible,
    parse_result,
    result_to_version,
)
from .current import (
    CURRENT_VERSION,
    DNS,
    Interface,
    IPAddress,
    IPConfig,
    IPInterface,
    Result,
    Route,
)

__all__ = [
    "CURRENT_VERSION",
    "DNS",
    "SUPPORTED_VERSIONS",
    "ErrorResult",
    "IPAddress",
    "IPConfig",
    "IPInterface",
    "Interface",
    "Result",
    "Route",
    "VersionResult",
    "check_expressible",
    "parse_result",
    "result_to_version",
]
