"""Role prompts: versioned templates shipped in ``replan/llm/prompts/``.

One file per role and purpose (``planner.replan.md``)::

    ---
    version: 1
    ---
    ## system
    You are the planner ...
    ## user
    Goal, verbatim:
    {{goal}}

``{{name}}`` is replaced by ``ModelRequest.context[name]`` rendered as text
(tasks as lines with their status and results, findings as bullets, a
verdict with its trigger and evidence...); an empty value reads ``(none)``,
and a line whose placeholders all name keys missing from the context is
left out (``candidate {{candidate}} of {{candidates}}`` only shows when the
planner is asked for several candidates).

The registry is open: :meth:`PromptRegistry.register` and
:meth:`PromptRegistry.load_dir` add or override templates (explore runs add
``planner.hypotheses``, say).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Self, get_args

from .._errors import ConfigurationError
from ._port import Role
from ._values import render_value

ROLES: tuple[str, ...] = get_args(Role)
"""The roles a request can name (``ModelRequest.role``)."""

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_SECTION = re.compile(r"^## (system|user)\s*$", re.M)


class MissingPromptError(ConfigurationError):
    """No template is registered for a role and purpose."""

    def __init__(self, role: str, purpose: str) -> None:
        super().__init__(
            f"prompts.{role}.{purpose}",
            f"no prompt template for role {role!r} and purpose {purpose!r}: add "
            f"{role}.{purpose}.md with PromptRegistry.load_dir() or register() it",
        )
        self.role = role
        self.purpose = purpose


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """One role's prompt for one purpose."""

    role: str
    purpose: str
    version: int
    system: str
    user: str

    @property
    def label(self) -> str:
        """``planner.replan@2``: what the journal and telemetry record."""
        return f"{self.role}.{self.purpose}@{self.version}"

    @property
    def placeholders(self) -> set[str]:
        return set(_PLACEHOLDER.findall(self.system + self.user))

    def render(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chat messages for ``context``."""
        return self._render(context, {})

    def _render(
        self, context: Mapping[str, Any], texts: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """The chat messages, with ``texts[name]`` for ``{{name}}`` where
        given instead of its value's rendering (a shortened list)."""
        return [
            {"role": "system", "content": _fill(self.system, context, texts)},
            {"role": "user", "content": _fill(self.user, context, texts)},
        ]

    @classmethod
    def parse(cls, text: str, *, role: str, purpose: str) -> PromptTemplate:
        """Read a template file's text.

        Raises:
            ConfigurationError: no version header, or no system/user section.
        """
        where = f"prompts.{role}.{purpose}"
        header = re.match(r"\A---\n(.*?)\n---\n", text, re.S)
        if header is None:
            raise ConfigurationError(where, "a template starts with a --- header")
        fields = dict(
            line.split(":", 1) for line in header.group(1).splitlines() if ":" in line
        )
        try:
            version = int(fields["version"].strip())
        except (KeyError, ValueError):
            raise ConfigurationError(where, "the header needs `version: N`") from None
        parts = _SECTION.split(text[header.end() :])
        sections = dict(zip(parts[1::2], (p.strip() for p in parts[2::2]), strict=True))
        if set(sections) != {"system", "user"}:
            raise ConfigurationError(where, "a template has a ## system and a ## user")
        return cls(role, purpose, version, sections["system"], sections["user"])


class PromptRegistry:
    """Templates by (role, purpose); starts with the ones shipped in the package."""

    def __init__(
        self, templates: Iterable[PromptTemplate] = (), *, shipped: bool = True
    ):
        self._templates: dict[tuple[str, str], PromptTemplate] = {}
        if shipped:
            for entry in resources.files("replan.llm").joinpath("prompts").iterdir():
                if entry.name.endswith(".md"):
                    self._add_text(entry.name, entry.read_text(encoding="utf-8"))
        for template in templates:
            self.register(template)

    def register(self, template: PromptTemplate) -> None:
        """Add a template, replacing any for the same role and purpose."""
        self._templates[template.role, template.purpose] = template

    def load_dir(self, path: str | Path) -> Self:
        """Add every ``role.purpose.md`` file of a directory.

        Returns:
            The registry itself, so that
            ``OpenAIModel(prompts=PromptRegistry().load_dir(path))`` passes
            it with the templates loaded (not None: the shipped ones only).

        Raises:
            ConfigurationError: ``path`` is no directory, or a file in it
                cannot be read (UTF-8) or is no template of a role.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise ConfigurationError(
                "prompts", f"{str(folder)!r} is no directory of templates"
            )
        for file in sorted(folder.glob("*.md")):
            try:
                # utf-8-sig: an editor's byte order mark is no part of the text.
                text = file.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(
                    f"prompts.{file.stem}", f"cannot read {file}: {exc}"
                ) from None
            self._add_text(file.name, text)
        return self

    def get(self, role: str, purpose: str) -> PromptTemplate:
        """The template for ``role`` and ``purpose``.

        Raises:
            MissingPromptError: none is registered.
        """
        template = self._templates.get((role, purpose))
        if template is None:
            raise MissingPromptError(role, purpose)
        return template

    def for_request(
        self, role: str, purpose: str, context: Mapping[str, Any]
    ) -> PromptTemplate:
        """The template for a request: a run kind's own variant first.

        An explore run asks for ``critique``, ``compare`` and ``evolve`` like a
        plan run, about hypotheses instead of plans: its context says
        ``run_kind="explore"``, and ``reviewer.critique.explore`` is preferred
        over ``reviewer.critique`` when it exists.

        Raises:
            MissingPromptError: neither is registered.
        """
        kind = context.get("run_kind")
        if isinstance(kind, str) and kind:
            variant = self._templates.get((role, f"{purpose}.{kind}"))
            if variant is not None:
                return variant
        return self.get(role, purpose)

    def available(self) -> list[tuple[str, str]]:
        """The (role, purpose) pairs that have a template, sorted."""
        return sorted(self._templates)

    def _add_text(self, filename: str, text: str) -> None:
        stem = filename.removesuffix(".md")
        role, _, purpose = stem.partition(".")
        if not purpose:
            raise ConfigurationError(
                f"prompts.{stem}", "template files are named role.purpose.md"
            )
        if role not in ROLES:
            # No request would ever use it: a misspelt override is no override.
            raise ConfigurationError(
                f"prompts.{stem}",
                f"no role {role!r}; template files are named role.purpose.md, "
                f"the role one of {', '.join(ROLES)}",
            )
        self.register(PromptTemplate.parse(text, role=role, purpose=purpose))


def _fill(text: str, context: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return texts[name] if name in texts else render_value(context.get(name))

    kept = []
    for line in text.split("\n"):
        names = _PLACEHOLDER.findall(line)
        if names and not any(name in context for name in names):
            continue
        kept.append(_PLACEHOLDER.sub(value, line))
    return "\n".join(kept)
