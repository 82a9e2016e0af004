"""Triton's perf_analyzer: fetched once into a cache, then run for one measurement.

perf_analyzer is the C++ load generator of NVIDIA Triton; PyPI ships it as the wheel
``perf-analyzer`` (here 2.60.0). Its only Linux wheel is tagged ``manylinux_2_38_x86_64``:
the binary needs glibc 2.38 and libstdc++ GLIBCXX_3.4.32. ``ensure`` makes it runnable:

1. ``pip download`` the wheel (pip refuses to install it on an older glibc, but downloads
   it when told the platform) and unpack ``perf_analyzer/bin/perf_analyzer``;
2. if the binary runs as it is (a host with glibc >= 2.38), that is all;
3. otherwise fetch Debian trixie's glibc, libstdc++, libgcc, OpenSSL, zlib and zstd with
   ``apt-get download`` through a private sources list and state directory (the host's
   sources, pinning and installed packages take no part), unpack them with ``dpkg-deb -x``
   and start the binary through trixie's dynamic loader, ``ld-linux-x86-64.so.2
   --library-path <trixie libs> perf_analyzer``.

Everything lands in ``.cache/perf_analyzer`` at the project root unless told otherwise;
a second call finds it there and downloads nothing.

``run`` measures one concurrency level: perf_analyzer takes measurement windows of
``measurement_ms`` until the last three agree within ``stability_percentage`` (throughput
and latency), at most ``max_trials`` windows, and reports those three merged. The report
comes from its CSV file (``-f``, with ``--verbose-csv`` for the average latency).

The server side: perf_analyzer speaks the KServe v2 protocol with Triton's extensions.
Before the load it asks for the model's metadata (``GET /v2/models/{m}`` or
ModelMetadata), the model configuration (``GET /v2/models/{m}/config`` or ModelConfig),
and the server metadata (``GET /v2`` or ServerMetadata); it polls the model statistics
(``GET /v2/models/{m}/stats`` or ModelStatistics) around every window only when the
server metadata lists the ``statistics`` extension, and the server columns of the result
are filled only then.
"""

from __future__ import annotations

import csv
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = ROOT / ".cache" / "perf_analyzer"

VERSION = "2.60.0"
WHEEL_PLATFORM = "manylinux_2_38_x86_64"
_WHEEL_MEMBER = "perf_analyzer/bin/perf_analyzer"

DEBIAN_SUITE = "trixie"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# libc6 brings the loader; libssl3t64 needs zlib1g and libzstd1 (libcrypto links both).
DEBIAN_PACKAGES = ("libc6", "libstdc++6", "libgcc-s1", "libssl3t64", "zlib1g", "libzstd1")
_LIB_DIR = "usr/lib/x86_64-linux-gnu"
_LOADER = "ld-linux-x86-64.so.2"
_COMPLETE = ".complete"  # written last into an unpacked tree: it is whole

# perf_analyzer's exit statuses (src/constants.h)
_STABILITY_ERROR = 2


class ProvisionError(RuntimeError):
    """perf_analyzer could not be made runnable; the message says what failed and what to do."""


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer ran and failed; ``output`` holds what it printed."""

    def __init__(
        self, message: str, *, command: Sequence[str], returncode: int | None, output: str
    ) -> None:
        super().__init__(f"{message}\ncommand: {' '.join(command)}\n--- output ---\n{output}")
        self.command = list(command)
        self.returncode = returncode
        self.output = output


class UnstableMeasurement(PerfAnalyzerError):
    """No three windows in a row agreed within the stability percentage (exit status 2)."""


def _progress(message: str) -> None:
    print(f"bench: perf_analyzer: {message}", file=sys.stderr, flush=True)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --- provisioning -------------------------------------------------------------------------


def ensure(cache_dir: Path = DEFAULT_CACHE) -> list[str]:
    """The command prefix that starts perf_analyzer, provisioning it into ``cache_dir`` once.

    The prefix is the binary alone where it runs natively, else trixie's loader, its
    ``--library-path`` and the binary. Raises ProvisionError when that cannot be done.
    """
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise ProvisionError(
            f"perf_analyzer {VERSION} ships for Linux x86_64 only; this is "
            f"{sys.platform} {platform.machine()}"
        )
    cache_dir = cache_dir.resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    binary = _binary(cache_dir)

    native = [str(binary)]
    runs, output = _version_check(native)
    if runs:
        return native

    root = _debian_root(cache_dir)
    lib_dir = root / _LIB_DIR
    prefix = [str(lib_dir / _LOADER), "--library-path", str(lib_dir), str(binary)]
    runs, loader_output = _version_check(prefix)
    if not runs:
        raise ProvisionError(
            f"perf_analyzer does not start, neither natively nor through Debian "
            f"{DEBIAN_SUITE}'s loader.\nnatively: {_tail(output)}\n"
            f"through {prefix[0]}: {_tail(loader_output)}\n"
            f"Delete {cache_dir} to provision again from scratch."
        )
    return prefix


def _version_check(prefix: Sequence[str]) -> tuple[bool, str]:
    """Whether ``prefix --version`` runs and names perf_analyzer, and what it printed."""
    try:
        done = subprocess.run(
            [*prefix, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    output = done.stdout + done.stderr
    return done.returncode == 0 and "Perf Analyzer Version" in output, output


def _binary(cache_dir: Path) -> Path:
    """The perf_analyzer binary from the wheel, downloaded and unpacked if not there yet."""
    binary = cache_dir / f"perf_analyzer-{VERSION}" / "perf_analyzer"
    if binary.is_file():
        return binary
    wheel = _wheel(cache_dir / "downloads")
    _progress(f"unpacking {wheel.name}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(binary.name + ".partial")
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(_WHEEL_MEMBER) as src,
        partial.open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    partial.chmod(0o755)
    os.replace(partial, binary)
    return binary


def _wheel(downloads: Path) -> Path:
    """The perf-analyzer wheel in ``downloads``, fetched from PyPI with pip if missing."""
    pattern = f"perf_analyzer-{VERSION}-*-{WHEEL_PLATFORM}.whl"
    found = sorted(downloads.glob(pattern))
    if found:
        return found[0]
    downloads.mkdir(parents=True, exist_ok=True)
    _progress(f"downloading perf-analyzer=={VERSION} ({WHEEL_PLATFORM} wheel) with pip")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        WHEEL_PLATFORM,
        "-d",
        str(downloads),
        f"perf-analyzer=={VERSION}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(downloads.glob(pattern))
    if done.returncode != 0 or not found:
        raise ProvisionError(
            f"could not download perf-analyzer=={VERSION} from PyPI "
            f"(`{' '.join(command)}` exited {done.returncode}):\n"
            f"{_tail(done.stdout + done.stderr)}\n"
            f"It needs pip in {sys.executable} and access to PyPI (or PIP_INDEX_URL naming a "
            f"mirror); or put {pattern} into {downloads} by hand and call again."
        )
    return found[0]


def _debian_root(cache_dir: Path) -> Path:
    """Debian trixie's runtime libraries unpacked under ``cache_dir``, fetched if missing."""
    root = cache_dir / f"debian-{DEBIAN_SUITE}"
    if (root / _COMPLETE).is_file() and (root / _LIB_DIR / _LOADER).is_file():
        return root
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing or not DEBIAN_KEYRING.is_file():
        what = f"{', '.join(missing)} on PATH" if missing else str(DEBIAN_KEYRING)
        raise ProvisionError(
            f"perf_analyzer {VERSION} needs glibc >= 2.38, which this host lacks, and the "
            f"fallback (Debian {DEBIAN_SUITE}'s libraries, fetched with apt) needs {what}. "
            f"Run the benchmark on a newer distribution (e.g. Debian 13, Ubuntu 24.04) or a "
            f"Debian-based one with apt-get, dpkg-deb and debian-archive-keyring."
        )
    _progress(f"binary needs glibc >= 2.38; fetching Debian {DEBIAN_SUITE}'s runtime libraries")
    work = Path(tempfile.mkdtemp(prefix="debian-", dir=cache_dir))
    try:
        debs = _apt_download(work)
        _progress(f"unpacking {len(debs)} packages")
        unpacked = work / "root"
        for deb in debs:
            _checked(["dpkg-deb", "-x", str(deb), str(unpacked)], f"unpacking {deb.name}")
        (unpacked / _COMPLETE).write_text(" ".join(deb.name for deb in debs) + "\n")
        if root.exists():
            shutil.rmtree(root)  # an incomplete tree from an interrupted run
        os.replace(unpacked, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


def _apt_download(work: Path) -> list[Path]:
    """``apt-get download`` DEBIAN_PACKAGES from DEBIAN_SUITE into ``work``; the .deb files.

    apt runs on a private sources list, package lists and cache under ``work`` (absolute
    paths: apt resolves relative ones against its own directories), so neither the host's
    sources nor its pinning nor its package state take part.
    """
    state = work / "apt"
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True)
    sources = state / "sources.list"
    sources.write_text(f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {DEBIAN_SUITE} main\n")
    options = {
        "Dir::Etc::SourceList": str(sources),
        "Dir::Etc::SourceParts": "/dev/null",
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": "/dev/null",
        "Dir::State::Lists": str(state / "lists"),
        "Dir::State::status": "/dev/null",  # the host's installed packages: none of ours
        "Dir::Cache": str(state / "cache"),
        "Debug::NoLocking": "1",
    }
    if os.geteuid() == 0:
        options["APT::Sandbox::User"] = "root"  # the _apt user may not write under work
    apt = ["apt-get", "-q", *(f"-o{key}={value}" for key, value in options.items())]
    debs = work / "debs"
    debs.mkdir()

    _progress(f"apt-get update ({DEBIAN_MIRROR} {DEBIAN_SUITE} main)")
    update = subprocess.run([*apt, "update"], capture_output=True, text=True, check=False)
    _progress(f"apt-get download {' '.join(DEBIAN_PACKAGES)}")
    download = subprocess.run(
        [*apt, "download", *DEBIAN_PACKAGES],
        cwd=debs,
        capture_output=True,
        text=True,
        check=False,
    )
    fetched = sorted(debs.glob("*.deb"))
    if download.returncode != 0 or len(fetched) != len(DEBIAN_PACKAGES):
        raise ProvisionError(
            f"could not fetch Debian {DEBIAN_SUITE} packages {', '.join(DEBIAN_PACKAGES)} "
            f"from {DEBIAN_MIRROR}.\napt-get update (exit {update.returncode}):\n"
            f"{_tail(update.stdout + update.stderr)}\n"
            f"apt-get download (exit {download.returncode}):\n"
            f"{_tail(download.stdout + download.stderr)}\n"
            f"It needs HTTP access to {DEBIAN_MIRROR} (apt honours http_proxy and "
            f"Acquire::http::Proxy), or a host with glibc >= 2.38 where perf_analyzer runs "
            f"as it is."
        )
    return fetched


def _checked(command: Sequence[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProvisionError(f"{what} failed (exit {done.returncode}):\n{_tail(done.stderr)}")


# --- measuring ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfResult:
    """One stable measurement at one concurrency; times in microseconds, from the CSV.

    Latencies are per request, from the client (send to last byte received). The server
    fields are None unless the server lists the ``statistics`` extension in its metadata.
    """

    concurrency: int
    throughput: float  # inferences per second (requests x batch size)
    p50_us: int
    p90_us: int
    p95_us: int
    p99_us: int
    avg_us: int | None  # None when stabilised on a percentile (--percentile)
    client_send_us: int
    client_recv_us: int
    response_wait_us: int
    request_count: int | None  # requests in the three merged windows, from stdout
    network_us: int | None  # "Network+Server Send/Recv": client wait not spent in the model
    server_queue_us: int | None
    server_compute_input_us: int | None
    server_compute_infer_us: int | None
    server_compute_output_us: int | None
    row: dict[str, str]  # the CSV row as perf_analyzer wrote it
    output: str  # perf_analyzer's stdout and stderr

    @property
    def server_compute_us(self) -> int | None:
        parts = (
            self.server_compute_input_us,
            self.server_compute_infer_us,
            self.server_compute_output_us,
        )
        return None if any(part is None for part in parts) else sum(p or 0 for p in parts)


def run(  # noqa: C901 (one branch per perf_analyzer option it translates)
    prefix: Sequence[str],
    *,
    model: str,
    url: str,
    protocol: Literal["http", "grpc"] = "http",
    concurrency: int = 1,
    shape: str | Sequence[str] | None = None,
    measurement_ms: int = 2000,
    streaming: bool = False,
    input_data: str | Path | None = None,
    binary: bool = True,
    batch_size: int = 1,
    model_version: str | None = None,
    stability_percentage: float = 10.0,
    max_trials: int = 6,
    percentile: int | None = None,
    warmup_requests: int = 0,
    shared_memory: bool = False,
    extra_args: Sequence[str] = (),
    timeout_s: float | None = None,
) -> PerfResult:
    """Measure ``model`` at ``url`` with ``concurrency`` requests in flight; the result.

    ``prefix`` comes from ``ensure`` (wrap it, e.g. in ``taskset``, to pin the load).
    ``url`` is host:port (an ``http://`` in front is dropped). ``shape`` ('obs:4', or
    several) gives the shape of inputs whose metadata has variable dimensions, without the
    batch dimension. ``input_data`` is "random" (perf_analyzer's default: drawn once,
    reused), "zero", a directory or a JSON file. ``binary`` (HTTP only) sends tensors as
    binary data after the JSON header; False sends them as JSON arrays. ``streaming``
    (gRPC only) sends over ModelStreamInfer, one stream per concurrent request.
    ``percentile`` stabilises on that latency percentile instead of the average.
    ``shared_memory`` passes inputs and outputs through system shared memory (Triton's
    extension: perf_analyzer registers POSIX regions with the server and sends only their
    names, offsets and sizes; the server must allow it).

    Raises UnstableMeasurement when no stable result came within ``max_trials`` windows
    and PerfAnalyzerError on any other failure, both with perf_analyzer's output.
    """
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
    if streaming and protocol != "grpc":
        raise ValueError("streaming needs protocol='grpc'")
    if not binary and protocol != "http":
        raise ValueError("binary=False (JSON tensors) exists for protocol='http' only")
    if concurrency < 1 or batch_size < 1:
        raise ValueError("concurrency and batch_size must be at least 1")
    if max_trials < 3:
        raise ValueError("max_trials must be at least 3: stability compares three windows")

    host_port = url.removeprefix("http://").rstrip("/")
    shapes = [shape] if isinstance(shape, str) else list(shape or ())
    with tempfile.TemporaryDirectory(prefix="perf_analyzer-") as tmp:
        report = Path(tmp) / "report.csv"
        command = [*prefix, "-m", model, "-u", host_port, "-i", protocol, "-b", str(batch_size)]
        command += ["--concurrency-range", str(concurrency)]
        command += ["--measurement-interval", str(measurement_ms), "--max-trials", str(max_trials)]
        command += ["--stability-percentage", f"{stability_percentage:g}"]
        command += ["-f", str(report), "--verbose-csv"]
        if model_version is not None:
            command += ["-x", model_version]
        for one in shapes:
            command += ["--shape", one]
        if input_data is not None:
            command += ["--input-data", str(input_data)]
        if shared_memory:
            command += ["--shared-memory", "system"]
        elif protocol == "http":
            tensor_format = "binary" if binary else "json"
            command += ["--input-tensor-format", tensor_format]
            command += ["--output-tensor-format", tensor_format]
        if streaming:
            command.append("--streaming")
        if percentile is not None:
            command.append(f"--percentile={percentile}")
        if warmup_requests:
            command += ["--warmup-request-count", str(warmup_requests)]
        command += list(extra_args)

        limit = timeout_s
        if limit is None:  # each window lasts 1.2 x the interval; then start-up and drain
            limit = 60 + 1.2 * measurement_ms / 1000 * (max_trials + 1)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=limit, check=False
            )
        except subprocess.TimeoutExpired as exc:
            partial = _text(exc.stdout) + _text(exc.stderr)
            raise PerfAnalyzerError(
                f"perf_analyzer did not finish within {limit:.0f} s",
                command=command,
                returncode=None,
                output=partial,
            ) from exc
        output = done.stdout + done.stderr
        if done.returncode == _STABILITY_ERROR:
            raise UnstableMeasurement(
                f"perf_analyzer found no stable measurement in {max_trials} windows of "
                f"{measurement_ms} ms (raise measurement_ms, max_trials or "
                f"stability_percentage)",
                command=command,
                returncode=done.returncode,
                output=output,
            )
        if done.returncode != 0 or not report.is_file():
            raise PerfAnalyzerError(
                f"perf_analyzer exited {done.returncode}"
                + ("" if report.is_file() else " without writing its report"),
                command=command,
                returncode=done.returncode,
                output=output,
            )
        with report.open(newline="") as report_file:
            rows = list(csv.DictReader(report_file))
    if len(rows) != 1:
        raise PerfAnalyzerError(
            f"expected one row in perf_analyzer's report, found {len(rows)}",
            command=command,
            returncode=done.returncode,
            output=output,
        )
    return _result(rows[0], output)


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _result(row: dict[str, str], output: str) -> PerfResult:
    """A PerfResult from one row of perf_analyzer's CSV (src/report_writer.cc)."""

    def number(column: str) -> int:
        return int(float(row[column]))

    def optional(column: str) -> int | None:
        return number(column) if row.get(column) not in (None, "") else None

    counts = re.findall(r"Request count: (\d+)", output)
    return PerfResult(
        concurrency=number("Concurrency"),
        throughput=float(row["Inferences/Second"]),
        p50_us=number("p50 latency"),
        p90_us=number("p90 latency"),
        p95_us=number("p95 latency"),
        p99_us=number("p99 latency"),
        avg_us=optional("Avg latency"),
        client_send_us=number("Client Send"),
        client_recv_us=number("Client Recv"),
        response_wait_us=number("response wait"),
        request_count=int(counts[-1]) if counts else None,
        network_us=optional("Network+Server Send/Recv"),
        server_queue_us=optional("Server Queue"),
        server_compute_input_us=optional("Server Compute Input"),
        server_compute_infer_us=optional("Server Compute Infer"),
        server_compute_output_us=optional("Server Compute Output"),
        row=dict(row),
        output=output,
    )
