"""What `dt-plugins check` validates of each active plugin's contributions without running
a model, so that a plugin's mistake is reported by plugin and op before its first call
rather than as torch's error deep inside one: records name real ops, functions take the
arguments their caller passes (read from their signatures and annotations, then a dry
call of each sharding function, `dt_core.strategy_probe`), passes run on the smallest
graph and say their settings, library op names parse and name ops that exist.
"""

from __future__ import annotations

import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from . import contributions as c
from .registry import describe

STRATEGY_KINDS = ("strategy", "rule", "placements")
_OP_NAME = re.compile(r"^(\w+)::(\w+)(\.\w+)?(?:@(\w+))?$")


def _name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else name


def _takes(fn: Any, count: int) -> bool | None:
    """Whether `fn` can be called with `count` positional arguments (None: unknown)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*[None] * count)
    except TypeError:
        return False
    return True


def _first_annotation(fn: Any) -> str:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ""
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return ""
    annotation = parameters[0].annotation
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")


def _callable(what: str, fn: Any, count: int, passed: str) -> Iterator[str]:
    if not callable(fn):
        yield f"{what}: {fn!r} is not callable"
    elif _takes(fn, count) is False:
        yield f"{what}: {_name(fn)}{inspect.signature(fn)} cannot take {passed}"


def _op_overload(what: str, op: Any) -> Iterator[str]:
    from .compat import op_schemas

    if not op_schemas.is_op_overload(op):
        yield f"{what}: {op!r} is not an op overload (e.g. torch.ops.aten.neg.default)"


def check_strategy(strategy: c.ShardingStrategy) -> Iterator[str]:
    """A sharding function whose kind does not fit how DTensor will call it."""
    from . import strategy_probe
    from .compat import op_schemas

    what = f"sharding strategy for {strategy.op} (kind={strategy.kind!r})"
    if strategy.kind not in STRATEGY_KINDS:
        yield f"{what}: kind must be one of {', '.join(map(repr, STRATEGY_KINDS))}"
        return
    problems = list(_op_overload(what, strategy.op))
    if problems or not callable(strategy.func):
        yield from problems or [f"{what}: {strategy.func!r} is not callable"]
        return
    fn, placements = strategy.func, strategy.kind == "placements"
    names = [
        a.name for a in op_schemas.op_arguments(strategy.op) if a.required and not a.kwarg_only
    ]
    hint = (
        "a strategy function? register it with kind='strategy'"
        if placements
        else "written for kind='placements'? register it with ShardingStrategy(..., "
        "kind='placements')"
    )
    if placements and _takes(fn, len(names)) is False:
        passed = f"the op's {len(names)} argument(s) ({', '.join(names)})"
        yield f"{what}: {_name(fn)}{inspect.signature(fn)} cannot take {passed}; {hint}"
        return
    if not placements and _takes(fn, 1) is False:
        passed = "the one OpSchema argument DTensor passes"
        yield f"{what}: {_name(fn)}{inspect.signature(fn)} cannot take {passed}; {hint}"
        return
    wrong = "OpSchema" if placements else "DTensorSpec"
    if wrong in _first_annotation(fn):
        yield f"{what}: {_name(fn)} is annotated to take a {wrong}; {hint}"
        return
    misread = strategy_probe.dry_call(strategy)
    if misread:
        yield (
            f"{what}: {_name(fn)} would fail at the op's first call with "
            f"AttributeError: {misread}; {hint}"
        )


def check_handler(handler: c.OpHandler) -> Iterator[str]:
    what = f"op handler for {handler.op}"
    yield from _op_overload(what, handler.op)
    yield from _callable(what, handler.handler, 3, "(op_call, args, kwargs)")
    if handler.takes is not None:
        yield from _callable(f"{what}'s takes", handler.takes, 2, "(args, kwargs)")


def check_hop_rule(rule: c.HopRule) -> Iterator[str]:
    from .compat import op_schemas

    what = f"rule {rule.claim()}"
    if not op_schemas.is_higher_order_operator(rule.hop):
        yield f"{what}: {rule.hop!r} is not a higher-order operator"
    if not callable(rule.fn):
        yield f"{what}: {rule.fn!r} is not callable"


def _smallest_graph() -> Any:
    """The smallest graph Inductor could hand a pass: one input, returned."""
    import torch.fx

    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    return graph


def check_graph_pass(graph_pass: c.GraphPass) -> Iterator[str]:
    """A pass must run on a graph (tried on the smallest one) and say its settings."""
    what = f"graph pass {graph_pass.name!r}"
    if graph_pass.stage not in ("post_grad_pre", "post_grad_post"):
        yield f"{what}: stage {graph_pass.stage!r} is not 'post_grad_pre' or 'post_grad_post'"
    try:
        settings = graph_pass.settings()
        if not isinstance(settings, Mapping):
            yield f"{what}: settings() returned {type(settings).__name__}, not a mapping"
    except Exception as error:  # noqa: BLE001 - the plugin's mistake, reported
        yield f"{what}: settings() raised {describe(error)}"
    problems = list(_callable(what, graph_pass.fn, 1, "the one graph Inductor passes"))
    yield from problems
    if not problems:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph_pass.fn(_smallest_graph())
        except Exception as error:  # noqa: BLE001 - the plugin's mistake, reported
            yield f"{what}: {_name(graph_pass.fn)} raised on the graph `x -> x`: {describe(error)}"


def _op_name(what: str, name: str, namespace: str | None = None) -> Iterator[str]:
    from .compat import op_schemas

    match = _OP_NAME.match(name)
    if match is None:
        yield f"{what}: {name!r} is not an op name 'namespace::name[.overload][@DispatchKey]'"
    elif namespace is not None and match.group(1) != namespace:
        yield f"{what}: {name!r} is outside the library's namespace {namespace!r}"
    elif match.group(4) and not op_schemas.is_dispatch_key(match.group(4)):
        yield f"{what}: {name!r} names no dispatch key of torch"


def _exists(namespace: str, name: str) -> bool:
    import torch

    return hasattr(getattr(torch.ops, namespace), name)


def check_library_ops(library_ops: c.LibraryOps) -> Iterator[str]:
    """Op names that parse and, once defined, exist (torch parsed their schemas)."""
    what = f"library {library_ops.namespace!r}"
    if library_ops.kind not in ("DEF", "FRAGMENT", "IMPL"):
        yield f"{what}: kind {library_ops.kind!r} is not 'DEF', 'FRAGMENT' or 'IMPL'"
    waiting = library_ops.defined_in is not None and library_ops.defined_in not in sys.modules
    for name in library_ops.ops:
        problems = list(_op_name(what, name, library_ops.namespace))
        yield from problems
        if not problems and not waiting:
            op = _OP_NAME.match(name)
            assert op is not None
            if not _exists(op.group(1), op.group(2)):
                yield f"{what}: claims {name!r}, which its define() does not define"


def check_local_tensor_rule(rule: c.LocalTensorRule) -> Iterator[str]:
    what = f"LocalTensorMode rule for {rule.op}"
    yield from _op_name(what, rule.op)
    yield from _callable(what, rule.fn, 5, "(mode, func, types, args, kwargs)")


CHECKS: dict[str, Callable[[Any], Iterator[str]]] = {
    "sharding_strategies": check_strategy,
    "op_handlers": check_handler,
    "hop_rules": check_hop_rule,
    "graph_passes": check_graph_pass,
    "library_ops": check_library_ops,
    "local_tensor_rules": check_local_tensor_rule,
}


def contribution_problems(records: list[Any]) -> list[str]:
    """One line per mistake in the contributions of `records` (the usable plugins')."""
    found = []
    for record in records:
        for kind_name, items in record.contributions.items():
            check = CHECKS.get(kind_name)
            if check is None:  # patches: checked as they are installed
                continue
            for item in items:
                try:
                    found += [f"plugin {record.name!r}: {line}" for line in check(item)]
                except Exception as error:  # noqa: BLE001 - a check must not stop the others
                    found.append(
                        f"plugin {record.name!r}: checking {kind_name} failed: {describe(error)}"
                    )
    return found


def checked_counts(records: list[Any]) -> dict[str, int]:
    """How many contributions of each kind `contribution_problems` checks in `records`:
    what `dt-plugins check` says it checked."""
    counts: dict[str, int] = {}
    for record in records:
        for kind_name, items in record.contributions.items():
            if kind_name in CHECKS and items:
                counts[kind_name] = counts.get(kind_name, 0) + len(items)
    return dict(sorted(counts.items()))
