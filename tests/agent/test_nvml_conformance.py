"""The agent's NVML calls against the real pynvml of the pinned nvidia-ml-py (issue 38, "NVML that cannot drift").

No GPU is needed: the module itself is loaded and looked at. Every ``pynvml.<name>`` the agent's code names must
exist in it; every call must bind to the real function's signature with the arguments the agent passes (a
renamed or re-shaped function in a new nvidia-ml-py fails here, not on the first real node); every structure the
agent builds must have the fields it fills; and the stand-in the agent's tests install (FakeNvml in
tests/agent/test_gpus_nvml.py) must take the same calls, so the tests cannot pass on a shape the real one refuses.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml
import pytest

import gpubook_agent
from tests.agent.test_gpus_nvml import FakeNvml

AGENT = Path(gpubook_agent.__file__).parent


@dataclass(frozen=True)
class Use:
    where: str  # file:line
    name: str
    call: ast.Call | None  # the call when the name is called


def uses() -> Iterator[Use]:
    """Every ``pynvml.<name>`` in the agent's code, with the call it is part of."""
    for path in sorted(AGENT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml":
                yield Use(f"{path.relative_to(AGENT)}:{node.lineno}", node.attr, calls.get(id(node)))


USES = list(uses())


def _binds(function: object, call: ast.Call) -> str | None:
    """Why ``call``'s shape (positional count, keyword names) cannot call ``function``, or None."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return None  # *args or **kwargs: nothing to tell statically
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(len(call.args)), **{kw.arg: None for kw in call.keywords if kw.arg})
    except TypeError as error:
        return str(error)
    return None


def test_the_agent_names_pynvml_in_the_modules_meant_for_it():
    assert USES, "no use of pynvml found: the scan is broken"
    assert {use.where.split(":")[0] for use in USES} >= {"gpus/nvml.py", "gpus/gpm.py"}


@pytest.mark.parametrize("use", USES, ids=lambda use: f"{use.name}@{use.where}")
def test_every_name_the_agent_uses_exists_in_the_pinned_pynvml(use):
    assert hasattr(pynvml, use.name), f"{use.where}: pynvml.{use.name} is not in nvidia-ml-py {_version()}"


CALLS = [use for use in USES if use.call is not None and callable(getattr(pynvml, use.name, None))]


@pytest.mark.parametrize("use", CALLS, ids=lambda use: f"{use.name}@{use.where}")
def test_every_call_binds_to_the_real_functions_signature(use):
    problem = _binds(getattr(pynvml, use.name), use.call)
    assert problem is None, f"{use.where}: pynvml.{use.name} called as the real one refuses: {problem}"


def structure_fields() -> Iterator[tuple[str, str, str]]:
    """(where, structure, field) for every field the agent sets or reads on a structure it made itself
    (``request = pynvml.c_nvmlGpmMetricsGet_t()`` then ``request.numMetrics = 1``), within one function."""
    for path in sorted(AGENT.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            made: dict[str, str] = {}
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Attribute)
                    and isinstance(node.value.func.value, ast.Name)
                    and node.value.func.value.id == "pynvml"
                    and node.value.func.attr.startswith("c_")
                ):
                    made.update(
                        {target.id: node.value.func.attr for target in node.targets if isinstance(target, ast.Name)}
                    )
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in made:
                    yield f"{path.relative_to(AGENT)}:{node.lineno}", made[node.value.id], node.attr


FIELDS = list(structure_fields())


def test_the_structures_the_agent_fills_are_found():
    assert {structure for _, structure, _ in FIELDS} >= {"c_nvmlGpmMetricsGet_t"}, "the scan is broken"


@pytest.mark.parametrize(("where", "structure", "field"), FIELDS, ids=lambda value: str(value))
def test_every_field_the_agent_sets_or_reads_exists(where, structure, field):
    fields = {name for name, *_ in getattr(pynvml, structure)._fields_}
    assert field in fields, f"{where}: pynvml.{structure} has no field {field!r} (it has {sorted(fields)})"


FAKED = [use for use in CALLS if use.name.startswith("nvml") and hasattr(FakeNvml, use.name)]


@pytest.mark.parametrize("use", FAKED, ids=lambda use: f"{use.name}@{use.where}")
def test_the_tests_stand_in_takes_the_agents_calls_as_the_real_one_does(use):
    fake = getattr(FakeNvml([]), use.name)
    assert _binds(fake, use.call) is None, f"{use.where}: FakeNvml.{use.name} takes another shape"


def test_the_tests_stand_in_fakes_only_functions_the_real_module_has():
    faked = {name for name in dir(FakeNvml) if name.startswith("nvml")}
    assert faked, "FakeNvml fakes nothing: the scan is broken"
    assert sorted(name for name in faked if not hasattr(pynvml, name)) == []


def test_a_call_the_real_function_refuses_is_caught():
    """The control: the check above does fail on a call of the wrong shape."""
    call = ast.parse("pynvml.nvmlDeviceGetHandleByIndex(0, 1)").body[0].value  # type: ignore[attr-defined]
    assert _binds(pynvml.nvmlDeviceGetHandleByIndex, call) is not None
    assert _binds(pynvml.nvmlDeviceGetHandleByIndex, ast.parse("f(0)").body[0].value) is None  # type: ignore[attr-defined]


def _version() -> str:
    from importlib.metadata import version

    return version("nvidia-ml-py")
