from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, Self, TypeVar, Union, cast, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from .._errors import ConfigurationError

READING_JOURNAL: ContextVar[bool] = ContextVar("replan_reading_journal", default=False)
"""Set while an event is read back from a journal (``read_event``): checks
added to a message after journals were written skip what they hold. A
context variable, not pydantic's validation context, which does not reach
the models that define their own ``__init__`` (:class:`Settings`)."""


class Frozen(BaseModel):
    """Base of every message: immutable, strict about unknown fields.

    Numbers must be finite: JSON has no NaN or infinity, so a journal would
    store ``null`` and the run could never be read back.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def evolve(self, **changes: Any) -> Self:
        """A copy with ``changes``, like ``model_copy(update=changes)``.

        Nothing is validated (as with ``model_copy``): the values must be of
        the fields' types. A frozen message has no extra fields and no private
        attributes, so the copy is one dict; run-state folding makes one per
        event, where ``model_copy``'s general machinery costs several times
        more.
        """
        copy = _new(type(self))
        fields = self.__dict__.copy()
        fields.update(changes)
        _set_dict(copy, fields)
        given = self.__pydantic_fields_set__
        # The changed fields are nearly always set already, once a model has
        # been evolved before: the copy shares the set object.
        _set_fields_set(
            copy, given if changes.keys() <= given else _union(given, changes)
        )
        _set_extra(copy, None)
        _set_private(copy, None)
        return copy

    def check_storable(self) -> None:
        """Refuse a message the journal could not store: every string must
        encode as UTF-8.

        JSON may carry a lone UTF-16 surrogate (``"\\udfff"``); Python's
        ``json`` module decodes it and pydantic keeps it, but no UTF-8
        journal can write it.

        Raises:
            ConfigurationError: naming the field of the first such string or
                key (``context.0``, ``metadata.notes``, ``tasks.1.description``).
        """
        _check_storable(self)


_FIELDS_SETS: dict[frozenset[str], set[str]] = {}
"""One set object per distinct combination of set fields.

A frozen model's fields set is never changed in place (``model_copy`` copies
it before adding to it), so copies can share one: a run's state keeps every
task of every plan version alive, each with its own set otherwise."""

# A copy's slots are set through their descriptors: ``object.__setattr__``
# looks each one up by name first, on every copy.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _interned(names: set[str]) -> set[str]:
    key = frozenset(names)
    shared = _FIELDS_SETS.get(key)
    if shared is None:
        shared = _FIELDS_SETS[key] = names
    return shared


_UNIONS: dict[tuple[object, ...], tuple[set[str], set[str]]] = {}
"""(id of a fields set, names an evolve sets) -> (that set, the interned
union of both). The tasks of a plan version share their template's set,
and each one's start and finish evolve it with fields it lacks."""
_UNIONS_KEPT = 512


def _union(given: set[str], changes: dict[str, Any]) -> set[str]:
    """The interned fields set of ``given`` and the names of ``changes``."""
    key = (id(given), *changes)
    known = _UNIONS.get(key)
    if known is not None and known[0] is given:
        return known[1]
    shared = _interned(given.union(changes))
    if len(_UNIONS) >= _UNIONS_KEPT:
        _UNIONS.clear()  # sets of models that came and went: start again
    # ``given`` is kept with its union: its id is nobody else's meanwhile.
    _UNIONS[key] = (given, shared)
    return shared


_M = TypeVar("_M", bound=BaseModel)


def built(cls: type[_M], fields: dict[str, Any]) -> _M:
    """``cls(**fields)`` as validation builds it, for values that are of
    their fields' types already (validated messages, counters, ids).

    Nothing is checked but the names: the values are kept as they are
    (validation would copy a list or a dict; the caller must not change
    one it gives afterwards). The fields are in their declared order, the
    others get their defaults, and the fields set names those given, as
    after validation. For the messages a run builds on every step from
    what it holds, where validating again costs more than the rest of
    building them.

    Raises:
        TypeError: ``fields`` names a field ``cls`` does not have, or lacks
            one it requires.
    """
    template = _TEMPLATES.get(cls)
    if template is None:
        template = _TEMPLATES[cls] = _Template(cls)
    given = tuple(fields)
    fields_set = template.fields_sets.get(given)
    if fields_set is None:
        fields_set = template.fields_sets[given] = template.fields_set(given)
    values = template.values.copy()
    values.update(fields)
    for name, factory in template.factories:
        if name not in fields:
            values[name] = factory()
    message = _new(cls)
    _set_dict(message, values)
    _set_fields_set(message, fields_set)
    _set_extra(message, None)
    _set_private(message, None)
    return message


class _Template:
    """What :func:`built` needs of a class: its fields in their declared
    order with their defaults, and the fields sets of the builds so far (by
    the names given, in order)."""

    def __init__(self, cls: type[BaseModel]) -> None:
        decorators = cls.__pydantic_decorators__
        if (
            decorators.field_validators
            or decorators.model_validators
            or cls.__private_attributes__
            or cls.model_config.get("extra") == "allow"
        ):
            # Its validators may normalize what they are given, or refuse
            # it, and extra fields or private attributes need more than a
            # dict: only validation builds it as validation does.
            raise TypeError(f"{cls.__name__} has validators: validate it")
        self.cls = cls
        self.values: dict[str, Any] = {}
        self.factories: list[tuple[str, Callable[[], Any]]] = []
        self.required: set[str] = set()
        for name, field in cls.model_fields.items():
            self.values[name] = None if field.is_required() else field.default
            if field.is_required():
                self.required.add(name)
            elif field.default_factory is not None:
                factory = cast("Callable[[], Any]", field.default_factory)
                self.factories.append((name, factory))
        self.fields_sets: dict[tuple[str, ...], set[str]] = {}

    def fields_set(self, given: tuple[str, ...]) -> set[str]:
        names = set(given)
        unknown = names - self.values.keys()
        missing = self.required - names
        if unknown or missing:
            raise TypeError(
                f"{self.cls.__name__}: unknown fields {sorted(unknown)}, "
                f"missing fields {sorted(missing)}"
            )
        return _interned(names)


_TEMPLATES: dict[type[BaseModel], _Template] = {}


class Settings(Frozen):
    """A frozen model whose construction errors are configuration errors.

    Building one with a bad field raises :class:`ConfigurationError` naming the
    field (``limits.max_replans``), not a bare pydantic ``ValidationError``.
    Numbers must be finite: a NaN deadline would pass no bound check. A
    number field refuses ``true`` and ``false`` (pydantic would read them as
    1 and 0), while still reading ``"3"``, as environment variables give it.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_boolean_number(cls, value, info)

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigurationError.from_validation(exc) from None

    # Reading a spec from a dict or a JSON file is construction too.

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise ConfigurationError.from_validation(exc) from None

    @classmethod
    def model_validate_json(
        cls, json_data: str | bytes | bytearray, *args: Any, **kwargs: Any
    ) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise ConfigurationError.from_validation(exc) from None


def _check_storable(message: BaseModel) -> None:
    """See :meth:`Frozen.check_storable`."""
    try:
        encoded = message.__pydantic_serializer__.to_json(message)
    except (ValueError, TypeError):
        pass  # find the string at fault (or let the journal say what it is)
    else:
        # Serialized whole: no string is at fault, unless a key was, which
        # pydantic replaces with U+FFFD rather than refusing it.
        if _REPLACEMENT not in encoded:
            return
    stack: list[tuple[str, object]] = [("", message)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                raise ConfigurationError(path, _UNENCODABLE)
        elif isinstance(value, BaseModel):
            names = reversed(type(value).model_fields)
            stack.extend((_join(path, name), getattr(value, name)) for name in names)
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if isinstance(key, str) and not _encodable(key):
                    raise ConfigurationError(path, f"a key {_UNENCODABLE}")
                stack.append((_join(path, str(key)), item))
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(enumerate(value))
            stack.extend((_join(path, str(i)), item) for i, item in reversed(items))


_REPLACEMENT = "\ufffd".encode()

_UNENCODABLE = (
    "contains a lone UTF-16 surrogate (such as \\udfff), "
    "which is not text and cannot be stored"
)


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def json_problem(value: dict[Any, Any]) -> tuple[str, str] | None:
    """The path (``a.1.b``) and problem of the first item of ``value`` that
    is no JSON value (a non-finite number, a key that is no string, an
    object JSON has no form for), or None."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return path or "(keys)", f"key {key!r} is not a string"
                stack.append((_join(path, key), child))
        elif isinstance(item, list | tuple):
            stack.extend((_join(path, str(i)), child) for i, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return path, f"not a finite number ({item})"
        elif item is not None and not isinstance(item, str | int | float):
            return path, f"a {type(item).__name__} is not a JSON value"
    return None


def json_depth(value: object) -> int:
    """How deeply objects and arrays nest in ``value`` (``{}`` is 1, a
    scalar 0)."""
    deepest = 0
    stack: list[tuple[int, object]] = [(0, value)]
    while stack:
        depth, item = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((depth + 1, child) for child in children)
    return deepest


def refuse_boolean_number(
    cls: type[BaseModel], value: Any, info: ValidationInfo
) -> Any:
    """A ``mode="before"`` check for every field: ``true`` or ``false`` given
    to a number field (``int``, ``float``, optional or not), or as a value of
    a ``dict`` of numbers, is an error."""
    shape = _number_fields(cls).get(info.field_name or "")
    if shape == "number" and isinstance(value, bool):
        raise ValueError("expected a number, not true or false")
    if shape == "map" and isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, bool):
                raise ValueError(f"{key}: expected a number, not true or false")
    return value


_NUMBER_FIELDS: dict[type[BaseModel], dict[str, str]] = {}


def _number_fields(cls: type[BaseModel]) -> dict[str, str]:
    """``cls``'s number fields (``"number"``) and dicts of numbers (``"map"``)."""
    shapes = _NUMBER_FIELDS.get(cls)
    if shapes is None:
        shapes = _NUMBER_FIELDS[cls] = {}
        for name, field in cls.model_fields.items():
            annotation = field.annotation
            if _is_number(annotation):
                shapes[name] = "number"
            elif get_origin(annotation) is dict and _is_number(get_args(annotation)[1]):
                shapes[name] = "map"
    return shapes


def _is_number(annotation: Any) -> bool:
    """``int``, ``float``, or either of them optional."""
    if annotation in (int, float):
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] in (int, float)
    return False
