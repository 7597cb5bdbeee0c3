r"""A linear probe of a pre-trained discriminator: logistic regression on frozen features.

    python -m benchmarks.probe --init_from=runs/tiny --task=SST-2 --data_dir=glue/SST-2

Fine-tuning's dev score moves by points from seed to seed at small compute; a probe has no
seeds: the discriminator's final states, mean-pooled over each example's real tokens, are
standardised with the training set's mean and std, and an L2-regularised logistic regression
(one weight per state dimension and class, full-batch L-BFGS for a fixed number of
iterations, from zeros) is fit on the training examples and scored on dev. The same inputs give
the same accuracy. `features` and `fit` are the pieces; `probe_score` runs a task. `--layers=K`
probes the states after the first K discriminator layers instead of the last (`truncated`).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _cli  # noqa: E402
from electra_jax.finetune import tasks as glue_tasks  # noqa: E402

L2 = 1e-3  # on standardised features: the probe's one setting, the same for every model
ITERATIONS = 200


def features(model, examples, max_length: int = 128, batch_size: int = 256) -> np.ndarray:
    """Mean-pooled final discriminator states of GLUE examples: float32 [n, H].

    model: an electra_jax.pretrained.Model; examples: tasks.Example (text_a, optional text_b).
    """
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        texts = [(e.text_a, e.text_b) if e.text_b else e.text_a for e in chunk]
        ids = model.tokenize(texts, max_length=max_length)
        hidden = model.encode(ids)  # [b, L, H]
        mask = ids["input_mask"][..., None].astype(np.float32)
        out.append((hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0))
    return np.concatenate(out).astype(np.float32)


def fit(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float = L2):
    """L2-regularised multinomial logistic regression on standardised `x` [n, H] with integer
    labels `y` [n]: returns predict(x) -> int labels [n]. Deterministic (L-BFGS from zeros)."""
    import jax
    import jax.numpy as jnp
    import optax

    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    xs = jnp.asarray((x - mean) / std)
    ys = jnp.asarray(y, jnp.int32)

    def loss(params):
        logits = xs @ params["w"] + params["b"]
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()
        return nll + l2 * jnp.sum(params["w"] ** 2)

    params = {
        "w": jnp.zeros((x.shape[1], num_classes), jnp.float32),
        "b": jnp.zeros((num_classes,), jnp.float32),
    }
    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    state = solver.init(params)
    for _ in range(ITERATIONS):
        params, state = step(params, state)
    w, b = np.asarray(params["w"]), np.asarray(params["b"])
    return lambda z: np.argmax(((z - mean) / std) @ w + b, axis=-1)


def probe_score(
    model, task_name: str, data_dir: str, max_train_examples: int = 20000, max_length: int = 128
) -> dict:
    """The probe's dev accuracy on a classification task: {task, accuracy, train_examples,
    dev_examples}. The first `max_train_examples` training examples are used (the same for
    every model)."""
    task = glue_tasks.get_task(task_name)
    if task.is_regression:
        raise ValueError(f"{task.name} is a regression task; the probe classifies")
    train = glue_tasks.load_split(task, glue_tasks.TRAIN, data_dir)[:max_train_examples]
    dev = glue_tasks.load_split(task, task.dev_splits[0], data_dir)
    y_train = np.array([int(e.label) for e in train])
    y_dev = np.array([int(e.label) for e in dev])
    predict = fit(features(model, train, max_length), y_train, len(task.labels))
    accuracy = float(np.mean(predict(features(model, dev, max_length)) == y_dev))
    return {
        "task": task.name,
        "accuracy": accuracy,
        "train_examples": len(train),
        "dev_examples": len(dev),
    }


def random_model(like):
    """A Model of `like`'s spec and tokenizer with freshly initialised weights (seed 0)."""
    import jax

    from electra_jax.model import networks as model_lib
    from electra_jax.model.weights import Pretrained
    from electra_jax.pretrained import Model

    params = model_lib.init_params(model_lib.Electra(like.pretrained.spec), jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(np.asarray, params)
    return Model(Pretrained(like.pretrained.spec, params, like.tokenizer, "random init"))


def truncated(model, layers: int):
    """The same Model cut to its first `layers` discriminator layers: its `encode` gives the
    states after layer `layers` (the last layers of a discriminator serve its one-bit head, so
    an earlier one may hold more of what a task needs). The generator is left as it is."""
    import dataclasses

    import jax

    from electra_jax.model.layer_stack import layer_key
    from electra_jax.model.networks import LAYERS
    from electra_jax.model.weights import Pretrained
    from electra_jax.pretrained import Model

    spec = model.pretrained.spec
    total = spec.discriminator.num_layers
    if not 1 <= layers <= total:
        raise ValueError(f"layers={layers}: the discriminator has 1 to {total}")
    params = dict(model.pretrained.params)
    disc = dict(params["discriminator"])
    if LAYERS in disc:  # scanned: one stacked tree, the layer index leading
        disc[LAYERS] = jax.tree_util.tree_map(lambda x: x[:layers], disc[LAYERS])
    else:
        disc = {
            k: v for k, v in disc.items() if k not in {layer_key(i) for i in range(layers, total)}
        }
    params["discriminator"] = disc
    spec = dataclasses.replace(
        spec, discriminator=dataclasses.replace(spec.discriminator, num_layers=layers)
    )
    where = f"{model.source}, its first {layers} of {total} layers"
    return Model(Pretrained(spec, params, model.tokenizer, where))


def main(argv=None) -> None:
    import electra_jax

    ap = _cli.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--init_from", required=True, help="a workdir (WORKDIR@STEP), an export")
    ap.add_argument("--task", default="SST-2")
    ap.add_argument("--data_dir", required=True, help="the task's folder of TSV files")
    ap.add_argument("--max_train_examples", type=_cli.positive_int, default=20000)
    ap.add_argument(
        "--max_length", type=_cli.positive_int, default=128, help="tokens per sentence (cut)"
    )
    ap.add_argument("--random", action="store_true", help="probe random weights of that shape")
    ap.add_argument(
        "--layers",
        type=_cli.positive_int,
        default=None,
        help="probe the states after this many discriminator layers (default: all of them)",
    )
    args = ap.parse_args(argv)
    [args.task] = _cli.glue_tasks("--task", args.task)
    if glue_tasks.get_task(args.task).is_regression:
        ap.error(f"argument --task: {args.task} is a regression task; the probe classifies")
    _cli.directory("--data_dir", args.data_dir, "the task's folder of TSV files")
    with _cli.failures(f"--init_from {args.init_from}", also=(OSError,)):
        model = electra_jax.load(args.init_from)
    if args.random:
        model = random_model(model)
    if args.layers is not None:
        total = model.pretrained.spec.discriminator.num_layers
        if args.layers > total:
            ap.error(f"argument --layers: {args.layers}: the discriminator has {total} layers")
        model = truncated(model, args.layers)
    score = probe_score(model, args.task, args.data_dir, args.max_train_examples, args.max_length)
    print(json.dumps(score))


if __name__ == "__main__":
    _cli.run(main)
