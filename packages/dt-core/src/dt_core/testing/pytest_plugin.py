"""pytest plugin for multi-rank tests: the `ranks(n)` marker and the `dist_world` fixture.

pytest loads this in every run wherever dt-core is installed, so it must stay cheap to
import: the harness (and torch) are imported only when a test asks for ranks.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dt_core.testing.world import World

_MARKER_HELP = (
    "ranks(n, ..., timeout=None): run the test body on each of n ranks (spawned CPU processes "
    "in a gloo process group, shared between tests); several sizes run the test once per "
    "size (ids '2ranks', '4ranks'; the fixture `world_size` gives it); parametrize arguments "
    "and picklable fixture values are passed along; timeout in seconds defaults to "
    "$DT_TEST_RANK_TIMEOUT or 120."
)
_HEAVY_HELP = (
    "compile_heavy: the test's cost is compiling (Inductor's code generation, or tracing a "
    "whole model) what another test checks exactly, eagerly or compiled; a CI with little "
    "time may leave it out (-m 'not compile_heavy')"
)
_ONCE_HELP = (
    "ci_once: what the test checks does not differ between torch releases (tooling, "
    "packaging, the demo's machinery) or is a larger twin of a case every release runs (a "
    "test on more than 2 rank processes, which simulated-rank sweeps cover on every "
    "release; it gets this marker by itself; a composed stack whose parts are checked "
    "alone); a CI running several torch releases may run it on one of them only"
)
_ENDS_HELP = (
    "window_ends: the test checks the project's own machinery through fresh interpreters "
    "(autoload, the CLI, the docs' examples, the test harness, packaging); torch matters to "
    "it only through what it imports and its version, which the window's oldest and newest "
    "releases bound; a CI running several torch releases may run it on those two only"
)
WORLD_SIZE_FIXTURE = "world_size"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    config.addinivalue_line("markers", _HEAVY_HELP)
    config.addinivalue_line("markers", _ONCE_HELP)
    config.addinivalue_line("markers", _ENDS_HELP)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`ranks(2, 4)`: one test per world size."""
    marker = metafunc.definition.get_closest_marker("ranks")
    if marker is None:
        return
    sizes, _ = _ranks_args(*marker.args, **marker.kwargs)
    if len(sizes) > 1:
        if WORLD_SIZE_FIXTURE not in metafunc.fixturenames:
            metafunc.fixturenames.append(WORLD_SIZE_FIXTURE)
        metafunc.parametrize(WORLD_SIZE_FIXTURE, sizes, ids=[f"{n}ranks" for n in sizes])


# Beyond 2 processes, a rank test is the twin of a simulated-rank sweep (LocalTensorMode
# runs 2-D meshes and 3-8 ranks in one process on every release): `ci_once`.
ONCE_ABOVE_RANKS = 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs on more than 2 processes `ci_once`."""
    for item in items:
        marker = item.get_closest_marker("ranks")
        if marker is None:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and WORLD_SIZE_FIXTURE in callspec.params:
            size = int(callspec.params[WORLD_SIZE_FIXTURE])
        else:
            size = _ranks_args(*marker.args, **marker.kwargs)[0][0]
        if size > ONCE_ABOVE_RANKS:
            item.add_marker(pytest.mark.ci_once)


@pytest.fixture(autouse=True)
def _forget_plugin_records() -> Iterator[None]:
    """What plugins recorded during a test (`dt_core.forget`) is not the next test's: in
    this process (simulated ranks) as in the rank processes, which forget after each task."""
    yield
    from dt_core.remembered import forget

    forget()


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """The number of ranks a `ranks(...)` test runs on."""
    if hasattr(request, "param"):
        return int(request.param)
    marker = request.node.get_closest_marker("ranks")
    if marker is None:
        raise pytest.UsageError("the world_size fixture needs a ranks(...) marker")
    return _ranks_args(*marker.args, **marker.kwargs)[0][0]


@pytest.fixture
def dist_world(request: pytest.FixtureRequest) -> Callable[[int], World]:
    """Factory: `dist_world(n)` is this process's shared World of n ranks."""
    from dt_core.testing.world import get_world

    _ship_by_value(request.module)
    return get_world


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run tests marked `ranks(n)` on the ranks instead of in this process."""
    marker = pyfuncitem.get_closest_marker("ranks")
    if marker is None:
        return None
    sizes, timeout = _ranks_args(*marker.args, **marker.kwargs)
    callspec = getattr(pyfuncitem, "callspec", None)
    world_size = int(callspec.params.get(WORLD_SIZE_FIXTURE, sizes[0]) if callspec else sizes[0])
    from dt_core.testing.world import RankFailure, get_world

    _ship_by_value(pyfuncitem.module)
    fn = pyfuncitem.obj
    params = inspect.signature(fn).parameters
    kwargs = {name: value for name, value in pyfuncitem.funcargs.items() if name in params}
    for name, value in kwargs.items():
        if problem := _pickling_problem(value):
            pytest.fail(f"argument {name!r} cannot be sent to the ranks: {problem}", pytrace=False)
    try:
        get_world(world_size).run(fn, timeout=timeout, **kwargs)
    except RankFailure as failure:
        outcome = failure
    else:
        return True
    # Reported outside the except block, so pytest doesn't repeat it as a chained exception.
    errors = list(outcome.errors.values())
    if len(errors) == world_size and all(err.type_name == "Skipped" for err in errors):
        pytest.skip(errors[0].message)  # every rank skipped, so the test is skipped
    pytest.fail(str(outcome), pytrace=False)


def _ranks_args(*sizes: int, timeout: float | None = None) -> tuple[tuple[int, ...], float | None]:
    if not sizes or not all(n > 0 for n in sizes):
        raise pytest.UsageError(f"ranks(...) takes positive world sizes, got {sizes}")
    return tuple(sizes), timeout


def _pickling_problem(value: Any) -> str | None:
    from dt_core.testing import pickling

    try:
        pickling.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling error means it can't be sent
        return f"{type(exc).__name__}: {exc}"
    return None


def _ship_by_value(module: ModuleType | None) -> None:
    """Pickle the test module's functions by value: under some import modes or rootdirs
    a rank could not import the module by name."""
    if module is None:
        return
    import cloudpickle

    try:
        cloudpickle.register_pickle_by_value(module)
    except ValueError:  # not in sys.modules: cloudpickle ships its functions by value anyway
        pass


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the shared worlds; only if a test started one (don't import the harness)."""
    world = sys.modules.get("dt_core.testing.world")
    if world is not None:
        world.shutdown_worlds()
