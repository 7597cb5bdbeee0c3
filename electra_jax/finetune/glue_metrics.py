"""GLUE's dev-set metrics, in numpy: accuracy, F1, Matthews correlation, Pearson and Spearman.

Each takes predictions and labels of shape [N] and returns a Python float. Degenerate inputs
(one predicted class, a constant score) give 0.0 where the formula divides by zero, as
scikit-learn and GLUE's scorer do.
"""

from __future__ import annotations

import numpy as np

from electra_jax.finetune.tasks import Task


def accuracy(predictions, labels) -> float:
    """Share of exact matches."""
    p, y = np.asarray(predictions), np.asarray(labels)
    return float(np.mean(p == y)) if y.size else 0.0


def _confusion(predictions, labels, positive: int = 1):
    p, y = np.asarray(predictions) == positive, np.asarray(labels) == positive
    tp, fp = float(np.sum(p & y)), float(np.sum(p & ~y))
    fn, tn = float(np.sum(~p & y)), float(np.sum(~p & ~y))
    return tp, fp, fn, tn


def f1(predictions, labels, positive: int = 1) -> float:
    """F1 of the positive class (MRPC's 'equivalent', QQP's 'duplicate'): 2TP / (2TP + FP + FN)."""
    tp, fp, fn, _ = _confusion(predictions, labels, positive)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Binary Matthews correlation (CoLA): (TP.TN - FP.FN) / sqrt of the four margins' product."""
    tp, fp, fn, tn = _confusion(predictions, labels)
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denom) if denom else 0.0


def pearson(x, y) -> float:
    """Pearson correlation of two [N] series."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    return float(np.sum(dx * dy) / denom) if denom else 0.0


def rankdata(x) -> np.ndarray:
    """1-based ranks of [N] values, ties sharing their average rank (scipy's 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Each run of equal values [start, end) gets the mean of ranks start+1 .. end.
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    run = np.cumsum(starts) - 1
    bounds = np.r_[np.flatnonzero(starts), x.size]
    mean_rank = (bounds[:-1] + bounds[1:] + 1) / 2.0
    ranks = np.empty(x.size, np.float64)
    ranks[order] = mean_rank[run]
    return ranks


def spearman(x, y) -> float:
    """Spearman rank correlation: Pearson of the (tie-averaged) ranks."""
    return pearson(rankdata(x), rankdata(y))


def task_metrics(task: Task, predictions, labels) -> dict[str, float]:
    """The metrics GLUE reports for the task on one dev set.

    predictions: [N] class indices, or scores for STS-B; labels: [N] the same kind.
    """
    if task.is_regression:
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels)}
    out = {"accuracy": accuracy(predictions, labels)}
    if task.name in ("MRPC", "QQP"):
        out["f1"] = f1(predictions, labels)
    if task.name == "CoLA":
        out["mcc"] = matthews_corrcoef(predictions, labels)
    return out
