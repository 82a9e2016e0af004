"""A canary's evidence across worker processes (serve/control/canary_evidence.py): each
worker writes its own file under the canary's salt, and any worker merges the others' with
its own: returns by Welford's merge, shadow comparisons by sums."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from serve.control.canary_evidence import Agreement, Evidence, read_others, write_own
from serve.control.return_gate import Returns
from serve.plugins import Comparison

ROOT = Path(__file__).resolve().parents[3]


def counted(values: list[float]) -> Returns:
    returns = Returns()
    for value in values:
        returns = returns.add(value)
    return returns


def test_another_workers_file_is_read_and_merged_with_this_ones(tmp_path: Path) -> None:
    folder = tmp_path / "cartpole" / ".canary" / "salt"
    theirs = {1: [10.0, 12.0, 9.0], 2: [30.0, 31.0]}
    code = (
        "import sys; from serve.control.canary_evidence import Evidence, write_own; "
        "from serve.control.return_gate import Returns; from pathlib import Path\n"
        "e = Evidence()\n"
        f"for v, values in {theirs!r}.items():\n"
        "    r = Returns()\n"
        "    for x in values: r = r.add(x)\n"
        "    e.returns[v] = r\n"
        "write_own(Path(sys.argv[1]), e.to_bytes())"
    )
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, cwd=ROOT)
    write_own(folder, Evidence({1: counted([11.0])}).to_bytes())  # this process's own file
    (other,) = read_others(folder)  # its own file is not among the others
    mine = Evidence({1: counted([11.0]), 2: counted([29.0, 33.0])})
    merged = mine.merged(other)
    everything = {1: [*theirs[1], 11.0], 2: [*theirs[2], 29.0, 33.0]}
    for version, values in everything.items():
        assert merged.returns[version].count == len(values)
        assert merged.returns[version].mean == pytest.approx(statistics.fmean(values))
        assert merged.returns[version].variance == pytest.approx(statistics.variance(values))


def test_a_file_being_written_or_broken_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "salt"
    folder.mkdir()
    (folder / "other-host:1.json").write_bytes(b'{"returns": {"1": {"count"')
    (folder / "other-host:2.json").write_bytes(Evidence({1: counted([1.0, 2.0])}).to_bytes())
    (found,) = read_others(folder)
    assert found.returns[1].count == 2
    assert read_others(tmp_path / "absent") == []


def test_shadow_comparisons_add_up() -> None:
    one = Agreement().add(Comparison(rows=10, agreeing=7, kl_sum=0.5))
    two = Agreement().add(Comparison(rows=5, agreeing=5, kl_sum=None))  # deterministic
    both = Evidence(shadow=one).merged(Evidence(shadow=two)).shadow
    again = Evidence.from_bytes(Evidence(shadow=both).to_bytes()).shadow
    assert again == both == Agreement(rows=15, agreeing=12, kl_sum=0.5, kl_rows=10)
    assert both.to_json() == {"rows": 15, "agreement": 12 / 15, "mean_kl": 0.05}
