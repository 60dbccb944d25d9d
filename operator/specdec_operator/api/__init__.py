"""The SpeculativeModel API: pydantic models that are the single source of the CRD schema."""

from specdec_operator.api.spec import SpeculativeModelSpec
from specdec_operator.api.status import SpeculativeModelStatus

__all__ = ["SpeculativeModelSpec", "SpeculativeModelStatus"]
