"""Whether an object's labels match a Kubernetes label selector string (pure).

The API server applies SPECDEC_MODEL_SELECTOR to the operator's watch, so models outside it are never listed.
A model relabelled out of it is still ours for a moment: kopf stops its loop only when the watch says it left,
and a pass in flight may meanwhile read the relabelled object from the API server (a 409's re-read). That pass
must not act on a model another shard now owns; it checks the labels it is about to act on with this.

The grammar is the API server's: comma-separated requirements, each `key=value`, `key==value`, `key!=value`,
`key in (v1,v2)`, `key notin (v1)`, `key` (exists) or `!key` (does not exist). As there, `!=` and `notin` also
match an object without the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

_SET = re.compile(r"^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)$")
_EXISTS = re.compile(r"^(?P<not>!?)\s*(?P<key>[^\s!=(),]+)$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # in, notin, exists, !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


def _terms(selector: str) -> list[str]:
    """Split on the commas that are not inside a value set's parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            raise ValueError(f"label selector {selector!r}: unbalanced ')'")
        current += char
    if depth != 0:
        raise ValueError(f"label selector {selector!r}: unbalanced '('")
    return [*terms, current]


@lru_cache(maxsize=16)  # an install has one selector; every reconcile pass asks for it
def parse(selector: str) -> tuple[Requirement, ...]:
    """The selector's requirements; ValueError naming the requirement that does not parse. Empty: everything."""
    if not selector.strip():
        return ()
    requirements = []
    for raw in _terms(selector):
        term = raw.strip()
        if found := _SET.match(term):
            values = frozenset(v.strip() for v in found["values"].split(",") if v.strip())
            requirements.append(Requirement(found["key"], found["op"], values))
        elif found := _EQUALITY.match(term):
            operator = "notin" if found["op"] == "!=" else "in"
            requirements.append(Requirement(found["key"], operator, frozenset([found["value"]])))
        elif found := _EXISTS.match(term):
            requirements.append(Requirement(found["key"], "!exists" if found["not"] else "exists"))
        else:
            raise ValueError(f"label selector {selector!r}: cannot parse requirement {term!r}")
    return tuple(requirements)


def matches(selector: str, labels: Mapping[str, str] | None) -> bool:
    """Whether labels satisfy every requirement of the selector (an empty selector matches everything)."""
    return all(requirement.matches(labels or {}) for requirement in parse(selector))
