"""What a generated Triton kernel computes, as a pass decides it: plain data that `opgen.runtime.codegen.triton`
prints into the kernel's source (a `FusedKernel`'s `plan`).

- `FusedGroup` (`passes.fusion.groups`): pointwise nodes and the row reductions that end or join them,
  as `Step`s over `Tensor`s; an output may be stored through data movements (`Placement`).
- `GemvPlan` (`passes.fusion.gemv`): matrix products of a few rows (one to 64) over one input, or a gated
  pair; one row may be computed first by a row group (`passes.fusion.gemv_prologue`).
- `AttentionPlan` (`passes.fusion.attention`): one query row attending over a key/value cache.
- `CacheWritePlan` (`passes.fusion.cache_writes`): writes into buffers at positions, or copies.
- `SpatialMeanPlan` (`passes.fusion.spatial_mean`): a mean over H and W of a channels-last tensor.
- `HorizontalPlan` (`passes.fusion.horizontal`): independent pointwise groups in one launch.

A plan holds sizes, strides and dtypes, never where its nodes were in the body: the pass keeps that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from opgen.runtime.ir.lines import Arg, TensorMeta

# A data movement from a group's value to where an output holds it (`passes.fusion.placement`):
# ("reshape", shape, ()), ("permute", dims, ()) or ("roll", shifts, dims).
Move = tuple[str, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Placement:
    """An output that holds the group's value `source` moved by `moves` (`passes.fusion.placement`)."""

    source: str
    moves: tuple[Move, ...]


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor a fused kernel reads or writes; `name` is its IR value and the kernel's parameter."""

    name: str
    meta: TensorMeta
    placement: Placement | None = None  # an output: stored where these moves put the group's value


@dataclass(frozen=True, slots=True)
class Step:
    """One graph node inside a fused kernel."""

    node: str
    target: str  # "aten.mul.Tensor"
    values: tuple[tuple[str, Arg], ...]  # its arguments by schema name; tensors as `Ref`s
    outputs: tuple[Tensor | None, ...]  # the values it defines (None: unused)
    # A cat: per operand, the absorbed steps that compute it in its range (none: the operand is loaded).
    branches: tuple[tuple[Step, ...], ...] = ()


def flat_steps(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Every step, those inside a cat's branches first (they ran earlier), each once: one step is the values it
    defines (two branches may share one; two steps of one node may not be one step: the `casts` pass moves one
    cast down several view chains, a step in each)."""
    seen: dict[tuple[str, tuple[str, ...]], Step] = {}
    for step in steps:
        for branch in step.branches:
            for inner in flat_steps(branch):
                seen.setdefault(_defines(inner), inner)
        seen.setdefault(_defines(step), step)
    return tuple(seen.values())


def _defines(step: Step) -> tuple[str, tuple[str, ...]]:
    return step.node, tuple(t.name for t in step.outputs if t is not None)


@dataclass(frozen=True, slots=True)
class FusedGroup:
    kind: str  # "pointwise" | "row"
    shape: tuple[int, ...]  # the iteration space S
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]  # the values read after the kernel, in definition order
    steps: tuple[Step, ...]
    moved: tuple[str, ...] = ()  # nodes of the data movements its outputs are stored through (`placement`)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (*(s.node for s in flat_steps(self.steps)), *self.moved)

    def describe(self) -> str:
        dims = "x".join(map(str, self.shape))
        if self.kind == "row":
            rows = 1
            for n in self.shape[:-1]:
                rows *= n
            return f"row kernel, {rows} rows of {self.shape[-1]} ({dims})"
        return f"pointwise kernel over {dims}"


@dataclass(frozen=True, slots=True)
class GemvRows:
    """One product of a matrix-vector kernel: `n` rows of a weight whose rows are `row_stride` apart."""

    n: int
    row_stride: int
    bias: bool  # a bias vector is added (the kernel takes it after the weights)


@dataclass(frozen=True, slots=True)
class GemvPlan:
    """Products of `m` input rows of `k` elements (`x_stride` apart, rows `x_row_stride` apart), in the
    kernel's parameter order. Each product's output is [m, n], contiguous."""

    k: int
    x_stride: int
    products: tuple[GemvRows, ...]
    gated: bool = False  # a gate and an up product (the gate first) writing `activation(gate) * up` alone
    dependent: bool = False  # its first weights are read before it waits for the kernel before it
    m: int = 1  # input rows: one is a matrix-vector kernel (`codegen.triton.gemv`), more tensor-core tiles
    x_row_stride: int = 0
    prologue: FusedGroup | None = None  # a row group of one row whose output `prologue_x` is the input row,
    prologue_x: int = 0  # computed by the kernel first (`passes.fusion.gemv_prologue`)
    prologue_stored: bool = False  # the input row is also stored (lines after the kernel read it)
    activation: str = "silu"  # a gated pair's: "silu" (SwiGLU), "gelu" or "gelu_tanh" (GeGLU)
    epilogue: FusedGroup | None = None  # a pointwise group of one output whose input `epilogue_y` is the one
    epilogue_y: int = 0  # product: the kernel stores the group's output instead (`passes.fusion.gemv_epilogue`)

    def blocks(self, block_n: int) -> int:
        """Programs of `block_n` rows covering every product (a gated pair's once: a program does both)."""
        products = self.products[:1] if self.gated else self.products
        return sum(-(-p.n // block_n) for p in products)

    def whole_row_k(self) -> int:
        """BLOCK_K where one step covers the row (a kernel computing its row first): K rounded up to a power
        of two, at least 16."""
        return 1 << max(4, (self.k - 1).bit_length())

    def whole_row_tiles(self) -> tuple[int, ...]:
        """BLOCK_N of a kernel holding whole rows of weights in registers (`WHOLE_ROW_TILE` elements at most; a
        gated pair holds two tiles), the smallest of `WHOLE_ROW_BLOCKS` always."""
        tiles = 2 if self.gated else 1
        fits = [n for n in WHOLE_ROW_BLOCKS if tiles * n * self.whole_row_k() <= WHOLE_ROW_TILE]
        return tuple(fits) or WHOLE_ROW_BLOCKS[:1]


WHOLE_ROW_TILE = 16384  # BLOCK_N * BLOCK_K at most where a tile spans the row: it lives in registers, in float32
WHOLE_ROW_BLOCKS = (2, 4, 8, 16)  # BLOCK_N candidates of such a kernel


@dataclass(frozen=True, slots=True)
class Computed:
    """A value a decode-attention kernel computes where it would load it (`passes.fusion.attention_prologue`):
    a pointwise group with one output, and per input of the group its parameter among the kernel's
    shared ones (`pi<j>`)."""

    group: FusedGroup
    args: tuple[int, ...]  # -1 for an input computed from `rows`
    rows: tuple[RowSource, ...] = ()  # row groups the kernel computes too (`passes.fusion.attention_rows`)
    reads: tuple[RowRead, ...] = ()  # the group's inputs that are views of their outputs


@dataclass(frozen=True, slots=True)
class RowSource:
    """A row group of a value a decode-attention kernel computes (a norm before the rotation: OLMo-2's q/k
    norms), computed by the kernel too (`passes.fusion.attention_rows`): its rows are the attention's batch
    rows, and its reductions (a sum, a mean, a max or a min over the row) are computed once a call of the
    value's function, over the batch row's whole row; its outputs at the elements the value reads.
    `args`: per input of the group, its parameter among the kernel's shared ones."""

    group: FusedGroup
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RowRead:
    """Input `input` of a `Computed` group is a view of output `output` of row source `source`: the
    group's element at the view's offset plus its strides' address is the row group's at that flat index."""

    input: int
    source: int
    output: int


@dataclass(frozen=True, slots=True)
class StepRows:
    """The step's key and value rows that a decode-attention kernel stores into its cache itself, at one
    position, before it reads the cache (`passes.fusion.attention_writes`): the rows' strides over
    (batch, key/value head, head dimension), and the position as the sum of `terms` one-element tensors
    (a cache's counter and the step's offset)."""

    key_stride: tuple[int, int, int]
    value_stride: tuple[int, int, int]
    terms: int
    key_part: Computed | None = None  # the key rows computed in the kernel (a rotation), not loaded


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """One query row per (batch, head) over `key`/`value` [B, H / group, S, D], where they are, its kept
    positions shared among up to `splits` programs (flash-decoding). A program takes one row, or where
    `grouped` the `group` rows that read one key/value head. With more than one split, the kernel also
    takes a float32 buffer of `partial_elements` for the programs' partial results and a zeroed int32
    counter per row or group (`programs`), which its last program resets once it has combined them."""

    query: TensorMeta  # [B, H, 1, D]
    key: TensorMeta
    value: TensorMeta
    mask: TensorMeta | None  # broadcast to [B, H, 1, S]: bool (keep where true) or additive
    out: TensorMeta
    group: int  # query heads per key/value head
    scale: float | None  # None: 1 / sqrt(D)
    splits: int = 1  # programs per row at most (a power of two)
    grouped: bool = False  # a program takes a key/value head's whole group of query rows (tensor-core dots)
    step_rows: StepRows | None = None  # the step's rows it writes into `key`/`value` first
    query_part: Computed | None = None  # the query computed in the kernel (a rotation), not loaded
    shared_inputs: int = 0  # the computed values' inputs: the kernel's first parameters (`pi<j>`)
    softcap: float | None = None  # scores capped as `softcap * tanh(s / softcap)` after the scale (Gemma-2)

    @property
    def heads(self) -> int:
        return int(self.query.shape[1])  # type: ignore[arg-type]

    @property
    def rows(self) -> int:
        return int(self.query.shape[0]) * self.heads  # type: ignore[arg-type]

    @property
    def programs(self) -> int:
        """The launch's first grid dimension, one counter each where it splits: a row's, or a group's."""
        return self.rows // self.group if self.grouped else self.rows

    @property
    def own_inputs(self) -> int:
        """The kernel's inputs that are the attention's: query, key, value and the mask where there is one
        (`attention_writes` puts the step's rows after them, the split's buffers come last)."""
        return 4 if self.mask is not None else 3

    @property
    def partial_elements(self) -> int:
        """Per row and program: the output row's partial sums, the running maximum and the sum of weights."""
        return self.rows * self.splits * (int(self.query.shape[3]) + 2)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RegionWrite:
    """One write of a cache-write kernel: `region` of the buffer `dst` (its shape, with the positions'
    count along `dim`; `dim` None: a copy into the whole buffer), from values `values_stride` apart,
    plus a number where `plus` is one (an update of the buffer by a number: its values are itself)."""

    region: tuple[int, ...]
    dst: TensorMeta
    dim: int | None
    values_stride: tuple[int, ...]  # the values' strides over the region (0 where they broadcast)
    plus: int | float | None = None


@dataclass(frozen=True, slots=True)
class CacheWritePlan:
    """Writes run as one kernel: through one index of `length` positions (the sum of its terms where
    `summed`), or copies (`positions` None)."""

    writes: tuple[RegionWrite, ...]
    positions: tuple[int, ...] | None  # per term of the positions: its stride along them (0 broadcasts)
    length: int = 0
    summed: bool = False

    @property
    def what(self) -> str:
        """ "2 write(s) at 1 position(s) of a sum", "16 copies into buffers", "16 updates of buffers"."""
        n = len(self.writes)
        if self.positions is None:
            updates = sum(w.plus is not None for w in self.writes)
            copies = [f"{n - updates} cop{'y' if n - updates == 1 else 'ies'} into buffers"] if n > updates else []
            return ", ".join([*copies, *([f"{updates} update(s) of buffers"] if updates else [])])
        summed = " of a sum" if self.summed else ""
        return f"{n} write(s) at {self.length} position(s){summed}"


@dataclass(frozen=True, slots=True)
class SpatialMeanPlan:
    """A keepdim mean over H and W of `x` (N, C, H, W), stored channels-last, into `out`."""

    x: TensorMeta
    out: TensorMeta


@dataclass(frozen=True, slots=True)
class HorizontalPlan:
    """Independent pointwise groups run by one launch, their blocks one group after another."""

    parts: tuple[FusedGroup, ...]


KernelPlan = Union[FusedGroup, GemvPlan, AttentionPlan, CacheWritePlan, SpatialMeanPlan, HorizontalPlan]  # noqa: UP007
