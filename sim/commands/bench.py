"""``pamsim bench``: speed ratios against baselines measured in the same run."""
import json

from sim.cli import fail, output_file
from sim.commands.train import multipliers_arg


def register(sub):
    p = sub.add_parser("bench", help="speed ratios against baselines measured in the same run")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds, for CI)")
    p.add_argument("--only", nargs="+", metavar="GROUP",
                   help="run only these case groups (modules of sim/benches, e.g. emu)")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   help="cuda: only the GPU group (says so and exits 0 without a GPU); "
                        "cpu: every group except the GPU one")
    p.add_argument("--mul", type=multipliers_arg,
                   help="comma-separated multipliers whose matmul the multipliers group times "
                        "against PAM's in the same run (e.g. lmul,cpam3-unbiased), instead of "
                        "its own rows (lmul, pam+3, cpam2-unbiased, exact, float)")
    p.add_argument("--json", type=output_file, help="also write the rows as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from sim import bench
    only, skip = args.only, None
    if args.device == "cuda":
        only = ["cuda"]
    elif args.device == "cpu":
        skip = ["cuda"]
    try:
        groups = bench.selected(only, skip)
    except ValueError as exc:
        return fail(args, f"--only: {exc}")
    if args.mul is not None and "multipliers" not in groups:
        return fail(args, f"--mul times the multipliers group, which this run leaves out "
                          f"(groups: {groups})")
    rows = bench.run(quick=args.quick, only=only, skip=skip, mul=args.mul)
    print(bench.host_line())
    print(bench.format_rows(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            [dict(r.__dict__, ratio=r.ratio) for r in rows], indent=2))
    return 0
