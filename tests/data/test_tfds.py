"""Tests of the tfds: source under tfds.testing.mock_data (no download, no TensorFlow).

tensorflow-datasets is in the test extra: without TensorFlow it still builds datasets' metadata
from their code, and mock_data serves random examples through ``as_data_source``, which is the
path this package reads ArrayRecord-prepared datasets by.
"""

import sys

import pytest

from electra_jax.data import sources
from electra_jax.errors import DataError

tfds = pytest.importorskip(
    "tensorflow_datasets", reason="tensorflow-datasets not installed: pip install -e '.[test]'"
)


def _mock(num_examples=6):
    return tfds.testing.mock_data(
        num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE
    )


def test_tfds_examples_are_documents():
    with _mock():
        texts = [ex["text"] for ex in tfds.builder("lm1b").as_data_source("train")]
        stats = sources.SourceStats()
        docs = list(sources.iter_documents("tfds:lm1b", stats))
    assert stats.files == 6
    expected = [t.split() for t in texts if t.strip()]
    # One document per example with text, its words in order (mock texts have no sentence ends).
    assert [" ".join(d).split() for d in docs] == expected
    assert "tensorflow" not in sys.modules  # read through as_data_source only


def test_tfds_split_field_and_fingerprint():
    with _mock(num_examples=3):
        docs = list(sources.iter_documents("tfds:imdb_reviews:1.0.0:test"))
        assert 1 <= len(docs) <= 3
        opts = sources.SourceOptions(tfds_text_field="label")
        with pytest.raises(DataError, match=r"no field 'nope'.*data\.tfds_text_field"):
            list(
                sources.iter_documents(
                    "tfds:imdb_reviews", options=sources.SourceOptions(tfds_text_field="nope")
                )
            )
        a = sources.source_fingerprint("tfds:imdb_reviews")
        assert a == sources.source_fingerprint("tfds:imdb_reviews:train")
        assert a != sources.source_fingerprint("tfds:imdb_reviews:test")
        assert a != sources.source_fingerprint("tfds:imdb_reviews", opts)


def test_tfds_split_parsing():
    assert sources._parse_tfds("c4/en") == ("c4/en", "train")
    assert sources._parse_tfds("c4/en:3.1.0") == ("c4/en:3.1.0", "train")
    assert sources._parse_tfds("wikipedia/20230601.en:train[:1%]") == (
        "wikipedia/20230601.en",
        "train[:1%]",
    )


def test_tfds_text_is_split_into_sentences_and_pieces():
    text = "First one. Second one! Third?\nNext paragraph, " + "x" * 45 + "\n\nLast line"
    examples = [{"text": text}, {"text": ""}, {"text": b"caf\xe9 bytes"}]

    def as_data_source(builder, *args, **kwargs):
        return examples

    opts = sources.SourceOptions(max_line_chars=20)
    stats = sources.SourceStats()
    with tfds.testing.mock_data(as_data_source_fn=as_data_source):
        docs = list(sources.iter_documents("tfds:lm1b", stats, opts))
    assert docs == [
        ["First one.", "Second one!", "Third?", "Next paragraph,"]
        + ["x" * 19, "x" * 20, "x" * 6, "Last line"],
        ["caf\ufffd bytes"],
    ]
    assert stats.files == 3 and stats.bytes_replaced == 1


def test_tfds_dataset_not_prepared_names_the_command(tmp_path):
    opts = sources.SourceOptions(tfds_data_dir=str(tmp_path))
    with pytest.raises(DataError) as e:
        sources.iter_documents("tfds:imdb_reviews", options=opts)
    message = str(e.value)
    assert "imdb_reviews" in message and "not prepared" in message
    assert f"tfds build imdb_reviews --data_dir={tmp_path}" in message
    assert "\n" not in message
    with pytest.raises(DataError, match="TFDS has no dataset 'no_such_dataset'"):
        sources.iter_documents("tfds:no_such_dataset", options=opts)
