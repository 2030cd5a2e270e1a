"""The API's keyword arguments are the playbooks' public variables, from the roles' argument
specs: listed by help(), typed in the signature, checked before anything runs."""
from __future__ import annotations

import inspect
import pydoc

import pytest

import torchfleet
from torchfleet import variables


def test_help_lists_every_public_variable_with_its_type_and_default():
    text = pydoc.render_doc(torchfleet.train, renderer=pydoc.plaintext)
    for name in ("nnodes", "master_port", "data_paths", "collective_isolate", "lost_after_s"):
        assert name in text
    assert "master_port: int (default 29500)" in text
    sig = inspect.signature(torchfleet.collective)
    assert sig.parameters["master_port"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["master_port"].annotation == int | None
    assert "variables" in sig.parameters and "on_event" in sig.parameters
    assert set(variables.public_spec()) <= set(sig.parameters)


@pytest.mark.parametrize("kwargs, named", [
    ({"master_port": "abc"}, "master_port"),
    ({"collective_isolate_schedule": "star"}, "collective_isolate_schedule"),
    ({"variables": {"nnodes": "two"}}, "nnodes"),
])
def test_a_value_of_the_wrong_type_is_refused_before_anything_runs(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named):
        torchfleet.collective(runs_root=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []  # no run directory: nothing ran


def test_an_unknown_keyword_is_refused_and_variables_takes_the_rest(tmp_path):
    with pytest.raises(TypeError, match="nnode.*variables="):
        torchfleet.preflight(runs_root=tmp_path, nnode=2)
    variables.check({"ansible_user": "ubuntu", "nnodes": 2})  # only public names are checked
