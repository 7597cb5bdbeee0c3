"""SentencePiece tokenizer with ELECTRA's five special pieces at fixed ids.

Ids 0-4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]`` in every model this module trains (the module
constants). The rest of the package takes the special ids from the tokenizer it uses, at every
use (``tokenizer.pad_id`` ...), never from these constants: a run continued from a BERT
vocab.txt (`wordpiece.WordPieceTokenizer`) has them elsewhere. ``[CLS] [SEP] [MASK]`` are
SentencePiece *control* symbols: encoding never produces them, so a corpus that contains the
literal text "[MASK]" is tokenized as ordinary characters and cannot forge a mask position.
"""

from __future__ import annotations

import errno
import hashlib
import io
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import sentencepiece as spm

from electra_jax.data import SPECIAL_PIECES, wordpiece
from electra_jax.errors import DataError
from electra_jax.store import paths

PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
MODEL_FILENAME = "spm.model"
VOCAB_FILENAME = "spm.vocab"


class Tokenizer:
    """A loaded SentencePiece model. Picklable: the state is the serialized model proto.

    Build one with ``Tokenizer.load(path)`` or ``train_tokenizer(...)``.
    """

    def __init__(self, model_proto: bytes, model_path: str):
        self._proto = bytes(model_proto)
        self._model_path = model_path
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        # The model file's bytes *are* the serialized proto, so this equals sha256(file).
        self._fingerprint = hashlib.sha256(self._proto).hexdigest()
        self._check_special_pieces()

    def _check_special_pieces(self) -> None:
        n = self._sp.get_piece_size()
        found = tuple(self._sp.id_to_piece(i) for i in range(min(n, len(SPECIAL_PIECES))))
        controls_ok = n >= len(SPECIAL_PIECES) and all(
            self._sp.is_control(i) for i in (PAD_ID, CLS_ID, SEP_ID, MASK_ID)
        )
        if found != SPECIAL_PIECES or not controls_ok:
            raise DataError(
                f"tokenizer {self._model_path} has pieces {list(found)} at ids 0-4, expected "
                f"{list(SPECIAL_PIECES)} (pad/cls/sep/mask as control symbols); set "
                "data.tokenizer='' to train a compatible one"
            )

    @classmethod
    def load(cls, path: str) -> Tokenizer:
        """Loads a SentencePiece model from a ``.model`` file or a directory holding ``spm.model``.

        The path may be remote (``gs://bucket/spm.model``, read through ``etils.epath``).

        Raises:
          DataError: the file does not exist, is not a SentencePiece model, or lacks the special
            pieces at ids 0-4; a remote path whose filesystem package is not installed.
        """
        model_path = path
        try:
            with paths.remote_errors(path, "data.tokenizer", DataError):
                if paths.isdir(path):
                    model_path = paths.join(path, MODEL_FILENAME)
                # A model is a few MB at most: read whole.
                proto = paths.read_bytes(model_path)
        except OSError as e:
            raise _unreadable(model_path, e.strerror or e) from None
        try:
            return cls(proto, model_path)
        except RuntimeError as e:  # SentencePiece's own parse error.
            raise DataError(
                f"tokenizer {model_path} is not a SentencePiece model ({e}); point "
                "data.tokenizer at a .model file or set data.tokenizer='' to train one"
            ) from None

    # Pickle the proto, not the C++ processor (which cannot be pickled), so a Tokenizer can be
    # shipped to worker processes.
    def __getstate__(self) -> dict:
        return {"model_proto": self._proto, "model_path": self._model_path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["model_path"])

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special pieces included (the embedding table's row count)."""
        return self._sp.get_piece_size()

    @property
    def model_path(self) -> str:
        return self._model_path

    @property
    def model_proto(self) -> bytes:
        return self._proto

    @property
    def fingerprint(self) -> str:
        """Hex sha256 of the model file's bytes: equal fingerprints mean identical tokenization."""
        return self._fingerprint

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def cls_id(self) -> int:
        return CLS_ID

    @property
    def sep_id(self) -> int:
        return SEP_ID

    @property
    def mask_id(self) -> int:
        return MASK_ID

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, no special pieces added: ``[num_tokens]``."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Token ids of many texts (SentencePiece encodes them on its thread pool, of num_threads
        threads when given, else its default size)."""
        if num_threads is None:
            return self._sp.encode(list(texts), out_type=int)
        return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids ``[num_tokens]``; special pieces decode to nothing."""
        return self._sp.decode([int(i) for i in ids])

    def save(self, out_dir: str) -> None:
        """Writes ``out_dir/spm.model`` and ``out_dir/spm.vocab`` atomically (see below)."""
        _write_files_atomically(
            out_dir,
            {VOCAB_FILENAME: _vocab_text(self._proto).encode("utf-8"), MODEL_FILENAME: self._proto},
        )

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)


def _unreadable(model_path: str, reason: object) -> DataError:
    return DataError(
        f"tokenizer {model_path} cannot be read ({reason}); point data.tokenizer at "
        f"a SentencePiece .model file or a directory holding {MODEL_FILENAME}, or set "
        "data.tokenizer='' to train one"
    )


def reservoir_sample(sentences: Iterable[str], k: int, rng: np.random.Generator) -> list[str]:
    """A uniform sample of k sentences (all of them if there are fewer), kept in stream order.

    SentencePiece can sample itself (input_sentence_size + shuffle_input_sentence), but its random
    generator is seeded once per thread, so a second training in the same process cannot be made
    to repeat the first. Sampling here, from a seeded numpy generator, makes training a pure
    function of (sentences, seed). Algorithm L: random skips, so cost is O(k log(n/k)) draws.
    """
    reservoir: list[tuple[int, str]] = []
    it = iter(sentences)
    for i, s in enumerate(it):
        reservoir.append((i, s))
        if len(reservoir) == k:
            break
    if len(reservoir) < k:
        return [s for _, s in reservoir]

    def log_uniform() -> float:
        u = 0.0
        while u == 0.0:  # rng.random() is in [0, 1); log(0) is undefined.
            u = rng.random()
        return math.log(u)

    def skip_to(last: int, w: float) -> int | None:
        # Index of the next stream item that enters the reservoir; None when w rounded to 1.0,
        # which means the skip is astronomically long (no further item will enter).
        if w >= 1.0:
            return None
        return last + int(math.floor(log_uniform() / math.log1p(-w))) + 1

    w = math.exp(log_uniform() / k)
    next_pick = skip_to(k - 1, w)
    for i, s in enumerate(it, start=k):
        if next_pick is None:
            break
        if i == next_pick:
            reservoir[int(rng.integers(k))] = (i, s)
            w *= math.exp(log_uniform() / k)
            next_pick = skip_to(i, w)
    reservoir.sort(key=lambda pair: pair[0])
    return [s for _, s in reservoir]


def _vocab_text(proto: bytes) -> str:
    # Same layout as SentencePiece's own .vocab file: piece<TAB>score, one per line, id order.
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return "".join(
        f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())
    )


def _write_files_atomically(out_dir: str, files: dict[str, bytes]) -> None:
    """Writes files into out_dir so that a reader never sees a partial set (paths.replace_files:
    a missing out_dir appears by one rename, an existing one, e.g. a workdir's tokenizer/ dir,
    gets the files one by one; in a bucket each is one upload): the last of ``files`` is moved
    in last, and callers put ``spm.model`` last, so its presence means the set is complete."""

    def write(tmp: str) -> None:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

    try:
        paths.replace_files(out_dir, write, last=list(files)[-1])
    except OSError as e:
        if e.errno is None:
            raise
        raise write_error(f"the tokenizer into {out_dir}", out_dir, e) from None


# Errors that mean "this disk is full" and "this place is not writable".
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def write_error(what: str, directory: str, error: OSError, elsewhere: str = "") -> DataError:
    """One DataError line for an OSError met writing ``what`` into ``directory``.

    Args:
      what: e.g. ``"the tokenizer into runs/x/tokenizer"``.
      directory: the directory the user can act on (free space there, or move elsewhere).
      error: the OSError.
      elsewhere: how to write somewhere else, e.g. ``"set data.cache_dir to another disk"``;
        defaults to using another --workdir.
    """
    elsewhere = elsewhere or "use a --workdir elsewhere"
    reason = error.strerror or str(error)
    if error.errno in _NO_SPACE:
        advice = f"free space on the disk of {directory}, or {elsewhere}"
    elif error.errno in _NOT_WRITABLE:
        advice = f"make {directory} writable, or {elsewhere}"
    else:
        advice = f"check {directory}, or {elsewhere}"
    return DataError(f"cannot write {what} ({reason}); {advice}")


_MAX_VOCAB_RE = re.compile(r"value <= (\d+)")
# SentencePiece's training threads. Its EM and pruning steps split the sentences into one share
# per thread and add the shares' sums in thread order, so the model is a deterministic function
# of the sample *and this count*: 1, 2 and 16 threads give three different models. A fixed count
# (SentencePiece's own default) keeps "same config and seed, same tokenizer" true on every host;
# it uses up to 16 cores, and more threads than cores only costs a little switching.
TRAIN_THREADS = 16


def train_tokenizer(
    sentences: Iterable[str],
    out_dir: str,
    vocab_size: int,
    character_coverage: float,
    seed: int,
    sample_sentences: int,
    log: Callable[[str], None] | None = None,
) -> Tokenizer:
    """Trains a SentencePiece unigram model and writes ``out_dir/spm.model`` and ``spm.vocab``.

    Args:
      sentences: training text, one sentence per item.
      out_dir: created (or filled) atomically; nothing is written if training fails.
      vocab_size: exact number of pieces, the 5 special pieces included.
      character_coverage: fraction of characters the alphabet covers (rarer ones become [UNK]).
      seed: the sample of sentences is a pure function of (sentences, seed).
      sample_sentences: train on a uniform sample of at most this many sentences.
      log: given, gets a line when SentencePiece starts (the sample's size) and one when it is
        done (its seconds); training is one long call that prints nothing itself.

    Returns:
      the trained tokenizer, loaded from ``out_dir/spm.model``.

    Raises:
      DataError: the corpus is empty, or too small for vocab_size (the message says the maximum
        it supports when SentencePiece reports one); out_dir cannot be written (disk full,
        read-only).
      KeyboardInterrupt: promptly, also during SentencePiece's training; nothing is written.
    """
    started = time.monotonic()
    sample = reservoir_sample(sentences, sample_sentences, np.random.default_rng(seed))
    if not sample:
        raise DataError(
            f"cannot train a tokenizer into {out_dir}: the corpus has no sentences; "
            "check data.source"
        )
    if log is not None:
        chars = sum(map(len, sample))
        log(
            f"training SentencePiece ({vocab_size:,} pieces) on {len(sample):,} sentences "
            f"({chars:,} characters, drawn in {time.monotonic() - started:.1f}s), "
            f"{TRAIN_THREADS} threads"
        )
    started = time.monotonic()
    try:
        proto = _train_model(
            sample,
            model_type="unigram",
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            eos_id=-1,
            pad_piece=SPECIAL_PIECES[PAD_ID],
            unk_piece=SPECIAL_PIECES[UNK_ID],
            control_symbols=list(SPECIAL_PIECES[CLS_ID:]),
            # Sampling is done above; SentencePiece must take every sentence, unshuffled.
            input_sentence_size=0,
            shuffle_input_sentence=False,
            hard_vocab_limit=True,
            num_threads=TRAIN_THREADS,
            minloglevel=2,
        )
    except RuntimeError as e:
        match = _MAX_VOCAB_RE.search(str(e))
        if match:
            raise DataError(
                f"data.vocab_size={vocab_size} is too large for this corpus ({len(sample)} "
                f"sentences); it supports at most {match.group(1)}: lower data.vocab_size or "
                "add text"
            ) from None
        message = " ".join(str(e).split())
        raise DataError(
            f"SentencePiece training with data.vocab_size={vocab_size} failed on "
            f"{len(sample)} sentences: {message}"
        ) from None
    Tokenizer(proto, os.path.join(out_dir, MODEL_FILENAME)).save(out_dir)
    if log is not None:
        log(
            f"trained in {time.monotonic() - started:.1f}s: {os.path.join(out_dir, MODEL_FILENAME)}"
        )
    return Tokenizer.load(os.path.join(out_dir, MODEL_FILENAME))


# SentencePiece's trainer is one C++ call that returns to Python only when training is done, so
# Python cannot raise KeyboardInterrupt during it: a Ctrl-C would wait for the whole training
# (minutes for a large vocabulary). Training in a child interpreter keeps this process free to
# take the interrupt and end the child at once. The child ignores SIGINT: a Ctrl-C at a terminal
# reaches both, and this process decides.
_TRAIN_IN_CHILD = """\
import io, pickle, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
import sentencepiece as spm
sentences, options = pickle.load(sys.stdin.buffer)
writer = io.BytesIO()
try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=writer, **options
    )
except RuntimeError as e:
    sys.stderr.write(str(e))
    sys.exit(3)
sys.stdout.buffer.write(writer.getvalue())
"""
_TRAIN_ERROR_STATUS = 3


def _train_model(sample: list[str], **options) -> bytes:
    """SentencePiece training of ``sample`` with ``options``, in a child process.

    Returns:
      the serialized model proto.

    Raises:
      RuntimeError: SentencePiece's error (its message), or the child failed.
      KeyboardInterrupt: at once; the child is ended first.
    """
    payload = pickle.dumps((sample, options), protocol=pickle.HIGHEST_PROTOCOL)
    # -P: the current directory is not put on the child's path (a stray pickle.py there).
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    try:
        if not sys.executable:
            raise OSError("no interpreter to start")
        proc = subprocess.Popen(
            [sys.executable, *safe_path, "-c", _TRAIN_IN_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError:  # An embedded interpreter, or no process to spare: train here.
        writer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=writer, **options
        )
        return writer.getvalue()
    try:
        model, err = proc.communicate(payload)
    finally:
        if proc.returncode is None:  # Interrupted (or failed) while the child trains.
            proc.kill()
            proc.wait()
    if proc.returncode == _TRAIN_ERROR_STATUS:
        raise RuntimeError(err.decode("utf-8", errors="replace"))
    if proc.returncode != 0:
        lines = err.decode("utf-8", errors="replace").strip().splitlines()
        how = (
            f"was killed by {signal.Signals(-proc.returncode).name}"
            if proc.returncode < 0
            else f"exited with status {proc.returncode}"
        )
        raise RuntimeError(f"the training process {how}" + (f": {lines[-1]}" if lines else ""))
    return model


def has_saved(tokenizer_dir: str) -> bool:
    """Whether ``tokenizer_dir`` holds a run's tokenizer (``spm.model`` or a ``vocab.txt``)."""
    return paths.exists(os.path.join(tokenizer_dir, MODEL_FILENAME)) or paths.exists(
        os.path.join(tokenizer_dir, wordpiece.VOCAB_FILENAME)
    )


def describe(tok) -> str:
    """A tokenizer in a few words, enough to tell two apart in one line: its kind, its size and
    the start of its fingerprint ('SentencePiece, 300 pieces, sha256 eb7e59d2e592')."""
    kind = "SentencePiece" if isinstance(tok, Tokenizer) else "WordPiece vocab.txt"
    return f"{kind}, {tok.vocab_size:,} pieces, sha256 {tok.fingerprint[:12]}"


def load_saved(tokenizer_dir: str):
    """A run's tokenizer from its folder: ``spm.model`` (ours), else a BERT ``vocab.txt`` (a run
    continued from a WordPiece checkpoint such as Google's; `wordpiece.WordPieceTokenizer`, with
    this class's interface).

    The folder's ``spm.model`` is the run's own (its checkpoints' ids mean its pieces), so a file
    that does not load, or whose pieces differ from the ``spm.vocab`` written beside it, is
    reported as damaged, with how to recover, not as a data.tokenizer to change.

    Raises:
      DataError: neither file is there or readable, or spm.model is damaged.
    """
    if not paths.exists(os.path.join(tokenizer_dir, MODEL_FILENAME)) and paths.exists(
        os.path.join(tokenizer_dir, wordpiece.VOCAB_FILENAME)
    ):
        return wordpiece.WordPieceTokenizer.load(tokenizer_dir)
    model_path = os.path.join(tokenizer_dir, MODEL_FILENAME)
    recover = (
        "the run's checkpoints depend on it: restore it from a copy, or, if the run has no "
        f"checkpoints yet, delete {tokenizer_dir} so that the next run trains a new one"
    )
    try:
        with paths.remote_errors(model_path, "data.tokenizer", DataError):
            proto = paths.read_bytes(model_path)
    except OSError as e:
        raise DataError(
            f"the run's tokenizer {model_path} cannot be read ({e.strerror or e}); {recover}"
        ) from None
    try:
        if not proto:
            raise DataError("empty")
        tok = Tokenizer(proto, model_path)
        damage = _vocab_mismatch(tok, os.path.join(tokenizer_dir, VOCAB_FILENAME))
    except RuntimeError:  # SentencePiece's parse error.
        damage = "not a SentencePiece model"
    except DataError:  # Empty, or ids 0-4 are not the special pieces this package writes.
        damage = "the file is empty" if not proto else "ids 0-4 are not the special pieces"
    if damage:
        raise DataError(f"the run's tokenizer {model_path} is damaged ({damage}); {recover}")
    return tok


def _vocab_mismatch(tok: Tokenizer, vocab_path: str) -> str:
    """Why ``tok`` differs from the ``spm.vocab`` file saved with it ('' if it does not, or if
    there is no such file to compare with): a model cut short can still parse, with fewer
    pieces."""
    try:
        text = paths.read_text(vocab_path)
    except (OSError, UnicodeDecodeError):
        return ""
    if text == _vocab_text(tok.model_proto):
        return ""
    # Compared piece by piece, so that a file written with other score formatting still agrees.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) != tok.vocab_size:
        return f"{tok.vocab_size} pieces, but {VOCAB_FILENAME} beside it lists {len(lines)}"
    for i, line in enumerate(lines):
        if line.rsplit("\t", 1)[0] != tok.id_to_piece(i):
            return f"piece {i} differs from {VOCAB_FILENAME} beside it"
    return ""
