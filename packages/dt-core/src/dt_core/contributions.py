"""What a plugin can contribute: plain records, free of torch imports.

Plugins return these from their hookimpls (see `dt_core.hookspecs`). dt-core turns
them into installed state through `dt_core.compat` (see `dt_core.kinds` for the table of
kinds), and records what it replaced so `deactivate()` can put back the very same objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PassStage = Literal["post_grad_pre", "post_grad_post"]


@dataclass(frozen=True)
class OpHandler:
    """Take over the whole DTensor dispatch of `op` (like torch's own convolution handler).

    `handler(op_call, args, kwargs)` receives DTensor arguments and returns the result.
    With `takes(args, kwargs) -> bool` the handler takes only the calls it says yes to
    and can share `op` with other plugins' handlers: dt-core asks each such handler in
    turn (plugins in load order), and a call none takes goes where it went before (a
    handler without `takes`, or torch). Two handlers without `takes` for one op conflict.
    """

    op: Any  # torch._ops.OpOverload
    handler: Callable[..., object]
    takes: Callable[[tuple[Any, ...], dict[str, Any]], bool] | None = None

    def claim(self, owner: str) -> str:
        """The conflict key: the op, or the op and its owner for a handler that takes only
        some calls (those share the op)."""
        return str(self.op) if self.takes is None else f"{self.op} [some calls: {owner}]"


@dataclass(frozen=True)
class HopRule:
    """A rule for a higher-order operator (e.g. torch's flex_attention) on a tensor subclass.

    When `hop` (a `torch._ops.HigherOrderOperator`) is called with a `subclass` argument
    (None: DTensor), `fn(*args, **kwargs)` runs instead of raising "no rule registered",
    as `hop.py_impl(subclass)` would do. Installed with the DTensor part; `deactivate()`
    puts back whatever rule was registered before.
    """

    hop: Any
    fn: Callable[..., object]
    subclass: Any = None

    def claim(self) -> str:
        """The name conflicts and `dt-plugins list` use: hop name and subclass name."""
        hop_name = getattr(self.hop, "_name", None) or str(self.hop)
        subclass_name = "DTensor" if self.subclass is None else self.subclass.__name__
        return f"hop {hop_name}[{subclass_name}]"


@dataclass(frozen=True)
class ShardingStrategy:
    """A sharding strategy (or propagation rule) for `op` in DTensor's sharding propagator.

    kind="strategy": `func(op_schema) -> OpStrategy` (register_op_strategy);
    kind="rule": `func(op_schema) -> OutputSharding` (register_sharding_prop_rule);
    kind="placements": `func(*args, **kwargs) -> [(output placements, input placements)]`
    for one mesh dim, with tensors replaced by their specs, as torch's public
    `register_sharding` takes; dt-core expands it over the mesh. This one needs no
    private torch types, so plugins should prefer it.
    `schema_info` is a `RuntimeSchemaInfo` or None (derived for kind="placements").
    """

    op: Any
    func: Callable[..., object]
    schema_info: Any = None
    kind: Literal["strategy", "rule", "placements"] = "strategy"


@dataclass(frozen=True)
class LibraryOps:
    """torch.library registrations owned by dt-core, so they can be taken out again.

    Installed as soon as activation starts (so ops exist before anyone calls them);
    dt-core creates `torch.library.Library(namespace, kind)` and calls `define(lib)`,
    which registers defs/impls/fake kernels on it. `ops` lists the qualified op names
    (with dispatch key for IMPL, e.g. `symm_mem::fused_all_gather_matmul@CPU`) that the
    plugin claims, for conflict detection and `dt-plugins list`.
    `defined_in` names the torch module whose import defines the namespace's ops when
    torch defines them in Python (e.g. "torch.distributed._symmetric_memory" for
    `symm_mem::*`): dt-core calls `define(lib)` as soon as that module has been imported
    (at once if it already is) and never imports it itself, so the kernels exist exactly
    when torch's ops do and a plain `import torch` does not pay for the module.
    """

    namespace: str
    define: Callable[[Any], None]
    ops: Sequence[str] = ()
    kind: Literal["DEF", "FRAGMENT", "IMPL"] = "FRAGMENT"
    defined_in: str | None = None


@dataclass(frozen=True)
class GraphPass:
    """An Inductor post-grad graph pass.

    `fn(graph)` mutates a `torch.fx.Graph`. `settings()` returns the JSON-serialisable
    settings the pass reads: they go into the pass's cache uuid, as do the source of
    `fn`'s module, any extra `source_files`, and the rank / world size. `order` sorts
    passes within a stage (lower first); ties break on the pass identity.
    """

    name: str
    fn: Callable[[Any], None]
    stage: PassStage = "post_grad_post"
    order: int = 0
    settings: Callable[[], Mapping[str, Any]] = field(default=dict)
    source_files: Sequence[str] = ()


def pass_identity(owner: str, graph_pass: GraphPass) -> str:
    """The name a plugin's pass is installed, listed and cache-keyed under."""
    return f"{owner}:{graph_pass.name}"


@dataclass(frozen=True)
class Patch:
    """Replace `target.attribute` with `replacement` while the plugin is active;
    `deactivate()` puts back the very object that was there.

    `target` is a module, class or other object, or names one as "package.module" or
    "package.module:Class" — the light form: the hook then imports nothing, and dt-core
    patches the target as soon as torch imports that module (at once if it already has),
    never importing it itself, so a patch of e.g. Dynamo costs `import torch` nothing.

    With `wrap_original=True`, `replacement(original)` is called at install and its
    result installed (a wrapper around torch's function). `torch_versions` ("" = any,
    e.g. ">=2.13,<2.14") is the range the patch was checked against: outside it the
    plugin fails with a message instead of patching an attribute that may mean something
    else. Two plugins patching the same target.attribute conflict.
    """

    target: Any
    attribute: str
    replacement: Any
    torch_versions: str = ""
    wrap_original: bool = False

    def target_name(self) -> str:
        if isinstance(self.target, str):
            return self.target.replace(":", ".")
        module = getattr(self.target, "__module__", None)
        name = getattr(self.target, "__qualname__", None) or getattr(self.target, "__name__", "")
        if isinstance(self.target, type) and module:
            return f"{module}.{name}"
        return name or repr(self.target)

    def claim(self) -> str:
        """The name conflicts and `dt-plugins list` use: the patched attribute's path."""
        return f"patch {self.target_name()}.{self.attribute}"


@dataclass(frozen=True)
class LocalTensorRule:
    """How op `op` ("namespace::name") runs under torch's LocalTensorMode, where one
    process simulates every rank and runs each op once per rank: a kernel that talks to
    its peers cannot work that way, so `fn(mode, func, types, args, kwargs)` computes the
    result for all simulated ranks at once (e.g. from functional collectives, which the
    mode simulates). Installed when `torch.distributed._local_tensor` is first imported;
    registered with `torch.library.register_torch_dispatch` and removed on deactivate.
    """

    op: str
    fn: Callable[..., object]

    def namespace(self) -> str:
        return self.op.split("::", 1)[0]

    def claim(self) -> str:
        return f"{self.op}[LocalTensorMode]"
