"""hf/tokenizer_files.py: the tokenizer files transformers loads, and reading them back."""

import pytest

from electra_jax.data.tokenizer import train_tokenizer
from electra_jax.data.wordpiece import VOCAB_FILENAME, WordPieceTokenizer
from electra_jax.errors import PretrainedError
from electra_jax.hf import tokenizer_files
from tests.test_export import TEXTS, _sentences

transformers = pytest.importorskip("transformers")


def _check_transformers_gives_our_ids(ours, folder):
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        want = [ours.cls_id, *ours.encode(text), ours.sep_id]
        assert theirs(text)["input_ids"] == want, text
    pair = theirs("one", "two")
    assert pair["token_type_ids"] == [0] * (len(ours.encode("one")) + 2) + [1] * (
        len(ours.encode("two")) + 1
    )
    assert theirs.mask_token_id == ours.mask_id and theirs.pad_token_id == ours.pad_id
    assert theirs.model_max_length == 128


def test_a_sentencepiece_tokenizer_is_loaded_by_transformers_with_our_ids(tmp_path):
    ours = train_tokenizer(_sentences()[:4000], str(tmp_path / "spm"), 300, 0.9995, 0, 4000)
    folder = tmp_path / "export"
    folder.mkdir()
    tokenizer_files.write_tokenizer_files(ours, str(folder), max_length=128)
    _check_transformers_gives_our_ids(ours, folder)
    back = tokenizer_files.read_hf_tokenizer(str(folder))
    assert back.fingerprint == ours.fingerprint  # the training tokenizer itself, spm.model


def test_a_wordpiece_tokenizer_is_loaded_by_transformers_with_our_ids(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "chef", "cook", "##ed", "a"]
    vocab += ["meal", ".", "one", "two", "!", ","]
    source = tmp_path / "vocab"
    source.mkdir()
    (source / VOCAB_FILENAME).write_text("".join(f"{v}\n" for v in vocab))
    ours = WordPieceTokenizer.load(str(source))
    folder = tmp_path / "export"
    folder.mkdir()
    tokenizer_files.write_tokenizer_files(ours, str(folder), max_length=128)
    _check_transformers_gives_our_ids(ours, folder)
    assert tokenizer_files.read_hf_tokenizer(str(folder)).vocab_size == len(vocab)


def test_a_folder_without_tokenizer_files_is_one_line(tmp_path):
    with pytest.raises(PretrainedError, match="has neither spm.model .* nor vocab.txt"):
        tokenizer_files.read_hf_tokenizer(str(tmp_path))
