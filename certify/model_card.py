"""The model-card fields a team states about its model, as command-line options.

``certify run``, ``certify demo`` and ``certify submit`` take the same flags (the service's
API and web form take the same names as form fields); they land in the signed measurement's
``model_card`` (:class:`certify.results.ModelCardDoc`) and the card's model details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from certify.errors import UsageError

if TYPE_CHECKING:
    from certify.results import ModelCardDoc

#: The fields, their flags' help, and the most characters each may have.
FIELDS: dict[str, tuple[str, int]] = {
    "model_name": ("The model's name as your team calls it (default: the file or endpoint "
                   "name).", 200),
    "model_version": ("The model version evaluated (for an endpoint: the version it serves).",
                      100),
    "owner": ("Who ships the model (team or organisation).", 200),
    "license": ("The model's license (e.g. apache-2.0).", 100),
    "intended_use": ("What the model is for, in a sentence or two (without it the card says "
                     "the intended use was not stated).", 2000),
}


def model_card_options(f: Any) -> Any:
    """Add --model-name, --model-version, --owner, --license and --intended-use."""
    for name, (text, _) in reversed(FIELDS.items()):
        flag = "--" + name.replace("_", "-")
        f = click.option(flag, name, metavar="TEXT", help=text)(f)
    return f


def model_card_from(**given: str | None) -> ModelCardDoc | None:
    """The stated fields (stripped; empty means not stated), checked for length and control
    characters; ``None`` when nothing was stated."""
    values: dict[str, str] = {}
    for name, value in given.items():
        if name not in FIELDS:
            raise TypeError(f"not a model-card field: {name}")
        if value is None or not value.strip():
            continue
        value = value.strip()
        limit = FIELDS[name][1]
        flag = "--" + name.replace("_", "-")
        if len(value) > limit:
            raise UsageError(f"{flag} is {len(value)} characters long, more than {limit}",
                             hint="shorten it: the card is for a release reader")
        if any(ord(c) < 32 and c not in "\n\t" for c in value):
            raise UsageError(f"{flag} contains control characters")
        values["name" if name == "model_name" else
               "version" if name == "model_version" else name] = value
    from certify.results import ModelCardDoc  # here: the CLI's start-up needs no torch

    return ModelCardDoc(**values) if values else None
