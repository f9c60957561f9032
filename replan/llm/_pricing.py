"""Prices per model, turning token counts into cost."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..messages import TokenUsage


class ModelPrice(BaseModel):
    """What one model costs, per million tokens (in any one currency).

    Prices must be finite: an infinite one would give every call a cost no
    journal can store.
    """

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    """Price of input tokens served from the prompt cache (``input`` if None)."""

    def cost(self, usage: TokenUsage) -> float:
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            (usage.input_tokens - cached) * self.input
            + cached * cached_price
            + usage.output_tokens * self.output
        ) / 1_000_000


PriceTable = Mapping[str, ModelPrice]
"""Model name -> price. A model missing from the table costs 0."""


def priced(usage: TokenUsage, model: str, prices: PriceTable | None) -> TokenUsage:
    """``usage`` with its ``cost`` set from the price of ``model``."""
    if not prices or model not in prices:
        return usage
    return usage.model_copy(update={"cost": prices[model].cost(usage)})
