"""The base of every config model: strict (unknown keys are errors), immutable, and
finite (``.inf`` and ``.nan`` are refused wherever a number is expected)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
