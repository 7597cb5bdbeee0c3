"""hf/write.py: an export is what transformers loads, and replaces only what an export wrote."""

import jax
import numpy as np
import pytest

from electra_jax.data.wordpiece import WordPieceTokenizer
from electra_jax.errors import PretrainedError
from electra_jax.hf import previous, write
from electra_jax.model.networks import Electra, init_params, spec_from_config
from electra_jax.model.weights import Pretrained
from tests.conftest import micro_config
from tests.hf.test_read import SPECIALS

transformers = pytest.importorskip("transformers")


def _pretrained(tmp_path) -> Pretrained:
    cfg = micro_config()
    spec = spec_from_config(cfg.model, cfg.generator, cfg.data.vocab_size)
    params = jax.device_get(init_params(Electra(spec), jax.random.PRNGKey(0)))
    vocab = SPECIALS + [f"w{i}" for i in range(cfg.data.vocab_size - len(SPECIALS))]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("".join(f"{v}\n" for v in vocab))
    return Pretrained(spec, params, WordPieceTokenizer.load(str(tmp_path / "vocab")), "test")


def test_an_export_loads_in_transformers_and_a_second_export_keeps_the_users_files(tmp_path):
    pretrained = _pretrained(tmp_path)
    out = tmp_path / "out"
    manifest = write.write_export(pretrained, str(out))
    assert (out / previous.MANIFEST).exists()
    assert all((out / f).is_file() for f in manifest["files"])
    assert manifest["discriminator_params"] > manifest["generator_params"] > 0
    for name, cls in (
        ("discriminator", transformers.ElectraForPreTraining),
        ("generator", transformers.ElectraForMaskedLM),
    ):
        model = cls.from_pretrained(str(out / name))
        weights = model.state_dict()["electra.embeddings.word_embeddings.weight"].numpy()
        np.testing.assert_array_equal(
            weights, pretrained.params["embeddings"]["word_embeddings"]["embedding"]
        )
    (out / "notes.txt").write_text("mine")
    assert previous.check_out(str(out)) == sorted(manifest["files"])
    write.write_export(pretrained, str(out))
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(previous.TMP_PREFIX)]


def test_a_folder_that_is_not_an_export_is_refused_and_left_alone(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    with pytest.raises(PretrainedError, match="is not an electra_jax export"):
        write.write_export(_pretrained(tmp_path), str(foreign))
    assert [p.name for p in foreign.iterdir()] == ["thesis.tex"]
    (tmp_path / "file").write_text("")
    with pytest.raises(PretrainedError, match="is a file"):
        previous.check_out(str(tmp_path / "file"))
