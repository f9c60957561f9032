"""Prices per model, turning token counts into cost."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._errors import ConfigurationError
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


def price_table(
    prices: Mapping[str, ModelPrice | Mapping[str, float]] | None,
) -> PriceTable | None:
    """``prices`` checked, each price a :class:`ModelPrice` (a mapping of its
    fields, as a JSON or TOML file gives it, is made into one).

    Raises:
        ConfigurationError: naming ``prices``, or the model and field
            (``prices.gpt-4o.input``) of a price that is none.
    """
    if prices is None:
        return None
    if not isinstance(prices, Mapping):
        raise ConfigurationError(
            "prices", f"must map model names to ModelPrice, not {prices!r}"
        )
    table: dict[str, ModelPrice] = {}
    for name, price in prices.items():
        if not isinstance(name, str):
            raise ConfigurationError("prices", f"a model name is text, not {name!r}")
        if isinstance(price, ModelPrice):
            table[name] = price
            continue
        if not isinstance(price, Mapping):
            raise ConfigurationError(
                f"prices.{name}",
                "must be a ModelPrice (input and output per million tokens), "
                f"not {price!r}",
            )
        try:
            table[name] = ModelPrice.model_validate(price)
        except ValidationError as exc:
            error = ConfigurationError.from_validation(exc)
            raise ConfigurationError(
                f"prices.{name}.{error.field}", error.problem
            ) from None
    return table


def priced(usage: TokenUsage, model: str, prices: PriceTable | None) -> TokenUsage:
    """``usage`` with its ``cost`` set from the price of ``model``."""
    if not prices or model not in prices:
        return usage
    return usage.model_copy(update={"cost": prices[model].cost(usage)})
