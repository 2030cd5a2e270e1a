"""The playbooks' public variables as the Python API's keyword arguments, from their one home:
the collection's plugins/module_utils/defaults.py (the roles' argument_specs, which Ansible
checks `-e` values against, are kept equal to it by tests/unit/test_defaults.py).

Gives each API function a signature that lists them (help(torchfleet.train) shows names,
types and defaults) and checks the values a caller passes before anything runs.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

# Options the playbooks set themselves (the workload), and run_id, run_dir and runs_root, which
# the API sets from its own run_id= and runs_root=.
INTERNAL = {"workload", "run_id", "run_dir", "runs_root"}
PY_TYPES = {"int": int, "str": str, "bool": bool, "float": float, "list": list, "dict": dict,
            "path": str, "raw": Any}


@functools.lru_cache(maxsize=1)
def public_spec() -> dict[str, dict]:
    """{variable: its spec (type, elements, choices, default, description)}."""
    spec: dict[str, dict] = {}
    for o in defaults.OPTIONS:
        if o.name in INTERNAL:
            continue
        entry: dict[str, Any] = {"type": o.type, "description": o.description}
        if o.elements:
            entry["elements"] = o.elements
        if o.choices:
            entry["choices"] = list(o.choices)
        if defaults.stated(o) is not None:
            entry["default"] = defaults.stated(o)
        spec[o.name] = entry
    return spec


def markdown() -> str:
    """The docs' table of the public variables (docs/variables.md holds it; a test keeps them
    equal): `torchfleet variables --markdown`."""
    rows = ["| variable | type | default | what it sets |", "| --- | --- | --- | --- |"]
    for o in defaults.OPTIONS:
        text = re.sub(r"[CO]\(([^)]*)\)", r"`\1`", o.description)  # Ansible's markup
        if o.choices:
            text += " One of: %s." % ", ".join(o.choices)
        shown = defaults.stated(o)
        shown = "" if shown is None else "`%s`" % (str(shown).lower() if isinstance(shown, bool)
                                                   else shown)
        rows.append("| `%s` | %s | %s | %s |" % (o.name, o.type, shown, text))
    return "\n".join(rows)


def _ansible_spec(spec: dict[str, dict]) -> dict[str, dict]:
    """The part of each option Ansible's validator reads (no description, no default: a value
    not given is left to the playbooks)."""
    keys = ("type", "elements", "choices")
    return {name: {k: v for k, v in opt.items() if k in keys} for name, opt in spec.items()}


def check(values: dict[str, Any]) -> None:
    """Raise TypeError / ValueError naming the variable when a public variable's value does
    not fit its spec (before anything runs); other names are left to the caller."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = public_spec()
    given = {k: v for k, v in values.items() if k in spec and v is not None}
    if not given:
        return
    result = ArgumentSpecValidator(_ansible_spec({k: spec[k] for k in given})).validate(given)
    if result.error_messages:
        raise ValueError("; ".join(result.error_messages))


def parameters() -> list[inspect.Parameter]:
    """Keyword-only parameters for every public variable, default None (= the playbooks'
    default, shown in the docstring)."""
    out = []
    for name, opt in sorted(public_spec().items()):
        kind = PY_TYPES.get(opt.get("type", "raw"), Any)
        annotation = Any if kind is Any else (kind | None)
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                     annotation=annotation))
    return out


def docs() -> str:
    lines = ["Playbook variables (keyword arguments; None leaves the playbooks' default):", ""]
    for name, opt in sorted(public_spec().items()):
        text = opt.get("description", "")
        text = " ".join(text) if isinstance(text, list) else str(text)
        default = "" if "default" not in opt else " (default %r)" % (opt["default"],)
        lines.append("    %s: %s%s. %s" % (name, opt.get("type", "raw"), default, text))
    return "\n".join(lines)


def typed(function):
    """Give an API function the public variables as keyword-only parameters in its signature
    and docstring, and check their values before it runs."""
    sig = inspect.signature(function)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    own = {p.name for p in params}
    extra = [p for p in parameters() if p.name not in own]
    variables = inspect.Parameter("variables", inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=dict[str, Any] | None)

    @functools.wraps(function)
    def wrapper(*args, variables: dict[str, Any] | None = None, **kwargs):
        unknown = sorted(set(kwargs) - own - set(public_spec()))
        if unknown:
            raise TypeError("%s() got unknown argument(s) %s: the playbooks' variables are "
                            "listed in help(torchfleet.%s); pass other variables in "
                            "variables={...}" % (function.__name__, ", ".join(unknown),
                                                 function.__name__))
        merged = {**(variables or {}), **kwargs}
        check(merged)
        return function(*args, **merged)

    wrapper.__signature__ = sig.replace(parameters=params + extra + [variables])
    wrapper.__doc__ = (function.__doc__ or "") + "\n\n" + docs()
    return wrapper
