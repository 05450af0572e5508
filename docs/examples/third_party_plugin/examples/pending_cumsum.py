"""An op handler with `takes`: the cumsum of a pending sum stays a pending sum.

torch alone all-reduces a Partial input before a cumsum. cumsum is linear, so each rank
can take the cumsum of its own part and leave the sum pending: no communication.
"""

import sys

import dt_core
from dt_core import OpHandler, hookimpl

DT_API = ">=1.0,<2"


def takes_pending_sum(args, kwargs):
    """Which calls the handler takes: an input that is a pending sum (Partial) on some mesh
    dim and replicated on the others. Every other call stays torch's."""
    from torch.distributed.tensor import Partial

    def pending_sum(p):
        return isinstance(p, Partial) and p.reduce_op == "sum"

    placements = args[0].placements
    return any(map(pending_sum, placements)) and all(
        pending_sum(p) or p.is_replicate() for p in placements
    )


def cumsum_of_pending_sum(op_call, args, kwargs):
    """The op on each rank's local part; the result keeps the input's placements."""
    from torch.distributed.tensor import DTensor

    x = args[0]
    local = op_call(x.to_local(), *args[1:], **kwargs)
    return DTensor.from_local(local, x.device_mesh, x.placements, run_check=False)


@hookimpl
def dt_op_handlers():
    import torch

    op = torch.ops.aten.cumsum.default
    return [OpHandler(op, cumsum_of_pending_sum, takes=takes_pending_sum)]


def try_it():
    """Register this module as a plugin of this process, then call cumsum on 2 simulated
    ranks: what the plugin's tests would do once it is a package."""
    import torch
    from dt_core.testing import simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    dt_core.deactivate()
    dt_core.register_plugin(sys.modules[__name__], "pending-cumsum")
    dt_core.activate()
    with simulated_ranks(2):
        mesh = init_device_mesh("cpu", (2,))
        x = DTensor.from_local(torch.arange(6.0).reshape(2, 3), mesh, [Partial()])
        y = torch.cumsum(x, dim=1)  # taken: still a pending sum (torch alone: all-reduced)
        assert y.placements == (Partial(),)
        torch.testing.assert_close(y.full_tensor(), torch.cumsum(2 * x.to_local(), dim=1))
        z = torch.cumsum(x.redistribute(mesh, [Replicate()]), dim=1)  # not taken: torch's
        assert z.placements == (Replicate(),)
    print("pending-cumsum:", y.placements)


if __name__ == "__main__":
    try_it()
