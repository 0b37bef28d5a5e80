"""IR passes. Each is a pure function `(Program, KernelRegistry) -> Program`, optional and testable alone.

`PASSES` names them; `DEFAULT_PIPELINE` is the order `opgen.compile` runs them in. Order matters
only for quality, not correctness: `pads` folds zero pads into the convolutions reading them first,
so that every later pass sees a convolution reading its input directly; batch-norm folding wants the
raw conv -> bn pattern, and
oneDNN (CPU) and cuDNN (CUDA) fusion the conv -> relu pattern folding leaves; `onednn` runs before
`layout` so that max pooling of its channels-last values joins its region; view
simplification and shape folding (and `empty_cat`, which drops a cat's empty operands, a cat left with
one being a copy, and `outer_products`, which makes a matrix product over a contraction of one element a
broadcast `mul` that fusion can take) leave dead code, removed before `prepack` looks for single
readers; constant folding hoists the weight transposes `mkl_linear` and `prepack` then replace
(`mkl_linear` first: it takes the static row counts it wins on and leaves the rest to `prepack`),
leaving dead code again, removed before memory planning; `reinplace` turns functional writes into buffers (a KV
cache's `index_put`, `slice_scatter`) into in-place ones once views are simplified, before constant
folding (views of the buffer stay in the body) and memory planning (which must see the writes);
`collectives` issues torch.distributed collectives early and waits for them late once the body is
simplified, before fusion and memory planning see it (its wait lines list the tensors in flight, so
both keep them); `one_shot_all_reduce` then sends the small CUDA all-reduces (decode's few KB) through a
one-shot all-reduce over peer memory, leaving larger ones on the process group, and `peer_sum` (CUDA) the
smallest of those through opgen's own kernel (values sent with their epoch, no barrier) rather than torch's,
and `peer_gather` (CUDA) the small all-gathers (decode's logits) through opgen's kernel of the same kind;
constant folding and memory planning decide what lives in setup; `hoist_views` then moves views of setup
values out of the call; `memo` moves what depends only on the size symbols of dynamic shapes (views of buffers and
constants, calls on constants) into the size memo, recomputed only when the sizes change: before memory
planning (calls on constants keep their own results) and after it (views of the buffers it made);
`decode_attention` (CUDA, static sizes) runs attention of one query row over a key/value cache as one
Triton kernel reading grouped heads in place (no repeat of the cache), reading a boolean mask as it
is, whether the graph has SDPA or the attention written out (Gemma-2's soft-capped eager form);
`grouped_attention` lets the other attention calls of grouped-query models read the key/value
heads in place too (`enable_gqa`) where ATen's kernel for them can; `attention_masks` then
converts the boolean masks other attention calls read to additive ones once, where ATen converted
them in every call; `sink_updates` (CUDA buffers) moves in-place updates of buffers by a number that
nothing after them reads (a KV cache's position counters) to the end of the step, and `cache_writes`
(CUDA, static sizes) runs the `index_put_` writes of a step's keys and values into a KV cache (which
`reinplace` made) as one Triton kernel, and those updates as another; `transpose_weights` (CUDA, static
sizes) gives few-row products on constant weights stored [K, N] row-major (GPT-2's `Conv1D`) a copy made
in setup in a linear layer's layout, which `gemv` reads; `split_products` (CUDA, static
sizes) makes a few-row product whose result is only split along its columns (Phi-3's fused gate/up
weight) one product per piece, on views of the weight's columns, so that `gemv` takes them as Llama's
separate products; `gemv` (CUDA, static
sizes) makes one-row matrix products on constant weights (siblings over one input together) Triton
kernels, `split_bias` (CUDA) takes the bias adds out of matrix products and convolutions whose readers
fusion takes, so that they join those kernels, `casts` (CUDA) moves dtype casts through the views
between them and the pointwise nodes they feed or read, so that they join those kernels too (gpt-fast's
rotary: `x.float()` viewed as pairs, then `type_as(x)` of the flattened result), `lift_views` (CUDA)
moves a permute or reshape above the pointwise node it reads, so that the nodes on both sides share one
iteration space, and `fusion` turns groups of pointwise nodes and row reductions into generated Triton
kernels once the graph is simplified, before memo and memory planning see the calls; `gemv_prologue` (CUDA)
makes a row kernel of one row (a norm) the first step of the matrix-vector kernel that alone reads its
output; `gemv_epilogue` (CUDA) makes a pointwise kernel (an activation) the last step of the product
kernel whose output it alone reads; `horizontal` (CUDA) runs neighbouring pointwise kernels that read
nothing of each other in one launch; `attention_writes` (CUDA) has the decode-attention kernel store
the step's key and value rows that the cache-write kernel just before it stored, and
`attention_prologue` has it compute its query and those key rows (a rotation) where the pointwise
kernel before it did, and `attention_rows` the row kernel (a norm: OLMo-2's q/k norms) whose outputs
that rotation reads; `dependent_launch` then lets each generated kernel start while the one before it
finishes (Hopper and newer). The passes that make Triton kernels only decide: each kernel is a
`FusedKernel` holding its plan (`opgen.runtime.ir.plans`), whose source `opgen.runtime.codegen.triton`
prints after the last pass; no pass imports a printer.
`sizes` binds the size arithmetic of dynamic shapes once per call, after
every pass that rewrites calls; `insert_frees` comes last because it needs the final body. `prepack` and `onednn` need
oneDNN, `mkl_linear` MKL, `cudnn` cuDNN and `fusion` opgen's JIT (a CUDA build, a GPU and triton) at run time,
so `opgen.runtime.pipeline.default_pipeline()` leaves each out where it is missing. `kernel_choice`
is not in the default pipeline (it benchmarks on the first call); add it before `memory`, which
turns functional calls into in-place ones that have no candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opgen.runtime.ir import Program
from opgen.runtime.passes.attention_masks import additive_masks
from opgen.runtime.passes.collectives import overlap_collectives
from opgen.runtime.passes.constants import fold_constants
from opgen.runtime.passes.conv_bn import fold_conv_bn
from opgen.runtime.passes.cudnn import fuse_cudnn
from opgen.runtime.passes.dead_code import eliminate_dead_code
from opgen.runtime.passes.dependent_launch import launch_dependently
from opgen.runtime.passes.empty_cat import drop_empty_cat_operands
from opgen.runtime.passes.fusion.attention import fuse_decode_attention
from opgen.runtime.passes.fusion.attention_prologue import fuse_attention_prologue
from opgen.runtime.passes.fusion.attention_rows import fuse_attention_rows
from opgen.runtime.passes.fusion.attention_writes import fuse_attention_writes
from opgen.runtime.passes.fusion.bias import split_bias
from opgen.runtime.passes.fusion.cache_writes import fuse_cache_writes
from opgen.runtime.passes.fusion.casts import move_casts
from opgen.runtime.passes.fusion.gemv import fuse_gemv
from opgen.runtime.passes.fusion.gemv_epilogue import fuse_gemv_epilogue
from opgen.runtime.passes.fusion.gemv_prologue import fuse_gemv_prologue
from opgen.runtime.passes.fusion.horizontal import fuse_horizontal
from opgen.runtime.passes.fusion.lift_views import lift_views
from opgen.runtime.passes.fusion.rewrite import fuse
from opgen.runtime.passes.fusion.spatial_mean import spatial_means
from opgen.runtime.passes.fusion.split_products import split_products
from opgen.runtime.passes.fusion.weight_layout import transpose_weights
from opgen.runtime.passes.grouped_attention import read_grouped_heads
from opgen.runtime.passes.kernel_choice import choose_kernels
from opgen.runtime.passes.layout import channels_last_pooling
from opgen.runtime.passes.memo import memoize_sizes
from opgen.runtime.passes.memory import insert_frees, plan_memory
from opgen.runtime.passes.mkl_linear import pack_linear_mkl
from opgen.runtime.passes.one_shot_all_reduce import one_shot_all_reduces
from opgen.runtime.passes.onednn import fuse_onednn
from opgen.runtime.passes.outer_products import outer_products
from opgen.runtime.passes.pads import fold_pads
from opgen.runtime.passes.peer_gather import peer_gathers
from opgen.runtime.passes.peer_sum import peer_sums
from opgen.runtime.passes.prepack import prepack_linear
from opgen.runtime.passes.reinplace import reinplace
from opgen.runtime.passes.shapes import fold_shapes
from opgen.runtime.passes.sink_updates import sink_updates
from opgen.runtime.passes.sizes import hoist_sizes
from opgen.runtime.passes.views import drop_identity_views, hoist_views, sink_reshapes
from opgen.runtime.registry import KernelRegistry

Pass = Callable[[Program, KernelRegistry], Program]

PASSES: dict[str, Pass] = {
    "pads": fold_pads,
    "conv_bn": fold_conv_bn,
    "onednn": fuse_onednn,
    "layout": channels_last_pooling,
    "cudnn": fuse_cudnn,
    "identity_views": drop_identity_views,
    "sink_reshapes": sink_reshapes,
    "shapes": fold_shapes,
    "empty_cat": drop_empty_cat_operands,
    "outer_products": outer_products,
    "reinplace": reinplace,
    "constants": fold_constants,
    "mkl_linear": pack_linear_mkl,
    "prepack": prepack_linear,
    "dead_code": eliminate_dead_code,
    "collectives": overlap_collectives,
    "one_shot_all_reduce": one_shot_all_reduces,
    "peer_sum": peer_sums,
    "peer_gather": peer_gathers,
    "decode_attention": fuse_decode_attention,
    "grouped_attention": read_grouped_heads,
    "attention_masks": additive_masks,
    "sink_updates": sink_updates,
    "cache_writes": fuse_cache_writes,
    "transpose_weights": transpose_weights,
    "split_products": split_products,
    "gemv": fuse_gemv,
    "split_bias": split_bias,
    "casts": move_casts,
    "lift_views": lift_views,
    "fusion": fuse,
    "spatial_mean": spatial_means,
    "gemv_prologue": fuse_gemv_prologue,
    "gemv_epilogue": fuse_gemv_epilogue,
    "horizontal": fuse_horizontal,
    "attention_writes": fuse_attention_writes,
    "attention_prologue": fuse_attention_prologue,
    "attention_rows": fuse_attention_rows,
    "dependent_launch": launch_dependently,
    "memory": plan_memory,
    "hoist_views": hoist_views,
    "memo": memoize_sizes,
    "sizes": hoist_sizes,
    "frees": insert_frees,
    "kernel_choice": choose_kernels,  # opt-in: times ATen against Triton candidates on the first call
}

DEFAULT_PIPELINE = (
    "pads",
    "conv_bn",
    "onednn",
    "layout",
    "cudnn",
    "identity_views",
    "sink_reshapes",
    "shapes",
    "empty_cat",
    "outer_products",
    "dead_code",
    "reinplace",
    "constants",
    "mkl_linear",
    "prepack",
    "dead_code",
    "collectives",
    "one_shot_all_reduce",
    "peer_sum",
    "peer_gather",
    "decode_attention",
    "grouped_attention",
    "attention_masks",
    "sink_updates",
    "cache_writes",
    "transpose_weights",
    "split_products",
    "gemv",
    "split_bias",
    "casts",
    "lift_views",
    "fusion",
    "spatial_mean",
    "gemv_prologue",
    "gemv_epilogue",
    "horizontal",
    "attention_writes",
    "attention_prologue",
    "attention_rows",
    "dependent_launch",
    "memo",
    "memory",
    "hoist_views",
    "memo",
    "sizes",
    "frees",
)


# The passes that make or launch Triton kernels: left out where opgen's JIT cannot run
# (`opgen.runtime.pipeline.default_pipeline`).
JIT_PASSES = frozenset(
    ("peer_sum", "peer_gather", "decode_attention", "sink_updates", "cache_writes", "transpose_weights",
     "split_products", "gemv", "split_bias", "casts", "lift_views", "fusion", "spatial_mean", "gemv_prologue",
     "gemv_epilogue", "horizontal", "attention_writes", "attention_prologue", "attention_rows", "dependent_launch")
)  # fmt: skip


def run_passes(program: Program, registry: KernelRegistry, names: Iterable[str] = DEFAULT_PIPELINE) -> Program:
    for name in names:
        if name not in PASSES:
            raise ValueError(f"unknown opgen pass '{name}' (known: {', '.join(PASSES)})")
        program = PASSES[name](program, registry)
    return program
