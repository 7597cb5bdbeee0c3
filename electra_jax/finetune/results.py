"""A finished fine-tuning's dev evaluation and what it writes: predictions in fixed-size
batches, the family's scores and prediction files, the weights, then eval_results.json (last:
its presence, with the weights, says the run is finished)."""

from __future__ import annotations

import functools
import time

import jax
import numpy as np

from electra_jax.finetune import checks, saved
from electra_jax.model.sharding import log
from electra_jax.store import jsonio, paths


def predict(predict_fn, params, arrays: dict, batch_size: int) -> dict:
    """predict_fn's outputs ([N, ...] numpy) for [N, L] input_ids, segment_ids, input_mask, in
    fixed-size batches (the last one padded with empty rows, so that one compiled shape serves
    every batch)."""
    inputs = {k: np.asarray(arrays[k]) for k in ("input_ids", "segment_ids", "input_mask")}
    n = len(inputs["input_ids"])
    chunks = []
    for start in range(0, max(n, 1), batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in inputs.items()}
        real = len(chunk["input_ids"])
        if real < batch_size:
            chunk = {k: np.pad(v, ((0, batch_size - real), (0, 0))) for k, v in chunk.items()}
        out = jax.device_get(predict_fn(params, chunk))
        chunks.append({k: np.asarray(v)[:real] for k, v in out.items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def evaluate_and_write(
    config,
    workdir: str,
    family,
    task,
    *,
    params,
    predict_fn,
    data,
    feats,
    num_steps: int,
    hyper: dict,
    init_source: str,
    train_loss: float,
    started: float,
) -> dict:
    """Scores the trained `params` on the dev set(s) (family.evaluate with `predict_fn`, the
    compiled prediction step), writes the weights, the family's prediction files and
    eval_results.json, and returns the results. `data` and `feats`: the task as read and
    featurized; `hyper`: fit.resolve_hyperparameters'; `started`: the run's time.time().

    Raises NonFiniteError (nothing written) when the model's dev outputs are not finite."""
    check = functools.partial(
        checks.check_finite_outputs, num_steps=num_steps, learning_rate=hyper["learning_rate"]
    )
    run_predict = lambda arrays: predict(predict_fn, params, arrays, config.eval_batch_size)
    results, files = family.evaluate(config, task, run_predict, data, feats, check)
    lines, score = family.shown(results)
    for line in lines:
        log(line)

    saved.save_weights(workdir, jax.device_get(params))
    results.update(
        {
            "steps": num_steps,
            "epochs": feats.epochs,
            "batch_size": config.batch_size,
            **hyper,
            "layer_decay_exponents": config.layer_decay_exponents,
            "seed": config.seed,
            "init_from": config.init_from,
            "init_source": init_source,
            "train_loss": train_loss,
            "predictions_file": family.predictions_file,
            "elapsed_sec": time.time() - started,
        }
    )
    for name, text in files.items():
        jsonio.write_atomic(paths.join(workdir, name), text)
    # eval_results.json last: its presence (with the weights) says the run is finished.
    jsonio.write_json(paths.join(workdir, saved.RESULTS_FILE), results)
    log(f"wrote {paths.join(workdir, saved.RESULTS_FILE)} ({score}) and {saved.WEIGHTS_FILE}")
    return results
