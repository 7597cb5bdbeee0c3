"""Tests of electra_jax.data.mixture: the spec, and which part each row of the blend comes from."""

import pytest

from electra_jax.data import mixture
from electra_jax.errors import ConfigError


def test_a_spec_reads_its_parts_names_and_weights():
    mix = mixture.parse(
        " builtin:0.7 ; books=text:/data/books/**/*.txt:0.2;"
        "jsonl:gs://b/c4/*.jsonl.gz:content:0.05;tfds:wikipedia/20230601.en:train:0.05;"
    )
    assert [(p.name, p.source, p.weight) for p in mix.parts] == [
        ("builtin", "builtin", 0.7),
        ("books", "text:/data/books/**/*.txt", 0.2),
        ("c4", "jsonl:gs://b/c4/*.jsonl.gz:content", 0.05),
        ("wikipedia_20230601.en", "tfds:wikipedia/20230601.en:train", 0.05),
    ]
    assert mix.proportions == (700000, 200000, 50000, 50000)
    # Only the ratios count; a file named whole is named without its extensions.
    other = mixture.parse("text:/a/wiki.txt.gz:7;text:/b/news/*.txt:3")
    assert other.names == ("wiki", "news") and other.shares == pytest.approx((0.7, 0.3))


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("builtin:1", "names 1 source(s); a mixture blends two or more"),
        ("builtin;text:a.txt:1", "'builtin' has no weight; write SOURCE:WEIGHT"),
        ("builtin:0;text:a.txt:1", "the weight of 'builtin:0' is '0'; use a number > 0"),
        ("builtin:-1;text:a.txt:1", "the weight of 'builtin:-1' is '-1'"),
        ("builtin:nan;text:a.txt:1", "the weight of 'builtin:nan' is 'nan'"),
        ("builtin:1e-9;text:a.txt:1", "below a millionth of the weights' sum"),
        ("wikipedia:1;builtin:1", "data.source 'wikipedia' is not a known source"),
        ("builtin:0.5;builtin:0.5", "the source 'builtin' is given twice"),
        ("text:/a/x.txt:1;text:/b/x.txt:1", "the name 'x' is given twice; name the parts apart"),
    ],
)
def test_a_bad_spec_is_one_line_naming_data_mixture(spec, expected):
    with pytest.raises(ConfigError) as e:
        mixture.parse(spec)
    message = str(e.value)
    assert message.startswith("data.mixture: ") and expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize("proportions", [(7, 3), (1, 1, 1), (700000, 300000), (5, 2, 3, 1)])
def test_every_stretch_of_the_blend_holds_each_parts_share(proportions):
    """Row k of the blend is row j of one part's stream: each part's rows come in order, none
    twice, and the first m rows hold each part's share to within a row or two (counts)."""
    total, rows = sum(proportions), 3000
    seen = [0] * len(proportions)
    for k in range(rows):
        part, row = mixture.locate(k, proportions)
        assert row == seen[part], (k, part, row)
        seen[part] += 1
        if k % 97 == 0 or k == rows - 1:
            assert tuple(seen) == mixture.counts(k + 1, proportions)
            for count, p in zip(seen, proportions, strict=True):
                assert abs(count - (k + 1) * p / total) < len(proportions)
    # Far out (a long run's steps x batch), the same answer without a walk from row 0.
    far = 10**12 + 7
    part, row = mixture.locate(far, proportions)
    before = mixture.counts(far, proportions)
    assert row == before[part] and mixture.counts(far + 1, proportions)[part] == row + 1
