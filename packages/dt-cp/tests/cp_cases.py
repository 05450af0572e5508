"""Shared checking code: one attention case sharded vs the same on one process, and the
random cases both sweeps draw (real ranks in `test_sweep.py`, simulated ones in
`test_sweep_local.py`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def make_qkv(shape: tuple, kv_heads: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    b, h, s, e = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, e, generator=gen, dtype=dtype)
    k = torch.randn(b, kv_heads, s, e, generator=gen, dtype=dtype)
    v = torch.randn(b, kv_heads, s, e, generator=gen, dtype=dtype)
    g = torch.randn(b, h, s, e, generator=gen, dtype=dtype)
    return [q, k, v, g]


LABELS = ("out", "dq", "dk", "dv")


def _mismatch(name: str, got: list[torch.Tensor], want: list[torch.Tensor], atol: float):
    for label, a, b in zip(LABELS, got, want, strict=True):
        if a.shape != b.shape:
            return f"{name}: {label} shape {tuple(a.shape)} != {tuple(b.shape)}"
        err = (a - b).abs().max().item() if a.numel() else 0.0
        if not err <= atol:
            return f"{name}: {label} max error {err:.3g}"
    return None


def compare(
    name: str,
    attend: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    mesh: Any,
    shape: tuple,
    kv_heads: int | None = None,
    seed: int = 0,
    balancer: str = "none",
    atol: float = 1e-10,
    documents: tuple[int, ...] | None = None,
    *,
    simulated: int = 0,
    algorithm: str | None = None,
) -> str | None:
    """Run `attend` on sharded DTensors and `reference` on full tensors; describe mismatch.

    `simulated=n`: shard over n ranks simulated in this process (LocalTensorMode; `mesh`
    is made there and ignored) and check every rank's values.
    """
    import dt_cp
    from dt_core.testing import rank_values, simulated_ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    q, k, v, g = make_qkv(shape, kv_heads or shape[1], seed)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    y_ref = reference(*ref)
    (y_ref * g).sum().backward()
    want = [y_ref.detach(), ref[0].grad, ref[1].grad, ref[2].grad]
    ranks = simulated_ranks(simulated) if simulated else contextlib.nullcontext()
    config = dt_cp.settings(algorithm=algorithm, load_balancer=balancer, documents=documents)
    with ranks, config:
        if simulated:
            mesh = init_device_mesh("cpu", (simulated,))
        qd, kd, vd = (dt_cp.shard_sequence(t, mesh, 2).requires_grad_() for t in (q, k, v))
        y = attend(qd, kd, vd)
        if tuple(y.placements) != (Shard(2),):
            return f"{name}: output placements {y.placements}"
        (y * dt_cp.shard_sequence(g, mesh, 2)).sum().backward()
        got = [dt_cp.unshard_sequence(t, 2) for t in (y, qd.grad, kd.grad, vd.grad)]
    if not simulated:
        return _mismatch(name, got, want, atol)
    per_rank = [rank_values(t, simulated) for t in got]
    for rank in range(simulated):
        failure = _mismatch(f"{name}: rank {rank}", [t[rank] for t in per_rank], want, atol)
        if failure:
            return failure
    return None


def sdpa(**kw: Any) -> Callable[..., torch.Tensor]:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def run_all(cases: list[tuple[str, Callable[[], str | None]]]) -> None:
    """Every case must pass without any dt-cp fallback warning."""
    from dt_core.testing.cases import expect_exact

    expect_exact("cp", [fn for _, fn in cases])


# --- the sweeps' random cases --------------------------------------------------------------


def sweep_strategies() -> dict[str, Any]:
    """What both sweeps draw: lengths (uneven, tiny, empty shards), heads, GQA, causal,
    windows, algorithms, every balancer (document cuts), the API, kernel piece size."""
    from hypothesis import strategies as st

    return {
        "seq": st.integers(1, 19),
        "kv_heads": st.sampled_from([1, 2]),
        "gqa": st.booleans(),
        "causal": st.booleans(),
        "window": st.integers(1, 6),
        "algorithm": st.sampled_from(["ring", "allgather"]),
        "balancer": st.sampled_from(["none", "head_tail", "document"]),
        "cuts": st.lists(st.integers(0, 19), max_size=3),
        "api": st.sampled_from(["sdpa", "flex", "flex_block_mask"]),
        "piece_rows": st.sampled_from([1024, 2, 5]),
        "seed": st.integers(0, 100),
    }


def sweep(examples: int, check: Callable[..., str | None], **extra: Any) -> str | None:
    """Check `examples` drawn cases: `check(SweepCase, **extra values)` describes a failure
    or returns None. `extra`: strategies beyond the shared ones. Derandomized, so every
    rank draws the same examples (they run collectives). Describes the failures, if any."""
    from hypothesis import HealthCheck, given, settings

    failures: list[str] = []

    @given(**extra, **sweep_strategies())
    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(**drawn: Any) -> None:
        rest = {name: drawn.pop(name) for name in extra}
        failure = check(SweepCase(**drawn), **rest)
        if failure:
            failures.append(failure)

    one()
    return f"{len(failures)} cases wrong:\n" + "\n".join(failures) if failures else None


@dataclass(frozen=True)
class SweepCase:
    """One drawn case: its tensors' shape, documents, and the attention to compare."""

    seq: int
    kv_heads: int
    gqa: bool
    causal: bool
    window: int
    algorithm: str
    balancer: str
    cuts: list[int]
    api: str
    piece_rows: int
    seed: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (1, self.kv_heads * (2 if self.gqa else 1), self.seq, 4)

    @property
    def documents(self) -> tuple[int, ...] | None:
        if self.balancer != "document":
            return None
        bounds = sorted({0, self.seq, *(min(c, self.seq) for c in self.cuts)})
        return tuple(b - a for a, b in zip(bounds, bounds[1:]))

    @property
    def name(self) -> str:
        return (
            f"{self.api} S={self.seq} H={self.shape[1]}/{self.kv_heads} causal={self.causal} "
            f"w={self.window} {self.algorithm} {self.balancer} docs={self.documents} "
            f"piece={self.piece_rows}"
        )

    def attention(self) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
        """(sharded attention, its one-process reference)."""
        import dt_cp
        from test_flex import dense_reference

        if self.api == "sdpa":
            f = sdpa(is_causal=self.causal, enable_gqa=self.gqa)
            return f, f
        window, causal, gqa = self.window, self.causal, self.gqa

        def mask(b, h, q, kv):
            near = (q - kv).abs() < window
            return near & (kv <= q) if causal else near

        block_mask = None
        if self.api == "flex_block_mask":
            block_mask = dt_cp.create_block_mask(mask, None, None, self.seq, self.seq, BLOCK_SIZE=2)

        def ours(q, k, v):
            if block_mask is not None:
                return dt_cp.flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
            return dt_cp.flex_attention(q, k, v, mask_mod=mask, enable_gqa=gqa)

        return ours, dense_reference(None, mask, gqa=gqa)

    def compare(self, mesh: Any, name: str, chunk_rows: int = 0, simulated: int = 0):
        """`compare` of this case, with kernel pieces of `piece_rows` rows (and ring
        messages of `chunk_rows`, if given)."""
        ours, reference = self.attention()
        # Calls against received ring chunks on a grid of their own (one row shorter).
        chunk_pieces = max(1, self.piece_rows - 1)
        with row_limits(self.piece_rows, chunk_rows, chunk_pieces):
            return compare(
                name,
                ours,
                reference,
                mesh,
                self.shape,
                self.kv_heads,
                self.seed,
                self.balancer,
                documents=self.documents,
                algorithm=self.algorithm,
                simulated=simulated,
            )


@contextlib.contextmanager
def row_limits(
    piece_rows: int = 0, chunk_rows: int = 0, chunk_piece_rows: int = 0
) -> Iterator[None]:
    """dt-cp's kernel pieces (`piece_rows`; against a received ring chunk
    `chunk_piece_rows`, default the same) and ring messages (`chunk_rows`) at most this
    many rows inside the block (0: unchanged), so tiny cases cut blocks many ways."""
    import dt_cp.algorithms
    import dt_cp.blocks

    limits = [(dt_cp.algorithms, "RING_CHUNK_ROWS", chunk_rows)]
    pieces = ("MAX_RANGE_ROWS", "GATHERED_RANGE_ROWS", "RING_RANGE_ROWS", "SPARSE_RANGE_ROWS")
    limits += [(dt_cp.blocks, name, piece_rows) for name in pieces]
    limits += [(dt_cp.blocks, "RING_CHUNK_RANGE_ROWS", chunk_piece_rows or piece_rows)]
    saved = [(module, name, getattr(module, name)) for module, name, rows in limits if rows]
    for module, name, rows in limits:
        if rows:
            setattr(module, name, rows)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
