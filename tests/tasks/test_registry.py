"""The task registry (harness/tasks): each task's generator, reward and lengths agree, its verl text form is
scored by its own text reward, and a new task is one module plus one YAML file."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from harness import tasks
from harness.backends.local.model import VOCAB_SIZE
from harness.backends.verl import data
from harness.spec import load
from harness.tasks.base import MARKER, TaskSpec

ROOT = Path(__file__).resolve().parents[2]
LOCAL = tasks.names("local")
SINGLE = tuple(n for n in LOCAL if tasks.get(n).tool is None)  # multi-turn tasks: tests/tasks/test_<name>.py
GENERATED = tuple(n for n in tasks.names("verl") if tasks.get(n).generated)


def test_registry_lists_the_shipped_tasks_and_each_has_a_yaml():
    assert {"sort", "addition", "gsm8k", "lookup"} <= set(tasks.names()) and "gsm8k" not in LOCAL
    assert "lookup" in LOCAL and "lookup" not in SINGLE and "lookup" not in tasks.names("verl")
    declared = {yaml.safe_load(p.read_text()).get("task", yaml.safe_load(p.read_text())).get("name")
                for p in (ROOT / "experiments" / "task").glob("*.yaml")}
    assert set(tasks.names()) <= declared
    with pytest.raises(KeyError, match="unknown task 'nope'; known: addition"):
        tasks.get("nope")


def test_a_spec_missing_what_its_backend_needs_is_refused():
    sort = tasks.get("sort")
    with pytest.raises(TypeError, match="the local backend needs prompt_len, answer_len, sample and reward"):
        TaskSpec(name="t", backends=("local",), summary="s", prompt_len=sort.prompt_len, sample=sort.sample)
    with pytest.raises(TypeError, match="exactly one of example"):
        TaskSpec(name="t", backends=("verl",), summary="s", example=sort.example, read=tasks.get("gsm8k").read)
    with pytest.raises(TypeError, match="needs a text_reward, or a data_source"):
        TaskSpec(name="t", backends=("verl",), summary="s", example=sort.example)
    with pytest.raises(ValueError, match="registered twice"):
        tasks.register(sort)
    with pytest.raises(TypeError, match="a multi-turn \\(tool\\) task runs on the local backend only"):
        TaskSpec(name="t", backends=("local", "verl"), summary="s", prompt_len=sort.prompt_len, answer_len=sort.answer_len,
                 sample=sort.sample, reward=sort.reward, example=sort.example, text_reward=sort.text_reward,
                 tool=tasks.get("lookup").tool)


@pytest.mark.parametrize("name", [n for n in LOCAL if n not in SINGLE])
@pytest.mark.parametrize("length", [1, 3, 6])
def test_multi_turn_generator_is_rewarded_by_its_own_reward(name, length):
    """A tool task's reference call, observation and answer fit their slots and the vocabulary, and the
    reference answer (EOS-terminated, PAD after) earns reward 1; a wrong first answer token loses its share."""
    spec = tasks.get(name)
    prompts, answers = spec.sample(64, length, torch.Generator().manual_seed(length))
    calls = spec.tool.call(prompts)
    obs = spec.tool.observe(prompts, calls)
    assert prompts.shape == (64, spec.prompt_len(length)) and answers.shape == (64, spec.answer_len(length))
    assert calls.shape == (64, spec.tool.call_len(length)) and obs.shape == (64, spec.tool.obs_len(length))
    for x in (prompts, calls, obs, answers):
        assert x.min() >= 0 and x.max() < VOCAB_SIZE
    for mode in spec.rewards:
        reward, exact = spec.reward(answers, answers, mode)
        assert torch.all(reward == 1.0) and torch.all(exact == 1.0)
        wrong = answers.clone()
        wrong[:, 0] = (wrong[:, 0] + 1) % 10
        reward, exact = spec.reward(wrong, answers, mode)
        assert torch.all(reward < 1.0) and torch.all(exact == 0.0)


@pytest.mark.parametrize("name", SINGLE)
@pytest.mark.parametrize("length", [1, 3, 6])
def test_local_generator_is_rewarded_by_its_own_reward(name, length):
    spec = tasks.get(name)
    prompts, answers = spec.sample(64, length, torch.Generator().manual_seed(length))
    assert prompts.shape == (64, spec.prompt_len(length)) and answers.shape == (64, spec.answer_len(length))
    assert prompts.min() >= 0 and prompts.max() < VOCAB_SIZE and answers.min() >= 0 and answers.max() <= 9
    for mode in spec.rewards:
        reward, exact = spec.reward(answers, answers, mode)
        assert torch.all(reward == 1.0) and torch.all(exact == 1.0)
        wrong = answers.clone()
        wrong[:, -1] = (wrong[:, -1] + 1) % 10
        reward, exact = spec.reward(wrong, answers, mode)
        assert torch.all(reward < 1.0) and torch.all(exact == 0.0)
        if mode == "partial":
            assert torch.allclose(reward, torch.full((64,), 1 - 1 / spec.answer_len(length)))
    a, b = spec.sample(8, length, torch.Generator().manual_seed(1)), spec.sample(8, length, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # seeded


@pytest.mark.parametrize("name", GENERATED)
def test_verl_text_form_is_rewarded_by_its_own_text_reward(name):
    spec, rng = tasks.get(name), random.Random(0)
    for length in (1, 4):
        for _ in range(20):
            prompt, ref = spec.example(rng, length)
            assert MARKER in prompt and len(ref.split()) == (spec.answer_len(length) if spec.answer_len else len(ref.split()))
            for mode in spec.rewards:
                assert spec.text_reward(f"I think... {MARKER} {ref}", ref, mode) == (1.0, 1.0)
                digits = ref.split()
                digits[0] = str((int(digits[0]) + 1) % 10)
                reward, exact = spec.text_reward(f"{MARKER} {' '.join(digits)}", ref, mode)
                assert reward < 1.0 and exact == 0.0
                assert spec.text_reward(ref, ref, mode) == (0.0, 0.0)  # no marker, no answer


def test_verl_reward_scores_a_row_by_its_tasks_text_reward():
    from harness.backends.verl import reward

    for name in GENERATED:
        (row,) = data.generated_rows(name, 3, 1, seed=0, split="test")
        ref = row["reward_model"]["ground_truth"]
        assert row["data_source"] == f"harness/{name}"
        assert reward.compute_score(row["data_source"], f"{MARKER} {ref}", ref) == {"score": 1.0, "acc": 1.0}
    for source in ("harness/gsm8k", "openai/gsm8k", "harness/nope"):  # verl's own rule, or no task: fail closed
        with pytest.raises(ValueError, match="not a harness task with a text reward"):
            reward.compute_score(source, f"{MARKER} 4", "4")


def test_gsm8k_rows_come_from_the_users_file(tmp_path):
    import pandas as pd

    rows = [{"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3 + 1200 = 1203\n#### 1,203"},
            {"question": "What is 2 + 2?", "answer": "#### 4"}]
    pd.DataFrame(rows).to_json(tmp_path / "train.jsonl", orient="records", lines=True)
    pd.DataFrame(rows[1:]).to_parquet(tmp_path / "test.parquet")
    assert data.main(["gsm8k", "--root", str(tmp_path / "out"), "--train", str(tmp_path / "train.jsonl"),
                      "--test", str(tmp_path / "test.parquet")]) == 0
    train = pd.read_parquet(tmp_path / "out" / tasks.get("gsm8k").data_dir(5) / "train.parquet")
    assert list(train.data_source) == ["openai/gsm8k"] * 2 and list(train.ability) == ["math"] * 2
    assert [r["ground_truth"] for r in train.reward_model] == ["1203", "4"]
    assert train.prompt[0][0]["content"].startswith("Tom has 3 apples") and train.prompt[0][0]["content"].endswith(
        f'output the final answer after "{MARKER}".')
    assert len(pd.read_parquet(tmp_path / "out" / "gsm8k" / "test.parquet")) == 1
    pd.DataFrame([{"question": "q"}]).to_json(tmp_path / "bad.jsonl", orient="records", lines=True)
    with pytest.raises(ValueError, match=r"columns \['answer'\] missing"):
        tasks.get("gsm8k").read(tmp_path / "bad.jsonl", "train")


def test_data_cli_never_downloads_gsm8k(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        data.main(["gsm8k", "--root", str(tmp_path), "--test", str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2 and "--train" in capsys.readouterr().err and not any(tmp_path.iterdir())
    assert "--train" in data.command("gsm8k", 1, "data/verl") and "--length 3" in data.command("addition", 3, "d")


TOY = '''
    """``reverse``: the L digits in reverse order (a toy task of tests/tasks/test_registry.py)."""
    from harness.tasks import register
    from harness.tasks.base import TaskSpec, digit_reward, randint


    def sample(n, length, gen):
        import torch

        from harness.tasks.vocab import BOS, EQUALS

        d = randint(gen, 0, 10, (n, length))
        return torch.cat([torch.full((n, 1), BOS), d, torch.full((n, 1), EQUALS)], 1), d.flip(-1)


    SPEC = register(TaskSpec(name="reverse", backends=("local",), summary="reverse L digits",
                             prompt_len=lambda length: length + 2, answer_len=lambda length: length,
                             sample=sample, reward=digit_reward))
'''
TINY = ["trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
        "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_sequences=4"]
PROBE = """
import json, torch
from harness import tasks
from harness.backends.local.tasks import Task
from harness.spec import load
prompts, answers = Task(load(["task=reverse"]).task).sample(4, torch.Generator().manual_seed(0))
print(json.dumps({"local": tasks.names("local"), "verl": tasks.names("verl"),
                  "reversed": torch.equal(prompts[:, 1:-1].flip(-1), answers),
                  "sig_sort": load(["task=sort"]).signature}))
"""


def test_a_new_task_is_one_module_and_one_yaml(tmp_path):
    """In a copy of the repository (its tracked and unignored files), ``harness/tasks/reverse.py`` and
    ``experiments/task/reverse.yaml`` are written and nothing else is edited: the copy's harness trains it 2
    tiny steps, refuses it on verl and in the verl data CLI (exit 2 naming it), and no signature moves."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split("\0")
    repo = tmp_path / "repo"
    for rel in files:
        if rel and not rel.startswith((".venv/", "mlruns", "runs/")) and (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    assert not (repo / "harness" / "tasks" / "reverse.py").exists()
    (repo / "harness" / "tasks" / "reverse.py").write_text(textwrap.dedent(TOY))
    (repo / "experiments" / "task" / "reverse.yaml").write_text(
        (ROOT / "experiments" / "task" / "sort.yaml").read_text().replace("name: sort", "name: reverse"))
    env = {**os.environ, "PYTHONPATH": str(repo), "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    store = f"tracking.uri=sqlite:///{tmp_path}/mlruns.db"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    res = run("-m", "harness.run", "task=reverse", *TINY, store, f"out_dir={tmp_path}/reverse")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "finished after 2 steps" in res.stdout.strip().splitlines()[-1], res.stdout

    res = run("-m", "harness.run", "backend=verl", "task=reverse", "model=qwen3_30b_a3b", "trainer.lr=1e-6", store,
              "--dry-run")
    assert res.returncode == 2 and res.stderr.startswith("error: task:") and "'reverse'" in res.stderr, res.stderr
    res = run("-m", "harness.backends.verl.data", "reverse", "--root", str(tmp_path / "data"))
    assert res.returncode == 2 and "'reverse'" in res.stderr and not (tmp_path / "data").exists(), res.stderr

    res = run("-c", PROBE)
    assert res.returncode == 0, res.stderr[-3000:]
    probe = json.loads(res.stdout)
    assert probe["local"] == ["addition", "lookup", "reverse", "sort"] and "reverse" not in probe["verl"] and probe["reversed"]
    assert probe["sig_sort"] == load(["task=sort"]).signature
