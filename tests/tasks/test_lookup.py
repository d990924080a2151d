"""The multi-turn tool task ``lookup`` (harness/tasks/lookup.py): its slots by hand, the environment on malformed
calls, the EOS-terminated reward, the warm start's targets, and two training steps end to end through MLflow."""
import subprocess
import sys
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from harness import metrics as M
from harness import tasks
from harness.backends.local.tasks import Task
from harness.spec import load
from harness.tasks.base import eos_reward
from harness.tasks.lookup import call, observe, sample
from harness.tasks.vocab import BOS, CALL_END, EOS, EQUALS, PAD

ROOT = Path(__file__).resolve().parents[2]
T = torch.tensor
PROMPTS = T([[BOS, 4, 9, 3, 0, EQUALS], [BOS, 6, 8, 7, 7, EQUALS], [BOS, 1, 1, 1, 1, EQUALS]])


def test_the_call_the_observation_and_the_answer_by_hand():
    # small digits (< 5) in prompt order; f(x) = (3x + 7) mod 10: f(4) = 9, f(3) = 6, f(0) = 7, f(1) = 0
    assert call(PROMPTS).tolist() == [[4, 3, 0, CALL_END, PAD], [CALL_END, PAD, PAD, PAD, PAD], [1, 1, 1, 1, CALL_END]]
    assert observe(PROMPTS, call(PROMPTS)).tolist() == [[9, 6, 7, PAD], [PAD] * 4, [0, 0, 0, 0]]
    prompts, answers = sample(3, 4, torch.Generator().manual_seed(0))
    assert prompts.shape == (3, 6) and answers.shape == (3, 5)
    for p, a in zip(prompts.tolist(), answers.tolist()):
        values = sorted((3 * d + 7) % 10 for d in p[1:-1] if d < 5)
        assert a == values + [EOS] + [PAD] * (4 - len(values))


def test_the_environment_answers_any_call_the_policy_writes():
    calls = T([[EOS, 3, CALL_END, 4, 4], [2, PAD, 1, 1, 1], [9, 8, 7, 6, 5]])  # junk skipped; after CALL_END unread
    assert observe(PROMPTS, calls).tolist() == [[6, PAD, PAD, PAD], [3, 0, 0, 0], [4, 1, 8, 5]]  # at most O = L


def test_the_reward_reads_the_answer_up_to_the_references_eos():
    ref = T([[6, 7, 9, EOS, PAD], [EOS, PAD, PAD, PAD, PAD]])
    resp = T([[6, 7, 9, EOS, PAD], [EOS, PAD, PAD, PAD, PAD]])
    assert eos_reward(resp, ref, "partial")[0].tolist() == [1.0, 1.0]
    early = T([[6, 7, EOS, PAD, PAD], [3, EOS, PAD, PAD, PAD]])  # stops early / does not stop at once
    reward, exact = eos_reward(early, ref, "partial")
    assert reward.tolist() == [0.5, 0.0] and exact.tolist() == [0.0, 0.0]
    late = T([[6, 7, 9, 9, EOS], [EOS, PAD, PAD, PAD, PAD]])
    assert eos_reward(late, ref, "partial")[0].tolist() == [0.75, 1.0]
    assert eos_reward(late, ref, "exact")[0].tolist() == [0.0, 1.0]


def test_the_warm_start_learns_the_policys_tokens_only():
    task = Task(load(["task=lookup"]).task)
    answers = T([[6, 7, 9, EOS, PAD], [EOS, PAD, PAD, PAD, PAD], [0, 0, 0, 0, EOS]])
    response, targets = task.teacher(PROMPTS, answers)
    assert response.tolist()[0] == [4, 3, 0, CALL_END, PAD, 9, 6, 7, PAD, 6, 7, 9, EOS, PAD]
    x = -100
    assert targets.tolist() == [[4, 3, 0, CALL_END, x, x, x, x, x, 6, 7, 9, EOS, x],
                                [CALL_END, x, x, x, x, x, x, x, x, EOS, x, x, x, x],
                                [1, 1, 1, 1, CALL_END, x, x, x, x, 0, 0, 0, 0, EOS]]
    assert task.response_len == 14 and task.multi_turn and not Task(load(["task=sort"]).task).multi_turn


def test_two_steps_end_to_end_through_mlflow_and_verl_refuses_it(tmp_path):
    db = f"sqlite:///{tmp_path}/mlruns.db"
    args = ["task=lookup", "trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4",
            "trainer.num_minibatches=2", "diagnostics.noise_sequences=4", "task.warmstart.max_steps=10",
            "estimator=tis", "estimator.clip_c=2", "estimator.level=sequence", f"tracking.uri={db}",
            "tracking.experiment=lookup", f"out_dir={tmp_path}/run"]
    res = subprocess.run([sys.executable, "-m", "harness.run", *args], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "finished after 2 steps" in res.stdout.strip().splitlines()[-1], res.stdout
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("lookup").experiment_id])
    assert run.data.tags["spec_sig"] == load(args).signature and run.data.params["task.name"] == "lookup"
    for key in (k for k in M.CATALOGUE if k not in M.KL_HELD_ONLY):  # a KL-held run's only (kl_control.py)
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0, 1], key
    res = subprocess.run([sys.executable, "-m", "harness.run", "backend=verl", "task=lookup", "model=qwen3_30b_a3b",
                          "trainer.lr=1e-6", f"tracking.uri={db}", "--dry-run"], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 2 and res.stderr.startswith("error: task:") and "'lookup'" in res.stderr, res.stderr
    assert "lookup" in tasks.names("local") and "lookup" not in tasks.names("verl")
