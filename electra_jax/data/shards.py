"""Prepare a corpus once: tokenizer (trained or loaded), then packed ArrayRecord shards.

Prepared data lives in ``cache_dir/<key>/`` where the key hashes everything the rows depend on
(source content, tokenizer, seq_length, seed, packing probabilities), so a second run with the same
inputs reuses it without re-tokenizing, and any change lands in a new directory. A directory is
built under a temporary name and renamed into place only when complete: a ``manifest.json``
inside ``cache_dir/<key>/`` therefore means the shards are complete.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from electra_jax.data import mixture, progress, sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data.packing import SentenceEnds, iter_packed
from electra_jax.errors import DataError
from electra_jax.store import filenames, jsonio, paths

MANIFEST = "manifest.json"
# Bumped when the row format or packing changes, so old caches are not reused (v2: the rest of a
# sentence that does not fit an example is carried into the next ones instead of dropped).
_FORMAT = "electra_jax-prepared-v2"
# Rows are little-endian int32 whatever the machine, so shards are portable between hosts.
ROW_DTYPE = np.dtype("<i4")
# Sentences per encode_batch call (and per task sent to a worker): large enough to keep
# SentencePiece's thread pool busy and amortize the transfer, small enough to stream a corpus of
# any size; the character cap bounds a chunk of very long sentences.
_ENCODE_CHUNK_SENTENCES = 8192
_ENCODE_CHUNK_CHARS = 4 << 20
# Chunks queued per worker: enough to keep workers busy while the parent packs, few enough that
# memory stays bounded whatever the corpus size.
_CHUNKS_IN_FLIGHT_PER_WORKER = 2
# Input bytes per tokenizing worker when the count is chosen for the host (auto_num_workers). A
# worker costs about a second to start (a fresh interpreter importing numpy and SentencePiece) and
# the parent's in-order packing bounds what workers gain, while one process already encodes on
# SentencePiece's thread per core: on a small corpus it is faster (benchmarks/notes/
# input_pipeline.md: 10 MB on 2 cores, 1.4 s in one process, 3.1 s with two workers).
_BYTES_PER_WORKER = 32 << 20
# Tokenizer training reads at most this many times data.tokenizer_sample_sentences sentences and
# samples uniformly among them: a spread-out sample without reading a huge corpus twice.
_TOKENIZER_SCAN_FACTOR = 10
# Separate random streams for the tokenizer sample and the packing coins under one seed.
_TOKENIZER_STREAM, _PACKING_STREAM = 1, 2


@dataclasses.dataclass
class PreparedData:
    """A complete prepared-data directory.

    directory: ``cache_dir/<key[:16]>``.
    shard_paths: absolute paths of the ArrayRecord shards, in order; each record is the raw
      little-endian bytes of one int32 [2, seq_length] row (input ids, segment ids), C order.
    num_examples: rows over all shards.
    seq_length: row length.
    manifest: the parsed manifest.json (source, statistics, shard names, ...).
    pad_id: the [PAD] id of the tokenizer the rows were made with (its fingerprint is part of the
      key), which pads them: the input mask is taken from it, never assumed to be 0.
    """

    directory: str
    shard_paths: list[str]
    num_examples: int
    seq_length: int
    manifest: dict
    pad_id: int


def _stream_seed(seed: int, stream: int, *more: int) -> np.random.Generator:
    # SeedSequence needs non-negative entropy; masking keeps negative seeds usable and distinct.
    # `more` parts the stream further (data.mixture's part index).
    return np.random.default_rng([seed & (2**64 - 1), stream, *more])


def _require_local(directory: str, field: str) -> None:
    """DataError for a remote directory we cannot write into: gs:// is written directly (the
    shards are built in a local temporary folder, then uploaded with the manifest last, whose
    presence means complete, as the rename does locally); other URIs are refused."""
    why = paths.unwritable(directory)
    if why:
        raise DataError(f"{field} {directory} {why}")


def ensure_tokenizer(data_cfg, tokenizer_dir: str, seed: int) -> tokenizer_lib.Tokenizer:
    """Returns the run's tokenizer, making sure ``tokenizer_dir/spm.model`` holds it.

    Order: ``data_cfg.tokenizer`` if set (copied into tokenizer_dir so the workdir is
    self-contained); else an existing ``tokenizer_dir/spm.model`` (a resumed run); else a new model
    trained on a sample of the source's sentences (``data_cfg.tokenizer_sample_sentences`` drawn
    uniformly with ``seed`` from the first 10x that many).

    Args:
      data_cfg: the ``data`` config section (source, tokenizer, vocab_size,
        tokenizer_sample_sentences, character_coverage).
      tokenizer_dir: e.g. ``<workdir>/tokenizer``.
      seed: fixes the training sample.

    Raises:
      DataError: data.tokenizer missing or unreadable; a tokenizer_dir model that is damaged
        (the message says how to recover) or differs from data.tokenizer; vocab size different
        from data.vocab_size; training failures; tokenizer_dir not writable or its disk full.
      KeyboardInterrupt: promptly, also while SentencePiece trains; nothing is left half
        written (the model is written to a temporary directory and renamed into place).
    """
    _require_local(tokenizer_dir, "the tokenizer directory (in --workdir)")
    model_path = os.path.join(tokenizer_dir, tokenizer_lib.MODEL_FILENAME)
    if data_cfg.tokenizer:
        given = tokenizer_lib.Tokenizer.load(data_cfg.tokenizer)
        if paths.exists(model_path):
            # The run's own copy: a damaged one is reported as such, not as data.tokenizer's.
            existing = tokenizer_lib.load_saved(tokenizer_dir)
            if existing.fingerprint != given.fingerprint:
                raise DataError(
                    f"{model_path} differs from data.tokenizer={data_cfg.tokenizer}; a run keeps "
                    "its tokenizer: use a new workdir, or unset data.tokenizer to resume"
                )
        else:
            given.save(tokenizer_dir)
        tok = tokenizer_lib.load_saved(tokenizer_dir)
    elif tokenizer_lib.has_saved(tokenizer_dir):
        tok = tokenizer_lib.load_saved(tokenizer_dir)
    else:
        n = int(data_cfg.tokenizer_sample_sentences)
        # The phase is named after the folder it fills (WORKDIR/tokenizer).
        report = progress.Progress(filenames.TOKENIZER_DIR)
        mix = mixture.of_config(data_cfg)
        if mix is None:
            stats = sources.SourceStats()
            docs = sources.from_config(data_cfg).documents(stats)
            sentences = _reported_sentences(docs, stats, report, _TOKENIZER_SCAN_FACTOR * n)
            sentences = itertools.islice(sentences, _TOKENIZER_SCAN_FACTOR * n)
        else:
            sentences = weighted_sample(data_cfg, mix, n, seed, report)
            n = max(1, len(sentences))  # the sample is drawn: SentencePiece takes all of it
        tok = tokenizer_lib.train_tokenizer(
            sentences,
            tokenizer_dir,
            vocab_size=int(data_cfg.vocab_size),
            character_coverage=float(data_cfg.character_coverage),
            seed=int(_stream_seed(seed, _TOKENIZER_STREAM).integers(2**63)),
            sample_sentences=n,
            log=report.line,
        )
    if tok.vocab_size != data_cfg.vocab_size:
        raise DataError(
            f"tokenizer {tok.model_path} has {tok.vocab_size} pieces but data.vocab_size="
            f"{data_cfg.vocab_size}; set data.vocab_size={tok.vocab_size} or use another tokenizer"
        )
    return tok


def weighted_sample(
    data_cfg, mix: mixture.Mixture, n: int, seed: int, report: progress.Progress | None = None
) -> list[str]:
    """The tokenizer's sample of a mixture: of `n` sentences, each part's share by weight
    (mixture.counts), drawn uniformly from the first 10x that many of its sentences with the
    seed's tokenizer stream for that part, parts in the spec's order. A part with fewer
    sentences gives all it has. So the pieces are learnt from the blend the run trains on,
    not from whichever corpus is largest."""
    report = report or progress.Progress(filenames.TOKENIZER_DIR)
    options = sources.SourceOptions.from_config(data_cfg)
    sample: list[str] = []
    for i, (part, k) in enumerate(zip(mix.parts, mixture.counts(n, mix.proportions), strict=True)):
        if k == 0:
            continue
        stats = sources.SourceStats()
        try:
            docs = sources.parse(part.source, options).documents(stats)
            cap = _TOKENIZER_SCAN_FACTOR * k
            read = itertools.islice(_reported_sentences(docs, stats, report, cap), cap)
            rng = _stream_seed(seed, _TOKENIZER_STREAM, i)
            sample += tokenizer_lib.reservoir_sample(read, k, rng)
        except DataError as e:
            raise mixture.in_part(part.name, e) from None
    return sample


def _reported_sentences(
    docs: Iterable[list[str]], stats: sources.SourceStats, report: progress.Progress, cap: int
) -> Iterator[str]:
    """The sentences of ``docs``, with a progress line now and then while the tokenizer's sample
    is drawn from the first ``cap`` of them."""
    read = 0

    def status() -> str:
        # Sampling ends at the cap or at the end of the input, whichever comes first.
        return f"sampling sentences: {_files_read(stats)}{read:,} read (of at most {cap:,})" + (
            progress.share_and_eta(
                stats.bytes_read(), stats.bytes_total, report.elapsed(), at_least=read / cap
            )
        )

    for doc in docs:
        for sentence in doc:
            read += 1
            yield sentence
        report.maybe(status)


def _files_read(stats: sources.SourceStats) -> str:
    """'3 of 12 files, ' (text sources), '1,234 examples, ' (TFDS), or '' (builtin)."""
    if stats.files_total is not None:
        return f"{stats.files + len(stats.skipped):,} of {stats.files_total:,} files, "
    return f"{stats.files:,} examples, " if stats.files else ""


def _key_fields(
    data_cfg,
    source: sources.Source,
    tokenizer: tokenizer_lib.Tokenizer,
    seed: int,
    fingerprint: str | None = None,
) -> dict:
    """The key fields; `fingerprint` stands for the source's content key (not read then)."""
    # Shard size is left out: the loader reads all shards as one sequence, so it does not change
    # what training sees.
    return {
        "format": _FORMAT,
        "source": source.name,
        "source_fingerprint": source.fingerprint() if fingerprint is None else fingerprint,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "seq_length": int(data_cfg.seq_length),
        "seed": int(seed),
        "single_segment_prob": float(data_cfg.single_segment_prob),
        "short_seq_prob": float(data_cfg.short_seq_prob),
    }


def _hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()


def key_fields(data_cfg, tokenizer: tokenizer_lib.Tokenizer, seed: int) -> dict:
    """Everything the prepared rows depend on (source content key, tokenizer, seq_length, seed,
    packing probabilities, row format), found without reading the corpus: what a resume
    compares with the run's start (resume.py) before any data is prepared.

    For data.mixture, the blend's: `mixture` (the spec: its parts and weights) and
    `mixture_fingerprint` (the parts' sources and content keys) in place of `source` and
    `source_fingerprint`, so that a resume names data.mixture as what changed."""
    mix = mixture.of_config(data_cfg)
    if mix is None:
        return _key_fields(data_cfg, sources.from_config(data_cfg), tokenizer, seed)
    parts = [(part, _part_fields(data_cfg, part, tokenizer, seed)) for part in mix.parts]
    fields = dict(parts[0][1])
    del fields["source"], fields["source_fingerprint"]
    content = [[part.source, f["source_fingerprint"]] for part, f in parts]
    fields["mixture"] = str(data_cfg.mixture)
    fields["mixture_fingerprint"] = _hash({"parts": content})
    return fields


def _part_fields(data_cfg, part: mixture.Part, tokenizer, seed: int) -> dict:
    """key_fields of one part of data.mixture: those of its source read alone."""
    try:
        return key_fields(mixture.part_config(data_cfg, part), tokenizer, seed)
    except DataError as e:
        raise mixture.in_part(part.name, e) from None


def mixture_record(data_cfg, tokenizer: tokenizer_lib.Tokenizer, seed: int) -> dict:
    """What a run's data record (resume.py) adds for data.mixture, {} without one:
    {"mixture": [{name, source, weight, fields}, ...]}, each part's key_fields, whose hash
    names the folder of its shards (CACHE/<key[:16]>/)."""
    mix = mixture.of_config(data_cfg)
    if mix is None:
        return {}
    return {
        "mixture": [
            {
                "name": part.name,
                "source": part.source,
                "weight": part.weight,
                "fields": _part_fields(data_cfg, part, tokenizer, seed),
            }
            for part in mix.parts
        ]
    }


def recorded(
    data_cfg,
    tokenizer: tokenizer_lib.Tokenizer,
    cache_dir: str,
    seed: int,
    fields: dict,
    min_examples: int = 1,
) -> PreparedData:
    """The prepared directory under `cache_dir` of the rows that `fields` describe (key_fields
    as recorded when they were prepared: a run's data record), found without reading
    data.source: for a corpus that is gone. Proven to be those rows as a reuse is, and more:
    the config's other key fields (tokenizer, seq_length, seed, ...) are the recorded ones,
    the directory is named after the fields' key, its manifest records that key and those
    fields, and every shard it names is there with the manifest's number of records.

    Raises:
      DataError: saying which of these fails (one line; the caller says what to do).
    """
    source = sources.from_config(data_cfg)
    content = fields.get("source_fingerprint")
    if not isinstance(content, str):
        raise DataError("the record holds no content key of the corpus")
    now = _key_fields(data_cfg, source, tokenizer, seed, fingerprint=content)
    differ = sorted(k for k in set(now) | set(fields) if now.get(k) != fields.get(k))
    if differ:
        verb = "differs" if len(differ) == 1 else "differ"
        raise DataError(f"the record's {', '.join(differ)} {verb} from this run's")
    key = _hash(fields)
    target = paths.join(paths.absolute(cache_dir), key[:16])
    if not paths.isfile(paths.join(target, MANIFEST)):
        raise DataError(f"{target} holds no complete prepared data (no {MANIFEST})")
    try:
        prepared = _reuse(target, data_cfg, key, min_examples, tokenizer.pad_id)
    except DataError as e:  # its way out, preparing the data again, needs the corpus
        raise DataError(str(e).split("; delete ", 1)[0]) from None
    manifest = prepared.manifest
    if manifest.get("key") != key or any(manifest.get(k) != v for k, v in fields.items()):
        raise DataError(f"{paths.join(target, MANIFEST)} records other rows than the record")
    return prepared


def content_key(data_cfg, tokenizer: tokenizer_lib.Tokenizer, seed: int) -> str:
    """Hex sha256 of everything the prepared rows depend on: source content, tokenizer,
    seq_length, seed and packing probabilities."""
    return _hash(key_fields(data_cfg, tokenizer, seed))


def _document_chunks(docs: Iterable[list[str]]) -> Iterator[list[list[str]]]:
    """Consecutive runs of whole documents, ~_ENCODE_CHUNK_SENTENCES sentences each."""
    chunk: list[list[str]] = []
    sentences = chars = 0
    for doc in docs:
        chunk.append(doc)
        sentences += len(doc)
        chars += sum(len(s) for s in doc)
        if sentences >= _ENCODE_CHUNK_SENTENCES or chars >= _ENCODE_CHUNK_CHARS:
            yield chunk
            chunk, sentences, chars = [], 0, 0
    if chunk:
        yield chunk


def _split_chunk(chunk: list[list[str]], ids: list[list[int]]) -> list[list[list[int]]]:
    out, start = [], 0
    for doc in chunk:
        out.append(ids[start : start + len(doc)])
        start += len(doc)
    return out


_worker_tokenizer: tokenizer_lib.Tokenizer | None = None


def _init_worker(model_proto: bytes) -> None:
    global _worker_tokenizer
    # Ctrl-C reaches the whole process group: the parent stops the pool and says so in one line;
    # the workers stay quiet rather than each printing a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = tokenizer_lib.Tokenizer(model_proto, "<worker>")


def _encode_in_worker(chunk: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Encodes a chunk in a worker process.

    Returns:
      (int32 [total_tokens] ids of all sentences concatenated, int64 [num_sentences] lengths):
      two flat arrays pickle far faster than a list of lists of ints.
    """
    sentences = [s for doc in chunk for s in doc]
    # One thread per worker: the processes are the parallelism.
    ids = _worker_tokenizer.encode_batch(sentences, num_threads=1)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def _unflatten(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    values = flat.tolist()
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    return [values[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]


def _tokenized_documents(
    docs: Iterable[list[str]], tokenizer: tokenizer_lib.Tokenizer, num_workers: int = 1
) -> Iterator[list[list[int]]]:
    """Encodes documents in chunks, in order, on num_workers processes (1: in this process).

    The output is the same for any num_workers: chunks are consecutive runs of documents and come
    back in submission order, so the packing that follows (with its seeded coins) sees the same
    sequence of documents.
    """
    chunks = _document_chunks(docs)
    if num_workers <= 1:
        for chunk in chunks:
            yield from _split_chunk(chunk, tokenizer.encode_batch([s for d in chunk for s in d]))
        return
    # spawn, not fork: the parent may have started JAX's or Grain's threads, which fork would copy
    # in whatever state they are in.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(tokenizer.model_proto,)) as pool:
        # Bounded submission (Pool.imap would read the whole corpus ahead into its task queue).
        pending: collections.deque = collections.deque()
        limit = _CHUNKS_IN_FLIGHT_PER_WORKER * num_workers
        for chunk in chunks:
            pending.append((chunk, pool.apply_async(_encode_in_worker, (chunk,))))
            if len(pending) >= limit:
                done, result = pending.popleft()
                yield from _split_chunk(done, _unflatten(*result.get()))
        while pending:
            done, result = pending.popleft()
            yield from _split_chunk(done, _unflatten(*result.get()))


def auto_num_workers(source: str | sources.Source, cpus: int | None = None) -> int:
    """Tokenizing processes for ``source`` on this host: one per ``_BYTES_PER_WORKER`` of input,
    at most one per core (``cpus``, default ``os.cpu_count()``), at least one.

    ``builtin`` (a few MB) gets one; sources of unknown size (TFDS, remote globs), usually large,
    one per core. The shards are the same bytes for any count (``_tokenized_documents``).

    Raises:
      DataError: a bad source or a glob that matches no file (as reading it would).
    """
    cpus = max(1, cpus or os.cpu_count() or 1)
    source = sources.parse(source)
    if source.kind == "builtin":
        return 1
    size = source.input_bytes()
    if size is None:
        return cpus
    return max(1, min(cpus, size // _BYTES_PER_WORKER))


def _tmp_prefix(key16: str) -> str:
    return f".{key16}.tmp-{socket.gethostname()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Someone else's live process.
    return True


def _clean_stale_tmp_dirs(cache_dir: str, key16: str) -> None:
    """Removes this key's temp dirs left by killed runs on this host.

    Only dirs named with this host and a pid that no longer runs are removed: a temp dir of a
    live prepare (here or on another host sharing the cache) is left alone, and so is the complete
    directory, whose name has no ``.tmp-`` part.
    """
    prefix = _tmp_prefix(key16)
    for name in os.listdir(cache_dir):
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if not (pid_text.isascii() and pid_text.isdigit()):  # '²' is a digit to isdigit()
            continue
        if int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            shutil.rmtree(os.path.join(cache_dir, name), ignore_errors=True)


def _rebuild(directory: str, problem: str) -> DataError:
    """A DataError for prepared data that cannot be used as it is: ``problem``, then the fix."""
    return DataError(f"{problem}; delete {directory} so that the next run prepares it again")


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_shard_name(name: object) -> bool:
    """A plain file name (as the writer makes: ``shard-00000.array_record``): no separator, no
    parent reference, nothing absolute, so that a manifest cannot point outside its folder."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not set(name) & {"/", "\\", os.sep, os.altsep or "/"}
        and name.isprintable()
    )


def _read_manifest(directory: str) -> dict:
    """The manifest of a prepared directory, checked for the fields the loader uses.

    Raises:
      DataError: unreadable, not JSON, not an object, or ``shards``, ``examples``,
        ``seq_length``, ``shard_examples`` missing, of the wrong type, or not adding up.
    """
    path = paths.join(directory, MANIFEST)
    try:
        manifest = jsonio.loads(paths.read_bytes(path))
    except OSError as e:
        raise _rebuild(directory, f"{path} cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, nested too deep
        reason = " ".join(str(e).split())
        raise _rebuild(directory, f"{path} is damaged: not JSON ({reason})") from None
    if not isinstance(manifest, dict):
        raise _rebuild(directory, f"{path} is damaged: not a JSON object")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not shards:
        raise _rebuild(directory, f"{path} is damaged: 'shards' is not a list of file names")
    for name in shards:
        if not _is_shard_name(name):
            raise _rebuild(
                directory,
                f"{path} names shard {name!r}, which is not a file name inside {directory}",
            )
    for field in ("examples", "seq_length"):
        if not _is_count(manifest.get(field), 1):
            raise _rebuild(directory, f"{path} is damaged: '{field}' is not a positive integer")
    counts = manifest.get("shard_examples")
    if (
        not isinstance(counts, list)
        or len(counts) != len(shards)
        or not all(_is_count(n, 0) for n in counts)
    ):
        raise _rebuild(
            directory,
            f"{path} is damaged: 'shard_examples' is not a list of {len(shards)} counts, one "
            "per shard",
        )
    if sum(counts) != manifest["examples"]:
        raise _rebuild(
            directory,
            f"{path} is damaged: 'shard_examples' add up to {sum(counts)}, but 'examples' is "
            f"{manifest['examples']}",
        )
    return manifest


def _check_shard(directory: str, path: str, expected: int) -> None:
    """Opens a shard's reader (its index only, no records) and compares its record count with
    the manifest's: a file cut short or overwritten fails here, before training starts, rather
    than in a read thread mid-run."""
    # array_record: only on the path that uses it (an optional extra, or slow to import).
    from array_record.python.array_record_module import ArrayRecordReader

    try:
        reader = ArrayRecordReader(path, options="readahead_buffer_size:0")
    except Exception as e:  # The reader's own errors (RuntimeError, ValueError, OSError).
        reason = " ".join(str(e).split())
        raise _rebuild(directory, f"prepared shard {path} cannot be opened ({reason})") from None
    found = reader.num_records() if reader.ok() else None
    with contextlib.suppress(Exception):  # A reader that failed to open fails to close, too.
        reader.close()
    if found != expected:
        holds = "no readable index" if found is None else f"{found} records"
        raise _rebuild(
            directory,
            f"prepared shard {path} is damaged: it holds {holds}, its manifest says {expected}",
        )


def _load(directory: str, pad_id: int) -> PreparedData:
    """A complete prepared directory, checked: its manifest (see ``_read_manifest``) and each
    shard named there (present, readable, holding the manifest's number of records). `pad_id`:
    the [PAD] id of the tokenizer that made it.

    Raises:
      DataError: naming the manifest or shard at fault and the directory to delete.
    """
    manifest = _read_manifest(directory)
    shard_paths = [paths.join(directory, name) for name in manifest["shards"]]
    for path in shard_paths:
        if not paths.isfile(path):
            raise DataError(
                f"prepared data in {directory} is missing {os.path.basename(path)}; delete "
                f"{directory} to prepare it again"
            )
    for path, expected in zip(shard_paths, manifest["shard_examples"], strict=True):
        _check_shard(directory, path, expected)
    return PreparedData(
        directory=directory,
        shard_paths=shard_paths,
        num_examples=manifest["examples"],
        seq_length=manifest["seq_length"],
        manifest=manifest,
        pad_id=int(pad_id),
    )


def _write_shards(
    data_cfg,
    source: sources.Source,
    tokenizer: tokenizer_lib.Tokenizer,
    out_dir: str,
    seed: int,
    num_workers: int = 1,
    min_examples: int = 1,
) -> dict[str, object]:
    """Tokenizes, packs and writes shards into out_dir; returns the manifest's statistics."""
    seq_length = int(data_cfg.seq_length)
    per_shard = int(data_cfg.examples_per_shard)
    if per_shard <= 0:
        raise DataError(f"data.examples_per_shard={per_shard} must be positive")
    source_stats = sources.SourceStats()
    docs = source.documents(source_stats)
    tokens_read = documents = 0

    def counted(token_docs: Iterable[list[list[int]]]) -> Iterator[list[list[int]]]:
        nonlocal tokens_read, documents
        for doc in token_docs:
            tokens_read += sum(map(len, doc))
            documents += 1
            yield doc

    report = progress.Progress("packing")

    def status(final: bool = False) -> str:
        seconds = report.elapsed()
        text = (
            f"{_files_read(source_stats)}{documents:,} documents, "
            f"{progress.count(tokens_read)} tokens ({progress.count(tokens_read / seconds)} "
            f"tokens/s), {count:,} examples written"
        )
        if final:
            return text
        bytes_read = source_stats.bytes_read()
        return text + progress.share_and_eta(bytes_read, source_stats.bytes_total, seconds)

    examples = iter_packed(
        counted(_tokenized_documents(docs, tokenizer, num_workers)),
        seq_length,
        _stream_seed(seed, _PACKING_STREAM),
        float(data_cfg.single_segment_prob),
        float(data_cfg.short_seq_prob),
        tokenizer.cls_id,
        tokenizer.sep_id,
        tokenizer.pad_id,
        SentenceEnds.from_tokenizer(tokenizer),
    )
    shards: list[str] = []
    shard_examples: list[int] = []
    count = tokens = kept = single = forced_single = short = 0
    writer = None
    try:
        for example in examples:
            if writer is None or shard_examples[-1] == per_shard:
                if writer is not None:
                    writer.close()
                shards.append(f"shard-{len(shards):05d}.array_record")
                shard_examples.append(0)
                # group_size:1 = one record per chunk: fastest random access for a global shuffle.
                writer = ArrayRecordWriter(os.path.join(out_dir, shards[-1]), "group_size:1")
            row = example.row
            writer.write(np.ascontiguousarray(row, dtype=ROW_DTYPE).tobytes())
            shard_examples[-1] += 1
            count += 1
            # [CLS] and one [SEP], a second [SEP] after a segment B: the row's real tokens.
            two_segments = example.has_second_segment
            kept += example.content_tokens
            tokens += example.content_tokens + 2 + two_segments
            single += not two_segments
            forced_single += int(example.forced_single_segment)
            short += int(example.target_length < seq_length)
            report.maybe(status)
    finally:
        if writer is not None:
            writer.close()
    if count == 0:
        raise DataError(
            f"data.source '{data_cfg.source}' produced no examples (no non-empty lines); "
            "check the files it names"
        )
    if count < min_examples:
        raise DataError(
            f"data.source '{data_cfg.source}' gave {count} examples of {seq_length} tokens, "
            f"fewer than one batch (train.batch_size={min_examples}); add text or lower "
            "train.batch_size / data.seq_length"
        )
    workers = f"{num_workers} worker processes" if num_workers > 1 else "one process"
    report.line(f"done in {report.elapsed():.1f}s on {workers}: {status(final=True)}")
    return {
        "files_read": source_stats.files,  # TFDS: examples read
        "bytes_replaced": source_stats.bytes_replaced,
        "files_skipped": source_stats.skipped,
        "examples": count,
        "tokens": tokens,
        # Tokens the tokenizer produced for the source, and those written into rows ([CLS] and
        # [SEP] not counted): packing drops nothing, so the two are equal.
        "tokens_read": tokens_read,
        "tokens_kept": kept,
        "real_token_fraction": tokens / (count * seq_length),
        "single_segment_fraction": single / count,
        "forced_single_segment_fraction": forced_single / count,
        "short_fraction": short / count,
        "shards": shards,
        "shard_examples": shard_examples,
    }


def prepare(
    data_cfg,
    tokenizer: tokenizer_lib.Tokenizer,
    cache_dir: str,
    seed: int,
    *,
    num_workers: int | None = 1,
    min_examples: int = 1,
) -> PreparedData:
    """Tokenizes and packs ``data_cfg.source`` into ArrayRecord shards, or reuses a cached copy.

    Args:
      data_cfg: the ``data`` config section (source, seq_length, single_segment_prob,
        short_seq_prob, examples_per_shard).
      tokenizer: from ``ensure_tokenizer``.
      cache_dir: parent of the prepared directories (created if missing).
      seed: fixes the packing coins.
      num_workers: processes that tokenize (1: this process; None: ``auto_num_workers``, as many
        as the corpus's size warrants on this host); the shards are the same bytes for any
        number, so it is not part of the key.
      min_examples: fewer examples than this (e.g. one global batch) is an error, raised before
        anything is renamed into place.

    Returns:
      PreparedData for ``cache_dir/<key[:16]>``. Rows are in corpus order: the loader shuffles.

    Raises:
      DataError: bad source, or a source that yields no examples; a cache_dir that is a file or
        cannot be created; a full disk or an unwritable cache_dir (the temporary directory is
        removed, other prepared data is left as it was); cached data whose manifest or shards
        are damaged (the message names the file and the directory to delete).
      KeyboardInterrupt: the temporary directory is removed first. A prepare killed outright
        leaves only a ``.<key>.tmp-*`` directory, which later runs never mistake for data and
        remove once its process is gone.
    """
    if not cache_dir:
        raise DataError("no cache directory for prepared data; set data.cache_dir")
    _require_local(cache_dir, "data.cache_dir")
    # Parsed once, and asked for its content key, its size and its documents below.
    source = sources.from_config(data_cfg)
    # Computed once: the manifest records exactly the fingerprint the directory is named after.
    fields = _key_fields(data_cfg, source, tokenizer, seed)
    key = _hash(fields)
    key16 = key[:16]
    if paths.is_remote(cache_dir):
        return _prepare_remote(
            data_cfg, tokenizer, cache_dir, seed, fields, num_workers, min_examples
        )
    target = os.path.join(os.path.abspath(cache_dir), key16)
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise DataError(
            f"data.cache_dir {cache_dir} is a file, not a directory; set data.cache_dir to a "
            "directory (by default prepared data goes to --workdir/data)"
        )
    if os.path.isfile(os.path.join(target, MANIFEST)):
        return _reuse(target, data_cfg, key, min_examples, tokenizer.pad_id)

    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        raise DataError(
            f"data.cache_dir {cache_dir} cannot be created ({e.strerror or e}); set "
            "data.cache_dir to a directory this user can create or write (by default prepared "
            "data goes to --workdir/data)"
        ) from None
    tmp = None
    try:
        _clean_stale_tmp_dirs(os.path.dirname(target), key16)
        tmp = tempfile.mkdtemp(
            prefix=f"{_tmp_prefix(key16)}{os.getpid()}-", dir=os.path.dirname(target)
        )
        # mkdtemp makes the directory private (0700); prepared data is shared with other hosts'
        # and users' runs reading the same cache.
        os.chmod(tmp, 0o755)
        if num_workers is None:
            num_workers = auto_num_workers(source)
        stats = _write_shards(data_cfg, source, tokenizer, tmp, seed, num_workers, min_examples)
        manifest = {
            **fields,
            "key": key,
            "vocab_size": tokenizer.vocab_size,
            "row_format": "int32 little-endian [2, seq_length]: input_ids, segment_ids",
            **stats,
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if os.path.isdir(target) and not os.path.isfile(os.path.join(target, MANIFEST)):
            # Not made by a rename of ours (those always hold a manifest): incomplete, replace it.
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError as e:
            # Another process finished the same key first; its copy is complete and identical.
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not os.path.isfile(
                os.path.join(target, MANIFEST)
            ):
                raise
    except (OSError, RuntimeError) as e:
        raise _write_error_of(e, os.path.dirname(target)) from None
    finally:
        # Also on KeyboardInterrupt: a half-written directory never outlives its prepare.
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return _load(target, tokenizer.pad_id)


@dataclasses.dataclass
class PreparedMixture:
    """The prepared data of data.mixture: each part's own PreparedData (its shards are those
    a run of its source alone prepares), in the spec's order.

    names: the parts' names (mixture.Part.name). parts: their PreparedData, of one seq_length
    and one tokenizer. proportions: mixture.Mixture.proportions, what the blend's order
    divides by (pipeline.py).
    """

    names: tuple[str, ...]
    parts: tuple[PreparedData, ...]
    proportions: tuple[int, ...]

    @property
    def seq_length(self) -> int:
        return self.parts[0].seq_length

    @property
    def pad_id(self) -> int:
        return self.parts[0].pad_id


def prepare_mixture(
    data_cfg,
    tokenizer: tokenizer_lib.Tokenizer,
    cache_dir: str,
    seed: int,
    *,
    num_workers: int | None = 1,
) -> PreparedMixture:
    """`prepare` of each part of data.mixture on its own (made, or reused by its content key:
    a part whose source is unchanged is never packed again, whatever the weights), into
    `cache_dir`. A part may be smaller than a batch: the blend repeats it.

    Raises:
      DataError: as `prepare`, the message naming the part (a part whose glob matches no file
        included: a mixture's parts have no stand-in shards).
    """
    mix = mixture.of_config(data_cfg)
    if mix is None:
        raise ValueError("prepare_mixture needs data.mixture")
    parts = []
    for part in mix.parts:
        try:
            parts.append(
                prepare(
                    mixture.part_config(data_cfg, part),
                    tokenizer,
                    cache_dir,
                    seed,
                    num_workers=num_workers,
                )
            )
        except DataError as e:
            raise mixture.in_part(part.name, e) from None
    return PreparedMixture(mix.names, tuple(parts), mix.proportions)


def _write_error_of(e: Exception, cache_dir: str) -> Exception:
    """The DataError for a failure to write prepared data into cache_dir, or `e` itself when it
    is something else (a read error of the source, a bug)."""
    error = _write_failure(e, cache_dir)
    if error is None:
        return e
    return tokenizer_lib.write_error(
        f"prepared data into {cache_dir}",
        cache_dir,
        error,
        elsewhere="set data.cache_dir to a directory elsewhere",
    )


def _reuse(target: str, data_cfg, key: str, min_examples: int, pad_id: int) -> PreparedData:
    """The complete prepared directory `target` (its manifest is there), checked."""
    prepared = _load(target, pad_id)
    seq_length = int(data_cfg.seq_length)
    if prepared.manifest.get("key", key) != key or prepared.seq_length != seq_length:
        raise _rebuild(
            target,
            f"{paths.join(target, MANIFEST)} is damaged: its key or seq_length is not those of "
            "the data it is named after",
        )
    if prepared.num_examples < min_examples:
        raise DataError(
            f"data.source '{data_cfg.source}' gave {prepared.num_examples} examples, fewer than "
            f"one batch (train.batch_size={min_examples}); add text or lower train.batch_size / "
            "data.seq_length"
        )
    return prepared


def _prepare_remote(
    data_cfg, tokenizer, cache_dir: str, seed: int, fields: dict, num_workers, min_examples: int
) -> PreparedData:
    """`prepare` for a gs:// cache_dir, so that every host reads the same shards without a
    shared filesystem: reused when its manifest.json is there; else built in a local temporary
    folder exactly as for a local cache, then uploaded shard by shard with manifest.json last
    (a bucket has no rename; the manifest's presence is what means complete). Two hosts building
    the same key upload the same bytes. The shards are read in place (ArrayRecord reads gs://)."""
    key = _hash(fields)
    target = paths.join(paths.absolute(cache_dir), key[:16])
    if paths.isfile(paths.join(target, MANIFEST)):
        return _reuse(target, data_cfg, key, min_examples, tokenizer.pad_id)
    with tempfile.TemporaryDirectory(prefix="electra_jax-prepare-") as local:
        local_cache = os.path.join(local, "cache")
        built = prepare(
            data_cfg,
            tokenizer,
            local_cache,
            seed,
            num_workers=num_workers,
            min_examples=min_examples,
        )
        try:
            paths.upload_dir(built.directory, target, last=MANIFEST)
        except OSError as e:
            raise _write_error_of(e, cache_dir) from None
    return _load(target, tokenizer.pad_id)


# Errors that can only come from writing (a full disk, a read-only file system), whatever file
# they name; others count as write errors when they name a file in the cache directory.
_WRITE_ONLY_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
_WRITE_ERRNOS = (*_WRITE_ONLY_ERRNOS, errno.EACCES, errno.EPERM)


def _write_failure(error: Exception, cache_dir: str) -> OSError | None:
    """The OSError behind a failure to write prepared data into cache_dir, or None when
    ``error`` is something else (a read error of the source, a bug).

    ArrayRecord's writer reports its file errors as RuntimeError whose message holds the
    system's error text and the file ("write() failed: No space left on device; writing ...").
    """
    if isinstance(error, OSError):
        if error.errno is None:
            return None
        names = [
            os.path.abspath(os.fsdecode(n))
            for n in (error.filename, error.filename2)
            if isinstance(n, str | bytes | os.PathLike)
        ]
        inside = any(n == cache_dir or n.startswith(os.path.join(cache_dir, "")) for n in names)
        return error if error.errno in _WRITE_ONLY_ERRNOS or inside else None
    message = str(error)
    for code in _WRITE_ERRNOS:
        if os.strerror(code) in message and (
            code in _WRITE_ONLY_ERRNOS or os.path.join(cache_dir, "") in message
        ):
            return OSError(code, os.strerror(code))
    return None
