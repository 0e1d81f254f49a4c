"""The result converters, registered by version (Go's pkg/types/internal/convert.go).

Go's libcni keeps its result converters in a registry that imports no version
package: each version package calls ``RegisterConverter`` from its ``init()``,
and ``Convert`` looks the pair of versions up. The same here, so that the
current `Result` can write any version without importing the module that
knows the older shapes (which imports it):

* `cni_skel.types.current` (the hub) calls `convert` from `Result.to_version`;
* `cni_skel.types.convert` registers one writer per group of versions when it
  loads (1.0.0/1.1.0, 0.3.0/0.3.1/0.4.0, 0.1.0/0.2.0).

Every conversion starts from the current `Result`, so a converter is keyed by
its target version alone (Go keys it by source and target). Importing any
module of `cni_skel.types` loads the package, whose ``__init__`` loads
`cni_skel.types.convert`: a `Result` never exists before its writers do, as a
Go result type never exists before the ``init()`` of its package has run.

This module imports nothing of `cni_skel.types`; it is internal (not in
``cni_skel.PUBLIC_MODULES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ERR_INCOMPATIBLE_CNI_VERSION, CNIError

__all__ = ["ConvertFn", "convert", "register_converter", "unsupported_version"]

ConvertFn = Callable[[Any, str], dict]
"""A writer: ``fn(result, version) -> dict``, the current `Result` as a
JSON-ready dict in the wire shape of ``version`` (one of the versions it was
registered for); raises `CNIError` when the result cannot be expressed there.
Go's ``ConvertFn``."""

_converters: dict[str, ConvertFn] = {}


def unsupported_version(version: str) -> CNIError:
    """The error for a target version no converter writes: code 1
    (incompatible CNI version), msg ``incompatible CNI versions``, details
    ``cannot convert result to unsupported version "V"``. Go's ``Convert``
    answers ``no converter for CNI result version A to B`` (code 999)."""
    return CNIError(
        ERR_INCOMPATIBLE_CNI_VERSION,
        "incompatible CNI versions",
        f'cannot convert result to unsupported version "{version}"',
    )


def register_converter(to_versions: Iterable[str], convert_fn: ConvertFn) -> None:
    """Register ``convert_fn`` as the writer of each of ``to_versions``.

    Called once per group of versions by the module that knows their shape,
    when it loads (Go's ``RegisterConverter``, from ``init()``). Raises
    ValueError when one of the versions has a writer already (Go panics): a
    bug, and nothing is registered then.
    """
    versions = tuple(to_versions)
    taken = [v for v in versions if v in _converters]
    if taken:
        raise ValueError(f"converter already registered for {', '.join(taken)}")
    for version in versions:
        _converters[version] = convert_fn


def convert(result: Any, version: str) -> dict:
    """``result`` (the current `Result`) as a JSON-ready dict in the wire
    shape of ``version``, written by the converter registered for it (Go's
    ``Convert``).

    Raises `CNIError` code 1: `unsupported_version` when no converter is
    registered for ``version``; else whatever the converter raises (0.1.0 and
    0.2.0: a result without an IP address, see `check_expressible`).
    """
    convert_fn = _converters.get(version)
    if convert_fn is None:
        raise unsupported_version(version)
    return convert_fn(result, version)
