"""The base class of every RLJob spec model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    """Base: camelCase field names as in Kubernetes manifests; unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)
