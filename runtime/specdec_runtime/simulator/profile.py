"""The simulator's profile file: acceptance, step-time model, load schedule and optional faults.

The format is documented in runtime/README.md. YAML is the primary format; JSON is accepted because
it is a subset of YAML, but `.json` files are parsed with the json module so their errors point at
JSON syntax.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
# The requests a segment serves: (share of the requests that arrive, conditional acceptance per draft position)
# per kind of request, shares summing to 1. One kind when every request accepts alike.
RequestKinds = tuple[tuple[float, tuple[float, ...]], ...]


# The profiles shipped with the package; the launcher and the fleet driver resolve names here.
PACKAGED_PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
DEFAULT_PROFILE = "default"
_PROFILE_SUFFIXES = ("", ".yaml", ".yml", ".json")


class ProfileError(ValueError):
    """A profile file that cannot be read or does not match the format. The message names file and field."""


class StepTime(BaseModel):
    """Cost model of one engine step with K draft tokens and B running sequences:
    base_s + per_token_s*B*(K+1) + K*(draft_base_s + draft_per_token_s*B)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_s: float = Field(gt=0)
    per_token_s: float = Field(ge=0)
    draft_base_s: float = Field(default=0.0, ge=0)
    draft_per_token_s: float = Field(default=0.0, ge=0)

    def seconds(self, batch: int, k: int) -> float:
        return (
            self.base_s
            + self.per_token_s * batch * (k + 1)
            + k * (self.draft_base_s + self.draft_per_token_s * batch)
        )


class LoadSegment(BaseModel):
    """`concurrency` closed-loop clients for `duration_s`; `acceptance` overrides the profile's if set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    duration_s: float = Field(gt=0)
    concurrency: int = Field(ge=0)
    acceptance: list[Probability] | None = Field(default=None, min_length=1)

    @functools.cached_property
    def kinds(self) -> RequestKinds | None:
        """Every request alike at the segment's own acceptance; None: the profile's kinds."""
        return None if self.acceptance is None else ((1.0, tuple(self.acceptance)),)


class RequestKind(BaseModel):
    """Requests of one kind (code completion, open chat): `share` of the arriving requests, each accepting draft
    tokens with `acceptance`. Real traffic mixes kinds whose acceptance differs a lot, and a mean over drafts
    then depends on K: the kinds that accept little take more steps per token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(gt=0)
    acceptance: list[Probability] = Field(min_length=1)


class RequestShape(BaseModel):
    """Sizes of the synthetic requests, so token, request and KV-cache metrics move like vLLM's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(default=512, ge=1)
    output_tokens: int = Field(default=256, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    kv_cache_tokens: int = Field(default=524_288, ge=1)


class Faults(BaseModel):
    """Failures the canary tests inject, shown as vLLM would show them.

    error_rate: the fraction of requests that fail: the engine finishes that share of its requests
        with finished_reason="error" (vLLM's request-level failure, always answered 500), and the
        HTTP server answers that share of /v1 completions 500.
    slowdown: every engine step takes this many times as long (a slower kernel, a wrong attention
        backend): TPOT and inter-token latency grow by the factor at unchanged acceptance.
    unhealthy_after_s: /health turns 503 this long after loading finished.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    error_rate: float = Field(default=0.0, ge=0, le=1)
    slowdown: float = Field(default=1.0, gt=0, le=100)
    unhealthy_after_s: float | None = Field(default=None, ge=0)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    acceptance: list[Probability] | None = Field(default=None, min_length=1)
    request_kinds: list[RequestKind] | None = Field(default=None, min_length=2)
    step_time: StepTime
    load: list[LoadSegment] = Field(min_length=1)
    restart_s: float = Field(default=120.0, ge=0)
    replicas: int = Field(default=1, ge=1)
    requests: RequestShape = Field(default_factory=RequestShape)
    faults: Faults = Field(default_factory=Faults)

    @model_validator(mode="after")
    def _one_acceptance(self) -> Profile:
        if (self.acceptance is None) == (self.request_kinds is None):
            raise ValueError("set exactly one of acceptance (every request alike) and request_kinds")
        return self

    def step_seconds(self, batch: int, k: int) -> float:
        """Mean duration of one engine step, with the slowdown fault applied."""
        return self.step_time.seconds(batch, k) * self.faults.slowdown

    @property
    def cycle_s(self) -> float:
        return sum(segment.duration_s for segment in self.load)

    def segment_at(self, t: float) -> tuple[LoadSegment, float]:
        """The segment in force at absolute time t (the schedule repeats) and the absolute time it ends."""
        cycle = self.cycle_s
        cycle_start = (t // cycle) * cycle
        offset = t - cycle_start
        elapsed = 0.0
        for segment in self.load:
            elapsed += segment.duration_s
            if offset < elapsed:
                return segment, cycle_start + elapsed
        # Floating-point rounding can leave offset == cycle: that instant belongs to the next cycle's start.
        return self.load[0], cycle_start + cycle + self.load[0].duration_s

    def kinds_for(self, segment: LoadSegment) -> RequestKinds:
        """The kinds of request the segment serves; a segment's own `acceptance` makes every request alike.
        Asked at every engine step: both answers are computed once."""
        return segment.kinds if segment.kinds is not None else self._kinds

    @functools.cached_property
    def _kinds(self) -> RequestKinds:
        if self.acceptance is not None:
            return ((1.0, tuple(self.acceptance)),)
        kinds = self.request_kinds or []
        total = sum(kind.share for kind in kinds)
        return tuple((kind.share / total, tuple(kind.acceptance)) for kind in kinds)


def load_profile(path: Path | str) -> Profile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ProfileError(f"profile {path}: cannot read: {err.strerror or err}") from err
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ProfileError(f"profile {path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {err}") from err
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise ProfileError(f"profile {path}: field {field}: {first['msg']}{more}") from err


def resolve_profile(name: str, profiles_dir: Path = PACKAGED_PROFILES_DIR) -> Path:
    """A profile name (`bursty`, `bursty.yaml`) in profiles_dir, or a path to an existing file."""
    direct = Path(name)
    if direct.is_absolute() or direct.parent != Path("."):
        if direct.is_file():
            return direct
        raise ProfileError(f"profile {direct}: no such file")
    for suffix in _PROFILE_SUFFIXES:
        candidate = profiles_dir / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    raise ProfileError(f"profile {name!r}: not found in {profiles_dir}")
