import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from benchmarks import gpu_data
from electra_jax.pretraining import dry_run, topology
from tests import command_server
from tests.conftest import ROOT, SHARED, micro_config, subprocess_env
from tests.pretraining.test_topology import libtpu_env, needs_libtpu  # noqa: F401  (a fixture)


def test_train_step_benchmark_prints_one_json_line():
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/train_step.py",
            "--config=configs/tiny.py",
            "--batch=4",
            "--seq=32",
            "--steps=2",
            "--warmup=1",
        ],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["finite"] and row["batch"] == 4 and row["seq"] == 32
    assert row["tokens_per_sec"] > 0 and row["median_s_per_step"] > 0
    assert row["mfu"] is None  # no known peak for a CPU
    # configs/tiny.py inherits 4 steps per call: the 2 timed steps are one whole call of 4.
    assert row["steps_per_call"] == 4 and row["steps"] == 4


# --------------------------------------------------------------- the single-GPU run (gpu.sh)

TASKS = "RTE,MRPC"  # the two smallest dev sets: both inits, averages and the gain, in little time


def test_as_documents_joins_wrapped_paragraphs_and_splits_wikitext_articles():
    wrapped = b"[A Book]\n\nIt was a dark\nand stormy night.\n\n\nThe end.\n"
    joined = b"[A Book]\nIt was a dark and stormy night.\nThe end.\n"
    assert gpu_data.as_documents(wrapped) == joined
    # No blank lines: a paragraph per line already; CRLF and edge spaces dropped.
    speech = b"Fellow citizens:\r\nWe meet today.\r\nThank you.\r\n"
    assert gpu_data.as_documents(speech) == b"Fellow citizens:\nWe meet today.\nThank you.\n"
    wiki = b" = First = \r\n A text . \r\n = = Section = = \r\n More . \r\n = Second = \r\n B .\r\n"
    assert gpu_data.as_documents(wiki) == (
        b"= First =\nA text .\n= = Section = =\nMore .\n\n= Second =\nB .\n"
    )


def test_stage_refuses_a_folder_it_did_not_make(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt.gz").write_bytes(b"x" * 10)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("someone else's")
    with pytest.raises(gpu_data.Refused, match="not staged by"):
        gpu_data.stage(str(corpus), [["a.txt.gz", 10]], str(theirs))
    assert (theirs / "keep.txt").read_text() == "someone else's"
    staged = tmp_path / "staged"
    source = gpu_data.stage(str(corpus), [["a.txt.gz", 10]], str(staged))
    assert source == f"text:{staged}/**/*.gz"
    assert (staged / "a.txt.gz").stat().st_mtime_ns == gpu_data.FIXED_MTIME_NS
    # Its own folder is staged again; a file of the wrong size is refused.
    with pytest.raises(gpu_data.Refused, match="not 11 bytes"):
        gpu_data.stage(str(corpus), [["a.txt.gz", 11]], str(staged))


def test_gpu_sh_budget_fits_one_device_call_and_refuses_unknown_parts(tmp_path):
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    gpu = script[script.index("else\n  TOTAL=") :]
    budget = {
        name: int(re.search(rf"{name}=\$\{{BUDGET_\w+:-(\d+)\}}", gpu).group(1))
        for name in ("TOTAL", "B_CHECKS", "B_PRETRAIN", "B_FINETUNE")
    }
    assert budget["TOTAL"] <= 600  # the device's limit on one command
    # setup (15 s) and what the parts before speed may take leave speed at least two rows' time
    first = 15 + budget["B_CHECKS"] + budget["B_PRETRAIN"] + budget["B_FINETUNE"]
    assert budget["TOTAL"] - first >= 120
    out = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--parts=checks,bogus"],
        cwd=ROOT,
        env=dict(subprocess_env(), OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "error: --parts: unknown part bogus" in out.stdout


def _run(args, env, timeout):
    return command_server.run([sys.executable, *args], cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(
    not (SHARED / "data" / "corpus").is_dir(), reason="needs the shared corpus and GLUE files"
)
def test_gpu_data_then_quality_on_cpu_writes_every_field(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted((SHARED / "data" / "corpus" / "nltk-inaugural").glob("19[0-4]*.txt")):
        shutil.copy(path, corpus)
    env = subprocess_env()
    data, staged = tmp_path / "data", tmp_path / "staged"
    prep = _run(
        [
            "benchmarks/gpu_data.py",
            f"--corpus={corpus}",
            f"--glue={SHARED / 'data' / 'glue'}",
            f"--out={data}",
            f"--staged_at={staged}",
            f"--tasks={TASKS}",
            "--vocab_size=600",
            "--seq_length=64",
            "--peer=",
        ],
        env,
        300,
    )
    assert prep.returncode == 0, prep.stderr[-2000:]
    summary = json.loads(prep.stdout.strip().splitlines()[-1])
    assert summary["vocab_size"] == 600 and summary["seq_length"] == 64
    assert summary["bytes"] == gpu_data.folder_bytes(str(data)) > 0
    assert 0 < summary["travels_bytes"] <= summary["carry_limit_bytes"]
    manifest = json.loads((data / "gpu_data.json").read_text())
    assert manifest["tasks"] == TASKS.split(",") and manifest["peer"] is None
    assert (data / manifest["shards"] / "manifest.json").is_file()
    assert (data / "tokenizer" / "spm.model").is_file()
    for task in TASKS.split(","):
        assert (data / "glue" / task / "dev.tsv").read_bytes() == (
            SHARED / "data" / "glue" / task / "dev.tsv"
        ).read_bytes()
    # A recipe whose data fields differ from the prepared ones is refused before any training.
    changed = tmp_path / "changed.py"
    changed.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(ROOT / 'configs' / 'gpu_quality.py')!r})\n"
        "FINETUNE = _base['FINETUNE']\n"
        "def get_config():\n"
        "    config = _base['get_config']()\n"
        "    config.data.short_seq_prob = 0.2\n"
        "    return config\n"
    )
    out = tmp_path / "out"
    refused = _run(
        [
            "benchmarks/gpu_quality.py",
            f"--data={data}",
            f"--out={out}",
            f"--config={changed}",
            f"--tasks={TASKS}",
        ],
        env,
        120,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("error:") and "no shards for this config" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    run = _run(
        [
            "benchmarks/gpu_quality.py",
            f"--data={data}",
            f"--out={out}",
            f"--workdir={tmp_path / 'work'}",
            f"--tasks={TASKS}",
            "--cpu",
            "--parallel=2",
            "--finetune_seconds=600",
        ],
        env,
        900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    q = json.loads((out / "h200_quality.json").read_text())
    assert q["status"] == "done"
    steps = q["steps_done"]
    assert steps == q["steps_planned"] == 8
    assert q["tokens"] == steps * 8 * 64
    assert q["pretrain_flops"] == steps * q["flops_per_step"] > 0
    assert q["pretrain_seconds"] > 0 and q["pretrain_exit_code"] == 0
    assert [e["step"] for e in q["eval"]] == [4, 8] and q["disc_auc"] == q["eval"][-1]["disc_auc"]
    assert 0 < q["disc_auc"] < 1
    for init in ("electra", "random_init"):
        scores = [q[init][t] for t in TASKS.split(",")]
        assert all(0 <= s <= 100 for s in scores)
        assert q[init]["average"] == round(sum(scores) / len(scores), 2)
        for task in TASKS.split(","):
            assert q["finetune"][init][task]["status"] == "done"
            assert q["finetune"][init][task]["num_train_examples"] > 0
    assert q["gain"] == round(q["electra"]["average"] - q["random_init"]["average"], 2)
    rows = [json.loads(line) for line in (out / "pretrain_metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == steps and "eval/disc_auc" in rows[-1]
    # What comes back from the device: plain files, no folders, names it accepts.
    assert sorted(os.listdir(out)) == ["h200_quality.json", "pretrain_metrics.jsonl"]


def test_compile_table_rows_and_markdown():
    from benchmarks import compile_table

    names = [compile_table.row_name(*r) for r in compile_table.ROWS]
    assert len(set(names)) == len(names)  # --only and the resume tell rows apart by name
    fitted = {
        "config": "base", "topology": "v4-16", "overrides": [], "device_kind": "TPU v4",
        "jax_topology": "v4:2x2x2",
        "devices": 8, "hosts": 2, "mesh": {"data": 8, "fsdp": 1}, "batch_per_device": 32,
        "memory_per_device_bytes": 3 * 2**30, "memory_state_bytes": 2**30,
        "memory_temp_bytes": 2 * 2**30, "hbm_per_device_bytes": 32 * 2**30,
        "headroom_bytes": 29 * 2**30, "fits": True, "compile_seconds": 12.5, "mfu_ceiling": 0.5,
        "mfu_ceiling_cycles": 0.25, "pallas_calls_per_step": 0, "commit": "abc1234",
    }  # fmt: skip
    failed = {"config": "large", "topology": "v4-128", "overrides": ["--config.train.remat=full"]}
    failed["error"] = "error: does not fit v4-128 (v4): a device needs 36.73G; try remat"
    fitted.update(remat="save_matmuls", remat_auto="train.remat=auto: 'save_matmuls' for ...")
    table = compile_table.markdown([fitted, failed]).splitlines()
    assert len(table) == 4 and all(line.count("|") == 14 for line in table)
    assert table[2].startswith(
        "| base | v4-16 (v4:2x2x2, TPU v4) | as is | auto: save_matmuls | 8 x 2 | 8 x 1 | 32 |"
    )
    assert (
        "| 3.00 (1.00 + 2.00) of 32.00 | yes (29.00) | 12.5 | 50.0% | 25.0% | abc1234 |" in table[2]
    )
    kernels = compile_table.markdown([{**fitted, "pallas_calls_per_step": 48}]).splitlines()[2]
    assert kernels.endswith("| 25.0% (Pallas calls at their roofline) | abc1234 |")
    assert "train.remat=full" in table[3] and "no: does not fit v4-128" in table[3]
    assert "try remat" not in table[3]  # the need and the have; the hints are the command's


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_hlo_costs_reads_the_tpu_compilers_estimates_and_bytes():
    """A small program compiled by the TPU compiler: each top-level instruction comes with the
    compiler's estimated cycles and the bytes of its operands and results, and is put under the
    part of the model its op_name names."""
    from benchmarks import hlo_costs
    from electra_jax.pretraining import compiled_costs

    target = topology.resolve("v5e:2x2")
    device = topology.compile_only_devices(target)[0]
    where = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=where)

    @jax.jit
    def f(x):
        with jax.named_scope("intermediate"):
            return jnp.tanh(x @ x.T) * 2.0

    with dry_run._without_persistent_cache():  # a compile-only executable is not cached
        lowered = f.lower(x)
        rows = compiled_costs.instructions(lowered.compile().as_text())
    assert rows and all(r["cycles"] >= 0 for r in rows) and sum(r["cycles"] for r in rows) > 0
    matmul = max(rows, key=lambda r: r["cycles"])  # the one fusion: matmul, tanh, scale
    # reads x and writes the [256, 256] product
    assert matmul["op"] == "fusion" and matmul["bytes"] == 256 * 512 * 4 + 256 * 256 * 4
    assert hlo_costs.part(matmul["op_name"]) == "ffn/forward"
    flops = compiled_costs.matmul_flops(lowered.as_text(debug_info=True))
    parts = hlo_costs.by_part(rows, target.generation, flops)
    assert sum(p["cycles"] for p in parts) == sum(r["cycles"] for r in rows)
    # x @ x.T: 2 x 256 x 256 x 512 FLOPs, all of them under the part its scope names
    assert {p["part"]: p["flops"] for p in parts}["ffn/forward"] == 2 * 256 * 256 * 512
    name = "jit(s)/transpose(jvp(Electra.generator_logits))/generator/layer_0/attention/dot_general"
    assert hlo_costs.part(name) == "generator/attention_projections/backward"
    # The layer norm after attention is the layer norm's, not the projections'.
    name = name.replace("/attention/dot_general", "/attention_LayerNorm/reduce_sum")
    assert hlo_costs.part(name) == "generator/layer_norm/backward"


def test_compile_table_again_replaces_a_row_in_its_place(tmp_path, monkeypatch):
    """--only skips a row OUT.json holds; with --again it runs it and puts the new row where
    the old one was, the other rows untouched."""
    from benchmarks import compile_table

    asked = []

    def fake_row(config, topology_name, overrides, timeout):
        asked.append(compile_table.row_name(config, topology_name, overrides))
        return {"config": config, "topology": topology_name, "overrides": list(overrides),
                "error": f"error: run {len(asked)}"}  # fmt: skip

    monkeypatch.setattr(compile_table, "run_row", fake_row)
    out = tmp_path / "table"
    first, second = (compile_table.row_name(*r) for r in compile_table.ROWS[3:5])
    only = f"--only={first}"
    for extra in ([f"{only},{second}"], [only], [only, "--again"]):
        monkeypatch.setattr(sys, "argv", ["compile_table.py", f"--out={out}", *extra])
        compile_table.main()
    assert asked == [first, second, first]
    rows = json.loads((tmp_path / "table.json").read_text())
    assert [r["error"] for r in rows] == ["error: run 3", "error: run 2"]
    assert "run 3" in (tmp_path / "table.md").read_text()


@needs_libtpu
@pytest.mark.usefixtures("libtpu_env")
def test_hlo_costs_compiles_one_discriminator_layer_alone():
    """--layer: one layer's forward and backward, whose attention core and feed-forward parts
    are found in both directions, and whose FLOPs are at least the layer's matmuls'."""
    from benchmarks import hlo_costs
    from electra_jax.pretraining import compiled_costs

    config = micro_config()
    lowered, compiled, _ = hlo_costs.layer_compiled(config, "v5e:2x2", 2)
    flops = compiled_costs.matmul_flops(lowered.as_text(debug_info=True))
    rows = compiled_costs.instructions(compiled.as_text())
    parts = hlo_costs.by_part(rows, topology.resolve("v5e:2x2").generation, flops)
    for part in ("attention_core", "ffn"):
        assert {f"{part}/forward", f"{part}/backward"} <= {p["part"] for p in parts}, parts
    tokens, width = 2 * config.data.seq_length, config.model.hidden_size
    matmuls = 2 * tokens * (4 * width * width + 2 * width * config.model.intermediate_size)
    assert dry_run._costs(compiled)["flops"] >= 3 * matmuls  # forward and two gradients
    # The lowered program's dots, by part: the projections' and the FFN's forward matmuls
    # exactly; their gradients twice over (and the bias gradients' matrix-vector products).
    by_part = {p["part"]: p["flops"] for p in parts}
    assert by_part["ffn/forward"] == 2 * tokens * 2 * width * config.model.intermediate_size
    assert by_part["attention_projections/forward"] == 2 * tokens * 4 * width * width
    assert by_part["ffn/backward"] >= 2 * by_part["ffn/forward"]
    # The layer is built under the config's remat policy (no compile to see it): 'full' keeps
    # its input and the loss's own output, [2, 32, 64] float32 each, beside the mask's bias and
    # the dropout key, for its backward pass.
    kept = {}
    for policy in ("none", "full"):
        config.train.remat = policy
        kept[policy] = hlo_costs.layer_kept_bytes(config, "v5e:2x2", 2)
    two = 2 * tokens * width * 4
    assert two < kept["full"] < two + 1024 < 4 * two < kept["none"]
