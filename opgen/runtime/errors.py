"""The runtime's exceptions. Each message names what failed, where, and what to do about it."""

from __future__ import annotations

from opgen.errors import OpgenError, OpgenWarning, warn

# Re-exported: the runtime's errors derive from them, and `warn` gives its warnings.
__all__ = ["OpgenError", "OpgenWarning", "warn"]


class UnsupportedOpError(OpgenError):
    """A graph node calls an op that `kernel_ops` does not bind (and fallback was not asked for).

    `custom`: the op is a `torch.library` custom op (`mylib.scaled_add.default`), which the user's own
    extension binds, not ops.yaml; the lowering knows, from the node's target."""

    def __init__(self, op: str, node: str, reason: str = "", *, custom: bool = False) -> None:
        self.op = op
        self.node = node
        detail = f" ({reason})" if reason else ""
        if not custom:
            advice = "Add it to ops.yaml (under '# --- ops the runtime needs ---') and rebuild"
            what = "kernel_ops binding"
        else:
            namespace, _, rest = op.partition(".")
            qualified = f"{namespace}::{rest.removesuffix('.default')}"
            advice = (
                f"Bind it in your own extension: draft its entry with `python -m opgen.draft {namespace}` "
                f"(it writes `torch_op: {qualified}`; fill in your kernel), build the spec with "
                "opgen_add_extension (docs/spec.md: your own kernels) and import that module before compiling"
            )
            what = "binding in kernel_ops or an imported extension (opgen.extensions.registered())"
        super().__init__(
            f"opgen cannot lower graph node '{node}': op {op} has no {what}{detail}. {advice}, or pass "
            f"fallback=True to call the op through the dispatcher for this node instead."
        )


class RequiresGradError(OpgenError):
    """opgen compiles inference graphs only; something needs autograd."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"opgen runs inference only, but {what} requires grad while grad mode is enabled. "
            "Call it under torch.no_grad() or torch.inference_mode(), call model.requires_grad_(False), "
            "or pass fallback=True to run the model eagerly."
        )


class InputMismatchError(ValueError):
    """An input does not match what the graph was compiled for, and recompiling is off or failed."""


class InputTypeError(TypeError):
    """An input has the wrong type or dtype."""


class PackageError(OpgenError):
    """An opgen package cannot be made (what the C++ executor cannot run) or loaded (not a package,
    truncated or corrupt, another format, torch version or op spec); the message names the file and what."""


class CaptureRefused(Exception):
    """Internal to CUDA-graph mode: this graph cannot be replayed faithfully (the message says why), so it
    runs plain; the reason goes to `report()` and one warning."""
