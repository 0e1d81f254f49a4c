"""The answer contract: what one plugin call must print and exit with.

Spec 1.1.0 section 1 ("Protocol") and section 2 ("Errors"), the rules
every call obeys whatever its input:

* stdout is empty or exactly one JSON object, never a traceback;
* exit 0 and no Error object, or a non-zero exit and one Error object
  (``code`` an integer > 0, ``msg`` a string);
* a successful ADD prints a result valid in the config's ``cniVersion``
  (section 4); a successful DEL, CHECK, GC or STATUS prints nothing;
  VERSION prints a version object; an unknown ``CNI_COMMAND`` is code 4.

`answer_contract` names every rule a `Call` breaks, each as a `Breach`
whose ``rule`` is a stable slug (``exit-0-with-error-object``, ...): the
conformance checks, the project's fuzz contract and a plugin author's own
tests share these names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import CNIError
from ..types import parse_result
from ..version import ALL_VERSIONS, config_version

__all__ = ["SPEC_VERBS", "TRACEBACK", "Breach", "Call", "answer_contract", "error_of",
           "result_version"]

#: The verbs of spec 1.1.0 section 1.
SPEC_VERBS = ("ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS")
TRACEBACK = "Traceback (most recent call last)"
#: A Go runtime panic on stderr (a plugin crashed rather than answered).
_GO_PANIC = re.compile(r"^panic: ", re.M)


@dataclass
class Call:
    """What one plugin call answered: ``exit_code`` (None: it timed out),
    raw ``stdout``, ``stderr`` text, wall ``seconds``."""

    exit_code: int | None
    stdout: bytes
    stderr: str
    seconds: float

    @property
    def doc(self) -> Any:
        """stdout decoded as JSON, or None (empty or not JSON)."""
        try:
            return json.loads(self.stdout)
        except ValueError:
            return None

    def brief(self) -> str:
        """One line for a report: exit status, stdout, stderr's last line."""
        out = self.stdout.decode("utf-8", "replace").strip().replace("\n", " ")
        out = re.sub(r"\s+", " ", out)
        err = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
        status = "timed out" if self.exit_code is None else f"exit {self.exit_code}"
        return (f"{status}, stdout {out[:400]!r}"
                + (f", stderr ends {err[0][:200]!r}" if err else ""))


class Breach(NamedTuple):
    """One broken rule: ``rule`` (a slug) and what showed it."""

    rule: str
    detail: str


def error_of(call: Call) -> dict[str, Any] | None:
    """The Error object ``call`` printed (a dict with ``code``), or None."""
    doc = call.doc
    return doc if isinstance(doc, dict) and "code" in doc else None


def result_version(stdin: bytes) -> str | None:
    """The cniVersion a result for config ``stdin`` must be written in
    (`cni_skel.version.config_version`: 0.1.0 when absent, the key matched
    as Go matches it), or None when stdin is no config object or names no
    version this SDK knows."""
    try:
        doc = json.loads(stdin)
        v = config_version(doc) if isinstance(doc, dict) else None
    except (ValueError, RecursionError, CNIError):
        return None
    return v if v in ALL_VERSIONS else None


def answer_contract(call: Call, verb: str, stdin: bytes, *,
                    timeout: float | None = None) -> list[Breach]:
    """Every rule of the answer contract ``call`` breaks.

    ``verb`` is what the plugin was asked: a spec verb, ``"about"``
    (CNI_COMMAND unset: a person asking) or ``"unknown"``; ``stdin`` the
    config it got (the cniVersion its ADD result must be in). Rules, by
    slug: ``call-timed-out``, ``traceback-on-stdout``,
    ``stdout-not-one-json-object``, ``exit-0-with-error-object``,
    ``add-success-without-result``, ``add-result-invalid``,
    ``add-result-wrong-version``, ``version-answer-invalid``,
    ``unknown-command-succeeded``, ``<verb>-printed-on-success``,
    ``error-without-error-object``, ``uncaught-exception-<code>`` (an
    Error object, but a Python traceback or a Go panic on stderr),
    ``unknown-command-not-code-4``.
    """
    if call.exit_code is None:
        bound = f" within {timeout:.0f} s" if timeout is not None else ""
        return [Breach("call-timed-out", f"no answer{bound}")]
    found: list[Breach] = []
    out = call.stdout
    if TRACEBACK.encode() in out:
        found.append(Breach("traceback-on-stdout", call.brief()))
    doc: Any = None
    if out.strip():
        doc = call.doc
        if not isinstance(doc, dict):
            found.append(Breach("stdout-not-one-json-object", call.brief()))
            return found
    is_error = isinstance(doc, dict) and "code" in doc
    if call.exit_code == 0:
        if is_error:
            found.append(Breach("exit-0-with-error-object", call.brief()))
        elif verb == "ADD":
            found += _result_breaches(doc, stdin, call)
        elif verb == "VERSION":
            if not (isinstance(doc, dict) and isinstance(doc.get("cniVersion"), str)
                    and isinstance(doc.get("supportedVersions"), list)):
                found.append(Breach("version-answer-invalid", call.brief()))
        elif verb == "unknown":
            found.append(Breach("unknown-command-succeeded", call.brief()))
        elif out.strip():
            found.append(Breach(f"{verb.lower()}-printed-on-success", call.brief()))
        return found
    assert isinstance(doc, dict) or doc is None
    code = doc.get("code") if doc is not None and is_error else None
    if not (is_error and type(code) is int and code > 0 and isinstance(doc.get("msg"), str)):
        found.append(Breach("error-without-error-object", call.brief()))
        return found
    if TRACEBACK in call.stderr or _GO_PANIC.search(call.stderr):
        last = call.stderr.strip().splitlines()[-1]
        found.append(Breach(f"uncaught-exception-{code}", f"{call.brief()}; {last[:300]}"))
    if verb == "unknown" and code != 4:
        found.append(Breach("unknown-command-not-code-4", call.brief()))
    return found


def _result_breaches(doc: Any, stdin: bytes, call: Call) -> list[Breach]:
    if not isinstance(doc, dict):
        return [Breach("add-success-without-result", call.brief())]
    want = result_version(stdin)
    try:
        parse_result(doc, want)
    except Exception as exc:
        return [Breach("add-result-invalid", f"{call.brief()}: {exc}")]
    if want is not None and doc.get("cniVersion") != want:
        return [Breach("add-result-wrong-version",
                       f"config {want}, result {doc.get('cniVersion')}")]
    return []
