"""`python -m opgen.bench {ops,graphs,backend_cost,jit,dynamic,gpu_work,gpu_models,zoo,decode,step,plan,chain,generate,
tp,tp_step,step_ncu} [options]`: the project's benchmarks (see ../shared/BENCH.md)."""

from __future__ import annotations

import importlib
import sys

from opgen.cli import until_reader_leaves

COMMANDS = {
    "ops": ("opgen.bench.ops", "each op through kernel_ops vs the eager torch call"),
    "graphs": ("opgen.bench.graphs", "the BENCH.md graph cases: eager, inductor, AOTInductor, opgen"),
    "backend_cost": ("opgen.bench.backend_cost", 'where a torch.compile(backend="opgen") call spends its time'),
    "jit": ("opgen.bench.jit", "host time per Triton launch: opgen, Triton, Inductor's launcher, bare (GPU)"),
    "dynamic": ("opgen.bench.dynamic", "a 4-layer decoder at 20 lengths: dynamic vs static vs eager vs inductor"),
    "gpu_work": ("opgen.bench.gpu_work", "GPU kernel time, launches and sync time per call, with and without fusion"),
    "gpu_models": ("opgen.bench.gpu_models", "torchvision, timm and transformers models on the GPU vs Inductor (GPU)"),
    "zoo": ("opgen.bench.zoo", "transformers models (the zoo extra): eager, opgen, inductor"),
    "decode": ("opgen.bench.decode_families", "LLM decoding, static KV cache: two Llamas at batch 1, or --families"),
    "step": ("opgen.bench.step_profile", "one decode step of an LLM family, kernel by kernel: time, launches, what"),
    "step_ncu": ("opgen.bench.step_ncu", "a decode step's kernels under Nsight Compute: programs, DRAM, % peak (GPU)"),
    "plan": ("opgen.bench.plan", "a decode step's CUDA kernels planned on any machine: launches a layer, what"),
    "chain": ("opgen.bench.chain", "a decoder's products as one persistent launch vs a launch each (GPU)"),
    "generate": ("opgen.bench.generate", "text generation, prompt to tokens: generate() five ways vs opgen's loop"),
    "tp": ("opgen.bench.tp", "Llama decode split over N GPUs (tensor parallelism): eager, reduce-overhead, opgen"),
    "tp_step": ("opgen.bench.tp_step", "a tensor-parallel rank's decode step, kernel by kernel: time, launches, what"),
}


def main(argv: list[str]) -> int:
    return until_reader_leaves(lambda: run(argv))


def run(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m opgen.bench {" + ",".join(COMMANDS) + "} [options]  (--help for each)")
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:12s} {what}")
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
