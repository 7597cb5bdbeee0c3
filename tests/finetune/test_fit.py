"""finetune/fit.py: the learning rate and layer decay by model size, the batch order."""

import numpy as np
import pytest

from electra_jax.finetune import fit
from tests.finetune.test_loop import _config


def test_the_batch_order_is_epoch_after_epoch_of_permutations_by_the_seed():
    order = fit.batch_order(10, 4, 5, seed=3)  # 20 draws: two epochs, each a permutation
    assert sorted(order.reshape(-1)[:10]) == list(range(10))
    assert sorted(order.reshape(-1)[10:]) == list(range(10))
    np.testing.assert_array_equal(order, fit.batch_order(10, 4, 5, seed=3))
    assert not np.array_equal(order, fit.batch_order(10, 4, 5, seed=4))


NEAREST = ", the nearest size to hidden "


@pytest.mark.parametrize(
    "hidden,learning_rate,layer_decay,expected_lr,expected_decay,paper",
    [
        # The paper's Table 7 by size, read from the discriminator's width.
        (256, 0.0, 0.0, 3e-4, 0.8, "paper: ELECTRA-Small"),
        (768, 0.0, 0.0, 1e-4, 0.8, "paper: ELECTRA-Base"),
        (1024, 0.0, 0.0, 5e-5, 0.9, "paper: ELECTRA-Large"),
        # Other widths take the nearest size's, by ratio, and say so.
        (128, 0.0, 0.0, 3e-4, 0.8, "paper: ELECTRA-Small" + NEAREST + "128"),
        (512, 0.0, 0.0, 1e-4, 0.8, "paper: ELECTRA-Base" + NEAREST + "512"),
        # An explicit value overrides the paper's.
        (1024, 2e-5, 0.0, 2e-5, 0.9, "paper: ELECTRA-Large"),
        (256, 0.0, 1.0, 3e-4, 1.0, "paper: ELECTRA-Small"),
    ],
)
def test_learning_rate_and_layer_decay_follow_the_model_size(
    hidden, learning_rate, layer_decay, expected_lr, expected_decay, paper
):
    config = _config("unused", learning_rate=learning_rate, layer_decay=layer_decay)
    assert fit.resolve_hyperparameters(config, hidden) == {
        "learning_rate": expected_lr,
        "learning_rate_source": "config" if learning_rate else paper,
        "layer_decay": expected_decay,
        "layer_decay_source": "config" if layer_decay else paper,
    }
