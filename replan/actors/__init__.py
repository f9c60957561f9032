"""The six actors and the small runtime they share."""

from __future__ import annotations

from ._runtime import Actor as Actor
from ._runtime import ActorContext as ActorContext
from ._runtime import ActorPool as ActorPool
from ._runtime import Envelope as Envelope
from ._runtime import PoolStatistics as PoolStatistics
from ._runtime import ReplySlot as ReplySlot

__all__ = (
    "Actor",
    "ActorContext",
    "ActorPool",
    "Envelope",
    "PoolStatistics",
    "ReplySlot",
)
