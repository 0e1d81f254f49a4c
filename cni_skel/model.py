"""Pydantic base model with Go's JSON key matching.

Go's encoding/json matches object keys to struct fields exactly first, then
case-insensitively, and runtimes rely on it: containerd sends
``runtimeConfig.portMappings`` as ``HostPort``/``ContainerPort``/``Protocol``/
``HostIP``. Every model of a CNI document (config, result, capability args)
derives from `CNIModel` so that the same folding applies at every depth.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

__all__ = ["CNIModel", "validate_nested"]


class CNIModel(BaseModel):
    """Base of every wire model: camelCase aliases, case-insensitive keys.

    Unknown keys are kept (``model_extra``) and ignored, as the spec asks of
    plugin-specific keys. Serialise with ``model_dump(by_alias=True)``.
    """

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    _cni_exact: ClassVar[frozenset[str]] = frozenset()
    _cni_folded: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        exact = set()
        folded: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            exact.add(key)
            folded.setdefault(key.lower(), key)
        cls._cni_exact = frozenset(exact)
        cls._cni_folded = folded

    @model_validator(mode="before")
    @classmethod
    def _fold_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls._cni_folded:
            return data
        renamed = None
        for key in data:
            if not isinstance(key, str) or key in cls._cni_exact:
                continue
            target = cls._cni_folded.get(key.lower())
            if target is not None:  # the last of the spellings wins, as in Go
                if renamed is None:
                    renamed = {}
                renamed[key] = target
        if not renamed:
            return data
        return {renamed.get(k, k): v for k, v in data.items()}


def validate_nested(model: type[BaseModel], value: Any) -> None:
    """Validate ``value`` (a dict, None as ``{}``) against ``model`` for a
    field validator of an enclosing model, so that an error names the
    nested key: raises ValueError ``"<key.path>: <problem>"`` from the
    first error (the enclosing model's error then reads
    ``runtimeConfig: mac: ...``, which `cni_skel.skel` answers with code 7
    as any config error). Used where a section is kept as a raw dict (Go
    reads it late, by key) but must be refused early when malformed.
    """
    try:
        model.model_validate(value or {})
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None
