"""One training step of the verl backend per estimator, with a tiny random Qwen3-MoE (``make verl-smoke``).

For a machine with a GPU, vLLM and the cluster extra (``pip install -e '.[cluster]'``). It has NOT
been run by the project yet (no GPU, no vLLM where it was written): it is the first thing to run on
a GPU box. Per estimator it runs the real path end to end, ``python -m harness.run backend=verl
... trainer.steps=1`` (preflight, MLflow run, verl's legacy trainer, vLLM rollout, one update), on
one GPU, and prints one line per estimator; the exit status is the number of failures.

The tiny model (2 layers, 8 experts, top-2, a word-level tokenizer with a chat template) and the
sort data are written under --work; nothing is downloaded. The estimators are those of the registry with
a verl mapping (``harness.estimators``); one that replays routing (r3) uses verl's megatron engine (TP1,
EP1), every other one the FSDP2 preset (rais: our router patch, plugins/rais_fsdp.py).

    python scripts/verl_smoke.py [--estimators tis,mis] [--work runs/verl_smoke] [--gpus 1] [--multi-turn]

``--multi-turn`` (``make verl-smoke-multi-turn``) runs the same step with ``verl.tools`` set (our example tool
file): verl's ToolAgentLoop, mean_n's ``harness_mean_n_tool``, the tools loaded in verl's agent-loop workers.
Each line then also says ``num_turns_max`` (verl's ``num_turns/max`` from the MLflow run): the random model
hardly ever emits a hermes tool call, so it checks the wiring on a GPU, not a tool conversation (docs/verl.md,
"multi-turn mean_n"). Estimators refused with tools (deterministic: its seeded loop is single-turn) are left out.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import estimators as registry  # noqa: E402  (after the sys.path line: runs from a checkout)

ESTIMATORS = tuple(e for e in registry.NAMES if registry.get(e).verl is not None)
MULTI_TURN = ("verl.tools=harness/backends/verl/tools.py",)
WORDS = ("sort these digits in ascending order write the sorted separated by spaces think briefly then output "
         "final answer after #### . : \" , 0 1 2 3 4 5 6 7 8 9").split()


def tiny_model(out: Path) -> Path:
    """A random 2-layer Qwen3-MoE checkpoint with a word-level tokenizer (no download)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from harness.backends.verl.tokenizer import write_word_tokenizer

    if (out / "config.json").exists():
        return out
    write_word_tokenizer(out, WORDS)
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         num_experts=8, num_experts_per_tok=2, max_position_embeddings=2048,
                         architectures=["Qwen3MoeForCausalLM"])
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def run_name(estimator: str, multi_turn: bool = False) -> str:
    return f"{estimator}-multi_turn" if multi_turn else estimator


def overrides(estimator: str, model: Path, work: Path, gpus: int, multi_turn: bool = False) -> list[str]:
    common = ["backend=verl", f"estimator={estimator}", f"model.path={model}", "task=sort", "task.length=3",
              f"verl.data.root={work / 'data'}", f"out_dir={work / 'runs' / run_name(estimator, multi_turn)}",
              f"tracking.uri=sqlite:///{work / 'mlruns.db'}", "tracking.experiment=verl_smoke",
              "trainer.steps=1", "trainer.prompts_per_step=4", "trainer.group_size=2", "trainer.num_minibatches=1",
              "trainer.lr=1e-6", "trainer.checkpoint_every=0", f"verl.gpus_per_node={gpus}",
              "verl.data.max_prompt_length=64", "verl.data.max_response_length=16",
              "verl.parallel.rollout_tp=1", "verl.parallel.gpu_memory_utilization=0.3",
              "verl.parallel.max_token_len_per_gpu=2048", *(MULTI_TURN if multi_turn else ())]
    needs = registry.get(estimator).needs
    if needs.replay or registry.get(estimator).verl.router_replay:  # Megatron's router replay (R3, R2)
        return [*common, "model=qwen3_30b_a3b", "verl.parallel.tp=1", "verl.parallel.ep=1", "verl.parallel.etp=1",
                "verl.parallel.cpu_adam=false"]
    extra = ["estimator.n=2"] if "n" in registry.get(estimator).param_names() else []  # fewer passes, for one GPU
    # the smoke runs the experimental paths too (verl.experimental_rais: read by rais's verl check only)
    return [*common, "model=qwen3_30b_a3b_fsdp", "verl.parallel.cpu_adam=false", "verl.experimental_rais=true",
            *extra]


def multi_turn_estimators(work: Path) -> list[str]:
    """The estimators whose spec the verl backend accepts with ``verl.tools`` (the others exit 2 by design)."""
    from harness.backends.verl.config import validate
    from harness.spec import load
    from harness.errors import ConfigError

    ok = []
    for est in ESTIMATORS:
        try:
            validate(load(overrides(est, work / "model", work, 1, multi_turn=True)))
        except ConfigError:
            continue
        ok.append(est)
    return ok


def num_turns_max(run_dir: Path, uri: str) -> float | None:
    """verl's ``num_turns/max`` of the smoke's MLflow run (None when the run logged none)."""
    from mlflow.tracking import MlflowClient

    from harness.backends.verl.runner import RUN_ID_FILE

    try:
        history = MlflowClient(uri).get_metric_history((run_dir / RUN_ID_FILE).read_text().strip(), "num_turns/max")
    except Exception:  # noqa: BLE001  (no run id file, no such run: the run failed before MLflow)
        return None
    return max((m.value for m in history), default=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "verl_smoke"))
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--multi-turn", action="store_true", help="with verl.tools (our example tool file)")
    ap.add_argument("--estimators", dest="estimators")
    args = ap.parse_args(argv)
    work = Path(args.work).resolve()
    mt = args.multi_turn
    allowed = multi_turn_estimators(work) if mt else list(ESTIMATORS)
    estimators = [e for e in (args.estimators or ",".join(allowed)).split(",") if e]
    unknown = [e for e in estimators if e not in allowed]
    if unknown:
        print(f"error: unknown estimator(s) {unknown}; allowed: {', '.join(allowed)}", file=sys.stderr)
        return 2
    from harness.backends.verl.data import prepare

    model = tiny_model(work / "tiny_qwen3_moe")
    prepare("sort", root=work / "data", length=3, n_train=64, n_test=8)
    failed = 0
    for est in estimators:
        t0 = time.time()
        # a fresh run each time: the fixed out_dir keeps the last smoke's summary (the runner then returns at
        # once and the smoke reports ok without running verl), MLflow run id and commit, whatever changed since
        name = run_name(est, mt)
        shutil.rmtree(work / "runs" / name, ignore_errors=True)
        argv_ = [sys.executable, "-m", "harness.run", *overrides(est, model, work, args.gpus, mt)]
        proc = subprocess.run(argv_, cwd=ROOT, capture_output=True, text=True)
        log = work / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        ok = proc.returncode == 0
        failed += not ok
        line = {"estimator": est, "ok": ok, "rc": proc.returncode, "seconds": round(time.time() - t0, 1),
                "log": str(log)}
        if mt:
            line["num_turns_max"] = num_turns_max(work / "runs" / name, f"sqlite:///{work / 'mlruns.db'}")
        print(json.dumps(line), flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
