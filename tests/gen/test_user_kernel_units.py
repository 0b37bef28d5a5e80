"""What the generator emits around the user's own kernels, uncompiled (tests/gen/test_user_kernels.py compiles it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from opgen.gen import user_kernels
from opgen.gen.emit import emit
from opgen.spec.validate import load_spec

SPEC = """- func: scaled_add(Tensor self, Tensor other, *, float alpha=1) -> Tensor
  kernels: {cpu: mylib::ops::scaled_add, cuda: mylib::ops::scaled_add_cuda}
  includes: [mylib/scaled_add.h, mylib/cuda.cuh]
  torch_op: mylib::scaled_add
  out: scaled_add.out
- func: pick(Tensor self, int[]? dims=None, str? mode=None) -> (Tensor a, Tensor b)
  kernels: {default: mylib::pick}
  includes: [mylib/pick.hpp]
"""


def _files(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "my_ops.yaml"
    path.write_text(SPEC)
    return emit(load_spec(path), "my_ops.yaml", shards=1)


def test_restore_lines_numbers_the_next_line() -> None:
    text = f"a\n{user_kernels.RESTORE}\nb\n{user_kernels.RESTORE}\n"
    assert user_kernels.restore_lines(text, "x.cpp") == 'a\n#line 3 "x.cpp"\nb\n#line 5 "x.cpp"\n'
    assert user_kernels.restore_lines("a\nb\n", "x.cpp") == "a\nb\n"


def test_every_line_directive_is_right(tmp_path: Path) -> None:
    """Each `#line N "file.cpp"` names the generated file's own next line; each `#line N "my_ops.yaml"` an op's."""
    files = _files(tmp_path)
    for name in ("kernel_ops_0.cpp", "thunks_0.cpp"):
        lines = files[name].split("\n")
        directives = [(i, line) for i, line in enumerate(lines, start=1) if line.startswith("#line")]
        assert directives, name
        for number, line in directives:
            target, file = re.fullmatch(r'#line (\d+) "([^"]+)"', line).groups()  # type: ignore[union-attr]
            assert (file, int(target)) in (
                (name, number + 1),
                ("my_ops.yaml", 1),
                ("my_ops.yaml", 5),
                ("my_ops.yaml", 6),
            )
        assert user_kernels.RESTORE not in files[name]


def test_headers_are_guarded_and_checks_name_the_signature(tmp_path: Path) -> None:
    shard = _files(tmp_path)["kernel_ops_0.cpp"]
    assert '#if __has_include(<mylib/cuda.cuh>)\n#include <mylib/cuda.cuh>\n#else\n#line 1 "my_ops.yaml"\n' in shard
    assert "header <mylib/pick.hpp> (its 'includes') not found" in shard
    assert (
        '"my_ops.yaml:1: kernel mylib::ops::scaled_add must be callable as '
        'at::Tensor(const at::Tensor& self, const at::Tensor& other, double alpha)"' in shard
    )
    assert (
        "std::is_invocable_r_v<at::Tensor, decltype(opgen_user_kernel_scaled_add_cpu), "
        "const at::Tensor&, const at::Tensor&, const double&>" in shard
    )
    # The out variant returns its argument: any result will do. Its kernel defaults to `<functional>_outf`.
    assert "kernel mylib::ops::scaled_add_outf must be callable as void(" in shard
    # Adapted arguments are checked as the binding passes them; tuples as opgen::wrap takes them.
    assert (
        "must be callable as std::tuple<at::Tensor, at::Tensor>(const at::Tensor& self, at::OptionalIntArrayRef dims, "
        "std::optional<c10::string_view> mode)" in shard
    )
    assert "decltype(opgen::opt_ref(std::declval<const std::optional<std::vector<int64_t>>&>()))" in shard
    # The CUDA kernel's check is compiled only in CUDA builds, like its call.
    assert (
        '#ifdef OPGEN_WITH_CUDA\n#line 1 "my_ops.yaml"\n'
        "[[maybe_unused]] constexpr auto opgen_user_kernel_scaled_add_cuda" in shard
    )
    assert "      return opgen::wrap(mylib::ops::scaled_add(self, other, alpha));\n#line" in shard


def test_user_kernels_get_thunks(tmp_path: Path) -> None:
    thunks = _files(tmp_path)["thunks_0.cpp"]
    assert "#include <mylib/scaled_add.h>" in thunks
    assert '#line 1 "my_ops.yaml"\n  f.result(in, mylib::ops::scaled_add(self, other, alpha));\n#line' in thunks
    assert '{"scaled_add", "cpu", thunk_scaled_add_cpu, false},' in thunks


def test_registry_records_the_torch_op(tmp_path: Path) -> None:
    module = _files(tmp_path)["module.cpp"]
    entries = {e["name"]: e for e in map(json.loads, re.findall(r'R"opgen\((\{.*?\})\)opgen"', module))}
    assert entries, module[:2000]
    assert entries["scaled_add"]["aten"] == "mylib::scaled_add"
    assert entries["scaled_add"]["torch_op"] == "mylib.scaled_add.default"
    assert entries["scaled_add"]["kernels"] == {"cpu": "mylib::ops::scaled_add", "cuda": "mylib::ops::scaled_add_cuda"}
    assert entries["scaled_add_out"]["aten"] == "opgen::scaled_add.out" and "torch_op" not in entries["scaled_add_out"]
    assert entries["pick"]["aten"] == "opgen::pick" and "torch_op" not in entries["pick"]
