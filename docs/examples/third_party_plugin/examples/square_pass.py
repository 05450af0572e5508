"""A graph pass: in the graphs Inductor compiles, `x ** 2` becomes `x * x`."""

import sys

import dt_core
from dt_core import GraphPass, hookimpl

DT_API = ">=1.0,<2"


def square_to_mul(graph):
    """Rewrite each `aten.pow(x, 2)` of an aten-level `torch.fx.Graph` as `aten.mul(x, x)`."""
    import torch

    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.target is aten.pow.Tensor_Scalar and node.args[1] == 2:
            with graph.inserting_before(node):
                square = graph.call_function(aten.mul.Tensor, (node.args[0], node.args[0]))
            square.meta.update(node.meta)  # the same value: shape, dtype, strides
            node.replace_all_uses_with(square)
            graph.erase_node(node)


@hookimpl
def dt_graph_passes():
    return [GraphPass("square-to-mul", square_to_mul)]


def try_it():
    """Register this module as a plugin of this process, then run the pass on the aten
    graph of a function, as Inductor would hand it over."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    dt_core.deactivate()
    dt_core.register_plugin(sys.modules[__name__], "square")
    dt_core.activate()
    (info,) = [p for p in dt_core.plugins() if p.name == "square"]
    assert info.passes == ("square:square-to-mul",), info.passes

    def f(x):
        return torch.sin(x) ** 2

    x = torch.randn(8)
    traced = make_fx(f)(x)  # the aten-level graph of f
    square_to_mul(traced.graph)
    traced.recompile()
    assert "pow" not in traced.code and "mul" in traced.code, traced.code
    torch.testing.assert_close(traced(x), f(x))
    print("square-to-mul:", [str(node.target) for node in traced.graph.nodes])


if __name__ == "__main__":
    try_it()
