"""GLUE metrics against values worked out by hand (and scipy where it is installed)."""

import math

import numpy as np
import pytest

from electra_jax.finetune import glue_metrics, tasks

# TP = 2 (items 0, 4), FP = 1 (item 1), FN = 1 (item 3), TN = 2 (items 2, 5).
PRED = [1, 1, 0, 0, 1, 0]
GOLD = [1, 0, 0, 1, 1, 0]


def test_accuracy_f1_mcc_by_hand():
    assert glue_metrics.accuracy(PRED, GOLD) == pytest.approx(4 / 6)
    assert glue_metrics.f1(PRED, GOLD) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # (TP.TN - FP.FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(81)
    assert glue_metrics.matthews_corrcoef(PRED, GOLD) == pytest.approx(1 / 3)
    # One predicted class: the MCC's denominator is 0, reported as 0 (as GLUE's scorer does).
    assert glue_metrics.matthews_corrcoef([1] * 6, GOLD) == 0.0
    assert glue_metrics.f1([0] * 6, GOLD) == 0.0


def test_pearson_spearman_by_hand():
    # dx = (-1.5, -.5, .5, 1.5), dy = (-3, -1, 0, 4): 11 / sqrt(5 x 26)
    assert glue_metrics.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    # Tied values share their mean rank: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4).
    np.testing.assert_allclose(glue_metrics.rankdata([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
    assert glue_metrics.spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(3 / math.sqrt(10))
    assert glue_metrics.spearman([1, 5, 9], [0.1, 0.2, 30.0]) == pytest.approx(1.0)
    assert glue_metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_against_scipy():
    stats = pytest.importorskip("scipy.stats", reason="scipy not installed")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, 200).astype(float)  # many ties
    y = x + rng.normal(size=200)
    assert glue_metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert glue_metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_task_metrics_per_task():
    get = tasks.get_task
    assert set(glue_metrics.task_metrics(get("MRPC"), PRED, GOLD)) == {"accuracy", "f1"}
    assert set(glue_metrics.task_metrics(get("QQP"), PRED, GOLD)) == {"accuracy", "f1"}
    assert glue_metrics.task_metrics(get("CoLA"), PRED, GOLD)["mcc"] == pytest.approx(1 / 3)
    assert set(glue_metrics.task_metrics(get("RTE"), PRED, GOLD)) == {"accuracy"}
    assert set(glue_metrics.task_metrics(get("STS-B"), [1.0, 2.0], [1.0, 3.0])) == {
        "pearson",
        "spearman",
    }
