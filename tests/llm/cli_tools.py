"""Tools that ``replan run --tool cli_tools:...`` loads in the CLI tests."""

from __future__ import annotations

from replan import tool

SENT: list[str] = []
"""The idempotency key of every email sent."""


@tool(side_effect=True)
def send_email(to: str, idempotency_key: str) -> str:
    """Email someone."""
    SENT.append(idempotency_key)
    return f"sent to {to}"


@tool
def search(query: str) -> str:
    """Search the trade press."""
    return f"two makers ship ({query})"


TOOLS = [send_email, search]
