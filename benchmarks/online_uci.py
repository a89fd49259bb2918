"""One pass over UCI regression, one point at a time: our updaters beside the published filters.

The protocol of ``pyro_bbb.bench.online_uci`` on every split-format folder under ``--data``
(every split unless ``--splits N``, the first N): LoFi and R-VGA at the library's defaults,
any variant of ``METHODS`` asked for, and our batch BNN (2,000 full-batch epochs) on the same
splits; test RMSE and log-likelihood per point in original units, mean ± standard error over
the splits, CPU seconds of the stream (the batch BNN's: training and prediction), beside the
LoFi authors' published one-pass RMSE of LoFi and of a full-covariance EKF. Writes
``online_uci.md`` and ``online_uci.json`` into ``--out`` and prints the table and the issue's
targets, met or not.

``--held-out`` runs the same on two larger sets of other shapes written for the purpose
(``write_held_out_shapes``: 8,000 and 6,000 rows), where no published figure exists.

    python benchmarks/online_uci.py [--splits 3] [--methods lofi rvga ekf batch] [--jobs 2]
    python benchmarks/online_uci.py --held-out [--methods lofi rvga ekf]
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from _common import UCI_FOLDER, machine, markdown_table, save_report, script_parser

from pyro_bbb.bench.online_uci import (
    BATCH,
    METHODS,
    PUBLISHED_RMSE,
    run_one_pass,
    summarise,
    write_held_out_shapes,
)

DEFAULTS = ("lofi", "rvga", BATCH)


def cell(row, name, decimals):
    if row is None or math.isnan(row[name]):
        return "failed" if row is not None else "—"
    failed = f" ({int(row['failed'])} failed)" if row["failed"] else ""
    return f"{row[name]:.{decimals}f} ± {row[name + '_se']:.{decimals}f}{failed}"


def decimals_for(dataset):
    return 3 if dataset == "wine" else 2


def main_table(table, methods):
    ours = [m for m in methods if m != BATCH]
    head = ["set", "splits"]
    head += [f"{METHODS[m].label} RMSE" for m in ours]
    head += list(PUBLISHED_RMSE)
    head += ["batch BNN RMSE"] if BATCH in methods else []
    head += [f"{METHODS[m].label} test LL" for m in ours]
    head += ["batch BNN test LL"] if BATCH in methods else []
    head += [f"{METHODS[m].label if m != BATCH else 'batch BNN'} CPU s" for m in methods]
    lines = []
    for dataset, rows in sorted(table.items()):
        places = decimals_for(dataset)
        splits = max(int(r["splits"]) for r in rows.values())
        line = [dataset, str(splits)]
        line += [cell(rows.get(m), "rmse", places) for m in ours]
        line += [
            f"{PUBLISHED_RMSE[p][dataset]:.{places}f}" if dataset in PUBLISHED_RMSE[p] else "—"
            for p in PUBLISHED_RMSE
        ]
        line += [cell(rows.get(BATCH), "rmse", places)] if BATCH in methods else []
        line += [cell(rows.get(m), "log_likelihood", 2) for m in ours]
        line += [cell(rows.get(BATCH), "log_likelihood", 2)] if BATCH in methods else []
        line += [f"{rows[m]['cpu_seconds']:.1f}" if m in rows else "—" for m in methods]
        lines.append(line)
    return markdown_table(head, lines, align="l" * len(head))


def targets(table, methods):
    """The issue's targets for each of our methods, met or not, with the margins."""
    lofi, ekf = PUBLISHED_RMSE.values()
    out = []
    for m in (m for m in methods if m != BATCH):
        rows = {d: r[m] for d, r in table.items() if m in r}
        below_lofi = [d for d, r in rows.items() if r["rmse"] <= lofi.get(d, -math.inf)]
        below_ekf = [d for d, r in rows.items() if r["rmse"] <= ekf.get(d, -math.inf)]
        gaps = {
            d: table[d][BATCH]["log_likelihood"] - r["log_likelihood"]
            for d, r in rows.items()
            if BATCH in table[d]
        }
        near = [d for d, gap in gaps.items() if gap <= 0.3]
        far = {d: round(gap, 2) for d, gap in gaps.items() if not gap <= 1.0}
        published = sum(d in lofi for d in rows)
        out.append(
            f"* {METHODS[m].label}: RMSE <= published LoFi on {len(below_lofi)} of {published} "
            f"({', '.join(sorted(below_lofi))}); <= published EKF on {len(below_ekf)} "
            f"({', '.join(sorted(below_ekf))}); test LL within 0.3 nats of the batch BNN on "
            f"{len(near)} ({', '.join(sorted(near))}); more than 1 nat below it on "
            f"{len(far)} {far if far else ''}"
        )
    return "\n".join(out)


def main():
    parser = script_parser(__doc__)
    parser.add_argument("--data", default=str(UCI_FOLDER))
    parser.add_argument("--splits", type=int, default=None, help="the first N splits of each")
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=list(DEFAULTS), choices=[*METHODS, BATCH])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="instead of --data, two larger sets of other shapes (friedman, smooth), 3 splits",
    )
    parser.add_argument("--out", default="online_uci_results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def show(result):
        print(
            f"{result.dataset:9s} {result.split:2d} {result.method:14s} RMSE {result.rmse:.3f} "
            f"LL {result.log_likelihood:.3f} CPU {result.cpu_seconds:.1f} s",
            flush=True,
        )

    data = args.data
    if args.held_out:
        data = str(out / "held_out")
        write_held_out_shapes(data)
    results = run_one_pass(
        data,
        methods=args.methods,
        num_splits=args.splits,
        datasets=args.datasets,
        jobs=args.jobs,
        on_result=show,
    )
    table = summarise(results)
    text = (
        f"One pass, one point at a time (machine: {machine()}; splits: "
        f"{'all' if args.splits is None else f'the first {args.splits}'} of each set)\n\n"
        + main_table(table, args.methods)
        + "\n\n"
        + targets(table, args.methods)
        + "\n"
    )
    print("\n" + text)
    report = {"results": [asdict(r) for r in results], "summary": table}
    save_report(out, "online_uci", text, report)


if __name__ == "__main__":
    main()
