"""Reading a checkpoint directory: the algorithm from TRL's traces, the EOS union, the
generation defaults, and a version of several files written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from export import writer
from export.errors import ExportError
from export.lm import eos, generation, source, training
from kernel.contract import Algorithm
from tests.export.lm.tiny_models import TinyModels

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies


def test_the_algorithm_is_read_from_trl_traces(
    lm_models: TinyModels, tiny_policies: TinyPolicies
) -> None:
    import trl

    dpo = training.detect(tiny_policies.llama_dpo)
    assert (dpo.algorithm, dpo.evidence) == (Algorithm.DPO, "README.md tag 'dpo'")
    assert dpo.trainer == f"trl {trl.__version__}"
    lora = training.detect(tiny_policies.llama_grpo_lora)
    assert (lora.algorithm, lora.evidence) == (Algorithm.GRPO, "README.md tag 'grpo'")
    pickled = training.detect(lm_models.qwen2)  # no model card: the pickled GRPOConfig
    assert (pickled.algorithm, pickled.evidence) == (
        Algorithm.GRPO,
        "training_args.bin holds a GRPOConfig",
    )
    assert training.detect(lm_models.llama) == training.Training(None, None, None)


def test_a_forced_algorithm_wins(lm_models: TinyModels, tiny_policies: TinyPolicies) -> None:
    plain = source.load(source.LoadOptions(checkpoint=lm_models.llama))
    assert plain.algorithm is None
    assert plain.algorithm_evidence.startswith("nothing in the directory says")
    forced = source.load(source.LoadOptions(checkpoint=lm_models.llama, algorithm=Algorithm.GRPO))
    assert (forced.algorithm, forced.algorithm_evidence) == (Algorithm.GRPO, "--algorithm")
    overruled = source.load(
        source.LoadOptions(checkpoint=tiny_policies.llama_dpo, algorithm=Algorithm.GRPO)
    )
    assert overruled.algorithm is Algorithm.GRPO
    assert overruled.algorithm_evidence == (
        "--algorithm; the directory says dpo: README.md tag 'dpo'"
    )


def test_eos_is_the_union_of_config_generation_config_and_tokenizer() -> None:
    assert eos.eos_token_ids({"eos_token_id": 2}, {"eos_token_id": [5, 2]}, 7, 10) == [2, 5, 7]
    assert eos.eos_token_ids({}, {"eos_token_id": 3}, None, 10) == [3]
    with pytest.raises(ExportError, match="no EOS token"):
        eos.eos_token_ids({}, {}, None, 10)
    with pytest.raises(ExportError, match=r"EOS token ids \[12\] are outside the vocabulary"):
        eos.eos_token_ids({"eos_token_id": 12}, {}, None, 10)
    with pytest.raises(ExportError, match=r"generation_config\.json eos_token_id is 'x'"):
        eos.eos_token_ids({}, {"eos_token_id": "x"}, None, 10)


def test_generation_defaults_come_from_the_keys_the_file_sets() -> None:
    defaults = generation.defaults({"temperature": 0.6, "top_k": None, "max_new_tokens": 20})
    assert (defaults.temperature, defaults.top_k, defaults.max_new_tokens) == (0.6, 0, 20)
    assert (defaults.top_p, defaults.do_sample) == (1.0, False)
    with pytest.raises(ExportError, match=r"generation_config\.json: unusable"):
        generation.defaults({"top_k": "many"})


def test_a_version_of_several_files_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    def fill(staging: Path) -> None:
        (staging / "model.onnx").write_bytes(b"graph")
        (staging / "tokenizer.json").write_text("{}")

    def refuse(staging: Path) -> None:
        assert {p.name for p in staging.iterdir()} == {"model.onnx", "tokenizer.json"}
        raise ExportError("no")

    with pytest.raises(ExportError, match="no"):
        writer.write_version(writer.destination(tmp_path, "m", None), fill, refuse)
    assert not (tmp_path / "m").exists()
    written = writer.write_version(writer.destination(tmp_path, "m", None), fill, lambda _: None)
    assert written == tmp_path / "m" / "1"
    assert (written / "tokenizer.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["1"]
