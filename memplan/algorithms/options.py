"""Options a family declares once; ``solve``, ``compare``, ``run``, ``algos`` and the API read them.

A family's options are one frozen dataclass whose fields are made by :func:`option`: the field's
name is the keyword of :func:`memplan.solve` (``slots``), and the declaration carries everything
else (the command-line flag, its metavar, what the command line converts the text to, the parser
that checks a value and names the flag when it is wrong, the default, the help, which commands show
it). :func:`parse_options` builds a family's options object from what a caller gave;
:mod:`memplan.cli.options` turns the declarations into the commands' options, and docs/cli.md's
tables are generated from them (tests/cli/test_options.py).

Several families may declare an option of the same name (``slots``, ``bandwidth``,
``time_limit``): each with its own default and range, the same flag, metavar and type. A value
given for an option the algorithm's family does not declare is checked with another family's
declaration and ignored, so one ``compare`` can pass ``--gpus`` to every algorithm of a sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memplan.errors import ArgumentError, InputError
from memplan.units import check_time_limit, parse_rate

COMMANDS = ("solve", "compare", "run")
"""The commands that take family options."""

_KEY = "memplan.option"


@dataclass(frozen=True)
class Option:
    """One declared option of one family (see the module docstring)."""

    name: str
    """Keyword of :func:`memplan.solve` and field of the family's options dataclass."""
    flag: str
    metavar: str
    cli_type: type
    """What the command line converts the text to before :attr:`parse` (int, float or str)."""
    help: str
    """One sentence, the same for every family that declares the option."""
    accepts: str
    """The values this family accepts, in words (``2 to 100000``)."""
    default: Any
    default_text: str
    parse: Callable[[Any], Any] = dataclasses.field(compare=False)
    """A given value -> the typed value; raises an
    :class:`~memplan.errors.ArgumentError` naming the parameter (the command line names the
    flag)."""
    commands: tuple[str, ...] = COMMANDS
    family: str = ""


def option(
    *,
    flag: str,
    metavar: str,
    help: str,
    accepts: str,
    default: Any,
    parse: Callable[[Any], Any],
    cli_type: type = str,
    default_text: str | None = None,
    commands: tuple[str, ...] = COMMANDS,
) -> Any:
    """A field of a family's options dataclass that declares one option."""
    spec = {
        "flag": flag,
        "metavar": metavar,
        "cli_type": cli_type,
        "help": help,
        "accepts": accepts,
        "default": default,
        "default_text": str(default) if default_text is None else default_text,
        "parse": parse,
        "commands": commands,
    }
    return dataclasses.field(default=default, metadata={_KEY: spec})


def declared(options: type, family: str = "") -> tuple[Option, ...]:
    """The options a family's options dataclass declares, in declaration order."""
    return tuple(
        Option(name=f.name, family=family, **f.metadata[_KEY])
        for f in dataclasses.fields(options)
        if _KEY in f.metadata
    )


def parse_options(
    family: str, options: type, given: Mapping[str, Any], everyone: Iterable[Option]
) -> Any:
    """The family's options object from the values a caller gave (None: not given).

    A value of an option the family declares goes through its parser; one that only other
    families declare is checked with the first of their parsers and dropped; a name that no family
    declares is a TypeError (a programming error, as an unknown keyword argument is).
    """
    mine = {spec.name: spec for spec in declared(options, family)}
    others: dict[str, Option] = {}
    for spec in everyone:
        others.setdefault(spec.name, spec)
    values: dict[str, Any] = {}
    for name, value in given.items():
        if name in mine:
            if value is not None:
                values[name] = mine[name].parse(value)
        elif name in others:
            if value is not None:
                others[name].parse(value)
        else:
            known = ", ".join(sorted(others))
            raise TypeError(f"unknown option {name!r}; the families declare: {known}")
    return options(**values)


# --------------------------------------------------------------------------- parsers


def integer_in(
    name: str, least: int, most: int, what: str = "", words: tuple[str, ...] = ()
) -> Callable[[Any], int | str]:
    """An integer from ``least`` to ``most`` (not a bool), as a number or as the command line's
    text, or one of ``words`` (e.g. ``("auto",)``); an error names the parameter ``name``.
    """

    def parse(value: Any) -> int | str:
        given = value
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in words:
                return text.lower()
            if text.lstrip("+-").isdigit():
                value = int(text)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            also = "".join(f" or {word!r}" for word in words)
            raise ArgumentError(
                name, f"expected an integer from {least} to {most}{also}{what}", given
            )
        return value

    return parse


def positive_integer(name: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(name, "expected a positive integer", value)
        return value

    return parse


def positive_number(name: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ArgumentError(name, "expected a positive number", value)
        return float(value)

    return parse


def _detail(exc: InputError) -> str:
    """What a parser of :mod:`memplan.units` said, without the value it names first."""
    return str(exc).split(": ", 1)[-1]


def rate(name: str) -> Callable[[Any], float]:
    """A rate (``12GB/s``, ``16GiB/s`` or bytes/s as a number) in bytes/s."""

    def parse(value: Any) -> float:
        try:
            return parse_rate(value)
        except InputError as exc:
            raise ArgumentError(name, _detail(exc), value) from None

    return parse


# --------------------------------------------------------------------------- shared declarations

SLOTS_HELP = "Memory discretization of the DP algorithms."


def slots_option(
    default: int | str | None, most: int, *, words: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``--slots``: the slots of a family's dynamic programs, 2 to ``most`` (or one of ``words``).

    The command line hands over the text (``cli_type=str``), so that a family may accept a word
    such as ``auto`` besides numbers.
    """
    what = kwargs.pop("what", "")
    accepts = f"2 to {most}" + "".join(f" or {word}" for word in words)
    return option(
        flag="--slots",
        metavar="N",
        cli_type=str,
        help=SLOTS_HELP,
        accepts=accepts,
        default=default,
        parse=integer_in("slots", 2, most, what, words),
        **kwargs,
    )


def bandwidth_option() -> Any:
    """``--bandwidth``: the host<->device bandwidth; None: the profile's."""
    return option(
        flag="--bandwidth",
        metavar="RATE",
        help="Host<->device bandwidth of the offloading and combined algorithms: 12.2GB/s.",
        accepts="a rate: 12GB/s, 16GiB/s, bytes/s",
        default=None,
        default_text="the profile's",
        parse=rate("bandwidth"),
    )


def _time_limit(value: Any) -> float | None:
    try:
        return check_time_limit(value)
    except InputError as exc:
        raise ArgumentError("time_limit", _detail(exc), value) from None


def time_limit_option(default: float | None) -> Any:
    """``--time-limit``: seconds of each CP-SAT solve, or of a dynamic program's whole run (None:
    no limit; the DP then returns its best plan so far).
    """
    return option(
        flag="--time-limit",
        metavar="SECONDS",
        cli_type=float,
        help="Time limit of each CP-SAT solve, or of a DP algorithm's run (its best plan so far).",
        accepts="seconds > 0, at most a week",
        default=default,
        default_text="none" if default is None else f"{default:g}",
        parse=_time_limit,
        commands=("solve", "compare"),
    )


def resolve_bandwidth(profile: Any, algo: str, bandwidth: float | None) -> float:
    """The bandwidth (bytes/s) of an offloading run: the option, else the profile's own."""
    if bandwidth is not None:
        return float(bandwidth)
    if profile.bandwidth is not None:
        return float(profile.bandwidth)
    raise InputError(
        f"algorithm {algo} needs a bandwidth: give --bandwidth 12GB/s or use a profile with a "
        "measured/estimated bandwidth (e.g. resnet50@a100)"
    )
