"""Export of fine-tuned models: transformers' ElectraForSequenceClassification and
ElectraForQuestionAnswering compute our logits, its pipelines give our labels, the model card
comes from the workdir's records, and bad input is one line, exit 2, nothing written.

The encoder is the micro pre-training workdir of test_export (checkpoint 6), fine-tuned for a
few steps: on synthetic SST-2 files (always), and on GLUE's real SST-2 and STS-B dev sentences
when ../shared/data/glue holds them.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import electra_jax
from electra_jax import export
from electra_jax.errors import PretrainedError
from electra_jax.finetune import loop, saved
from tests import command_server
from tests.conftest import ROOT, SHARED, subprocess_env
from tests.finetune import test_squad_loop
from tests.finetune.test_loop import _config, _sst2
from tests.finetune.test_squad_data import write_squad
from tests.test_export import make_workdir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
GLUE = SHARED / "data" / "glue"
needs_glue = pytest.mark.skipif(
    not (GLUE / "SST-2" / "dev.tsv").exists(), reason=f"no GLUE files in {GLUE}"
)


def _finetuned(tmp_path_factory, data, task="SST-2", seq_length=32, **overrides):
    run = make_workdir(tmp_path_factory)
    settings = dict(
        task=task,
        init_from=run["path"],
        seq_length=seq_length,
        num_epochs=1.0,
        max_train_examples=64,
        **{"model.hidden_size": 64},
    )
    config = _config(data, **{**settings, **overrides})
    workdir = tmp_path_factory.mktemp("finetuned") / task
    results = loop.finetune(config, str(workdir))
    return workdir, results


def _hf_logits(model_dir, model, texts):
    """transformers' logits [N, C] for our tokenization of texts (strings or pairs)."""
    from electra_jax.finetune import features

    examples = [
        electra_jax.finetune.tasks.Example(*(t if isinstance(t, tuple) else (t, None)), 0, "")
        for t in texts
    ]
    arrays = features.encode_examples(
        model.tokenizer, examples, model.config.seq_length, regression=False
    )
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(arrays["input_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(arrays["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(arrays["input_mask"], dtype=torch.long),
        )
    return out.logits.numpy()


def _front_matter(readme: str) -> dict:
    import yaml

    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n")[1])


def _check_classifier(workdir, results, texts, tmp_path):
    out = tmp_path / "hf"
    manifest = export.export(str(workdir), str(out))
    assert manifest["architecture"] == "ElectraForSequenceClassification"
    model = electra_jax.load(str(workdir))
    ours = model.outputs(texts)
    theirs = _hf_logits(out, model, texts)
    error = float(np.abs(theirs - ours).max())
    print(f"{model.record['task']}: max |transformers - ours| = {error:.2e} over {len(texts)}")
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)
    pipe = transformers.pipeline("text-classification", model=str(out), device="cpu")
    # Truncated as in training (the export's model_max_length is the run's seq_length), but for
    # pairs too long for it: transformers' longest_first splits the tokens of such a pair
    # differently from BERT's rule, which ours follows, so those are left out here.
    length = model.config.seq_length
    sizes = [
        sum(len(model.tokenizer.encode(x)) + 1 for x in t) + 1 if isinstance(t, tuple) else 0
        for t in texts
    ]
    kept = [t for t, n in zip(texts, sizes, strict=True) if n <= length]
    assert len(kept) >= len(texts) // 4, len(kept)
    texts = kept
    inputs = [t if isinstance(t, str) else {"text": t[0], "text_pair": t[1]} for t in texts]
    got = pipe(inputs, truncation=True)
    predicted = model.predict(texts)
    if model.task.is_regression:
        np.testing.assert_allclose([g["score"] for g in got], predicted, atol=1e-5, rtol=0)
    else:
        assert [g["label"] for g in got] == predicted.labels
        np.testing.assert_allclose(
            [g["score"] for g in got], predicted.probabilities.max(-1), atol=1e-5, rtol=0
        )
    config = json.loads((out / "config.json").read_text())
    # The card's numbers are the workdir's own.
    front = _front_matter((out / "README.md").read_text())
    assert front["pipeline_tag"] == "text-classification"
    values = {m["type"]: m["value"] for m in front["model-index"][0]["results"][0]["metrics"]}
    assert values == results["metrics"]["dev"]
    return config, out


def test_a_classifier_exports_with_our_logits_labels_and_card(tmp_path_factory, tmp_path):
    data = _sst2(tmp_path / "SST-2", n_train=80, n_dev=24)
    workdir, results = _finetuned(tmp_path_factory, data)
    texts = [
        line.split("\t")[0].strip() for line in (data / "dev.tsv").read_text().splitlines()[1:]
    ]
    config, out = _check_classifier(workdir, results, texts, tmp_path)
    assert config["id2label"] == {"0": "0", "1": "1"} and config["label2id"] == {"0": 0, "1": 1}
    assert config["problem_type"] == "single_label_classification"
    assert {"tokenizer.json", "model.safetensors", "README.md", "export.json"} <= set(
        os.listdir(out)
    )
    readme = (out / "README.md").read_text()
    record = json.loads((workdir / saved.MODEL_FILE).read_text())
    pre = record["pretraining"]
    assert f"{pre['flops']:.3e} FLOPs" in readme and f"steps: {pre['step']:,}" in readme
    assert f"`{pre['corpus']}`" in readme and "through the Python API" in readme


@needs_glue
def test_real_sst2_dev_sentences(tmp_path_factory, tmp_path):
    workdir, results = _finetuned(tmp_path_factory, GLUE / "SST-2")
    rows = (GLUE / "SST-2" / "dev.tsv").read_text().splitlines()[1:201]
    _check_classifier(workdir, results, [r.split("\t")[0].strip() for r in rows], tmp_path)


@needs_glue
def test_real_stsb_dev_pairs_export_as_regression(tmp_path_factory, tmp_path):
    workdir, results = _finetuned(tmp_path_factory, GLUE / "STS-B", task="STS-B", seq_length=128)
    rows = (GLUE / "STS-B" / "dev.tsv").read_text().splitlines()[1:201]
    pairs = [tuple(r.split("\t")[7:9]) for r in rows]
    config, _ = _check_classifier(workdir, results, pairs, tmp_path)
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "score"}


def _squad(tmp_path_factory, tmp_path, version, **overrides):
    data = write_squad(tmp_path / "squad", version, n_train=8, n_dev=2)
    config = test_squad_loop._config(data, version, **overrides)
    workdir = tmp_path_factory.mktemp("squad") / f"squad-{version}"
    loop.finetune(config, str(workdir))
    return workdir


def test_an_independent_squad_head_exports_as_question_answering(tmp_path_factory, tmp_path):
    import jax
    import jax.numpy as jnp

    workdir = _squad(tmp_path_factory, tmp_path, "1.1", joint_prediction=False)
    out = tmp_path / "hf"
    assert export.export(str(workdir), str(out))["architecture"] == "ElectraForQuestionAnswering"
    qa = electra_jax.load(str(workdir))
    context = "Anna lives in Oslo. The cat is old (1895-1943). Boris lives in Rome."
    question = "Who lives in Rome?"
    from electra_jax.finetune import squad

    feats = squad.featurizer(qa.config, qa.tokenizer)(
        [electra_jax.finetune.squad_data.Example("q", question, context, (), "")]
    )
    ids, seg, mask = (jnp.asarray(getattr(feats, k)) for k in squad.INPUTS)
    model = qa.family.network(qa.config, qa.task, qa.spec)
    ours = jax.jit(model.apply)({"params": qa.params}, ids, seg, mask, jnp.zeros(len(ids), int))
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
            token_type_ids=torch.tensor(np.asarray(seg), dtype=torch.long),
            attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
        )
    allowed = np.asarray(ours["start_logits"]) > -500  # ours carry -1000 where no span can be
    for key in ("start_logits", "end_logits"):
        np.testing.assert_allclose(
            getattr(theirs, key).numpy()[allowed], np.asarray(ours[key])[allowed], atol=1e-5
        )
    if "question-answering" in transformers.pipelines.SUPPORTED_TASKS:  # removed in 5.x
        answer = transformers.pipeline("question-answering", model=str(out), device="cpu")(
            question=question, context=context
        )
        assert context[answer["start"] : answer["end"]] == answer["answer"]
    front = _front_matter((out / "README.md").read_text())
    assert front["pipeline_tag"] == "question-answering"


def _export_cli(workdir, out):
    return command_server.run(
        [sys.executable, "-m", "electra_jax.export", f"--workdir={workdir}", f"--out={out}"],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=180,
    )


def _one_error_line(result) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_bad_exports_are_one_line_exit_2_and_write_nothing(tmp_path_factory, tmp_path):
    data = _sst2(tmp_path / "SST-2", n_train=40, n_dev=8)
    config = _config(data, **{"checkpoint.every_steps": 2})
    unfinished = tmp_path / "unfinished"
    loop.finetune(config, str(unfinished), stop_after=2)
    finished = tmp_path / "finished"
    loop.finetune(config, str(finished))
    renamed, relabelled = tmp_path / "renamed", tmp_path / "relabelled"
    for folder in (renamed, relabelled):
        subprocess.run(["cp", "-r", str(finished), str(folder)], check=True)
    settings = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({**settings, "task": "SST-3"}))
    record = json.loads((relabelled / saved.MODEL_FILE).read_text())
    (relabelled / saved.MODEL_FILE).write_text(json.dumps({**record, "labels": ["neg", "pos"]}))
    joint = _squad(tmp_path_factory, tmp_path, "1.1")
    cases = [
        (unfinished, "holds no saved weights"),
        (renamed, "config.task='SST-3' is not a GLUE task"),
        (relabelled, "labels ['neg', 'pos'], but SST-2 has ['0', '1']"),
        (joint, "its end logits depend on the start (config.joint_prediction=true"),
    ]
    for workdir, expected in cases:
        out = tmp_path / f"out-{workdir.name}"
        line = _one_error_line(_export_cli(workdir, out))
        assert expected in line, line
        assert not out.exists() and not (workdir / "hf").exists()
    answerable = _squad(tmp_path_factory, tmp_path, "2.0", joint_prediction=False)
    with pytest.raises(PretrainedError, match="answerability classifier"):
        export.export(str(answerable), str(tmp_path / "out-2.0"))
    assert not (tmp_path / "out-2.0").exists()
