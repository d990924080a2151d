# The two commands of the README. Both install into .venv first (scripts/install.sh).
PY := .venv/bin/python

.PHONY: install install-test demo test probe bench bench-overlap results study study-v4 study-v4-b stress bench-quoted calibrated agentic ablation20 clean verl-smoke verl-smoke-multi-turn verl-pass-variance gpu-engine-check gpu-engine-check-wheels gpu-wheels verl-image verl-sif

install:
	bash scripts/install.sh

install-test:
	bash scripts/install.sh test

# `make demo DEVICE=cuda`: the same sweep on a GPU, the 2 seeds of each estimator trained as one seed pack per job
DEVICE ?= cpu
DEMO_DEVICE := $(if $(filter cpu,$(DEVICE)),,backend.device=$(DEVICE) launcher.seeds_per_job=2)
demo: install
	$(PY) -m harness.sweep sweeps/demo.yaml launcher=local --wait $(DEMO_DEVICE)
	$(PY) -m analysis report --experiment demo

test: install-test
	$(PY) -m pytest

probe: install
	$(PY) -m harness.probe

# Issue 31's confirmatory study (docs/preregistration.md): the noise calibration, the regime pilot, the two
# pre-registered conditions in blocks of 4 seeds (scripts/run_study_v3.sh, nice 19; finished runs are skipped, so a
# rerun resumes), their reports and their per-step histories (the metrics the verdicts and the conservative-update
# control read: a report from the file, `--from`, gives the same verdicts; docs/results/v3_*/histories.json.gz).
V3_METRICS := moe/replay_coverage,reward/mean,reward/accuracy,policy/loss,time/step_s,is/masked_frac,policy/clipfrac,policy/update_norm,policy/grad_norm,policy/approx_kl,mismatch/k3,mismatch/rec_k3,mismatch/abs_diff,noise/var_rollout,moe/routing_flip_rate,is/weight_max,perturb/level
study: install
	$(PY) scripts/calibrate_sparse_noise.py --out docs/results/noise_v3/calibration.csv > docs/results/noise_v3/calibration.txt
	$(PY) -m harness.sweep sweeps/pilot_v3.yaml launcher=local --wait
	$(PY) -m analysis report --experiment pilot_v3 --out docs/results/pilot_v3
	bash scripts/run_study_v3.sh
	for e in v3_sparse v3_bias v3_engines; do \
	  $(PY) -m analysis report --experiment $$e --x n --out docs/results/$$e && \
	  $(PY) -m analysis export --experiment $$e --metrics $(V3_METRICS) --out docs/results/$$e/histories.json.gz; \
	done
	$(PY) scripts/conservative_control.py docs/results/v3_sparse docs/results/v3_bias > docs/results/conservative_control.txt
	$(PY) scripts/v3_primary.py docs/results/v3_sparse docs/results/v3_bias --out docs/results/v3_primary
	$(PY) -m analysis readme README.md && $(PY) -m analysis readme docs/results.md  # the tables quoted there

# Issue 42's science v4 (docs/preregistration_v4.md): stage A's hazard map in blocks of 4 seeds and the declared
# positive control (finished runs skipped, interrupted ones resumed), the noise calibration along training, then the
# map's rule, the control's verdict and both experiments' per-step histories. Stage B follows an amendment naming
# stage A's cell: scripts/v4_stage_b.py writes its sweep (on a GPU: benchmarks/gpu_study.sh).
# V4_METRICS: one home, the script that archives stage A's parts; v4_map's histories are those parts
# (docs/results/v4_map/parts: `analysis hazard --from` reads the folder)
V4_METRICS := $(shell bash scripts/run_study_v4.sh --metrics)
study-v4: install
	$(PY) -m analysis restore --dir docs/results/v4_positive/histories.json.gz  # the control's committed runs: not retrained
	nice -n 5 $(PY) -m harness.sweep sweeps/v4_positive.yaml launcher=local --wait
	bash scripts/run_study_v4.sh
	$(PY) scripts/calibrate_along.py --out docs/results/v4_calibration
	$(PY) -m analysis survival --experiment v4_positive --horizon 300 --pair "recompute|mean_n(n=8)" --out docs/results/v4_positive
	$(PY) -m analysis hazard --from docs/results/v4_map/parts --horizon 1500 --out docs/results/v4_map
	$(PY) -m analysis export --experiment v4_positive --metrics $(V4_METRICS) --out docs/results/v4_positive/histories.json.gz

# Stage B, once stage A's rule chose its cell and an amendment names it: `scripts/v4_stage_b.py` writes
# sweeps/v4_stage_b.yaml (commit it before the first run), then this trains it (across working sessions: parts in
# docs/results/v4_stage_b/parts) and runs the survival verdicts its header declares.
study-v4-b: install
	STAGE=b bash scripts/run_study_v4.sh
	STAGE=b PYTHON=$(PY) bash scripts/run_study_v4.sh --verdicts

# Everything the README and docs/results.md quote: the study (above), the numerics-3 stress tests (below), the
# agentic section and the overlap benchmark behind the README's cost ratios (benchmarks/README.md).
results: study stress agentic bench-overlap bench-quoted

# the other step costs the README quotes: the pinned numerics' cost (recompute and mean_n(8)) and the seed-pack
# scaling with its operator counts (docs/speed.md)
bench-quoted: install-test
	$(PY) benchmarks/numerics_cost.py
	$(PY) benchmarks/numerics_cost.py estimator=mean_n estimator.n=8
	$(PY) benchmarks/pack_scaling.py --device cpu --packs 1 8 --quick

# docs/results.md, regenerated end to end (issues 6 and 15): the noise probes; issue 15's four sweeps at
# KwaiKAT-calibrated noise (router sigma 0.1): the headline (every estimator), mean_n's n-sweep, the sampler arms
# (raw vs processed log-probs) and the noise-vs-bias dose-response, fixed and KL-held along training; the sigma = 1 stress arm (the ablation, 10 seeds,
# and its n-sweep, 5 seeds); the reports under docs/results/ and docs/results.md's generated tables. Runs already finished
# in the store are skipped, so a rerun only fills what is missing. Every sweep also runs on Slurm (launcher=slurm).
# Wall time from an empty store on 2 cores: docs/results.md, "Its cost is not met" (~5 h 10 min).
PROBE := $(PY) -m harness.probe tracking.experiment=noise_probe
stress: install
	$(PROBE)
	$(PROBE) inference.router_noise_sigma=0.1
	$(PROBE) inference.router_noise_sigma=0
	$(PROBE) inference.router_noise_sigma=0 model.n_layers=4
	$(PROBE) inference.router_noise_sigma=0 model.n_layers=8
	$(PY) -m harness.sweep sweeps/calibrated.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/n_calibrated.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/sampler.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/dose.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/kl_held.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/ablation.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/n_sweep.yaml launcher=local --wait
	$(PY) -m analysis report --experiment noise_probe --out docs/results/noise_probe
	$(PY) -m analysis report --experiment calibrated --x n --out docs/results/calibrated
	$(PY) -m analysis report --experiment sampler --group-by inference.logprobs_mode --out docs/results/sampler
	$(PY) -m analysis report --experiment dose --group-by perturbation --out docs/results/dose
	$(PY) -m analysis dose --experiment dose --out docs/results/dose
	$(PY) -m analysis report --experiment kl_held --group-by perturbation --out docs/results/kl_held
	$(PY) -m analysis dose --experiment kl_held --out docs/results/kl_held
	$(PY) scripts/equal_kl.py --sigmas 0.05,0.1,0.2 --deltas 0.9,0.8,0.7 > docs/results/dose/equal_kl.txt
	for s in 0.1 0.3 1.0; do $(PY) scripts/equal_kl.py --sigmas "" --deltas "" inference.router_noise_sigma=$$s; done >> docs/results/dose/equal_kl.txt
	$(PY) -m analysis report --experiment ablation --x n --out docs/results/ablation_v2
	$(PY) scripts/pilot_seeds.py > docs/results/pilot_seeds.md
	$(PY) -m analysis readme docs/results.md

bench: install-test
	$(PY) benchmarks/rollout_speed.py

# issue 17: seconds per step of mean_8 and recompute, synchronous and with trainer.overlap (a rollout process),
# and in a thread for comparison; the ratios mean_8 / recompute (benchmarks/README.md). OVERLAP_ARGS: more options.
OVERLAP_ARGS ?=
bench-overlap: install
	$(PY) benchmarks/overlap.py --modes sync,process,thread $(OVERLAP_ARGS)

# issue 15's headline alone: every estimator at router noise 0.1 (KwaiKAT's var_rollout) and mean_n's n-sweep
# x 10 seeds in packs of 5 (sweeps/calibrated.yaml, sweeps/n_calibrated.yaml), then its report (docs/results/calibrated).
calibrated: install
	$(PY) -m harness.sweep sweeps/calibrated.yaml launcher=local --wait
	$(PY) -m harness.sweep sweeps/n_calibrated.yaml launcher=local --wait
	$(PY) -m analysis report --experiment calibrated --x n --out docs/results/calibrated

# issue 17: R3 at replay coverage 1.0/0.9/0.7/0.5 beside mean_8 and recompute on the multi-turn lookup task x 10
# seeds (sweeps/agentic.yaml, ~50 min on 2 quiet cores), its report (docs/results/agentic) and docs/results.md's tables.
agentic: install
	$(PY) -m harness.sweep sweeps/agentic.yaml launcher=local --wait
	$(PY) -m analysis report --experiment agentic --group-by inference.prefix_cache_capacity --out docs/results/agentic
	$(PY) -m analysis readme docs/results.md

# 10 estimators x 20 seeds (200 runs x 300 steps) in seed packs of 5 (sweeps/ablation20.yaml, issue 13),
# then its report. benchmarks/rollout_speed.py prints the wall-time estimate for this machine.
ablation20: install
	$(PY) -m harness.sweep sweeps/ablation20.yaml launcher=local --wait
	$(PY) -m analysis report --experiment ablation20 --out docs/results/ablation20

# verl on a GPU box with vLLM (pip install -e '.[cluster]'); never in CI, not yet run by the project.
# One training step per estimator with a tiny random Qwen3-MoE (docs/verl.md, "GPU checks").
verl-smoke:
	$(PY) scripts/verl_smoke.py
# The same step with verl.tools (verl's ToolAgentLoop; mean_n: harness_mean_n_tool): the multi-turn wiring.
verl-smoke-multi-turn:
	$(PY) scripts/verl_smoke.py --multi-turn
# mean_n's vLLM re-scoring passes: pass-to-pass spread, concurrent vs sequential (MODEL=..., TP=...).
MODEL ?= Qwen/Qwen3-30B-A3B
TP ?= 4
verl-pass-variance:
	$(PY) scripts/verl_pass_variance.py --model $(MODEL) --tp $(TP)

# The container route (docs/verl.md, "Container route"): verl's pinned image + the harness, on a machine with docker
# or apptainer and network; the commit is baked in (BUILD_COMMIT: the image has no .git); the build ends with the
# install check (harness/backends/verl/requirements.py), exit 1 naming a gap.
HARNESS_COMMIT ?= $(shell git rev-parse HEAD)$(shell git diff --quiet HEAD || echo -dirty)
verl-image:
	docker build -f containers/Dockerfile --build-arg HARNESS_COMMIT=$(HARNESS_COMMIT) -t moe-rl-harness:verl091 .
verl-sif:
	apptainer build --build-arg HARNESS_COMMIT=$(HARNESS_COMMIT) moe-rl-harness.sif containers/harness.def

# issue 30 item 8: verl's FSDP2 engine with our plugins on a tiny random Qwen3-MoE, one process, no vLLM, no Ray
# (docs/verl.md, "GPU engine check"); CUDA where available, else CPU (gloo). CHECK_ARGS: e.g. --out check.json
CHECK_ARGS ?=
gpu-engine-check:
	.venv/bin/torchrun --standalone --nproc_per_node=1 scripts/gpu_engine_check.py $(CHECK_ARGS)
# the wheels it needs on a GPU machine without network (Python 3.12, torch from the machine), into .whl/
GPU_CHECK_WHEELS := verl==0.9.1 hydra-core==1.3.8 omegaconf==2.3.1 tensordict==0.10.0 pyvers==0.1.0 orjson==3.13.0 \
	codetiming==1.4.0 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 pydantic==2.14.4 pydantic-core==2.50.5 \
	typing-inspection==0.4.5 annotated-types==0.8.0 cachetools==7.3.3 transformers==5.10.4 tokenizers==0.22.2 \
	regex==2026.11.19 typing-extensions==4.16.0
gpu-engine-check-wheels:
	$(PY) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_CHECK_WHEELS)
	$(PY) -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3  # sdist only on PyPI (pure Python)

# issue 41: the wheels a bare GPU machine lacks for the study pipeline (benchmarks/gpu_study.sh: MLflow's tracking
# client and sqlite store, Hydra, submitit, ruptures and their dependencies), resolved together for Python $(PYVER),
# into .whl/study-cp<ver>; what such a machine has (torch, numpy, scipy, pandas, ...) is left out. ~20 MiB for 3.12.
PYVER ?= 3.12
STUDY_WHEELS := mlflow-skinny==3.17.2 sqlalchemy==2.1.9 alembic==1.20.1 hydra-core==1.3.8 omegaconf==2.3.1 \
	antlr4-python3-runtime==4.9.3 submitit==1.5.4 ruptures==1.1.10
STUDY_DIR := .whl/study-cp$(subst .,,$(PYVER))
gpu-wheels:
	mkdir -p $(STUDY_DIR)
	$(PY) -m pip wheel -q --no-deps -w $(STUDY_DIR) antlr4-python3-runtime==4.9.3  # sdist only on PyPI (pure Python)
	$(PY) -m pip download -q --only-binary=:all: --python-version $(PYVER) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --find-links $(STUDY_DIR) -d $(STUDY_DIR) $(STUDY_WHEELS)
	rm -f $(STUDY_DIR)/numpy-* $(STUDY_DIR)/scipy-*  # the bare machine has them (and they are 50 MiB)
	du -sh $(STUDY_DIR); ls $(STUDY_DIR) | wc -l

clean:
	rm -rf runs figures .cache/warmstart
