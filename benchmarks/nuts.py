"""NUTS with both backends on the same models: wall time, function-space ESS/s, time to ESS 400.

Four tanh BNNs with a N(0, 1) prior on every weight and the noise fixed (0.1 on the gap data,
0.3 on the standardised UCI targets):

* 1-10-1 on 60 gap points, 1-20-1 on 100, 1-50-50-1 on 300 (``pyro_bbb.data.gap_regression``);
* 8-50-1 on 450 rows of UCI concrete (8 features; the first 450 training rows of split 0,
  standardised) if ``--uci`` points at the split folders (default ``../shared/data/uci``),
  else 450 rows of a generated 8-feature regression.

NumPyro runs ``--chains`` vectorised chains of warm-up + draws (per problem: 500 + 500 for
the small nets, 100 + 100 for 1-50-50-1 and 200 + 200 for 8-50-1, whose draws cost up to a
second each; ``--draws`` sets all). Its ESS is the bulk ESS of the network's output (the mean
of y under each draw), the smallest over the inputs judged (a 300-point grid on [-7, 7] for
the gap data, 100 test rows for UCI), pooled over chains; its fixed cost is XLA's tracing and
compilation (read from ``jax.monitoring``), and time to ESS 400 is the fixed cost plus the
sampling time scaled by 400 / ESS.

Pyro runs one chain of k warm-up iterations and k draws, then 2k + 2k (k = 20 for the small
nets, 5 and 10 for the others; ``--pyro-draws`` sets all), and is extrapolated: the
difference of the two runs' times over the difference of their leapfrog steps is its time
per step (the fixed cost, tracing, JIT and the MAP start, cancels), and times the leapfrog
steps NumPyro's draws took it gives its time per draw; its ESS per draw is taken to be
NumPyro's (the same algorithm and adaptation).

    python benchmarks/nuts.py                          # the table (30-40 minutes, 2 cores)
    python benchmarks/nuts.py --problems 1-10-1 --pyro-draws 0
    python benchmarks/nuts.py --problems 1-50-50-1 --variants   # where its time goes
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import UCI_FOLDER, machine, markdown_table, script_parser

import pyro_bbb as bbb

#: name: (layer sizes, data points, default warm-up = draws per chain, Pyro's measured draws)
PROBLEMS = {
    "1-10-1": ([1, 10, 1], 60, 500, 20),
    "1-20-1": ([1, 20, 1], 100, 500, 20),
    "1-50-50-1": ([1, 50, 50, 1], 300, 100, 5),
    "8-50-1": ([8, 50, 1], 450, 200, 10),
}


@dataclass
class Problem:
    name: str
    model: object
    x: torch.Tensor
    y: torch.Tensor
    x_eval: torch.Tensor
    data: str


def make_problem(name: str, uci: Path) -> Problem:
    sizes, num, _, _ = PROBLEMS[name]
    if sizes[0] == 1:
        data = bbb.data.gap_regression(num, noise=0.1, seed=0)
        x, y, x_eval, noise, source = (
            data.x,
            data.y,
            torch.linspace(-7, 7, 300)[:, None],
            0.1,
            "gap",
        )
    else:
        if (uci / "concrete" / "data.txt").is_file():
            split = bbb.data.uci_folder.load_uci_folder(uci / "concrete", num_splits=1)[0]
            x, y = split.x_train[:num], split.y_train[:num]
            x_eval, source = split.x_test[:100], "UCI concrete"
        else:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(num + 100, sizes[0], generator=g)
            y = torch.tanh(x @ torch.randn(sizes[0], generator=g) / 2) + 0.3 * torch.randn(
                num + 100, generator=g
            )
            x, y, x_eval, source = x[:num], y[:num], x[num:], "generated"
        noise = 0.3
    torch.manual_seed(0)
    net = bbb.mlp(sizes, activation="tanh", prior=bbb.priors.Gaussian(1.0))
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=noise), num_data=num)
    return Problem(name, model, x, y, x_eval, f"{source}, noise {noise}")


class CompileClock:
    """Seconds JAX spends tracing and compiling, from its monitoring events."""

    EVENTS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")

    def __init__(self) -> None:
        import jax.monitoring

        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, event: str, duration: float, **kwargs) -> None:
        if event.rsplit("/", 1)[-1] in self.EVENTS:
            self.seconds += duration


def function_ess(problem: Problem, result) -> tuple[float, float]:
    diagnostics = bbb.evaluation.function_space_diagnostics(problem.model, result, problem.x_eval)
    return float(diagnostics.ess.min()), float(diagnostics.r_hat.max())


def run_numpyro(problem: Problem, args, clock: CompileClock, **options) -> dict:
    compiled = clock.seconds
    result = bbb.run_nuts(
        problem.model, problem.x, problem.y, num_samples=args.samples, warmup_steps=args.warmup,
        num_chains=args.chains, seed=0, progress=False, backend="numpyro",
        max_tree_depth=options.pop("max_tree_depth", args.max_tree_depth), **options,
    )  # fmt: skip
    fixed = clock.seconds - compiled
    ess, rhat = function_ess(problem, result)
    iterations = args.chains * (args.warmup + args.samples)
    steps = result.sample_stats["n_steps"].double()
    warm_steps = float(result.warmup_stats["mean_n_steps"].mean())
    all_steps = args.chains * (args.warmup * warm_steps + args.samples * float(steps.mean()))
    sampling = result.wall_time - fixed
    return {
        "wall": result.wall_time, "fixed": fixed, "per_draw": sampling / iterations,
        "per_step": sampling / all_steps, "steps": float(steps.mean()), "warm_steps": warm_steps,
        "at_cap": float((result.sample_stats["tree_depth"] >= args.max_tree_depth).double().mean()),
        "lockstep": float(steps.mean() / steps.max(0).values.mean()),
        "ess": ess, "rhat": rhat, "to_400": fixed + sampling * 400 / ess,
        "step_size": result.warmup_stats["step_size"].tolist(), "result": result,
    }  # fmt: skip


def run_pyro(problem: Problem, args, numpyro_row: dict) -> dict:
    def run(draws):
        result = bbb.run_nuts(
            problem.model, problem.x, problem.y, num_samples=draws, warmup_steps=draws,
            seed=0, progress=False, max_tree_depth=args.max_tree_depth,
        )  # fmt: skip
        steps = result.sample_stats["n_steps"].double().sum()
        steps += draws * result.warmup_stats["mean_n_steps"][0]
        return result.wall_time, float(steps)

    # the same fixed cost (trace, JIT, MAP start) in both runs: the difference is sampling
    short_wall, short_steps = run(args.pyro_draws)
    long_wall, long_steps = run(2 * args.pyro_draws)
    per_step = (long_wall - short_wall) / (long_steps - short_steps)
    fixed = max(short_wall - per_step * short_steps, 0.0)
    per_draw = per_step * numpyro_row["all_steps_per_draw"]
    iterations = args.chains * (args.warmup + args.samples)
    wall = fixed + per_draw * iterations
    ess = numpyro_row["ess"]
    return {
        "wall": wall, "fixed": fixed, "per_draw": per_draw, "per_step": per_step, "ess": ess,
        "to_400": fixed + per_draw * iterations * 400 / ess, "measured": long_wall,
    }  # fmt: skip


def table(rows: list[tuple[str, str, dict]], args) -> str:
    header = (
        "problem", "backend", "wall time (s)", "fixed (s)", "ms / draw", "µs / leapfrog step",
        "steps / draw", "fn-space ESS min", "R̂ max", "ESS / s", "time to ESS 400 (s)",
    )  # fmt: skip
    cells = []
    for problem, backend, row in rows:
        extrapolated = backend == "pyro"
        mark = "*" if extrapolated else ""
        cells.append((
            problem, f"{backend}{mark}", f"{row['wall']:.0f}{mark}", f"{row['fixed']:.1f}",
            f"{1e3 * row['per_draw']:.2f}", f"{1e6 * row['per_step']:.1f}",
            "—" if extrapolated else f"{row['steps']:.0f}",
            "(NumPyro's)" if extrapolated else f"{row['ess']:.0f}",
            "—" if extrapolated else f"{row['rhat']:.3f}",
            f"{row['ess'] / row['wall']:.2f}{mark}", f"{row['to_400']:.0f}{mark}",
        ))  # fmt: skip
    lines = [markdown_table(header, cells, align="ll" + "r" * 9)]
    lines.append(
        f"\n{args.chains} chains × (warm-up + draws): "
        + ", ".join(f"{p} {r['draws']} + {r['draws']}" for p, b, r in rows if b == "numpyro")
        + f"; max tree depth {args.max_tree_depth}; ms / draw is per chain and iteration "
        "(warm-up included). *Pyro: one chain of "
        + ", ".join(f"{r['pyro_draws']} + {r['pyro_draws']}" for p, b, r in rows if b == "pyro")
        + " and twice that measured (their difference: time per leapfrog step), extrapolated to "
        "NumPyro's leapfrog steps and draws, with NumPyro's ESS per draw."
    )
    return "\n".join(lines)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--problems", nargs="+", choices=list(PROBLEMS), default=list(PROBLEMS))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, help="warm-up iterations = draws per chain")
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--pyro-draws", type=int, help="Pyro's measured draws; 0: NumPyro only")
    parser.add_argument("--uci", type=Path, default=UCI_FOLDER)
    parser.add_argument("--variants", action="store_true", help="chain method, depth, mass, init")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{machine()}, torch {torch.__version__}, {torch.get_num_threads()} torch thread")
    clock = CompileClock()
    rows = []  # (problem, backend, row)
    given_draws, given_pyro = args.draws, args.pyro_draws
    for name in args.problems:
        _, _, draws, pyro_draws = PROBLEMS[name]
        args.warmup = args.samples = given_draws or draws
        args.pyro_draws = pyro_draws if given_pyro is None else given_pyro
        problem = make_problem(name, args.uci)
        print(f"\n{name}: {len(problem.x)} points ({problem.data})", flush=True)
        row = run_numpyro(problem, args, clock)
        row["draws"] = args.warmup
        row["all_steps_per_draw"] = (
            args.warmup * row["warm_steps"] + args.samples * row["steps"]
        ) / (args.warmup + args.samples)
        print(
            f"  numpyro: {row['wall']:.1f} s ({row['fixed']:.1f} s compiling), "
            f"{row['steps']:.0f} steps/draw ({100 * row['at_cap']:.0f} % at the cap, "
            f"{row['warm_steps']:.0f} in warm-up), step size {row['step_size']}, chains in "
            f"lockstep {100 * row['lockstep']:.0f} % busy, ESS {row['ess']:.0f}, "
            f"R-hat {row['rhat']:.3f}",
            flush=True,
        )
        rows.append((name, "numpyro", row))
        if args.pyro_draws:
            pyro_row = run_pyro(problem, args, row)
            print(
                f"  pyro: {pyro_row['measured']:.1f} s for 1 x ({2 * args.pyro_draws} + "
                f"{2 * args.pyro_draws}), {1e6 * pyro_row['per_step']:.0f} µs/step; per draw "
                f"{pyro_row['per_draw'] / row['per_draw']:.0f}x NumPyro's",
                flush=True,
            )
            pyro_row["pyro_draws"] = args.pyro_draws
            rows.append((name, "pyro", pyro_row))
        if args.variants:
            variants(problem, args, clock, row)
    print()
    print(table(rows, args))


def variants(problem: Problem, args, clock: CompileClock, base: dict) -> None:
    """The same problem under other settings: what helps, and where the time goes."""
    trials = {
        "precision='float32'": {"precision": "float32"},
        "max_tree_depth=8": {"max_tree_depth": 8},
        "chain_method='sequential'": {"chain_method": "sequential"},
        "full_mass=True (dense)": {"full_mass": True},
    }
    guide = bbb.MeanFieldGuide(problem.model, init_scale=0.01, name="bench_guide")
    start = time.perf_counter()
    bbb.fit(problem.model, guide, problem.x, problem.y, epochs=2000, lr=0.01, progress=False)
    print(f"  (mean-field guide for init: {time.perf_counter() - start:.0f} s)")
    trials["init=guide (mean-field)"] = {"init": guide}
    header = ("variant", "wall s", "fixed s", "µs/step", "steps", "warm-up", "ESS", "R-hat",
              "ESS/s", "step size")  # fmt: skip
    print("  | " + " | ".join(header) + " |\n  |" + " --- |" * len(header))

    def line(label, row):
        sizes = ", ".join(f"{s:.2g}" for s in row["step_size"])
        print(f"  | {label} | {row['wall']:.0f} | {row['fixed']:.0f} | "
              f"{1e6 * row['per_step']:.0f} | {row['steps']:.0f} | {row['warm_steps']:.0f} | "
              f"{row['ess']:.0f} | {row['rhat']:.3f} | {row['ess'] / row['wall']:.3f} | "
              f"{sizes} |", flush=True)  # fmt: skip

    line("baseline", base)
    for label, options in trials.items():
        line(label, run_numpyro(problem, args, clock, **options))


if __name__ == "__main__":
    main()
