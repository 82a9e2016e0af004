"""Links in a checkpoint directory: one that leads outside is refused by name before anything
is read (what an export reads is published), one that stays inside exports, and a hub cache
snapshot's links into its own ``blobs/`` are inside. Names of files outside, in the JSON files
transformers follows (a sharded checkpoint's weight map, ``fast_tokenizer_files``), are refused
the same way."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from export.errors import ExportError
from export.lm import source
from tests.export.lm.conftest import LinkedExport, rlserve
from tests.export.lm.tiny_models import TinyModels, orphan_adapter

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies


def _with_link(model: Path, out: Path, name: str, target: Path) -> Path:
    """A copy of ``model`` whose ``name`` is a link to ``target``."""
    checkpoint = Path(shutil.copytree(model, out))
    (checkpoint / name).unlink(missing_ok=True)
    (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
    (checkpoint / name).symlink_to(target)
    return checkpoint


def _outside_copy(model: Path, name: str, out: Path) -> Path:
    """The model's own ``name``, copied outside it: a file any loader would accept."""
    out.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(model / name, out / name))


def test_a_chat_template_linked_from_outside_is_refused_by_name_and_nothing_is_written(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    outside = tmp_path / "home" / "notes.jinja"
    outside.parent.mkdir()
    outside.write_text("PRIVATE {{ messages }}", encoding="utf-8")
    checkpoint = _with_link(lm_models.qwen2, tmp_path / "run", "chat_template.jinja", outside)
    repository = tmp_path / "models"
    done = rlserve("export", "lm", checkpoint, "--name", "leak", "--model-repository", repository)
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(f"rlserve export: error: CHECKPOINT_DIR {checkpoint}: ")
    assert f"chat_template.jinja is a link to {outside}, outside the directory" in message
    assert f"copy {outside} into {checkpoint} in place of the link" in message
    assert "PRIVATE" not in done.stdout + done.stderr
    assert not repository.exists()


@pytest.mark.parametrize(
    "name", ["tokenizer_config.json", "generation_config.json", "model.safetensors"]
)
def test_any_file_linked_from_outside_is_refused_before_loading(
    lm_models: TinyModels, tmp_path: Path, name: str
) -> None:
    outside = _outside_copy(lm_models.llama, name, tmp_path / "elsewhere")
    checkpoint = _with_link(lm_models.llama, tmp_path / "run", name, outside)
    with pytest.raises(ExportError) as refused:
        source.load(source.LoadOptions(checkpoint=checkpoint))
    assert f"CHECKPOINT_DIR {checkpoint}: {name} is a link to {outside}" in refused.value.message
    assert "copy" in refused.value.message


def test_links_out_of_a_subfolder_or_a_linked_folder_are_refused(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    template = _outside_copy(lm_models.llama, "chat_template.jinja", outside)
    nested = _with_link(
        lm_models.llama, tmp_path / "nested", "additional_chat_templates/tool.jinja", template
    )
    with pytest.raises(ExportError, match=r"additional_chat_templates/tool.jinja is a link to"):
        source.load(source.LoadOptions(checkpoint=nested))
    folder = _with_link(lm_models.llama, tmp_path / "folder", "templates", outside)
    with pytest.raises(ExportError, match=rf"templates is a link to {outside}, outside"):
        source.load(source.LoadOptions(checkpoint=folder))


def test_a_base_with_a_link_outside_is_refused_as_the_base(
    tiny_policies: TinyPolicies, tmp_path: Path
) -> None:
    adapter = orphan_adapter(tiny_policies.llama_grpo_lora, tmp_path / "adapter")
    outside = _outside_copy(tiny_policies.llama_base, "config.json", tmp_path / "elsewhere")
    base = _with_link(tiny_policies.llama_base, tmp_path / "base", "config.json", outside)
    with pytest.raises(ExportError, match=rf"--base {base}: config.json is a link to {outside}"):
        source.load(source.LoadOptions(checkpoint=adapter, base=base))


def test_a_weight_map_naming_a_shard_outside_is_refused(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    """transformers opens the shards a ``model.safetensors.index.json`` names, joined to the
    directory: ``../`` would load (and publish) another model's weights."""
    outside = _outside_copy(lm_models.llama, "model.safetensors", tmp_path / "private")
    checkpoint = Path(shutil.copytree(lm_models.llama, tmp_path / "run"))
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "../private/model.safetensors"}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ExportError) as refused:
        source.load(source.LoadOptions(checkpoint=checkpoint))
    assert (
        f"CHECKPOINT_DIR {checkpoint}: model.safetensors.index.json names "
        f"'../private/model.safetensors' (weight_map), which is {outside}, outside the directory"
    ) in refused.value.message


def test_fast_tokenizer_files_naming_a_file_outside_are_refused(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    outside = tmp_path / "private" / "tokenizer.1.0.json"
    outside.parent.mkdir()
    shutil.copyfile(lm_models.qwen2 / "tokenizer.json", outside)
    checkpoint = Path(shutil.copytree(lm_models.llama, tmp_path / "run"))
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["fast_tokenizer_files"] = [str(outside)]
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(
        ExportError, match=r"tokenizer_config.json names .* \(fast_tokenizer_files\)"
    ):
        source.load(source.LoadOptions(checkpoint=checkpoint))


def test_links_inside_export_and_the_version_holds_what_was_read_at_load(
    linked_export: LinkedExport,
) -> None:
    outcome = linked_export.outcome
    assert outcome.report.passed, outcome.report.table()
    assert outcome.path is not None
    written = outcome.path / "chat_template.jinja"
    assert not written.is_symlink()
    # The link was pointed outside after loading; the copy is what was read, not re-read.
    assert written.read_text(encoding="utf-8") == linked_export.template
    assert outcome.contract.chat_template == linked_export.template
    assert (linked_export.checkpoint / "chat_template.jinja").resolve() == linked_export.outside
    for file in outcome.path.iterdir():
        assert not file.is_symlink()
        assert b"PRIVATE" not in file.read_bytes()


def _hub_snapshot(model: Path, cache: Path, revision: str) -> Path:
    """``model`` laid out as the Hugging Face hub cache stores a download: the files in
    ``blobs/`` by digest, the snapshot's names linking to them."""
    repo = cache / "models--tiny--llama"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(model.iterdir()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", digest))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")
    return snapshot


def test_a_hub_cache_snapshot_loads_through_its_links_into_its_blobs(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    snapshot = _hub_snapshot(lm_models.llama, tmp_path / "hub", "0123abcd")
    loaded = source.load(source.LoadOptions(checkpoint=snapshot))
    assert loaded.provenance.checkpoint == "0123abcd"
    template = (lm_models.llama / "chat_template.jinja").read_bytes()
    assert loaded.side_files["chat_template.jinja"].data == template


def test_a_hub_snapshot_link_out_of_its_own_blobs_is_refused(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    snapshot = _hub_snapshot(lm_models.llama, tmp_path / "hub", "0123abcd")
    other = _outside_copy(lm_models.llama, "tokenizer_config.json", tmp_path / "hub" / "other")
    (snapshot / "tokenizer_config.json").unlink()
    (snapshot / "tokenizer_config.json").symlink_to(other)
    with pytest.raises(ExportError, match=r"tokenizer_config.json is a link to .*hub cache's"):
        source.load(source.LoadOptions(checkpoint=snapshot))


def test_a_hub_snapshot_whose_blobs_folder_is_a_link_is_refused(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    snapshot = _hub_snapshot(lm_models.llama, tmp_path / "hub", "0123abcd")
    blobs = snapshot.parent.parent / "blobs"
    moved = Path(shutil.move(blobs, tmp_path / "elsewhere-blobs"))
    blobs.symlink_to(moved)
    with pytest.raises(ExportError, match=rf"is a link to {moved}/[0-9a-f]+, outside the dir"):
        source.load(source.LoadOptions(checkpoint=snapshot))
