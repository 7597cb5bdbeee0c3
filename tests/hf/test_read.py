"""hf/read.py: the folders transformers itself saves, read into a `Pretrained`."""

import numpy as np
import pytest

from electra_jax.errors import PretrainedError
from electra_jax.hf import read
from electra_jax.hf.electra_config import hf_config
from electra_jax.hf.names import DISCRIMINATOR
from electra_jax.model.networks import spec_from_config
from tests.conftest import micro_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _saved_discriminator(tmp_path, **save_kwargs):
    """transformers' ElectraForPreTraining of the micro size, as its save_pretrained writes it,
    with a WordPiece vocab.txt: (its state dict as numpy, the folder)."""
    cfg = micro_config()
    spec = spec_from_config(cfg.model, cfg.generator, cfg.data.vocab_size)
    torch.manual_seed(0)
    model = transformers.ElectraForPreTraining(
        transformers.ElectraConfig(**hf_config(spec, DISCRIMINATOR, pad_id=0))
    )
    folder = tmp_path / "discriminator-only"
    model.save_pretrained(str(folder), **save_kwargs)
    vocab = SPECIALS + [f"w{i}" for i in range(cfg.data.vocab_size - len(SPECIALS))]
    (folder / "vocab.txt").write_text("".join(f"{v}\n" for v in vocab))
    return {k: v.numpy() for k, v in model.state_dict().items()}, folder


@pytest.mark.parametrize("save", [{}, {"max_shard_size": "200KB"}], ids=["safetensors", "sharded"])
def test_a_folder_transformers_saved_is_read_tensor_for_tensor(tmp_path, save):
    state, folder = _saved_discriminator(tmp_path, **save)
    if save:
        assert (folder / "model.safetensors.index.json").exists()
    tensors = read.read_hf_tensors(str(folder))
    assert set(tensors) == set(state)
    for name, value in state.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    pretrained = read.read_hf(str(folder))
    assert pretrained.source.startswith(f"hf:{folder} (no generator in")
    assert pretrained.tokenizer.mask_id == 4 and pretrained.spec.vocab_size == 300
    embeddings = pretrained.params["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(embeddings, state["electra.embeddings.word_embeddings.weight"])
    # The generator is a fresh one of a quarter of the width (the paper's Small).
    assert pretrained.spec.generator.hidden_size == pretrained.spec.discriminator.hidden_size // 4


def test_a_pytorch_model_bin_is_read_as_plain_tensors(tmp_path):
    state, folder = _saved_discriminator(tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, folder / "pytorch_model.bin")
    tensors = read.read_hf_tensors(str(folder))
    for name, value in state.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)


def test_a_folder_that_is_no_model_is_one_line(tmp_path):
    with pytest.raises(PretrainedError, match="does not exist or is not a directory"):
        read.read_hf(str(tmp_path / "missing"))
    with pytest.raises(PretrainedError, match="holds neither discriminator/"):
        read.read_hf(str(tmp_path))
