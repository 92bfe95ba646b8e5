"""``agentspec serve``'s ``--agentspec-*`` options, generated from :class:`EngineSettings`.

Each field of the settings (and of a nested model such as the drafter's) is one option:
its name is ``--agentspec-`` and the field's name with dashes unless the field's ``cli``
metadata names it (:func:`agentspec.engine.settings.cli`), and its help, default and
validation are the field's own. A nested model given whole (the index's configuration)
is one option taking JSON. The launcher adds only what is not a setting
(``--agentspec-dry-run``).

The command line takes every value as text and the settings validate it, so a bad value
is refused the same way whatever its type: one line naming the option (:func:`explain`).
"""

from __future__ import annotations

import json
import re
import shlex
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agentspec.engine.settings import EngineSettings

#: Every agentspec option of ``serve`` starts with this; any other option is vLLM's.
OPTION_PREFIX = "--agentspec-"


@dataclass(frozen=True)
class SettingOption:
    """One ``--agentspec-*`` option and the settings field it sets."""

    flag: str
    #: Where the value goes in :class:`EngineSettings`, e.g. ``("drafter", "model")``.
    path: tuple[str, ...]
    help: str
    metavar: str
    #: The field's default as help shows it; None when it has none worth showing.
    default: str | None
    is_flag: bool = False
    is_json: bool = False
    #: The nested model's field without which its other options mean nothing (the drafter's model).
    required: bool = False

    @property
    def param(self) -> str:
        """The option's parameter name on the command (a Python identifier)."""
        return "_".join(self.path)


def setting_options(model: type[BaseModel] = EngineSettings, prefix: tuple[str, ...] = ()) -> list[SettingOption]:
    """The options of ``model``'s fields, in the order the fields are declared."""
    out: list[SettingOption] = []
    for name, field in model.model_fields.items():
        meta = _cli_meta(field)
        if meta.get("hidden"):
            continue
        annotation = _without_none(field.annotation)
        path = (*prefix, name)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and not meta.get("json"):
            out += setting_options(annotation, path)
            continue
        flag = OPTION_PREFIX + (meta.get("name") or name.replace("_", "-"))
        out.append(
            SettingOption(
                flag=flag,
                path=path,
                help=field.description or "",
                metavar=meta.get("metavar") or _metavar(annotation, is_json=bool(meta.get("json"))),
                default=_default_text(field),
                is_flag=annotation is bool,
                is_json=bool(meta.get("json")),
                required=bool(prefix) and field.is_required(),
            )
        )
    return out


def settings_data(options: list[SettingOption], values: Mapping[str, Any]) -> dict[str, Any]:
    """The data for :class:`EngineSettings` from the given option values (by
    :attr:`SettingOption.param`; None: not given). Raises :class:`OptionError` for JSON that
    does not parse and for a nested model's options given without its required one."""
    data: dict[str, Any] = {}
    given = {o.param for o in options if values.get(o.param) not in (None, False)}
    for option in options:
        value = values.get(option.param)
        if value is None or (option.is_flag and not value):
            continue
        if len(option.path) > 1 and not _group_required_given(options, option, given):
            required = next(o for o in options if o.path[:-1] == option.path[:-1] and o.required)
            raise OptionError(
                f"{option.flag} sets up {_group_name(option)}: give {required.flag} {required.metavar} with it"
            )
        if option.is_json:
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise OptionError(f"{option.flag}: not valid JSON ({exc})") from None
        target = data
        for key in option.path[:-1]:
            target = target.setdefault(key, {})
        target[option.path[-1]] = value
    return data


class OptionError(ValueError):
    """A bad ``--agentspec-*`` value, as one line that names the option."""


def explain(exc: ValidationError, options: list[SettingOption]) -> str:
    """The first error of ``exc`` as one line naming the option (not the field) and the
    value given."""
    error = exc.errors(include_url=False)[0]
    loc = tuple(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    option = _option_at(loc, options)
    if option is None:  # a rule across fields: its message names them; name the options
        return _with_flags(message, options)
    inner = loc[len(option.path) :]
    where = option.flag + (f": {'.'.join(inner)}" if inner else "")
    # A validator's own message says what it got; pydantic's type and range errors do not.
    typed = not inner and "input" in error and not option.is_json and error["type"] != "value_error"
    shown = f", got {shlex.quote(str(error['input']))}" if typed else ""
    return f"{where}: {message}{shown}"


def _option_at(loc: tuple[str, ...], options: list[SettingOption]) -> SettingOption | None:
    matches = [o for o in options if loc[: len(o.path)] == o.path]
    return max(matches, key=lambda o: len(o.path), default=None)


def _with_flags(message: str, options: list[SettingOption]) -> str:
    """``message`` with each field named in it (``exchange_dir``, ``drafter.model``) as its option."""
    for option in sorted(options, key=lambda o: -len(".".join(o.path))):
        dotted = ".".join(option.path)
        if "_" in dotted or "." in dotted:  # plain words (index, drafter) may be prose
            message = re.sub(rf"(?<![\w.-]){re.escape(dotted)}(?![\w.])", option.flag, message)
    return message


def _group_required_given(options: list[SettingOption], option: SettingOption, given: set[str]) -> bool:
    group = [o for o in options if o.path[:-1] == option.path[:-1]]
    return any(o.param in given for o in group if o.required)


def _group_name(option: SettingOption) -> str:
    return {"drafter": "a model drafter"}.get(option.path[0], option.path[0].replace("_", " "))


def _cli_meta(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    meta = extra.get("cli") if isinstance(extra, dict) else None
    return dict(meta) if isinstance(meta, dict) else {}


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _metavar(annotation: Any, *, is_json: bool) -> str:
    if is_json:
        return "JSON"
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    return {int: "INT", float: "FLOAT", bool: ""}.get(annotation, "TEXT")


def _default_text(field: FieldInfo) -> str | None:
    if field.default is PydanticUndefined or field.default is None or field.default is False:
        return None
    return str(field.default)
