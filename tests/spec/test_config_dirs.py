"""A user's own configs: ``--config-dir DIR`` and ``./experiments`` are searched before the shipped ones
(harness/spec/compose.py)."""
import pytest

from harness.run import main
from harness.spec import ConfigError, config_dirs, load


@pytest.fixture
def mine(tmp_path):
    d = tmp_path / "my_configs"
    (d / "estimator").mkdir(parents=True)
    (d / "estimator" / "tis_c3.yaml").write_text("name: tis\nclip_c: 3.0\nlevel: token\n")
    return d


def test_a_preset_of_ones_own_composes_beside_the_shipped_ones(mine):
    cfg = load(["estimator=tis_c3", "model=dense_tiny"], dirs=config_dirs([mine]))
    assert (cfg.estimator.name, cfg.estimator.clip_c, cfg.model.name) == ("tis", 3.0, "dense_tiny")
    with pytest.raises(ConfigError) as err:
        load(["estimator=tis_c3"])  # not without the folder
    assert err.value.key == "estimator" and "tis_c3" not in str(err.value).split("allowed:")[1]


def test_ones_own_config_yaml_comes_first(mine):
    (mine / "config.yaml").write_text("defaults:\n  - schema\n  - _self_\n  - estimator: tis_c3\n  - model: moe_tiny\n"
                                      "  - task: sort\n  - backend: local\ntrainer:\n  steps: 7\n")
    cfg = load([], dirs=config_dirs([mine]))
    assert (cfg.trainer.steps, cfg.estimator.name) == (7, "tis")


def test_the_working_directorys_experiments_folder_is_searched(mine, monkeypatch):
    mine.rename(mine.parent / "experiments")
    monkeypatch.chdir(mine.parent)
    assert load(["estimator=tis_c3"]).estimator.clip_c == 3.0


def test_the_cli_takes_config_dir_and_refuses_a_missing_folder(mine, capsys, tmp_path):
    assert main(["--config-dir", str(mine), "estimator=tis_c3", "--print-config"]) == 0
    assert "clip_c: 3.0" in capsys.readouterr().out
    assert main([f"--config-dir={tmp_path / 'nope'}", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config-dir:") and "not a folder" in err and err.count("\n") == 1


def test_a_preset_named_like_a_shipped_one_is_refused(mine):
    (mine / "estimator" / "mean_n.yaml").write_text("name: tis\nclip_c: 5.0\nlevel: token\n")
    with pytest.raises(ConfigError) as err:
        load(["estimator=tis_c3"], dirs=config_dirs([mine]))
    assert err.value.key == "estimator" and "mean_n.yaml has the name of a shipped preset" in str(err.value)
