"""Command line: ``python -m analysis {report,dose,hazard,survival,compare,export,archive,restore,list,params,readme,validate} ...``.

Exit status: 0 success, 2 a problem the user can fix (unknown experiment or group, bad option), 1 an
unexpected error. Heavy modules (mlflow, matplotlib, pandas) are imported only once a command runs,
so ``--help`` is instant.
"""
from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  python -m analysis report --experiment ablation
  python -m analysis report --experiment ablation --x n   # the n-sweep logs into the ablation experiment
  python -m analysis dose --experiment dose --out docs/results/dose   # collapse vs KL along training, per arm
  python -m analysis hazard --experiment v4_map --horizon 1500 --out docs/results/v4_map   # stage A's map + rule
  python -m analysis survival -e v4_positive --horizon 300 --pair "recompute|mean_n(n=8)"  # time-to-collapse verdicts
  python -m analysis compare --experiment ablation --a mean_n --b tis
  python -m analysis export --experiment ablation --out docs/results/ablation.json.gz   # runs + full histories
  python -m analysis report --from docs/results/ablation.json.gz   # the same report, no MLflow store
  python -m analysis archive -e v4_map --dir docs/results/v4_map/parts --metrics reward/mean,policy/loss  # new part
  python -m analysis restore --dir docs/results/v4_map/parts   # a new checkout's store gets the archived runs back
  python -m analysis list
  python -m analysis params            # the definitions and their defaults
  python -m analysis readme docs/results.md  # refill the results' generated tables from docs/results/
  python -m analysis validate          # the collapse detector on labelled curves (synthetic + analysis/labelled)
  python -m analysis report -e calibrated --primary "recompute|mean_n(n=8)" --primary "trend:mean_n over n"
  python -m analysis power --p1 0.5 --p2 0.1                  # seeds per arm for 80% power (McNemar, paired)
  python -m analysis power --delta 0.8 --family 10            # ... for a reward shift of 0.8 sd, 10 tests
  python -m analysis verdicts --runs docs/results/calibrated/runs.csv --trend "mean_n(n=*)"   # from a committed table
"""


FROM_HELP = ("an exported histories file (`python -m analysis export`), or a folder of archived parts "
             "(`python -m analysis archive`), read instead of the store")


def _source(p: argparse.ArgumentParser, experiment_help: str = "MLflow experiment name") -> None:
    """Exactly one of --experiment (the store) and --from (an exported histories file)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--experiment", "-e", default=None, help=experiment_help)
    src.add_argument("--from", dest="source", default=None, metavar="FILE|DIR", help=FROM_HELP)


def _common(p: argparse.ArgumentParser) -> None:
    _source(p)
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")
    p.add_argument("--filter", default=None, dest="filter_string",
                   help="MLflow search filter on the runs, e.g. \"tags.task = 'sort'\"")
    p.add_argument("--group-by", action="append", default=[], metavar="KEY",
                   help="a run tag or any logged param (e.g. perturbation, trainer.lr): its value in every label "
                        "and a table pooled per value (repeatable)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="keep runs that are not FINISHED (default: left out and listed in a note)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override an analysis parameter (repeatable; see `params`)")
    p.add_argument("--config", default=None, help="YAML file of analysis parameters")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Analyse harness runs in MLflow: collapse onset, convergence, CIs over seeds, figures.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    _report_parser(sub)
    _power_parser(sub)
    _verdicts_parser(sub)
    _dose_parser(sub)
    _survival_parsers(sub)
    _other_parsers(sub)
    _archive_parsers(sub)
    return ap


def _report_parser(sub) -> None:
    rp = sub.add_parser("report", help="tables, figures (PNG+PDF) and report.md for one experiment")
    _common(rp)
    rp.add_argument("--x", default=None, metavar="KEY",
                    help="the sweep axis to feature: an estimator knob (n, clip_c, estimator.<knob>) or any spec key "
                         "the runs differ in (trainer.lr, inference.kl_target): its table, figure and trend families")
    rp.add_argument("--out", default=None, help="output folder (default: <project>/figures/<experiment>, the name made a plain folder name)")
    rp.add_argument("--no-log", action="store_true", help="do not log the report as a summary MLflow run")
    rp.add_argument("--primary", action="append", default=[], metavar="A|B or trend:FAMILY",
                    help="a primary contrast declared before the runs: two group labels 'A|B', or 'trend:<family> over "
                         "<x>' (repeatable); tested first, Holm among themselves, the rest exploratory")


def _power_parser(sub) -> None:
    pw = sub.add_parser("power", help="seeds per arm for a given power, computed for the report's own tests")
    pw.add_argument("--p1", type=float, default=None, help="collapse rate of one arm")
    pw.add_argument("--p2", type=float, default=None, help="collapse rate of the other arm")
    pw.add_argument("--delta", type=float, default=None,
                    help="instead of rates: a paired final-reward shift in sd of the per-seed differences (Wilcoxon)")
    pw.add_argument("--unpaired", action="store_true", help="groups that do not share seeds (Fisher exact)")
    pw.add_argument("--family", type=int, default=1, help="tests in the family (Holm: first step at alpha/family)")
    pw.add_argument("--alpha", type=float, default=0.05)
    pw.add_argument("--power", type=float, default=0.8, dest="target")
    pw.add_argument("--seeds", type=int, default=None, help="instead of solving for seeds: the power at this many")


def _verdicts_parser(sub) -> None:
    vd = sub.add_parser("verdicts", help="the report's verdicts from a per-run table (runs.csv) alone, no store")
    vd.add_argument("--runs", required=True, help="a report's runs.csv (label, seed, collapsed, final, auc, ...)")
    vd.add_argument("--primary", action="append", default=[], metavar="A|B or trend:PATTERN",
                    help="a primary contrast: two group labels 'A|B', or a trend named by its --trend pattern")
    vd.add_argument("--trend", action="append", default=[], metavar="PATTERN",
                    help="an ordered family to trend-test: the labels with one '*' for the level, e.g. 'mean_n(n=*)', "
                         "'recompute[router=*];recompute[none]=0' (a control arm at level 0)")
    vd.add_argument("--versus", default=None, metavar="LABEL",
                    help="compare every group against this one only (a many-to-one family), not every pair")
    vd.add_argument("--out", default=None, help="write verdicts.md|csv|tex and separation.md|csv|tex here")
    vd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    vd.add_argument("--config", default=None)


def _dose_parser(sub) -> None:
    dp = sub.add_parser("dose", help="dose-response: collapse rate per perturbation arm against the KL along training")
    _source(dp, "MLflow experiment name (e.g. dose)")
    dp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")
    dp.add_argument("--filter", default=None, dest="filter_string",
                    help="MLflow search filter, e.g. \"tags.estimator = 'recompute'\" (one estimator per dose table)")
    dp.add_argument("--include-unfinished", action="store_true",
                    help="keep runs that are not FINISHED (default: left out and listed in a note)")
    dp.add_argument("--edge", type=int, default=50, help="steps at each end of a run for 'k3 first/last' (default 50)")
    dp.add_argument("--out", default=None, help="output folder (default: <project>/figures/<experiment>, the name made a plain folder name)")
    dp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="override an analysis parameter (repeatable; see `params`)")
    dp.add_argument("--config", default=None, help="YAML file of analysis parameters")


def _horizon_options(p: argparse.ArgumentParser) -> None:
    """The options of hazard and survival: the experiment's source, the horizon, the store, filter and folder, and
    the analysis parameters."""
    _source(p)
    p.add_argument("--horizon", type=float, required=True, help="the last scored step H (steps after it: the unscored tail)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")
    p.add_argument("--filter", default=None, dest="filter_string", help="MLflow search filter on the runs")
    p.add_argument("--include-unfinished", action="store_true",
                   help="keep runs that are not FINISHED (default: left out and listed in a note)")
    p.add_argument("--out", default=None, help="output folder (default: <home>/figures/<experiment>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override an analysis parameter (repeatable; see `params`)")
    p.add_argument("--config", default=None, help="YAML file of analysis parameters")


def _survival_parsers(sub) -> None:
    """hazard and survival: time to collapse with an unscored tail (science v4, docs/preregistration_v4.md)."""
    hz = sub.add_parser("hazard", help="hazard map: collapse by a horizon per (kl_target dose, lr) cell, KM, the "
                        "stage A selection rule (docs/preregistration_v4.md)")
    _horizon_options(hz)
    sv = sub.add_parser("survival", help="time to collapse per arm and for declared pairs: seed-stratified log-rank "
                        "(Holm over the pairs), Cox HR, RMST, McNemar (docs/preregistration_v4.md)")
    _horizon_options(sv)
    sv.add_argument("--pair", action="append", default=[], metavar="A|B",
                    help="a declared pair of group labels, e.g. \"recompute|mean_n(n=8)\" (repeatable: one family)")
    sv.add_argument("--interaction", default=None, metavar="A|B",
                    help="two estimator arms (label part before '[') run at several doses (inference.kl_target): the "
                         "dose x estimator interaction joins the family; critical doses and their ratio beside")


def _archive_parsers(sub) -> None:
    """archive, restore (analysis/archive.py)."""
    ap = sub.add_parser("archive", help="write an experiment's finished runs that no part in --dir holds yet as the "
                        "next part (histories that travel in git; analysis/archive.py)")
    ap.add_argument("--experiment", "-e", required=True, help="MLflow experiment name")
    ap.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")
    ap.add_argument("--dir", required=True, help="the experiment's folder of parts, e.g. docs/results/v4_map/parts")
    ap.add_argument("--metrics", required=True, help="comma-separated metric names the parts keep")
    rp = sub.add_parser("restore", help="write the runs of --dir's parts that the store lacks into it (a sweep then "
                        "skips them)")
    rp.add_argument("--dir", required=True, metavar="DIR|FILE",
                    help="a folder of parts written by `archive`, or one histories file written by `export`")
    rp.add_argument("--marks", action="store_true", help="tags and params only (fast): enough for a sweep to skip "
                    "the runs; the analysis reads their histories from the parts (--from DIR)")
    rp.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")


def _other_parsers(sub) -> None:
    """compare, export, list, params, readme, validate, export-curves."""
    cp = sub.add_parser("compare", help="probability of improvement and CIs between two groups")
    _common(cp)
    cp.add_argument("--a", required=True, help="group label or estimator name (e.g. mean_n or 'mean_n(n=8)')")
    cp.add_argument("--b", required=True, help="group label or estimator name")
    ep = sub.add_parser("export", help="write an experiment's runs and full per-step histories to one .json.gz file")
    ep.add_argument("--experiment", "-e", required=True, help="MLflow experiment name")
    ep.add_argument("--tracking-uri", default=None,
                    help="MLflow tracking URI (default: sqlite:///<project root>/mlruns.db)")
    ep.add_argument("--out", required=True, help="file ending in .json.gz, e.g. docs/results/ablation.json.gz")
    ep.add_argument("--metrics", default=None, help="comma-separated metric names to keep (default: every metric "
                    "any run logged); the file then says it is not complete")
    lp = sub.add_parser("list", help="list the experiments and groups in a tracking store")
    lp.add_argument("--tracking-uri", default=None)
    lp.add_argument("--experiment", "-e", default=None, help="list this experiment's groups")
    sub.add_parser("params", help="print the analysis parameters and definitions")
    mp = sub.add_parser("readme", help="refill a Markdown file's `<!-- generated: TABLE.md -->` blocks from report tables")
    mp.add_argument("file", nargs="?", default="docs/results.md")
    mp.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    vp = sub.add_parser("validate", help="precision, recall and onset error of the collapse detector on labelled curves")
    vp.add_argument("--n", type=int, default=None, help="synthetic curves (default 1200)")
    vp.add_argument("--seed", type=int, default=None, help="seed of the synthetic set (default 12)")
    vp.add_argument("--no-cp", action="store_true", help="skip the change-point estimate (faster)")
    vp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="override an analysis parameter (repeatable; see `params`)")
    vp.add_argument("--config", default=None, help="YAML file of analysis parameters")
    xp = sub.add_parser("export-curves", help="write an experiment's reward curves as <set>_curves.csv (to label by eye)")
    xp.add_argument("--experiment", "-e", required=True)
    xp.add_argument("--tracking-uri", default=None)
    xp.add_argument("--out", required=True, help="path ending in _curves.csv, e.g. analysis/labelled/own_curves.csv")


def _config(args):
    from .config import AnalysisConfig

    cfg = AnalysisConfig.from_yaml(args.config) if getattr(args, "config", None) else AnalysisConfig()
    return AnalysisConfig.from_overrides(getattr(args, "overrides", []) or [], cfg)


def parse_primary(items: list[str]) -> list[tuple]:
    """``A|B`` -> ("A", "B"); ``trend:F`` -> ("trend", "F"); anything else is exit 2."""
    from .config import ConfigError

    out = []
    for item in items:
        if item.startswith("trend:") and item[6:].strip():
            out.append(("trend", item[6:].strip()))
        elif item.count("|") == 1 and all(x.strip() for x in item.split("|")):
            out.append(tuple(x.strip() for x in item.split("|")))
        else:
            raise ConfigError(f"--primary {item!r}: write two group labels as 'A|B' or a trend as 'trend:<family> "
                              "over <x>' (the labels of `python -m analysis list -e EXPERIMENT`)")
    return out


def cmd_report(args) -> int:
    from .report import build_report

    build_report(args.experiment, args.tracking_uri, args.out, _config(args), x=args.x,
                 filter_string=args.filter_string, group_by=args.group_by, log_to_mlflow=not args.no_log,
                 include_unfinished=args.include_unfinished, source=args.source,
                 primary=parse_primary(args.primary))
    return 0


def cmd_power(args) -> int:
    from .power import cli

    return cli(args)


def cmd_verdicts(args) -> int:
    from .verdict_tables import verdicts_from_runs

    return verdicts_from_runs(args.runs, _config(args), parse_primary(args.primary), args.trend, args.out,
                              args.versus)


def cmd_dose(args) -> int:
    from .dose import build_dose

    build_dose(args.experiment, args.tracking_uri, args.out, _config(args), filter_string=args.filter_string,
               include_unfinished=args.include_unfinished, edge=args.edge, source=args.source)
    return 0


def cmd_hazard(args) -> int:
    from .hazard import build_hazard

    build_hazard(args.experiment, args.tracking_uri, args.out, _config(args), args.horizon, source=args.source,
                 include_unfinished=args.include_unfinished, filter_string=args.filter_string)
    return 0


def cmd_survival(args) -> int:
    from .survival_verdicts import build_survival

    build_survival(args.experiment, args.tracking_uri, args.out, _config(args), args.horizon, args.pair,
                   source=args.source, include_unfinished=args.include_unfinished, filter_string=args.filter_string,
                   interaction=args.interaction)
    return 0


def cmd_compare(args) -> int:
    from .compare import compare_table, resolve_group
    from .histories import open_experiment
    from .measures import measure_experiment

    cfg = _config(args)
    exp = open_experiment(args.experiment, args.tracking_uri, args.source, metrics=(cfg.reward_metric, cfg.loss_metric),
                          filter_string=args.filter_string, group_by=args.group_by,
                          include_unfinished=args.include_unfinished)
    a, b = resolve_group(exp, args.a), resolve_group(exp, args.b)
    measures = measure_experiment(exp, cfg)
    print(compare_table(exp, measures, a, b, cfg).terminal())
    return 0


def cmd_export_histories(args) -> int:
    from .histories import export

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    done = export(args.experiment, args.tracking_uri, args.out, metrics=metrics)
    print(f"{done.runs} runs, {done.metrics} metrics, {done.values} values -> {done.path} "
          f"({done.size / 1e6:.2f} MB)")
    return 0


def cmd_archive(args) -> int:
    from .archive import archive

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    done = archive(args.experiment, args.dir, metrics, args.tracking_uri)
    if done.path is None:
        print(f"nothing new to archive: the parts in {args.dir} hold {done.already} runs of {args.experiment!r}")
    else:
        print(f"{done.runs} runs -> {done.path} ({done.size / 1e6:.2f} MB); {done.already} were archived before")
    return 0


def cmd_restore(args) -> int:
    from .archive import restore

    done = restore(args.dir, args.tracking_uri, marks=args.marks)
    print(f"{done.written} runs restored from {done.parts} parts in {args.dir}; {done.present} were in the store")
    return 0


def cmd_list(args) -> int:
    from .load import default_tracking_uri, list_experiments, load_experiment

    uri = args.tracking_uri or default_tracking_uri()
    if args.experiment:
        exp = load_experiment(args.experiment, uri, metrics=())
        for label in exp.labels:
            print(f"{label}\t{len(exp.group_runs(label))} runs")
        if len(exp.probes):
            print(f"(noise probe)\t{len(exp.probes)} runs")
        return 0
    for name in list_experiments(uri):
        print(name)
    return 0


def cmd_params(args) -> int:
    from .config import AnalysisConfig

    cfg = AnalysisConfig()
    for key, value in cfg.as_dict().items():
        print(f"{key} = {value}")
    print()
    print(cfg.describe())
    return 0


def cmd_readme(args) -> int:
    from .readme import main as readme

    return readme(args.file, check=args.check)


def cmd_validate(args) -> int:
    from .benchmark import N_DEFAULT, SEED_DEFAULT
    from .load import AnalysisError
    from .validate import print_results, run

    n = N_DEFAULT if args.n is None else args.n
    seed = SEED_DEFAULT if args.seed is None else args.seed
    if n < 10:
        raise AnalysisError(f"--n must be >= 10, got {n}")
    cfg = _config(args)
    print_results(run(n, seed, cfg, with_cp=not args.no_cp), cfg, n, seed)
    return 0


def cmd_export(args) -> int:
    from .validate import export_curves

    n = export_curves(args.experiment, args.tracking_uri, args.out)
    print(f"{n} curves -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handler = {"report": cmd_report, "dose": cmd_dose, "hazard": cmd_hazard, "survival": cmd_survival, "compare": cmd_compare, "export": cmd_export_histories,
               "archive": cmd_archive, "restore": cmd_restore,
               "list": cmd_list, "params": cmd_params, "readme": cmd_readme, "validate": cmd_validate,
               "power": cmd_power, "verdicts": cmd_verdicts,
               "export-curves": cmd_export}[args.command]
    try:
        return handler(args)
    except Exception as exc:  # noqa: BLE001
        from .config import ConfigError
        from .load import AnalysisError
        from .readme import ReadmeError

        if isinstance(exc, (AnalysisError, ConfigError, ReadmeError)):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, OSError):  # a full disk, a folder where a file goes, no permission: one line, exit 1
            where = f" {exc.filename}" if exc.filename else ""
            print(f"error: cannot write or read{where}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
