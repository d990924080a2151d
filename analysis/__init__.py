"""Analysis of harness runs: MLflow runs -> per-run curves -> collapse onset, convergence ->
across-seed confidence intervals -> figures, tables and a report.

MLflow is the only bridge to the harness: this package imports nothing from ``harness`` but the
metric-name catalogue (``harness.metrics``), so it works on runs made by any backend, or by anyone
who logs the same metric names and run tags.

Modules (one concept each)::

    config    AnalysisConfig: every analysis parameter, printed under every table
    load      MLflow experiment -> Experiment (runs, labels, full metric histories, probe runs)
    histories an experiment's runs and full histories <-> one .json.gz file (`export`, `report --from`)
    measures  per-run definitions: smoothing, collapse onset, change point, convergence, peak/final/AUC
    stats     across-seed statistics: IQM, stratified bootstrap CIs, probability of improvement,
              Kaplan-Meier survival, Wilson intervals
    palette   one colour / line style per estimator, shared by every figure
    figures   matplotlib figures (PNG + PDF)
    tables    tables as markdown, CSV and LaTeX (booktabs)
    report    `python -m analysis report`: everything above into figures/<experiment>/ + report.md
    compare   `python -m analysis compare`: probability of improvement between two groups
    synthetic synthetic curves / experiments with known answers (tests, benchmark, demos)

Heavy imports (mlflow, matplotlib) happen inside the modules that need them, never here, so that
``python -m analysis --help`` stays fast.
"""
from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
