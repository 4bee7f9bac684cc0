"""``cswap train``: real training on digits, the report and plots, bad input, and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from cswap.cli import app
from cswap.options import POLICIES
from cswap.paths import shipped_configs_dir
from cswap.training.config import RecipeError, TrainConfig, load_config, shipped_recipes
from cswap.training.loop import GlobalBatchSampler, OutOfMemoryAdvice, _oom_advice, train

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _train(tmp_path: Path, **overrides: object) -> dict:
    cfg = TrainConfig(report=tmp_path / "report.json", **overrides)
    return train(cfg, show_progress=False)


@pytest.mark.parametrize("policy", ["none", "cswap"])
def test_digits_loss_falls_and_accuracy_rises(tmp_path: Path, policy: str) -> None:
    report = _train(tmp_path, model="resnet18", width_mult=0.25, dataset="digits", image_size=16, epochs=3,
                    batch_size=32, lr=0.05, train_samples=512, policy=policy, min_bytes=0)
    epochs = report["epochs"]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert epochs[-1]["accuracy"] > epochs[0]["accuracy"]
    assert epochs[-1]["accuracy"] > 0.5  # ten classes: chance is 0.1


def test_report_and_plots_written(tmp_path: Path) -> None:
    report = _train(tmp_path, model="vgg11", width_mult=0.125, epochs=2, batch_size=16, train_samples=64,
                    policy="compress-swap", tune="bo", tune_budget=4, min_bytes=0)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert {"model", "policy", "device", "tune", "epochs"} <= set(saved)
    assert saved["model"] == "vgg11" and saved["policy"] == "compress-swap" and saved["tune"]["mode"] == "bo"
    epoch = saved["epochs"][0]
    for key in ("loss", "accuracy", "samples_per_s", "peak_memory_bytes", "kept_bytes", "offloaded_bytes",
                "compressed_bytes", "decisions", "predicted_compress_s", "measured_compress_s"):
        assert key in epoch, key
    assert epoch["decisions"]["zvc-swap"] > 0
    assert epoch["compressed_bytes"] > 0
    assert set(report["plots"]) == {"sparsity", "decisions", "memory", "convergence"}
    for path in report["plots"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(saved["memory_timeline"]) == set(POLICIES)
    assert all(len(run["evaluations"]) == 4 for run in saved["tune"]["runs"])


def test_second_run_reuses_tuned_configs(tmp_path: Path) -> None:
    options = dict(model="vgg11", width_mult=0.125, epochs=1, batch_size=16, train_samples=32, tune="bo", tune_budget=3)
    first = _train(tmp_path / "a", **options)
    second = _train(tmp_path / "b", **options)
    assert all(run["method"] == "bo" for run in first["tune"]["runs"])
    assert all(run["method"] == "cached" and not run["evaluations"] for run in second["tune"]["runs"])
    tuned = {(run["kernel"].rsplit(".", 1)[1], run["dtype"], run["bucket"]): run["best_params"] for run in first["tune"]["runs"]}
    reused = {(k["op"], k["dtype"], k["bucket"]): k["params"] for k in second["tune"]["kernels"]
              if (k["op"], k["dtype"], k["bucket"]) in tuned}
    assert reused == tuned


def test_unknown_model_names_the_valid_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--model", "vgg17", "--report", str(tmp_path / "r.json"), "--no-progress"])
    assert result.exit_code == 2
    assert "vgg17" in result.output and "vgg16" in result.output


def test_unknown_dataset_names_the_valid_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--dataset", "imagenet", "--report", str(tmp_path / "r.json"), "--no-progress"])
    assert result.exit_code == 2
    assert "imagenet" in result.output and "digits" in result.output


def test_bad_recipe_names_the_key_and_the_file(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: vgg11\nepochz: 3\n")
    with pytest.raises(RecipeError, match=r"bad\.yaml.*'epochz'"):
        load_config(recipe)
    recipe.write_text("policy: fastest\n")
    with pytest.raises(RecipeError, match=r"bad\.yaml.*'policy'"):
        load_config(recipe)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--no-progress"])
    assert result.exit_code == 2 and "bad.yaml" in result.output


def test_recipe_then_flags(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: resnet18\nepochs: 5\nlr: 0.1\n")
    cfg = load_config(recipe, {"epochs": 2, "lr": None})
    assert (cfg.model, cfg.epochs, cfg.lr) == ("resnet18", 2, 0.1)


@pytest.mark.parametrize("name", shipped_recipes())
def test_shipped_recipe_by_name(name: str) -> None:
    expected = yaml.safe_load((shipped_configs_dir() / "recipes" / f"{name}.yaml").read_text())
    cfg = load_config(name)
    assert {key: getattr(cfg, key) for key in expected} == expected


def test_unknown_recipe_name_lists_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert shipped_recipes() == ("policies-synthetic", "resnet18-digits", "vgg16-digits")
    with pytest.raises(RecipeError, match=r"'vgg99'.*one of: policies-synthetic, resnet18-digits, vgg16-digits"):
        load_config("vgg99")
    with pytest.raises(RecipeError, match=r"cannot read recipe missing\.yaml"):
        load_config("missing.yaml")  # a path stays a path: no name lookup
    (tmp_path / "vgg16-digits").write_text("epochs: 7\n")  # a file of that name wins over the shipped recipe
    assert load_config("vgg16-digits").epochs == 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_gpu_says_so(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--device", "cuda", "--report", str(tmp_path / "r.json"), "--no-progress"])
    assert result.exit_code == 2
    assert "CUDA" in result.output and "--device cpu" in result.output


@pytest.mark.parametrize("policy, hint", [("none", "--policy cswap"), ("swap", "--batch-size")])
def test_out_of_memory_suggests_a_policy(policy: str, hint: str) -> None:
    with pytest.raises(OutOfMemoryAdvice, match=hint):
        with _oom_advice(policy):
            raise torch.OutOfMemoryError("CUDA out of memory")


def test_global_batches_split_evenly_across_ranks() -> None:
    whole = list(GlobalBatchSampler(40, 8, seed=3))
    halves = [list(GlobalBatchSampler(40, 8, rank=r, world_size=2, seed=3)) for r in range(2)]
    assert [a + b for a, b in zip(*halves)] == whole
    with pytest.raises(ValueError, match="multiple of the 3 ranks"):
        GlobalBatchSampler(40, 8, world_size=3)


def test_torchrun_two_processes_match_one(tmp_path: Path) -> None:
    common = ["--model", "tests.cli.nets:tiny_cnn", "--dataset", "digits", "--image-size", "16", "--epochs", "1",
              "--batch-size", "16", "--train-samples", "64", "--policy", "compress-swap", "--min-bytes", "0",
              "--device", "cpu", "--no-progress", "--lr", "0.05"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    single = [sys.executable, "-m", "cswap.train", *common, "--save-model", str(tmp_path / "one.pt"),
              "--report", str(tmp_path / "one.json")]
    double = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "cswap.train",
              *common, "--save-model", str(tmp_path / "two.pt"), "--report", str(tmp_path / "two.json")]
    for command in (single, double):
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    one = torch.load(tmp_path / "one.pt")
    two = torch.load(tmp_path / "two.pt")
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    assert json.loads((tmp_path / "two.json").read_text())["world_size"] == 2


@pytest.mark.parametrize("recipe", sorted((REPO / "configs" / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_load(recipe: Path) -> None:
    cfg = load_config(recipe)
    assert cfg.model and cfg.dataset


def test_tuner_url_alone_means_cached_lookup() -> None:
    assert load_config(None, {"tuner_url": "http://127.0.0.1:8765"}).tune == "cached"
    assert load_config(None, {"tuner_url": "https://tuner.example:443", "tune": "bo"}).tune == "bo"
    assert load_config(None, {}).tune == "off"


def _tiny_run(tmp_path: Path, *args: str):
    return runner.invoke(app, ["train", "--model", "tests.cli.nets:tiny_cnn", "--image-size", "16", "--epochs", "1",
                               "--batch-size", "16", "--train-samples", "16", "--device", "cpu", "--no-progress",
                               "--report", str(tmp_path / "r.json"), *args], env={"CSWAP_HOME": str(tmp_path / "home")})


def test_tuner_url_is_announced_at_start(tmp_path: Path) -> None:
    from cswap.server.app import create_app
    from tests.server.helpers import serve_in_thread

    with serve_in_thread(create_app(tmp_path / "service.db")) as url:
        result = _tiny_run(tmp_path, "--tuner-url", url)
    assert result.exit_code == 0, result.output
    assert f"tuning service {url} (--tune cached): kernel configs are looked up there" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["tune"]["mode"] == "cached"


def test_service_down_warning_is_one_plain_stderr_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cswap.training.loop as train_module
    from cswap.server.client import ServiceUnavailable, TuningClient

    real = train_module.prepare_kernel_configs

    def warn_then_prepare(*args: object, **kwargs: object):
        TuningClient("http://127.0.0.1:9").warn_once(ServiceUnavailable("tuning service down"), "using the local store")
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "prepare_kernel_configs", warn_then_prepare)
    result = _tiny_run(tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["warning: tuning service down; using the local store"]


def test_plots_go_beside_the_report_named_after_it(tmp_path: Path) -> None:
    """Two reports in one folder keep their own plots; none land in a shared ``../plots``."""
    from cswap.training.report import draw_plots

    report = {"epochs": [], "memory_timeline": {"none": [[0.0, 1 << 20], [1.0, 2 << 20]]}}
    first = TrainConfig(report=tmp_path / "runs" / "a.json")
    second = TrainConfig(report=tmp_path / "runs" / "b.json")
    chosen = TrainConfig(report=tmp_path / "runs" / "c.json", plots=tmp_path / "figures")
    paths = {cfg.report_path.stem: draw_plots(report, cfg.plot_path) for cfg in (first, second, chosen)}
    assert paths["a"] == {"sparsity": str(tmp_path / "runs" / "a-sparsity.png"),
                          "decisions": str(tmp_path / "runs" / "a-decisions.png"),
                          "memory": str(tmp_path / "runs" / "a-memory.png")}
    assert paths["b"]["memory"] == str(tmp_path / "runs" / "b-memory.png")
    assert paths["c"]["memory"] == str(tmp_path / "figures" / "memory.png")
    assert not (tmp_path / "plots").exists() and not (tmp_path / "runs" / "plots").exists()
    for produced in paths.values():
        for path in produced.values():
            assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
