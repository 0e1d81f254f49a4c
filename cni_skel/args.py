"""Typed CNI_ARGS: a plugin declares the keys it understands as a model.

Source: Go ``types.LoadArgs`` / ``types.CommonArgs``: keys are matched exactly
(``IP``, ``MAC``, ``K8S_POD_NAME``...), unknown keys are an error unless
``IgnoreUnknown`` is ``1``/``true`` (case-insensitive), values are parsed by
the field's type. Where Go answers code 999 we answer code 4: CNI_ARGS is an
environment variable and the spec's code for a bad one is 4.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .env import parse_cni_args
from .errors import ERR_INVALID_ENVIRONMENT_VARIABLES, CNIError

__all__ = [
    "ArgBool",
    "CNIArgs",
    "IPList",
    "K8sArgs",
    "MacAddress",
    "load_args",
]


def _arg_bool(value: Any) -> Any:
    if isinstance(value, str):
        low = value.lower()
        if low in ("1", "true"):
            return True
        if low in ("0", "false"):
            return False
        raise ValueError(f"invalid boolean {value!r} (use 1, true, 0 or false)")
    return value


#: Go's ``UnmarshallableBool``: 1/true/0/false in any case.
ArgBool = Annotated[bool, BeforeValidator(_arg_bool)]


def _mac(value: Any) -> Any:
    if isinstance(value, str):
        parts = value.replace("-", ":").split(":")
        if len(parts) != 6 or not all(len(p) == 2 for p in parts):
            raise ValueError(f"invalid MAC address {value!r}")
        try:
            octets = bytes(int(p, 16) for p in parts)
        except ValueError:
            raise ValueError(f"invalid MAC address {value!r}") from None
        return ":".join(f"{b:02x}" for b in octets)
    return value


#: A 48-bit MAC address, normalised to lower-case ``aa:bb:cc:dd:ee:ff``.
MacAddress = Annotated[str, BeforeValidator(_mac)]


def _ip_list(value: Any) -> Any:
    if isinstance(value, str):
        return [ipaddress.ip_address(v.strip()) for v in value.split(",") if v.strip()]
    return value


#: A comma-separated list of IP addresses (host-local's ``IP=a,b``).
IPList = Annotated[list[ipaddress.IPv4Address | ipaddress.IPv6Address], BeforeValidator(_ip_list)]


class CNIArgs(BaseModel):
    """Base of a plugin's CNI_ARGS model; declare keys as fields with their
    exact CNI_ARGS spelling as alias, e.g. ``ip: IPList = Field([], alias="IP")``."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    ignore_unknown: ArgBool = Field(False, alias="IgnoreUnknown")


M = TypeVar("M", bound="CNIArgs")


class K8sArgs(CNIArgs):
    """The keys kubelet/containerd send (CNI conventions)."""

    # Built when a plugin's args model (a subclass) is first used, not at import.
    model_config = ConfigDict(defer_build=True)

    k8s_pod_namespace: str = Field("", alias="K8S_POD_NAMESPACE")
    k8s_pod_name: str = Field("", alias="K8S_POD_NAME")
    k8s_pod_infra_container_id: str = Field("", alias="K8S_POD_INFRA_CONTAINER_ID")
    k8s_pod_uid: str = Field("", alias="K8S_POD_UID")


def load_args(raw: str, model: type[M]) -> M:
    """Parse CNI_ARGS into ``model``.

    Raises:
        CNIError: code 4 for a malformed pair, an unknown key without
            IgnoreUnknown (``CNI_ARGS: unknown args ["FOO=bar"]``), or a value
            its field rejects (naming the pair).
    """
    pairs = parse_cni_args(raw)
    keys = {f.alias or n: n for n, f in model.model_fields.items()}
    values: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in pairs:
        if key in keys:
            values[key] = value
        else:
            unknown.append(f"{key}={value}")
    try:
        parsed = model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "?"
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES,
                       f'CNI_ARGS: error parsing value of pair "{key}={values.get(key, "")}"',
                       err["msg"]) from None
    if unknown and not parsed.ignore_unknown:
        listed = " ".join(f'"{u}"' for u in unknown)
        raise CNIError(ERR_INVALID_ENVIRONMENT_VARIABLES, f"CNI_ARGS: unknown args [{listed}]")
    return parsed
