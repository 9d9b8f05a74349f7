"""`specrt generate --json-schema FILE | --json-object | --regex R | --grammar FILE` -> a ConstraintSpec."""

from __future__ import annotations

from pathlib import Path

from specrt.core.errors import InvalidArgument
from specrt.runtime.constraint import ConstraintSpec


def _read(path: Path, option: str) -> str:
    """A regular file of at most the constraint size bound (a FIFO, /dev/zero or a huge file: one line)."""
    from specrt.core.textfile import read_user_text
    from specrt.runtime.constraint_limits import MAX_BYTES

    return read_user_text(path, option, MAX_BYTES)


def constraint_from_options(json_schema: Path | None, json_object: bool, regex: str | None,
                            grammar: Path | None) -> ConstraintSpec | None:
    """At most one constraint option; None when none is given. Bad files or JSON raise InvalidArgument."""
    given = [name for name, v in (("--json-schema", json_schema), ("--json-object", json_object),
                                  ("--regex", regex), ("--grammar", grammar)) if v]
    if len(given) > 1:
        raise InvalidArgument(f"give at most one of --json-schema, --json-object, --regex, --grammar "
                              f"(got {', '.join(given)})")
    if json_schema is not None:
        return ConstraintSpec.json_schema(_read(json_schema, "--json-schema"))
    if json_object:
        return ConstraintSpec.json_object()
    if regex is not None:
        return ConstraintSpec.regex(regex)
    if grammar is not None:
        return ConstraintSpec.grammar(_read(grammar, "--grammar"))
    return None
