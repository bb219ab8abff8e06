"""A method parameter's value checked against its Config's annotation, before the Config is built.

Each method checks what its values mean (``0 < k <= 1``, a known ``format``) in its Config's ``__post_init__``; what
they are - a number, a list of field names, true or false - is written once, in the annotation, and checked here
for every method alike. Without it a list where a number belongs (``methods.min_k.k=[0.2]``) failed inside a
comparison as "'<' not supported between instances of 'float' and 'list'", naming no key.

The types the Configs use: ``bool``, ``int``, ``float`` (an int is a float), ``str``, ``tuple[X, ...]`` (a list or
tuple of X; a lone string for ``tuple[str, ...]``, which the Configs read as one field), ``dict[...]`` (a mapping),
unions of them (``float | None``, ``bool | str``); ``Any`` and anything else is left to the Config.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any


def check_param_types(config: type, params: Mapping[str, Any], where: str) -> None:
    """Raise ValueError naming ``<where>.<key>``, what it expects and what it got, for the first value of
    ``params`` that does not fit its field's annotation in the dataclass ``config``."""
    hints = typing.get_type_hints(config)
    fields = {f.name for f in dataclasses.fields(config)}
    for key, value in params.items():
        if key in fields and not fits(value, hints[key]):
            raise ValueError(f"{where}.{key}: expected {describe(hints[key])}, got {value!r}")


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as YAML or JSON gives it: lists, dicts, numbers, strings) is of type ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        args = typing.get_args(hint)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if item is str and isinstance(value, str):
            return True
        return isinstance(value, (list, tuple)) and (item is None or all(fits(v, item) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, Mapping)
    return True  # Any, or a type the Configs check themselves


def describe(hint: Any) -> str:
    """``hint`` in words, as an error names it ("a number or null", "a list of strings")."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arm) for arm in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        return f"a list of {_plural(item)}" if item is not None else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


_NAMES: dict[Any, str] = {
    bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null",
}  # fmt: skip


def _plural(item: Any) -> str:
    return {str: "strings", float: "numbers", int: "integers", bool: "true/false values"}.get(item, describe(item))
