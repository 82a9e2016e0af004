"""Generate the Python modules of our Open Inference Protocol .proto files.

    python -m serve.frontends.oip.proto.generate          # rewrite the checked-in modules
    python -m serve.frontends.oip.proto.generate --check  # exit 1 listing the stale ones

Runs grpcio-tools' bundled protoc (messages and gRPC stubs) with mypy-protobuf's plugins (typed
``.pyi`` stubs); both come with the ``test`` extra, not the serving install, so grpc_tools is
imported only when this runs. The output depends on the exact grpcio-tools and mypy-protobuf
versions, which is why the test extra pins both.

Imports: protoc's source path is the repository root (plus grpc_tools' well-known types, unused
today), so the .proto files are named ``serve/frontends/oip/proto/*.proto`` (inference.proto
imports model_config.proto by that name) and every generated import is already package-correct,
e.g. ``from serve.frontends.oip.proto import inference_pb2``. No import is rewritten.

Post-processing, one step: each ``*_pb2.py`` registers its file in our private descriptor pool
(``_pool.POOL``) instead of protobuf's default one, because tritonclient registers the same
``inference.*`` names there; see ``_pool.py``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parents[3]  # serve/frontends/oip/proto -> the repository root
PACKAGE_DIR = PROTO_DIR.relative_to(ROOT)  # serve/frontends/oip/proto

# (the .proto file, whether it declares a service and so gets gRPC stubs)
PROTOS: tuple[tuple[str, bool], ...] = (("model_config.proto", False), ("inference.proto", True))

_DEFAULT_POOL_LINE = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL_LINE = "DESCRIPTOR = _pool.POOL.AddSerializedFile("
_IMPORT_ANCHOR = "from google.protobuf.internal import builder as _builder\n"
_POOL_IMPORT = f"from {'.'.join(PACKAGE_DIR.parts)} import _pool\n"


def generated_files() -> list[str]:
    """The names of the generated files, in PROTO_DIR."""
    names = []
    for proto, has_service in PROTOS:
        stem = proto.removesuffix(".proto")
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]
        if has_service:
            names += [f"{stem}_pb2_grpc.py", f"{stem}_pb2_grpc.pyi"]
    return names


def _plugin(name: str) -> str:
    """A protoc plugin's executable: next to this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install mypy-protobuf (the `test` extra)")
    return found


def _use_private_pool(path: Path) -> None:
    text = path.read_text()
    if text.count(_DEFAULT_POOL_LINE) != 1 or text.count(_IMPORT_ANCHOR) != 1:
        raise SystemExit(f"{path.name}: protoc's output changed shape; update generate.py")
    text = text.replace(_IMPORT_ANCHOR, _IMPORT_ANCHOR + _POOL_IMPORT)
    path.write_text(text.replace(_DEFAULT_POOL_LINE, _PRIVATE_POOL_LINE))


def _generate(out: Path) -> None:
    """Write every generated file into ``out`` (flat)."""
    from grpc_tools import protoc  # the test extra only: not in the serving install

    tree = out / "tree"
    tree.mkdir()
    well_known = Path(protoc.__file__).parent / "_proto"
    common = [
        "grpc_tools.protoc",
        f"--proto_path={ROOT}",
        f"--proto_path={well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--python_out={tree}",
        "--mypy_opt=quiet",
        f"--mypy_out={tree}",
    ]
    grpc = [
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--grpc_python_out={tree}",
        "--mypy_grpc_opt=quiet",
        f"--mypy_grpc_out={tree}",
    ]
    for proto, has_service in PROTOS:
        args = common + (grpc if has_service else []) + [str(PACKAGE_DIR / proto)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
    for name in generated_files():
        produced = tree / PACKAGE_DIR / name
        if name.endswith("_pb2.py"):
            _use_private_pool(produced)
        shutil.copyfile(produced, out / name)
    shutil.rmtree(tree)


def _versions() -> str:
    found = []
    for dist in ("grpcio-tools", "mypy-protobuf", "protobuf"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve.frontends.oip.proto.generate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory; exit 1 listing checked-in files that differ",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlserve-proto-") as tmp:
        out = Path(tmp)
        _generate(out)
        if args.check:
            stale = [
                name
                for name in generated_files()
                if not (PROTO_DIR / name).exists()
                or (PROTO_DIR / name).read_bytes() != (out / name).read_bytes()
            ]
            if stale:
                print(f"stale generated files (regenerated with {_versions()}):")
                for name in stale:
                    print(f"  {PACKAGE_DIR / name}")
                print("run `make proto` and commit the result")
                return 1
            print(f"{len(generated_files())} generated files are current")
            return 0
        for name in generated_files():
            shutil.copyfile(out / name, PROTO_DIR / name)
            print(f"wrote {PACKAGE_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
