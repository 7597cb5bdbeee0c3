"""Tests of electra_jax.data.tokenizer: special ids, exact vocab, determinism, atomic files."""

import errno
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pydoc_data.topics import topics

import numpy as np
import pytest

from electra_jax.data import sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.tokenizer import Tokenizer, train_tokenizer
from electra_jax.errors import DataError
from tests import held
from tests.conftest import ROOT, subprocess_env


def _small_corpus():
    # ~150 KB of English from pydoc_data: trains a 300-piece model in well under a second.
    text = "\n".join(topics[name] for name in sorted(topics)[:30])
    return [line.strip() for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def builtin_tokenizer(tmp_path_factory):
    """A 1000-piece model on the whole builtin corpus, trained once for this module."""
    sentences = (s for doc in sources.iter_documents("builtin") for s in doc)
    out = tmp_path_factory.mktemp("builtin_tok") / "tokenizer"
    return train_tokenizer(sentences, str(out), 1000, 0.9995, seed=0, sample_sentences=300_000)


def test_special_ids(builtin_tokenizer):
    tok = builtin_tokenizer
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert (tokenizer_lib.PAD_ID, tokenizer_lib.MASK_ID) == (0, 4)
    assert [tok.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ids = tok.encode("The chef cooked a meal.")
    assert ids and min(ids) >= 5
    assert tok.decode(ids) == "The chef cooked a meal."


def test_literal_special_text_is_not_special(builtin_tokenizer):
    tok = builtin_tokenizer
    ids = tok.encode("Replace [MASK] and [CLS] or [SEP] and [PAD]")
    assert not {0, 2, 3, 4} & set(ids)
    assert "[MASK]" in tok.decode(ids)


def test_exact_vocab_size_and_files(builtin_tokenizer):
    tok = builtin_tokenizer
    assert tok.vocab_size == 1000
    out_dir = os.path.dirname(tok.model_path)
    assert sorted(os.listdir(out_dir)) == ["spm.model", "spm.vocab"]
    with open(os.path.join(out_dir, "spm.vocab"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == 1000
    assert lines[4].split("\t")[0] == "[MASK]"


def test_encode_batch_matches_encode(builtin_tokenizer):
    tok = builtin_tokenizer
    texts = ["Hello world.", "", "Return the sum of a and b.", "ünïcödé"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_pickle_round_trip(builtin_tokenizer):
    tok = builtin_tokenizer
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.fingerprint == tok.fingerprint
    assert clone.model_path == tok.model_path
    assert clone.vocab_size == tok.vocab_size
    text = "Pickled tokenizers encode the same way."
    assert clone.encode(text) == tok.encode(text)


def test_fingerprint_is_sha256_of_file(builtin_tokenizer):
    import hashlib

    with open(builtin_tokenizer.model_path, "rb") as f:
        assert builtin_tokenizer.fingerprint == hashlib.sha256(f.read()).hexdigest()


def test_training_is_deterministic(tmp_path):
    sentences = _small_corpus()
    a = train_tokenizer(sentences, str(tmp_path / "a"), 300, 0.9995, seed=3, sample_sentences=1000)
    b = train_tokenizer(sentences, str(tmp_path / "b"), 300, 0.9995, seed=3, sample_sentences=1000)
    c = train_tokenizer(sentences, str(tmp_path / "c"), 300, 0.9995, seed=4, sample_sentences=1000)
    assert a.fingerprint == b.fingerprint
    # The seed picks the 1000-sentence sample out of ~3000, so another seed, another model.
    assert c.fingerprint != a.fingerprint


def test_training_is_deterministic_across_processes(tmp_path):
    # SentencePiece seeds its own random generator once per thread from process-wide state, so
    # in-process repeats can agree while separate processes differ; check a fresh interpreter.
    code = (
        "import sys\n"
        "from tests.data.test_tokenizer import _small_corpus\n"
        "from electra_jax.data.tokenizer import train_tokenizer\n"
        "tok = train_tokenizer(_small_corpus(), sys.argv[1], 300, 0.9995, seed=3,\n"
        "                      sample_sentences=1000)\n"
        "print(tok.fingerprint)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "sub")],
        env=env,
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr
    here = train_tokenizer(_small_corpus(), str(tmp_path / "here"), 300, 0.9995, 3, 1000)
    assert out.stdout.strip() == here.fingerprint


def test_reservoir_sample_is_uniform_and_ordered():
    rng = np.random.default_rng(0)
    counts = np.zeros(50)
    for _ in range(4000):
        sample = tokenizer_lib.reservoir_sample(map(str, range(50)), 10, rng)
        assert len(sample) == 10
        assert [int(s) for s in sample] == sorted(int(s) for s in sample)
        for s in sample:
            counts[int(s)] += 1
    # Each item is kept with probability 10/50: expected 800, std ~25.
    assert np.all(np.abs(counts - 800) < 120), counts
    assert tokenizer_lib.reservoir_sample(["a", "b"], 10, rng) == ["a", "b"]


def test_vocab_too_large_raises_and_writes_nothing(tmp_path):
    out = tmp_path / "tok"
    with pytest.raises(DataError, match=r"data\.vocab_size=50000 .* at most \d+"):
        train_tokenizer(_small_corpus(), str(out), 50000, 0.9995, seed=0, sample_sentences=10**6)
    assert os.listdir(tmp_path) == []


def test_failed_write_leaves_no_out_dir(tmp_path, monkeypatch):
    def broken_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer_lib.os, "rename", broken_rename)
    with pytest.raises(OSError, match="disk full"):
        train_tokenizer(_small_corpus(), str(tmp_path / "tok"), 300, 0.9995, 0, 10**6)
    assert os.listdir(tmp_path) == []  # Neither out_dir nor the temp dir beside it.


def test_training_into_existing_dir(tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "other.txt").write_text("kept")
    tok = train_tokenizer(_small_corpus(), str(out), 300, 0.9995, seed=0, sample_sentences=10**6)
    assert sorted(os.listdir(out)) == ["other.txt", "spm.model", "spm.vocab"]
    assert sorted(os.listdir(tmp_path)) == ["tok"]
    assert Tokenizer.load(str(out)).fingerprint == tok.fingerprint


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="missing.model"):
        Tokenizer.load(str(tmp_path / "missing.model"))
    with pytest.raises(DataError, match="cannot be read"):
        Tokenizer.load(str(tmp_path))  # A directory without spm.model.
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(DataError, match="bad.model"):
        Tokenizer.load(str(bad))


def test_load_rejects_model_without_special_pieces(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_small_corpus()),
        model_prefix=str(tmp_path / "plain"),
        vocab_size=300,
        minloglevel=2,
    )
    with pytest.raises(DataError, match=r"expected \['\[PAD\]'"):
        Tokenizer.load(str(tmp_path / "plain.model"))


# ---- interrupts and write failures ----------------------------------------------------------


# The child that trains SentencePiece (tokenizer._TRAIN_IN_CHILD), with one change: once
# SentencePiece has read every sentence, inside its training call, it holds (tests/held.py) until
# the test releases it. The training then lasts until the Ctrl-C, however fast the machine: the
# signal never races the training. It is released only once the test is over, so a
# train_tokenizer that waits for its child (or holds the interrupt until the training ends)
# never returns within the test's timeout.
_HELD_CHILD = """
import sentencepiece as _spm
from tests import held as _held
_train = _spm.SentencePieceTrainer.train
def _read_then_hold(sentence_iterator):
    yield from sentence_iterator
    _held.hold(HOLD_DIR, "SentencePiece's training, every sentence read")
_spm.SentencePieceTrainer.train = lambda sentence_iterator, **options: _train(
    sentence_iterator=_read_then_hold(sentence_iterator), **options
)
"""

_INTERRUPTED_TRAINING = """
import faulthandler, signal, sys
# Ctrl-C as a shell delivers it: Python raises KeyboardInterrupt only where SIGINT was at its
# default when it started, and a process started with SIGINT ignored keeps ignoring it.
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks if this never returns
from electra_jax.data import tokenizer as tokenizer_lib

out, hold_dir, held_child = sys.argv[1:]
assert "SentencePieceTrainer.train(" in tokenizer_lib._TRAIN_IN_CHILD
tokenizer_lib._TRAIN_IN_CHILD = held_child.replace("HOLD_DIR", repr(hold_dir)) + (
    tokenizer_lib._TRAIN_IN_CHILD
)
sentences = [f"sentence {i} with words like w{i % 97} and v{i % 31}" for i in range(3000)]
try:
    tokenizer_lib.train_tokenizer(sentences, out, 300, 1.0, seed=0, sample_sentences=10**6)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_during_training_returns_at_once_and_writes_nothing(tmp_path):
    # SentencePiece trains in one C++ call; run in this process, it delays KeyboardInterrupt
    # until the whole training is done.
    out, hold_dir = tmp_path / "run" / "tokenizer", tmp_path / "hold"
    hold_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_TRAINING, str(out), str(hold_dir), _HELD_CHILD],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        held.wait_held(hold_dir, proc, timeout=120)  # SentencePiece is training
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # where it hangs, for the failure's message
            time.sleep(2)  # a hang is already the failure; this only lets the stacks be written
            proc.kill()
            raise AssertionError(f"no return 60 s after Ctrl-C: {proc.communicate()}") from None
        took = time.monotonic() - sent
    finally:
        proc.kill()
        held.release(hold_dir)  # the child, if it is still there
    assert stdout.strip() == "interrupted", stderr
    assert took < 30  # a guard against a hang: the hold, not a clock, orders the events
    assert not (tmp_path / "run").exists() or os.listdir(tmp_path / "run") == []


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.ENOSPC, r"No space left on device\); free space on the disk of .*tok"),
        (errno.EACCES, r"Permission denied\); make .*tok writable"),
        (errno.EROFS, r"Read-only file system\); make .*tok writable"),
    ],
)
def test_unwritable_out_dir_raises_one_line(
    tmp_path, monkeypatch, small_tokenizer_dir, code, advice
):
    tok = Tokenizer.load(str(small_tokenizer_dir))
    real_open = open

    def failing_open(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(tokenizer_lib, "open", failing_open, raising=False)
    with pytest.raises(DataError, match=rf"cannot write the tokenizer into .*{advice}") as info:
        tok.save(str(tmp_path / "tok"))  # What train_tokenizer does once trained.
    assert "\n" not in str(info.value) and "--workdir" in str(info.value)
    assert os.listdir(tmp_path) == []  # Neither out_dir nor the temp dir beside it.


def _damage(model: str, how: str) -> None:
    with open(model, "rb") as f:
        proto = f.read()
    if how == "empty":
        proto = b""
    elif how == "half":
        proto = proto[: len(proto) // 2]
    elif how == "garbage":
        proto = bytes(range(256)) * 8
    elif how == "fewer pieces":
        # Cut at a piece boundary: still a valid model, with fewer pieces than spm.vocab lists.
        cut = next(n for n in range(len(proto)) if _parses(proto[:n]))
        proto = proto[:cut]
    with open(model, "wb") as f:
        f.write(proto)


def _parses(proto: bytes) -> bool:
    try:
        Tokenizer(proto, "x")
    except (RuntimeError, DataError):
        return False
    return True


@pytest.fixture(scope="module")
def small_tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "tokenizer"
    train_tokenizer(_small_corpus(), str(out), 300, 0.9995, seed=0, sample_sentences=10**6)
    return out


@pytest.mark.parametrize("how", ["empty", "half", "garbage", "fewer pieces"])
def test_damaged_saved_tokenizer_says_how_to_recover(tmp_path, small_tokenizer_dir, how):
    tok_dir = tmp_path / "run" / "tokenizer"
    shutil.copytree(small_tokenizer_dir, tok_dir)
    assert tokenizer_lib.load_saved(str(tok_dir)).vocab_size == 300
    _damage(str(tok_dir / "spm.model"), how)
    with pytest.raises(DataError) as info:
        tokenizer_lib.load_saved(str(tok_dir))
    message = str(info.value)
    assert f"{tok_dir / 'spm.model'} is damaged" in message
    assert "checkpoints depend on it" in message and f"delete {tok_dir}" in message
    assert "data.tokenizer" not in message and "\n" not in message
