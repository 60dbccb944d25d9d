"""`spec.runtime.resources`: refused at admission exactly where the API server would refuse the container.

Mirrors k8s.io/kubernetes v1.36 ValidateContainerResourceRequirements: resource names, non-negative
quantities, whole numbers for extended resources, requests within limits (equal to them for resources
that cannot be overcommitted), and hugepages sizes. amd.com/gpu belongs to the operator. Its rule that
hugepages need a cpu or memory request is met by the container the operator renders, which always
requests both (derived when not set here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict, JsonValue

from specdec_operator.api.base import ApiModel, cel
from specdec_operator.api.kubeformats import QUALIFIED_NAME, is_quantity, quantity_value

GPU_RESOURCE = "amd.com/gpu"
_STANDARD = ("cpu", "memory", "ephemeral-storage")
_HUGEPAGES = "hugepages-"
_MAPS = ("requests", "limits")
_FIELD = "spec.runtime.resources"


def _quantity_values(which: str) -> object:
    message = f"{_FIELD}.{which} values must be non-negative quantities such as 8, 500m or 64Gi"
    extra: JsonDict = {"x-kubernetes-validations": [cel("isQuantity(self) && sign(quantity(self)) >= 0", message)]}
    return Field(max_length=64, json_schema_extra=extra)


# CEL spellings of the resource classes (k is the resource name).
_EXTENDED = "(k.contains('/') && !k.contains('kubernetes.io/'))"
_OVERCOMMIT = f"(!{_EXTENDED} && !k.startsWith('{_HUGEPAGES}'))"


def _name_message(which: str) -> str:
    return (
        f"{_FIELD}.{which} keys must be cpu, memory, ephemeral-storage, hugepages-<page size> or an extended "
        "resource such as example.com/device"
    )


def _gpu_message(which: str) -> str:
    return f"{_FIELD}.{which} may not set {GPU_RESOURCE}: the operator requests spec.model.tensorParallelSize GPUs"


def _integer_message(which: str) -> str:
    return f"{_FIELD}.{which}: extended resources such as example.com/device take whole numbers"


def _hugepages_message(which: str) -> str:
    return f"{_FIELD}.{which}: a hugepages-<size> amount must be a whole multiple of a positive whole page size"


_WITHIN_LIMITS = (
    f"{_FIELD}.requests must not exceed {_FIELD}.limits, and must equal them for extended resources and hugepages"
)
_LIMIT_REQUIRED = f"{_FIELD}.limits must be set for every extended resource and hugepages size that is requested"


def _per_map_rules(which: str) -> list[JsonDict]:
    m = f"self.{which}"
    qualified = QUALIFIED_NAME.cel("k")
    name_ok = (
        f"k in {list(_STANDARD)} || (k.startsWith('{_HUGEPAGES}') && {qualified} && isQuantity(k.substring(10))) "
        f"|| (k.contains('/') && {qualified} && !k.startsWith('requests.') && k.matches('^[^/]{{1,244}}/'))"
    )
    page = "quantity(k.substring(10))"
    amount = f"quantity({m}[k])"
    return [
        cel(f"!has({m}) || {m}.all(k, {name_ok})", _name_message(which)),
        cel(f"!has({m}) || !('{GPU_RESOURCE}' in {m})", _gpu_message(which)),
        cel(
            f"!has({m}) || {m}.all(k, !{_EXTENDED} || !isQuantity({m}[k]) || {amount}.isInteger())",
            _integer_message(which),
        ),
        cel(
            f"!has({m}) || {m}.all(k, !k.startsWith('{_HUGEPAGES}') || !isQuantity(k.substring(10)) "
            f"|| !isQuantity({m}[k]) || ({page}.isInteger() && {page}.asInteger() > 0 && {amount}.isInteger() "
            f"&& {amount}.asInteger() % {page}.asInteger() == 0))",
            _hugepages_message(which),
        ),
    ]


_RULES: list[JsonValue] = [
    *_per_map_rules("requests"),
    *_per_map_rules("limits"),
    cel(
        "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) "
        f"|| !isQuantity(self.requests[k]) || !isQuantity(self.limits[k]) || ({_OVERCOMMIT} ? "
        "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0 : "
        "quantity(self.requests[k]).compareTo(quantity(self.limits[k])) == 0))",
        _WITHIN_LIMITS,
    ),
    cel(
        f"!has(self.requests) || self.requests.all(k, {_OVERCOMMIT} || (has(self.limits) && k in self.limits))",
        _LIMIT_REQUIRED,
    ),
]


def _extended(name: str) -> bool:
    return "/" in name and "kubernetes.io/" not in name


def _overcommit(name: str) -> bool:
    return not _extended(name) and not name.startswith(_HUGEPAGES)


def _name_valid(name: str) -> bool:
    hugepages = name.startswith(_HUGEPAGES) and QUALIFIED_NAME.valid(name) and is_quantity(name[len(_HUGEPAGES) :])
    prefix = name.split("/", 1)[0]
    extended = (
        "/" in name and QUALIFIED_NAME.valid(name) and not name.startswith("requests.") and 1 <= len(prefix) <= 244
    )
    return name in _STANDARD or hugepages or extended


def _hugepages_valid(name: str, amount: str) -> bool:
    page_size = name[len(_HUGEPAGES) :]
    if not (is_quantity(page_size) and is_quantity(amount)):
        return True  # another rule names the problem
    page, value = quantity_value(page_size), quantity_value(amount)
    return page.denominator == 1 and page > 0 and value.denominator == 1 and value % page == 0


def _map_problem(which: str, resources: Mapping[str, str]) -> str | None:
    if not all(_name_valid(name) for name in resources):
        return _name_message(which)
    if GPU_RESOURCE in resources:
        return _gpu_message(which)
    if any(_extended(k) and is_quantity(v) and quantity_value(v).denominator != 1 for k, v in resources.items()):
        return _integer_message(which)
    if not all(_hugepages_valid(k, v) for k, v in resources.items() if k.startswith(_HUGEPAGES)):
        return _hugepages_message(which)
    return None


def resources_problem(requests: Mapping[str, str], limits: Mapping[str, str]) -> str | None:
    """The first rule of `_RULES` the pair breaks, in its exact words, or None."""
    for which, resources in zip(_MAPS, (requests, limits), strict=True):
        if (problem := _map_problem(which, resources)) is not None:
            return problem
    for name, request in requests.items():
        limit = limits.get(name)
        if limit is None or not (is_quantity(request) and is_quantity(limit)):
            continue
        asked, allowed = quantity_value(request), quantity_value(limit)
        if asked > allowed or (not _overcommit(name) and asked != allowed):
            return _WITHIN_LIMITS
    if any(not _overcommit(name) and name not in limits for name in requests):
        return _LIMIT_REQUIRED
    return None


class Resources(ApiModel):
    """Container resources over the derived cpu and memory defaults (render/podspec.py container_resources).
    amd.com/gpu is the operator's: it requests spec.model.tensorParallelSize."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _RULES})

    requests: dict[str, Annotated[str, _quantity_values("requests")]] = Field(
        default_factory=dict, max_length=16, description="Resource requests, e.g. cpu: '8'."
    )
    limits: dict[str, Annotated[str, _quantity_values("limits")]] = Field(
        default_factory=dict, max_length=16, description="Resource limits, e.g. memory: 256Gi."
    )

    @model_validator(mode="after")
    def _valid(self) -> Resources:
        for which, resources in zip(_MAPS, (self.requests, self.limits), strict=True):
            for value in resources.values():
                if not (is_quantity(value) and quantity_value(value) >= 0):
                    raise ValueError(
                        f"{_FIELD}.{which} values must be non-negative quantities such as 8, 500m or 64Gi"
                    )
        problem = resources_problem(self.requests, self.limits)
        if problem is not None:
            raise ValueError(problem)
        return self
