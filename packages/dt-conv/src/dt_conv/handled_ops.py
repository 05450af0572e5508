"""The aten ops dt-conv handles, by family: names only.

The plugin's hooks list these while `torch.distributed.tensor` is still importing, so this
module imports nothing; `handlers.py` maps each name to the function that handles it.
"""

from __future__ import annotations


def in_dims(*prefixes: str, dims: tuple[int, ...] = (1, 2, 3)) -> tuple[str, ...]:
    """`<prefix><n>d` for each prefix and spatial rank `n` (aten's per-rank op names)."""
    return tuple(f"{prefix}{n}d" for prefix in prefixes for n in dims)


def backward_of(names: tuple[str, ...]) -> tuple[str, ...]:
    """aten's backward op of each op in `names`."""
    return tuple(f"{name}_backward" for name in names)


CONVOLUTION = ("convolution",)
MAX_POOL = tuple(f"{name}_with_indices" for name in in_dims("max_pool", dims=(2, 3)))
AVG_POOL = in_dims("avg_pool", dims=(2, 3))
CONSTANT_PAD = ("constant_pad_nd",)  # its adjoint is itself with negated pads: no backward op
MODE_PAD = in_dims("reflection_pad", "replication_pad")
# every `F.interpolate` mode dt-conv shards; also the composite `.vec` overloads it catches
UPSAMPLE = (
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_bicubic2d",
    "upsample_trilinear3d",
    *in_dims("upsample_nearest", "_upsample_nearest_exact"),
    # antialiased: not sharded, but taken so that the replicated fallback warns (torch's
    # own rules would replicate them without a word)
    "_upsample_bilinear2d_aa",
    "_upsample_bicubic2d_aa",
)

HANDLED = (
    *CONSTANT_PAD,
    *(
        name
        for family in (CONVOLUTION, MAX_POOL, AVG_POOL, MODE_PAD, UPSAMPLE)
        for name in (*family, *backward_of(family))
    ),
)

# Normalizations dt-conv takes only where the input has a sharded spatial (or, for layer
# norm, normalized) dim; torch keeps the other calls. "name.overload" for each family's
# forward and backward ops, by the module in `ops.norm` that handles them.
NORM_FAMILIES = {
    "batch_norm": (
        (
            "native_batch_norm.default",
            "_native_batch_norm_legit.default",
            "_native_batch_norm_legit.no_stats",
            "_native_batch_norm_legit_functional.default",
            "_native_batch_norm_legit_no_training.default",
            "_batch_norm_with_update.default",
            "_batch_norm_with_update_functional.default",
            "_batch_norm_no_update.default",
        ),
        ("native_batch_norm_backward.default", "batch_norm_backward.default"),
    ),
    "group_norm": (("native_group_norm.default",), ("native_group_norm_backward.default",)),
    "layer_norm": (("native_layer_norm.default",), ("native_layer_norm_backward.default",)),
}
