# The two commands of the README. Both install into .venv first (scripts/install.sh).
PY := .venv/bin/python

.PHONY: install install-test demo test probe bench clean

install:
	bash scripts/install.sh

install-test:
	bash scripts/install.sh test

demo: install
	$(PY) -m harness.sweep sweeps/demo.yaml launcher=local --wait
	$(PY) -m analysis report --experiment demo

test: install-test
	$(PY) -m pytest

probe: install
	$(PY) -m harness.probe

bench: install-test
	$(PY) benchmarks/rollout_speed.py

clean:
	rm -rf runs figures .cache/warmstart
