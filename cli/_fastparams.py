"""Keep pydantic out of `mp`'s start-up: plain str/int/float/choice option coercion.

Typer 0.29.2 coerces every parameter (bar a flag that already holds a bool) through a pydantic `TypeAdapter`,
built the first time the parameter is processed, even when its value is None.
That imports pydantic (about 80 ms here) on every `mp` run, most of the budget
of `mp flow list` (bench/cli_start.py). This module gives `str`, `int`, `float`,
`bool` and `Literal`/`Enum` choice parameters a tiny coercer with Typer's own error
type, and leaves every other parameter to Typer.

It leans on two private names of the pinned Typer (`typer._coercion.RuntimeParam`
and `typer.core._TyperParameter.get_runtime_param`). If a Typer upgrade removes
them, `install()` does nothing and `mp` only starts slower;
tests/cli/test_startup.py then fails on the pydantic import, which is the signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


def install() -> bool:
    """Patch Typer's parameter coercion; True when the fast path is active."""
    try:
        from typer import _coercion, core
        from typer._click.exceptions import BadParameter
    except ImportError:  # pragma: no cover - a different Typer
        return False
    runtime_param = getattr(_coercion, "RuntimeParam", None)
    typer_parameter = getattr(core, "_TyperParameter", None)
    if runtime_param is None or typer_parameter is None or not hasattr(typer_parameter, "get_runtime_param"):
        return False  # pragma: no cover
    if getattr(typer_parameter, "_mp_fast", False):
        return True

    @dataclass(frozen=True)
    class PlainParam(runtime_param):  # type: ignore[misc, valid-type]
        kind: str = "str"
        choices: tuple[Any, ...] = ()
        case_sensitive: bool = True

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if self.kind == "str":
                return str(value)
            if self.kind == "bool":
                if isinstance(value, bool):
                    return value
                text = str(value).strip().lower()
                if text in ("1", "true", "t", "yes", "y", "on"):
                    return True
                if text in ("0", "false", "f", "no", "n", "off"):
                    return False
                raise BadParameter(f"{value!r} is not a valid boolean.", ctx=ctx, param=param)
            if self.kind == "int":
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
                try:
                    return int(str(value).strip())
                except ValueError:
                    raise BadParameter(f"{value!r} is not a valid integer.", ctx=ctx, param=param) from None
            if self.kind == "float":
                if isinstance(value, int | float) and not isinstance(value, bool):
                    return float(value)
                try:
                    return float(str(value).strip())
                except ValueError:
                    raise BadParameter(f"{value!r} is not a valid float.", ctx=ctx, param=param) from None
            # choice
            for choice in self.choices:
                label = str(choice.value) if isinstance(choice, Enum) else str(choice)
                if (
                    value is choice
                    or label == str(value)
                    or (not self.case_sensitive and label.lower() == str(value).lower())
                ):
                    return choice
            shown = ", ".join(repr(str(c.value) if isinstance(c, Enum) else str(c)) for c in self.choices)
            raise BadParameter(f"{value!r} is not one of {shown}.", ctx=ctx, param=param)

    original = typer_parameter.get_runtime_param

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            fast = _plain_for(self.type_descriptor, PlainParam)
            if fast is not None:
                self._runtime_param = fast
        return original(self)

    typer_parameter.get_runtime_param = get_runtime_param
    typer_parameter._mp_fast = True
    return True


def _plain_for(desc: Any, plain: Any) -> Any:
    """A PlainParam for simple annotations, or None to let Typer build its adapter."""
    try:
        info = desc.parameter_info
        if desc.file_annotation is not None or desc.is_list or desc.is_tuple or desc.is_path:
            return None
        if getattr(info, "parser", None) is not None or desc.is_ranged:
            return None
        annotation = desc.annotation
        if desc.is_choice:
            return plain(
                parameter_info=info,
                annotation=annotation,
                kind="choice",
                choices=tuple(desc.choices),
                case_sensitive=desc.case_sensitive,
            )
        kind = {str: "str", int: "int", float: "float", bool: "bool"}.get(annotation)
        if kind is None:
            return None
        return plain(parameter_info=info, annotation=annotation, kind=kind)
    except AttributeError:  # pragma: no cover - a different Typer
        return None
