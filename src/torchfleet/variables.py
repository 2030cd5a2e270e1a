"""The playbooks' public variables as the Python API's keyword arguments, from one definition:
the roles' meta/argument_specs.yml (the same file Ansible checks `-e` values against).

Gives each API function a signature that lists them (help(torchfleet.train) shows names,
types and defaults) and checks the values a caller passes before anything runs.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import yaml

from torchfleet.paths import collection_root

# Options the playbooks set themselves (the workload), and run_dir and runs_root, which the API
# sets from runs_root= and run_id=. A role's own parameters (the hand-offs between roles, named
# <role>_*) are not public either.
INTERNAL = {"workload", "run_dir", "runs_root"}
PY_TYPES = {"int": int, "str": str, "bool": bool, "float": float, "list": list, "dict": dict,
            "path": str, "raw": Any}


@functools.lru_cache(maxsize=1)
def public_spec() -> dict[str, dict]:
    """{variable: its argument spec} over every role's entry points, first definition kept."""
    spec: dict[str, dict] = {}
    for path in sorted(Path(collection_root(), "roles").glob("*/meta/argument_specs.yml")):
        role = path.parents[1].name
        entries = (yaml.safe_load(path.read_text()) or {}).get("argument_specs", {})
        for entry in entries.values():
            for name, option in (entry.get("options") or {}).items():
                if name not in INTERNAL and not name.startswith(role + "_"):
                    spec.setdefault(name, option)
    return spec


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
