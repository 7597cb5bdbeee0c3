"""python -m electra_jax.prepare: figures on success, reuse, and one clear line per bad input."""

import json
import os
from pydoc_data.topics import topics

import pytest

from tests.conftest import ROOT, SHARED, run_command

# Small enough that SentencePiece trains in a second on a few KB of text.
FAST = ["--config.data.vocab_size=300", "--config.data.seq_length=64"]


def _prepare(workdir, source, *extra, timeout=300, file_size_limit=0):
    return run_command(
        "electra_jax.prepare",
        f"--config={ROOT / 'configs' / 'tiny.py'}",
        f"--workdir={workdir}",
        f"--config.data.source={source}",
        # FAST's settings but those `extra` gives: a flag given twice is refused.
        *(f for f in FAST if f.split("=")[0] not in {e.split("=")[0] for e in extra}),
        *extra,
        timeout=timeout,
        file_size_limit=file_size_limit,
    )


def _english(n_topics):
    return "\n\n".join(topics[name] for name in sorted(topics)[:n_topics])


def _one_error_line(out, *fragments):
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_prepare_prints_figures_then_reuses(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text(_english(40))
    source = f"text:{tmp_path}/c/*.txt"
    out = _prepare(tmp_path / "w", source, "--num_workers=2")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().splitlines()) == 1  # the figures; progress goes to stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    progress = [ln for ln in out.stderr.splitlines() if ln.startswith(("tokenizer:", "packing:"))]
    assert progress[0].startswith("tokenizer: training SentencePiece (300 pieces) on ")
    assert progress[1].startswith("tokenizer: trained in ")
    assert progress[-1].startswith("packing: done in ") and "on 2 worker processes" in progress[-1]
    assert summary["source"] == source and not summary["reused"]
    assert summary["tokens"] > 10_000 and summary["examples"] >= 32
    for key in ("real_token_fraction", "single_segment_fraction", "short_fraction"):
        assert 0 < summary[key] <= 1
    manifest = json.loads(
        (
            tmp_path / "w" / "data" / os.path.basename(summary["directory"]) / "manifest.json"
        ).read_text()
    )
    assert manifest["tokens"] == summary["tokens"]
    again = _prepare(tmp_path / "w", source)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout.strip().splitlines()[-1])
    assert second["reused"] and second["directory"] == summary["directory"]
    assert "tokenizer:" not in again.stderr and "packing:" not in again.stderr  # nothing done


def test_bad_inputs_get_one_line_each(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "empty" / "b.txt").write_text("\n\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00" * 500)
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "a.txt").write_text(_english(40)[:2_500])
    cases = [
        (f"text:{tmp_path}/none/**/*.txt", ["none/**/*.txt", "matches no files"]),
        (f"text:{tmp_path}/empty/*.txt", ["empty/*.txt", "empty", "a.txt"]),
        (f"text:{tmp_path}/bin/*.txt", ["x.txt: binary", "skipped"]),
        (f"text:{tmp_path}/small/*.txt", ["small/*.txt", "fewer than one batch"], "200"),
        ("tfds:", ["not a known source"]),
    ]
    for source, fragments, *vocab in cases:
        extra = [f"--config.data.vocab_size={vocab[0]}"] if vocab else []
        out = _prepare(tmp_path / f"w{len(source)}", source, *extra)
        _one_error_line(out, *fragments)


def test_file_without_newline_is_prepared(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "flat.txt").write_text(" ".join(_english(60).split()))  # ~200 KB, no "\n"
    out = _prepare(tmp_path / "w", f"text:{tmp_path}/c/*.txt")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["examples"] >= 32


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_one_line(tmp_path):
    (tmp_path / "c").mkdir()
    locked = tmp_path / "c" / "locked.txt"
    locked.write_text("text\n")
    locked.chmod(0)
    _one_error_line(_prepare(tmp_path / "w", f"text:{tmp_path}/c/*.txt"), "locked.txt")


@pytest.mark.skipif(
    not (SHARED / "data" / "corpus").is_dir(), reason=f"{SHARED / 'data' / 'corpus'} absent"
)
def test_shared_corpus_latin1_bytes_are_counted(tmp_path):
    from electra_jax.data import sources

    stats = sources.SourceStats()
    for _ in sources.iter_documents(f"text:{SHARED}/data/corpus/*/*.txt", stats):
        pass
    assert stats.bytes_replaced > 0 and stats.skipped == []


def test_a_full_disk_while_packing_is_one_line_and_keeps_nothing_half_written(tmp_path):
    """A file size limit stands in for a full disk (both are OSErrors on write; Python ignores
    SIGXFSZ): the tokenizer (~240 KB) fits under it, the shard (~460 KB) does not."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text(_english(40))
    source = f"text:{tmp_path}/c/*.txt"

    out = _prepare(tmp_path / "w", source, file_size_limit=350_000)
    _one_error_line(out, "cannot write prepared data", "File too large")
    assert (tmp_path / "w" / "tokenizer" / "spm.model").is_file()
    data = tmp_path / "w" / "data"
    assert not data.exists() or not [p for p in data.rglob("*") if p.is_file()]
    # With room again, the same command finishes and keeps the tokenizer it had written.
    model_bytes = (tmp_path / "w" / "tokenizer" / "spm.model").read_bytes()
    out = _prepare(tmp_path / "w", source)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "w" / "tokenizer" / "spm.model").read_bytes() == model_bytes
    assert json.loads(out.stdout.strip().splitlines()[-1])["examples"] > 0


def test_prepare_with_init_from_tokenizes_with_the_tokenizer_of_those_weights(tmp_path):
    """Prepared data of a run that starts from weights is tokenized with their tokenizer (here
    a BERT vocab.txt): prepare places it in the workdir as train does, so that train finds the
    data prepared (another tokenizer there is refused by both: tests/pretraining/test_resume.py)."""
    import jax
    import numpy as np

    from electra_jax.data.wordpiece import WordPieceTokenizer
    from electra_jax.hf import write
    from electra_jax.model.networks import spec_from_config
    from electra_jax.model.weights import Pretrained, abstract_params
    from tests.conftest import micro_config

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *[f"##{c}" for c in letters]]
    vocab += ["the", "of", "and", "to", "a", "is", "in", "for", "this", "that", "be", "return"]
    cfg = micro_config()
    spec = spec_from_config(cfg.model, cfg.generator, len(vocab))
    params = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), abstract_params(spec))
    model = tmp_path / "model"
    write.write_export(Pretrained(spec, params, WordPieceTokenizer(vocab), "test"), str(model))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text(_english(40))
    source = f"text:{tmp_path}/c/*.txt"
    init_from = [f"--config.train.init_from={model}", f"--config.data.vocab_size={len(vocab)}"]

    out = _prepare(tmp_path / "w", source, *init_from)
    assert out.returncode == 0, out.stderr
    tokenizer = tmp_path / "w" / "tokenizer"
    assert sorted(os.listdir(tokenizer)) == ["tokenizer_config.json", "vocab.txt"]
    assert (tokenizer / "vocab.txt").read_text() == "".join(f"{v}\n" for v in vocab)
    directory = json.loads(out.stdout.strip().splitlines()[-1])["directory"]
    manifest = json.loads(
        (tmp_path / "w" / "data" / os.path.basename(directory) / "manifest.json").read_text()
    )
    assert manifest["vocab_size"] == len(vocab)
    assert manifest["tokenizer_fingerprint"] == WordPieceTokenizer(vocab).fingerprint
