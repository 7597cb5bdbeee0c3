"""checkpoint_steps: a workdir's saved steps from its folder names, and 'WORKDIR@STEP'."""

from electra_jax.store import checkpoint_steps


def test_saved_steps_are_the_folders_named_as_this_run_names_a_step(tmp_path):
    assert checkpoint_steps.saved_steps(str(tmp_path)) == []
    assert not checkpoint_steps.has_checkpoints(str(tmp_path))
    directory = tmp_path / "checkpoints"
    # A step, a set-aside checkpoint, a save in progress, a leading zero, Unicode digits.
    for name in ("12", "3", "0", "5.corrupt", "9.orbax-checkpoint-tmp-1", "07", "١٢"):
        (directory / name).mkdir(parents=True)
    assert checkpoint_steps.checkpoint_dir(str(tmp_path)) == str(directory)
    assert checkpoint_steps.saved_steps(str(tmp_path)) == [0, 3, 12]
    assert checkpoint_steps.has_checkpoints(str(tmp_path))


def test_split_step_names_a_step_only_where_no_such_path_exists(tmp_path):
    assert checkpoint_steps.split_step("runs/x@12") == ("runs/x", 12)
    assert checkpoint_steps.split_step("hf:dir") == ("hf:dir", None)
    assert checkpoint_steps.split_step("@12") == ("@12", None)
    # A folder whose own name ends in '@<digits>' is that folder, not a step of another.
    assert checkpoint_steps.split_step(str(tmp_path)) == (str(tmp_path), None)
    odd = tmp_path / "run@7"
    odd.mkdir()
    assert checkpoint_steps.split_step(str(odd)) == (str(odd), None)
    # Digits to str.isdigit() that int() refuses: a path, not a step (nothing raises).
    assert checkpoint_steps.split_step("runs/x@²") == ("runs/x@²", None)
    assert checkpoint_steps.split_step("runs/x@١٢") == ("runs/x@١٢", None)
