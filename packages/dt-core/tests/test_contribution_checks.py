"""`dt-plugins check` validates what plugins contribute before any call: a sharding
function registered with a kind that does not fit it (torch would fail at the op's first
call), handlers and passes that cannot take their arguments, op names that do not parse
or name nothing. Each mistake is named by plugin and op; the real plugins pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from dt_core import GraphPass, LibraryOps, LocalTensorRule, OpHandler, ShardingStrategy, torch_gaps
from dt_core import contribution_checks as checks
from dt_core.compat.sharding_rules import placement_strategy
from test_autoload import make_plugin_dist, run_python

NEG = torch.ops.aten.neg.default  # one tensor argument
PAD = torch.ops.aten.constant_pad_nd.default  # a tensor, sizes, a value with a default


def neg_placements(spec: Any) -> list:
    from torch.distributed.tensor import Replicate, Shard

    return [([Shard(d)], [Shard(d)]) for d in range(spec.ndim)] + [([Replicate()], [Replicate()])]


def neg_strategy(op_schema: Any) -> Any:  # pragma: no cover - the dry call stops first
    return op_schema.args_schema[0]


def annotated(spec: Any) -> list:  # pragma: no cover - never called
    return []


annotated.__annotations__["spec"] = "DTensorSpec"  # as `spec: DTensorSpec` would say


def _problems(check, item) -> list[str]:
    return list(check(item))


@pytest.mark.parametrize(
    "strategy",
    [
        ShardingStrategy(NEG, neg_placements, kind="placements"),
        ShardingStrategy(NEG, neg_strategy),
        ShardingStrategy(NEG, neg_strategy, kind="rule"),
        ShardingStrategy(PAD, torch_gaps.constant_pad_placements, kind="placements"),
        ShardingStrategy(NEG, placement_strategy(NEG, neg_placements)[0]),  # as installed
    ],
    ids=["placements", "strategy", "rule", "varargs", "expanded"],
)
def test_functions_that_fit_their_kind_pass(strategy: ShardingStrategy) -> None:
    assert _problems(checks.check_strategy, strategy) == []


def test_a_placements_function_registered_as_a_strategy_is_found_by_a_dry_call() -> None:
    (problem,) = _problems(checks.check_strategy, ShardingStrategy(NEG, neg_placements))
    assert problem.startswith("sharding strategy for aten.neg.default (kind='strategy'): ")
    assert "AttributeError: 'OpSchema' object has no attribute 'ndim'" in problem
    assert "kind='placements'" in problem and "neg_placements" in problem


def test_a_placements_function_that_takes_the_ops_arguments_is_found_by_its_signature() -> None:
    (problem,) = _problems(
        checks.check_strategy,
        ShardingStrategy(torch.ops.aten.add.Tensor, lambda x_spec, other_spec: []),
    )
    assert "(x_spec, other_spec) cannot take the one OpSchema argument" in problem


def test_a_strategy_function_registered_for_placements_is_found() -> None:
    strategy = ShardingStrategy(NEG, neg_strategy, kind="placements")
    (problem,) = _problems(checks.check_strategy, strategy)
    assert "'DTensorSpec' object has no attribute 'args_schema'" in problem
    assert "kind='strategy'" in problem
    (problem,) = _problems(
        checks.check_strategy, ShardingStrategy(PAD, neg_strategy, kind="placements")
    )
    assert "cannot take the op's 2 argument(s) (self, pad)" in problem


def test_annotations_kinds_and_ops_are_checked() -> None:
    (problem,) = _problems(checks.check_strategy, ShardingStrategy(NEG, annotated))
    assert "annotated to take a DTensorSpec" in problem
    (problem,) = _problems(checks.check_strategy, ShardingStrategy(NEG, neg_strategy, kind="x"))
    assert "kind must be one of 'strategy', 'rule', 'placements'" in problem
    (problem,) = _problems(
        checks.check_strategy, ShardingStrategy(torch.ops.aten.neg, neg_strategy)
    )
    assert "is not an op overload" in problem


def test_handlers_passes_library_names_and_rules_are_checked() -> None:
    (problem,) = _problems(checks.check_handler, OpHandler(NEG, lambda op_call, args: None))
    assert problem.startswith("op handler for aten.neg.default: ")
    assert "cannot take (op_call, args, kwargs)" in problem
    handler = OpHandler(NEG, lambda op_call, args, kwargs: None, takes=lambda args: True)
    (problem,) = _problems(checks.check_handler, handler)
    assert "takes" in problem and "cannot take (args, kwargs)" in problem

    def no_graph() -> None:
        pass

    def needs_nodes(graph: Any) -> None:
        raise ValueError("expected a collective")

    (problem,) = _problems(checks.check_graph_pass, GraphPass("p", no_graph))
    assert "graph pass 'p'" in problem and "cannot take the one graph" in problem
    (problem,) = _problems(checks.check_graph_pass, GraphPass("p", needs_nodes))
    assert "raised on the graph `x -> x`: ValueError: expected a collective" in problem
    broken_settings = GraphPass("p", lambda graph: None, settings=lambda: 1 / 0)  # type: ignore[arg-type]
    assert (
        "settings() raised ZeroDivisionError"
        in _problems(checks.check_graph_pass, broken_settings)[0]
    )

    names = ["aten::neg", "aten:neg", "other::neg", "aten::neg@NoSuchKey", "aten::never_defined"]
    problems = _problems(checks.check_library_ops, LibraryOps("aten", lambda lib: None, ops=names))
    assert len(problems) == 4, problems
    assert "'aten:neg' is not an op name" in problems[0]
    assert "'other::neg' is outside the library's namespace 'aten'" in problems[1]
    assert "'aten::neg@NoSuchKey' names no dispatch key" in problems[2]
    assert "claims 'aten::never_defined', which its define() does not define" in problems[3]

    (problem,) = _problems(checks.check_local_tensor_rule, LocalTensorRule("ns::op", lambda m: m))
    assert "cannot take (mode, func, types, args, kwargs)" in problem


# A third party's plugin with the mistakes `check` exists for.
MISFIT = """
import dt_core

def _define(lib):
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("scaled(Tensor x, float alpha) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    lib.impl("scaled", lambda x, alpha: x * alpha, "CPU")
    import torch
    torch.library.register_fake("dt_misfit::twice", lambda x: torch.empty_like(x), lib=lib)

@dt_core.hookimpl
def dt_library_ops():
    ops = ["dt_misfit::twice", "dt_misfit::scaled"]
    return [dt_core.LibraryOps("dt_misfit", _define, ops=ops, kind="DEF")]

def twice_placements(x_spec):
    from torch.distributed.tensor import Replicate, Shard
    shards = [([Shard(d)], [Shard(d)]) for d in range(x_spec.ndim)]
    return shards + [([Replicate()], [Replicate()])]

def scaled_placements(x_spec, alpha):
    from torch.distributed.tensor import Replicate
    return [([Replicate()], [Replicate(), None])]

@dt_core.hookimpl
def dt_sharding_strategies():
    import torch
    ops = torch.ops.dt_misfit
    return [  # kind="placements" forgotten on both
        dt_core.ShardingStrategy(ops.twice.default, twice_placements),
        dt_core.ShardingStrategy(ops.scaled.default, scaled_placements),
    ]

def count(graph, extra):
    pass

@dt_core.hookimpl
def dt_graph_passes():
    return [dt_core.GraphPass("count", count)]
"""

FIRST_CALL = """
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from dt_core.testing import simulated_ranks
try:
    with simulated_ranks(2):
        x = distribute_tensor(torch.ones(4, 4), init_device_mesh("cpu", (2,)), [Shard(0)])
        torch.ops.dt_misfit.twice(x)
except Exception as error:
    cause = error.__cause__ or error
    print("FIRST_CALL", type(cause).__name__, cause)
"""


@pytest.mark.window_ends  # the CLI in a fresh interpreter: the window's ends
def test_check_names_a_third_party_plugins_mistakes_before_its_first_call(tmp_path: Path) -> None:
    make_plugin_dist(tmp_path, "misfit", MISFIT)
    check = "import sys; from dt_core.cli import main; sys.exit(main(['check']))"
    result = run_python(check, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert len(problems) == 3, result.stdout
    assert all(p.startswith("problem: plugin 'misfit': ") for p in problems)
    twice, scaled, graph_pass = problems
    assert "sharding strategy for dt_misfit.twice.default (kind='strategy')" in twice
    assert "AttributeError: 'OpSchema' object has no attribute 'ndim'" in twice
    assert "dt_misfit.scaled.default" in scaled and "scaled_placements(x_spec, alpha)" in scaled
    assert "graph pass 'count'" in graph_pass
    # What the first call would have said instead, deep in DTensor's propagation:
    first = run_python(FIRST_CALL, tmp_path)
    assert "'OpSchema' object has no attribute 'ndim'" in first.stdout, first.stderr


def test_check_passes_with_every_installed_plugin() -> None:
    """No false alarms: dt-core's torch-gaps and every plugin installed here pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_PLUGINS_")}
    check = "import sys; from dt_core.cli import main; sys.exit(main(['check']))"
    result = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "problem:" not in result.stdout
