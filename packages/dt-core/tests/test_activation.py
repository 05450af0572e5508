"""Activation and deactivation in this process, with in-process plugins.

The sample plugin is installed in this environment and autoloaded; each test starts
from a deactivated core (fixture `core`) and leaves it deactivated with its own
plugins unregistered.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import dt_core
import pytest
import torch
import torch.distributed.tensor  # noqa: F401 - the handler tables live here
from dt_core.compat import dispatch
from dt_core.testing.torch_state import installed_graph_passes

IS_SAME_SIZE = torch.ops.aten.is_same_size.default
CONV = torch.ops.aten.convolution.default


def _handler(op_call, args, kwargs):  # pragma: no cover - never dispatched here
    return None


def _strategy(op_schema):  # pragma: no cover
    return None


def _other_installed_plugins() -> list[str]:
    """Installed plugins besides the sample (e.g. dt-conv in a shared dev venv): they
    would conflict with the fake plugins here, so the tests disable them."""
    from dt_core.discovery import plugin_entry_points

    return [ep.name for ep in plugin_entry_points() if ep.name != "sample"]


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A deactivated core; names registered through the yielded list are cleaned up, and
    the core is left as found (active with the installed plugins, if it was), so a later
    test in the same process (another package's) meets what autoload set up."""
    was_active = dt_core.is_active()
    monkeypatch.setenv("DT_PLUGINS_DISABLE", ",".join(_other_installed_plugins()))
    dt_core.deactivate()
    dt_core.unregister_plugin("")  # forget the discovery done under the old environment
    names: list[str] = []
    yield names
    dt_core.deactivate()
    for name in names:
        dt_core.unregister_plugin(name)
    monkeypatch.undo()  # the environment first: discovery reads DT_PLUGINS_DISABLE
    dt_core.unregister_plugin("")
    if was_active:
        dt_core.activate()


def plugin(**hooks) -> SimpleNamespace:
    return SimpleNamespace(**{name: dt_core.hookimpl(fn) for name, fn in hooks.items()})


def _propagator_tables() -> dict[str, dict]:
    """Every op-keyed table of torch's sharding propagator (2.14 adds single-dim ones)."""
    propagator = torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator
    return {
        name: table
        for name, table in vars(propagator).items()
        if isinstance(table, dict) and name.startswith("op_")
    }


def test_deactivate_restores_torchs_own_handlers_as_the_same_objects(core) -> None:
    table = dispatch.op_handler_table()
    before = dict(table)
    tables_before = {name: dict(t) for name, t in _propagator_tables().items()}
    dt_core.register_plugin(
        plugin(
            dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)],
            dt_sharding_strategies=lambda: [
                dt_core.ShardingStrategy(torch.ops.aten.mm.default, _strategy)
            ],
        ),
        "replacer",
    )
    core.append("replacer")
    dt_core.activate()
    assert table[CONV] is _handler
    funcs = torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert funcs[torch.ops.aten.mm.default] is _strategy
    # nothing of torch's may shadow it (torch 2.14 looks up single-dim strategies first)
    for name, live in _propagator_tables().items():
        if "single_dim" in name:
            assert torch.ops.aten.mm.default not in live, name
    dt_core.deactivate()
    assert table.keys() == before.keys()
    assert all(table[op] is before[op] for op in before)  # identical objects, torch's own
    for name, live in _propagator_tables().items():
        assert live.keys() == tables_before[name].keys(), name
        assert all(live[op] is tables_before[name][op] for op in live), name


def test_plugin_state_transitions_and_info(core) -> None:
    dt_core.register_plugin(plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), "a")
    core.append("a")
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["a"].state == "active"
    assert infos["a"].distribution is None
    assert infos["a"].ops == (str(CONV),)
    dt_core.deactivate()
    assert {p.name: p.state for p in dt_core.plugins()}["a"] == "inactive"


def test_conflict_raises_and_leaves_everything_untouched(core) -> None:
    table = dispatch.op_handler_table()
    before = dict(table)
    for name in ("first", "second"):
        dt_core.register_plugin(
            plugin(dt_op_handlers=lambda: [dt_core.OpHandler(IS_SAME_SIZE, _handler)]), name
        )
        core.append(name)
    with pytest.raises(dt_core.PluginConflictError) as info:
        dt_core.activate()
    message = str(info.value)
    assert "'first'" in message and "'second'" in message and str(IS_SAME_SIZE) in message
    assert not dt_core.is_active()
    assert all(table[op] is before[op] for op in before) and table.keys() == before.keys()


def _same_placements(*args, **kwargs):  # pragma: no cover - never propagated here
    from torch.distributed.tensor import Replicate

    return [([Replicate()], [Replicate()] + [None] * (len(args) - 1))]


def test_a_handler_and_another_plugins_strategy_for_one_op_compose(core) -> None:
    """A handler hands calls it does not own back to torch, where another plugin's
    strategy for the op is what torch then uses: different kinds never conflict; two
    strategies for one op still do."""
    from dt_core.compat.sharding_rules import strategy_tables

    strategy = dt_core.ShardingStrategy(CONV, _same_placements, kind="placements")
    dt_core.register_plugin(plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), "h")
    dt_core.register_plugin(plugin(dt_sharding_strategies=lambda: [strategy]), "s")
    core.extend(["h", "s"])
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["h"].state == infos["s"].state == "active"
    assert dispatch.op_handler_table()[CONV] is _handler
    assert CONV in strategy_tables("strategy")[0]
    dt_core.deactivate()
    dt_core.register_plugin(plugin(dt_sharding_strategies=lambda: [strategy]), "s2")
    core.append("s2")
    with pytest.raises(dt_core.PluginConflictError, match=str(CONV)):
        dt_core.activate()


def test_disabling_one_side_of_a_conflict_resolves_it(core, monkeypatch) -> None:
    for name in ("first", "second"):
        dt_core.register_plugin(
            plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), name
        )
        core.append(name)
    monkeypatch.setenv(
        "DT_PLUGINS_DISABLE", ",".join(["second", "sample", *_other_installed_plugins()])
    )
    dt_core.unregister_plugin("second")  # re-discover with the new environment
    dt_core.register_plugin(
        plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), "second"
    )
    states = {p.name: p.state for p in dt_core.activate()}
    assert states["first"] == "active" and states["second"] == "disabled"
    assert dispatch.op_handler_table()[CONV] is _handler


def test_a_raising_hook_fails_only_its_plugin(core, recwarn) -> None:
    def broken():
        raise ValueError("no handlers today")

    dt_core.register_plugin(plugin(dt_op_handlers=broken), "broken")
    dt_core.register_plugin(
        plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), "ok"
    )
    core.extend(["broken", "ok"])
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["broken"].state == "failed"
    assert "no handlers today" in infos["broken"].reason
    assert infos["ok"].state == "active"
    messages = [str(w.message) for w in recwarn if "dt-core" in str(w.message)]
    assert len(messages) == 1 and "'broken'" in messages[0]


def test_user_passes_stay_in_place_and_keep_running(core) -> None:
    import torch._inductor.config as config

    seen: list[str] = []

    def user_pass(graph) -> None:
        seen.append("user")

    dt_core.register_plugin(
        plugin(
            dt_graph_passes=lambda: [dt_core.GraphPass("mine", lambda graph: seen.append("plugin"))]
        ),
        "passer",
    )
    core.append("passer")
    config.post_grad_custom_post_pass = user_pass
    try:
        dt_core.activate()
        installed = installed_graph_passes("post_grad_post")
        assert installed[0] is user_pass and len(installed) >= 2
        # A later assignment by the user keeps the plugins' passes after the user's.
        config.post_grad_custom_post_pass = [user_pass, user_pass]
        installed = installed_graph_passes("post_grad_post")
        assert installed[:2] == (user_pass, user_pass) and len(installed) >= 3
        assert any(repr(p) == "<dt pass passer:mine>" for p in installed)
        dt_core.deactivate()
        assert config.post_grad_custom_post_pass == [user_pass, user_pass]
    finally:
        config.post_grad_custom_post_pass = None


def test_reactivation_after_deactivate_installs_again(core) -> None:
    dt_core.activate()
    assert torch.ops.dt_sample.scale(torch.ones(1), 4.0).item() == 4.0
    dt_core.deactivate()
    assert not hasattr(torch.ops.dt_sample, "scale")
    dt_core.activate()
    assert torch.ops.dt_sample.scale(torch.ones(1), 5.0).item() == 5.0


def test_library_ops_wait_for_the_torch_module_that_defines_them() -> None:
    """`defined_in`: registered when torch's module is imported, never importing it; the
    undo of a still-waiting registration forgets it, that of a done one removes it."""
    import sys

    from dt_core import LibraryOps, import_hooks, installers

    calls: list[object] = []
    waiting = "torch.dt_core_probe_never_imported"
    assert waiting not in sys.modules
    undo = installers.install_library_ops(
        "probe", LibraryOps("dt_core_probe", calls.append, kind="FRAGMENT", defined_in=waiting)
    )
    assert calls == [] and waiting in import_hooks.pending()
    undo()
    assert waiting not in import_hooks.pending() and calls == []

    lib_ops = LibraryOps(
        "dt_core_probe",
        lambda lib: (calls.append(lib), lib.define("probe_op(Tensor x) -> Tensor")),
        kind="FRAGMENT",
        defined_in="torch.nn",  # already imported: registers at once
    )
    undo = installers.install_library_ops("probe", lib_ops)
    assert len(calls) == 1 and hasattr(torch.ops.dt_core_probe, "probe_op")
    undo()
    with pytest.raises((AttributeError, RuntimeError)):
        torch.ops.dt_core_probe.probe_op.default  # noqa: B018 - the definition is gone
    with pytest.raises(ValueError, match="not a torch module"):
        installers.install_library_ops(
            "probe", LibraryOps("dt_core_probe", calls.append, defined_in="numpy")
        )


def test_patches_named_by_module_wait_for_its_import() -> None:
    """A Patch naming its target by module patches once torch imports it, never importing
    it itself; undoing a still-waiting patch forgets it."""
    import sys

    from dt_core import Patch, import_hooks, installers

    waiting = "torch.dt_core_probe_never_imported"
    undo = installers.install_patch("probe", Patch(f"{waiting}:Thing", "attr", 1))
    assert waiting not in sys.modules and waiting in import_hooks.pending()
    undo()
    assert waiting not in import_hooks.pending()
    module_class = torch.nn.Module  # already imported: patched at once, put back by the undo
    own = module_class.dump_patches
    undo = installers.install_patch("probe", Patch("torch.nn:Module", "dump_patches", "probe"))
    assert module_class.dump_patches == "probe"
    undo()
    assert module_class.dump_patches is own


def test_torch_gaps_fills_only_what_torch_lacks_and_takes_it_out_again(core) -> None:
    """dt-core's torch-gaps plugin: only ops torch's own tables lack (from 2.13 on, only
    PReLU's forward and backward, which no torch of the window registers);
    with one of torch's interpolation strategies taken away (as torch 2.12 lacks it), the
    plugin fills it, the op then runs exact on DTensors, and deactivate removes it."""
    from dt_core import torch_gaps
    from dt_core.compat.sharding_rules import has_sharding_entry, lacks_cache_key
    from dt_core.testing import rank_values, simulated_ranks
    from torch.distributed.tensor import DTensor, Partial

    filled = [strategy.op for strategy in torch_gaps.dt_sharding_strategies()]
    # each one torch lacks, or one it registers without a cache key (2.11's constant pad)
    assert all(not has_sharding_entry(op) or lacks_cache_key(op) for op in filled)
    bilinear_backward = torch.ops.aten.upsample_bilinear2d_backward.default
    prelu = [torch.ops.aten._prelu_kernel.default, torch.ops.aten._prelu_kernel_backward.default]
    assert all(op in filled for op in prelu)
    if has_sharding_entry(bilinear_backward):  # a torch with every older piece (2.13 on)
        assert filled == prelu
    else:
        assert bilinear_backward in filled  # 2.11, 2.12
    op = torch.ops.aten.upsample_nearest2d_backward.default
    tables = _propagator_tables()
    taken = {name: table.pop(op) for name, table in tables.items() if op in table}
    try:
        assert not has_sharding_entry(op)
        dt_core.register_plugin(torch_gaps, "gaps")
        core.append("gaps")
        infos = {p.name: p for p in dt_core.activate()}
        assert infos["gaps"].state == "active" and str(op) in infos["gaps"].ops
        assert has_sharding_entry(op)
        grad = torch.arange(32.0).reshape(1, 2, 4, 4)
        with simulated_ranks(2) as mode:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2,))
            # the simulated ranks hold a quarter and three quarters: a pending sum
            shares = mode.rank_map(lambda r: grad * (0.25 if r == 0 else 0.75))
            partial = DTensor.from_local(shares, mesh, [Partial()], run_check=False)
            got = op(partial, [4, 4], [1, 2, 2, 2], 2.0, 2.0)
            assert tuple(got.placements) == (Partial(),)  # linear: the pending sum stays
            values = rank_values(got.full_tensor(), 2)
        expected = grad.reshape(1, 2, 2, 2, 2, 2).sum((3, 5))  # each input pixel's 2x2
        for value in values:
            torch.testing.assert_close(value, expected)
        dt_core.deactivate()
        assert not has_sharding_entry(op)
    finally:
        for name, value in taken.items():
            tables[name][op] = value


def test_handlers_that_take_some_calls_share_an_op_and_leave_the_rest(core) -> None:
    """Two plugins' handlers with `takes` share one op: each call goes to the first that
    takes it, a call neither takes to what handled the op before (torch's own handler
    here); no conflict is reported, and deactivate() puts torch's handler back."""
    table = dispatch.op_handler_table()
    before = table.get(CONV)
    seen: list[str] = []

    def handler(name: str):
        def run(op_call, args, kwargs):
            seen.append(name)
            return name

        return run

    for name, wanted in (("evens", 0), ("odds", 1)):
        dt_core.register_plugin(
            plugin(
                dt_op_handlers=lambda name=name, wanted=wanted: [
                    dt_core.OpHandler(
                        CONV, handler(name), takes=lambda a, k, w=wanted: a[0] % 2 == w
                    )
                ]
            ),
            name,
        )
        core.append(name)
    infos = {p.name: p for p in dt_core.activate()}
    assert infos["evens"].state == infos["odds"].state == "active"
    shared = table[CONV]
    assert shared(CONV, (2,), {}) == "evens" and shared(CONV, (3,), {}) == "odds"
    assert seen == ["evens", "odds"]
    assert shared.otherwise is before  # the calls neither takes: torch's own handler
    dt_core.deactivate()
    assert table.get(CONV) is before


def test_two_handlers_that_take_every_call_still_conflict(core) -> None:
    for name in ("first", "second"):
        dt_core.register_plugin(
            plugin(dt_op_handlers=lambda: [dt_core.OpHandler(CONV, _handler)]), name
        )
        core.append(name)
    with pytest.raises(dt_core.PluginConflictError, match="both claim"):
        dt_core.activate(lazy=False)


@pytest.mark.parametrize("parameters", [1, 4])
def test_prelu_keeps_every_shard(parameters: int) -> None:
    """PReLU forward and backward on inputs sharded along batch, channels or rows (2
    simulated ranks) against one process: output and the gradients of input and weight
    match, output and input gradient keep the input's placement, and the forward moves
    nothing (torch alone raises in the backward: no strategy; torch 2.11 gathers the
    input in the forward)."""
    import copy

    from dt_core.testing import rank_values, simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    gen = torch.Generator().manual_seed(parameters)
    x = torch.randn(2, 4, 6, 5, generator=gen, dtype=torch.float64)
    layer = torch.nn.PReLU(parameters).double()
    with torch.no_grad():
        layer.weight.uniform_(0.1, 0.9, generator=gen)
    ref, xr = copy.deepcopy(layer), x.clone().requires_grad_()
    (ref(xr) ** 2).sum().backward()
    for placement in (Shard(0), Shard(1), Shard(2)):
        with simulated_ranks(2) as mode:
            mesh = init_device_mesh("cpu", (2,))
            sharded = copy.deepcopy(layer)
            distribute_module(sharded, mesh)
            xd = distribute_tensor(x, mesh, [placement]).requires_grad_()
            with CommDebugMode() as comms:
                out = sharded(xd)
            assert comms.get_total_counts() == 0, comms.get_comm_counts()
            assert out.placements == (placement,)
            (out**2).sum().backward()
            assert xd.grad.placements == (placement,)
            tensors = (out.full_tensor(), xd.grad.full_tensor(), sharded.weight.grad.full_tensor())
            with mode.disable():
                got = [rank_values(t, 2) for t in tensors]
        for rank in range(2):
            torch.testing.assert_close(got[0][rank], ref(x))
            torch.testing.assert_close(got[1][rank], xr.grad)
            torch.testing.assert_close(got[2][rank], ref.weight.grad)
