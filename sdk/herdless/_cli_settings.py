"""Command lines generated from pydantic-settings models: flags, help and errors.

Every ``herdless`` command is one settings model; :class:`SettingsCommand` turns it
into an :mod:`argparse` parser so that the flags, their defaults and their help can
never drift from the model:

- each field ``max_queue`` is the flag ``--max-queue`` (a ``bool`` is
  ``--access-log`` / ``--no-access-log``) and the variable ``<PREFIX>MAX_QUEUE``;
  a flag wins over its variable, which wins over the default;
- the help of a flag is the field's ``description=``, followed by
  ``[default: 256; env: HERDLESS_GATEWAY_MAX_QUEUE]``;
- a field that holds a secret (``SecretStr``) has no flag: a command line is
  visible to every user of the machine (``ps``). The help lists it as environment only;
- a bad value is refused as argparse refuses a bad flag (usage, then one line
  ``herdless serve: error: ...``, status 2), naming what the user actually set:
  ``argument --max-queue`` for a flag, ``variable HERDLESS_GATEWAY_MAX_QUEUE`` for
  the environment.

Flags reach the model as the strings typed, so that pydantic is the one place a
value is checked, whichever way it came. pydantic-settings' own CLI source was not
used: it validates flags and variables together, so its errors cannot tell which
of the two was wrong, its help names no variable, and hiding a secret's flag would
take an annotation on every secret field of every model.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

from pydantic import AnyUrl, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined
from pydantic_settings import BaseSettings, SettingsError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["SettingsCommand", "config_by_name", "exit_status", "fail"]

S = TypeVar("S", bound=BaseSettings)
C = TypeVar("C", bound="DataclassInstance")

_USAGE_ERROR = 2  # argparse's status for a bad command line


def exit_status(exc: SystemExit) -> int:
    """The status a ``SystemExit`` from argparse carries (``--help``: 0, an error: 2)."""
    return exc.code if isinstance(exc.code, int) else _USAGE_ERROR


def fail(prog: str, message: str, *, status: int = _USAGE_ERROR) -> int:
    """Write ``<prog>: error: <message>`` to stderr and return ``status``.

    For errors found after the command line was read (a missing extra, a port
    taken): the same one line as a bad flag gets.
    """
    print(f"{prog}: error: {message}", file=sys.stderr)
    return status


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line: ``<prog>: error: <message>``.

    argparse writes the usage first; with some forty flags that is twenty lines
    above the one that says what is wrong.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(_USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _members(annotation: Any) -> list[Any]:
    """The types an annotation allows, ``None`` left out (``int | None`` is ``[int]``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def is_secret(field: FieldInfo) -> bool:
    """Whether a field holds a secret, which the command line never takes."""
    return SecretStr in _members(field.annotation)


def _is_bool(field: FieldInfo) -> bool:
    return _members(field.annotation) == [bool]


def _metavar(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("metavar"), str):
        return str(extra["metavar"])  # the model's own word for it (URL)
    (kind, *_) = _members(field.annotation) or [str]
    if typing.get_origin(kind) is typing.Literal:
        return "{" + ",".join(str(choice) for choice in typing.get_args(kind)) + "}"
    if isinstance(kind, type):
        for base, name in ((bool, "BOOL"), (int, "N"), (float, "NUMBER"), (Path, "PATH")):
            if issubclass(kind, base):
                return name
        if issubclass(kind, AnyUrl):
            return "URL"
    return "TEXT"


def shown_default(field: FieldInfo) -> str:
    """A field's default as the help and the docs show it (``unset`` for ``None``)."""
    value: Any = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flag_of(name: str) -> str:
    """The flag of a field: ``max_queue`` is ``--max-queue``."""
    return "--" + name.replace("_", "-")


class SettingsCommand(Generic[S]):
    """The command line of one settings model: its parser, its help, its errors.

    Args:
        model: the pydantic-settings class; its ``env_prefix`` names the variables.
        prog: the command as typed (``"herdless serve"``).
        description: what the command does, shown first in its help.
        usage: the usage line after the command's name.

    Add positional arguments that are not settings to :attr:`parser` before
    :meth:`parse` (``herdless bench SCENARIO``).
    """

    def __init__(
        self, model: type[S], *, prog: str, description: str, usage: str = "[options]"
    ) -> None:
        self.model = model
        self.prog = prog
        self.prefix = str(model.model_config.get("env_prefix") or "")
        self.parser = _Parser(
            prog=prog,
            usage=f"%(prog)s {usage}",
            description=description,
            epilog=self._epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            # An absent flag leaves the variable, then the default, in charge.
            argument_default=argparse.SUPPRESS,
        )
        for name, field in model.model_fields.items():
            if is_secret(field):
                continue
            help_ = self.help_of(name).replace("%", "%%")  # argparse %-formats help
            if _is_bool(field):
                self.parser.add_argument(
                    flag_of(name), action=argparse.BooleanOptionalAction, help=help_
                )
            else:
                self.parser.add_argument(flag_of(name), metavar=_metavar(field), help=help_)

    def env_of(self, name: str) -> str:
        """The variable of a field: ``HERDLESS_GATEWAY_`` + ``MAX_QUEUE``."""
        return f"{self.prefix}{name}".upper()

    def help_of(self, name: str) -> str:
        """A field's help: its description, its default and its variable."""
        field = self.model.model_fields[name]
        text = " ".join((field.description or "").split())
        return f"{text} [default: {shown_default(field)}; env: {self.env_of(name)}]"

    def secrets(self) -> list[str]:
        """The fields that are environment only."""
        return [n for n, f in self.model.model_fields.items() if is_secret(f)]

    def _epilog(self) -> str:
        lines = [
            f"A flag shown with env: is also that variable, {self.prefix}<FLAG> (upper case,",
            "'_' for '-'); a flag wins over its variable, a variable over the default.",
        ]
        secrets = self.secrets()
        if secrets:
            lines += ["", "Environment only (secrets: a command line is visible to every user):"]
            for name in secrets:
                lines.append(f"  {self.env_of(name)}")
                text = " ".join((self.model.model_fields[name].description or "").split())
                lines += [f"      {line}" for line in textwrap.wrap(text, 72)]
        return "\n".join(lines)

    def format_help(self) -> str:
        """The ``--help`` text."""
        return self.parser.format_help()

    def parse(
        self, argv: Sequence[str], *, environ: Mapping[str, str] | None = None
    ) -> tuple[S, argparse.Namespace]:
        """Settings from flags over variables over defaults, and the parsed arguments.

        Args:
            argv: the arguments after the command's name.
            environ: where the variables were read (``os.environ``); only used to say
                which variable was set when one is refused.

        Raises:
            SystemExit: ``--help`` (status 0), or a bad flag or variable (status 2,
                one ``<prog>: error:`` line on stderr, as argparse's own errors).
        """
        args = list(argv)
        for name in self.secrets():  # say why, rather than "unrecognized arguments"
            flag = flag_of(name)
            if any(a == flag or a.startswith(flag + "=") for a in args):
                self.parser.error(
                    f"{flag} is a secret, environment only: set {self.env_of(name)} "
                    "(a command line is visible to every user of the machine)"
                )
        namespace = self.parser.parse_args(args)
        given = {k: v for k, v in vars(namespace).items() if k in self.model.model_fields}
        env = os.environ if environ is None else environ
        for warning in self.unknown_variables(env):
            print(f"{self.parser.prog}: warning: {warning}", file=sys.stderr)
        try:
            return self.model(**given), namespace
        except ValidationError as exc:
            self._refuse([self._problem(e, given, env) for e in exc.errors()])
        except SettingsError as exc:  # a variable pydantic-settings could not decode
            self._refuse([str(exc)])

    def unknown_variables(self, environ: Mapping[str, str]) -> list[str]:
        """A line for each variable with this command's prefix that names no setting
        (a misspelling is otherwise silently ignored), with the closest one when any."""
        if not self.prefix:
            return []
        known = {field.upper() for field in self.model.model_fields}
        lines = []
        for variable in sorted(environ):
            rest = variable.upper().removeprefix(self.prefix.upper())
            if rest == variable.upper() or rest in known:
                continue
            line = f"{variable} is not a setting of this command and is ignored"
            close = difflib.get_close_matches(rest, sorted(known), n=1, cutoff=0.75)
            lines.append(line + (f"; did you mean {self.prefix}{close[0]}?" if close else ""))
        return lines

    def _refuse(self, problems: list[str]) -> NoReturn:
        self.parser.error("; ".join(problems))

    def source(self, name: str, given: Mapping[str, object], environ: Mapping[str, str]) -> str:
        """What set a field: ``argument --max-queue``, ``variable HERDLESS_...`` or ``default``."""
        if name in given:
            return f"argument {flag_of(name)}"
        wanted = self.env_of(name)
        # pydantic-settings matches variables without regard to case (case_sensitive=False).
        for variable in environ:
            if variable.upper() == wanted:
                return f"variable {variable}"
        return f"{name} (default)"

    def _problem(
        self, error: ErrorDetails, given: Mapping[str, object], environ: Mapping[str, str]
    ) -> str:
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = error["loc"]
        fields = self.model.model_fields
        if loc and loc[0] in fields:
            name = str(loc[0])
            where = self.source(name, given, environ)
            value = error.get("input")
            if isinstance(value, str) and not is_secret(fields[name]):
                message += f" (got {value!r})"
            return f"{where}: {message}"
        # A check across fields names them in its message: name what set each one.
        for name in sorted(fields, key=len, reverse=True):
            if name in given or self.source(name, given, environ).startswith("variable"):
                shown = self.source(name, given, environ).split(" ", 1)[1]
                message = re.sub(rf"\b{name}\b", shown, message)
        return message


def config_by_name(config: type[C], settings: BaseSettings, **given: object) -> C:
    """``config`` (a dataclass) with each field the setting of its name, but those in
    ``given``; a field no setting names keeps its default.

    The names are the contract: a knob is ``--<name>``, ``<PREFIX><NAME>`` and the field
    ``<name>`` of the config it belongs to, so a new one is declared in both places and
    wired by its name, with no third list to keep in step (each command's tests check
    that every shared name has one type and one value on both sides).
    """
    names = {f.name for f in fields(config)} & type(settings).model_fields.keys()
    return config(**{name: getattr(settings, name) for name in names - given.keys()}, **given)
