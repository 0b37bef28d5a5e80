"""`python -m opgen gen|check|cmake-dir`: the generator's command line (no torch needed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opgen.gen.emit import DEFAULT_MODULE, DEFAULT_SHARDS, emit
from opgen.gen.writer import write_files
from opgen.spec.loader import SpecError
from opgen.spec.validate import load_spec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m opgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("gen", help="validate a spec and write the generated C++ and stub")
    gen.add_argument("--spec", type=Path, required=True, help="the op spec YAML file")
    gen.add_argument("--out", type=Path, required=True, help="directory to write into")
    gen.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="number of C++ binding files")
    gen.add_argument("--module", default=DEFAULT_MODULE, help="extension module name (PyInit_<name>)")
    gen.add_argument("--quiet", action="store_true", help="print nothing on success")
    check = sub.add_parser("check", help="validate a spec and report every problem")
    check.add_argument("--spec", type=Path, required=True)
    sub.add_parser("cmake-dir", help="print the folder holding opgen.cmake, for CMAKE_MODULE_PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "cmake-dir":
        print(Path(__file__).resolve().parent / "cmake")
        return 0
    if args.command == "gen" and args.shards < 1:
        print("error: --shards must be at least 1", file=sys.stderr)
        return 2
    try:
        ops = load_spec(args.spec, display_name=args.spec.name)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "check":
        print(f"{args.spec}: {len(ops)} bound functions, no problems")
        return 0
    changed = write_files(args.out, emit(ops, args.spec.name, args.shards, args.module))
    if not args.quiet:
        print(f"opgen: {len(ops)} bound functions from {args.spec}; {len(changed)} file(s) updated in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
