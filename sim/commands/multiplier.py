"""``pamsim multiplier import``: a user's combinational Verilog multiplier as a table
multiplier that ``--mul table:NAME`` then trains with (sim.multiplier_import)."""
import time

import emu
from sim.cli import fail, format_arg


def register(sub):
    p = sub.add_parser("multiplier", help="bring your own multiplier: import a Verilog "
                                          "module as a table multiplier")
    acts = p.add_subparsers(dest="action", metavar="action", required=True)
    q = acts.add_parser(
        "import", help="check, simulate exhaustively (Verilator) and save a Verilog multiplier",
        description="The module must be combinational, with ports a and b (the operand "
                    "format's width, an encoding each) and y (an encoding of --out-fmt). "
                    "Its table is saved under $PAMSIM_MULTIPLIERS (default "
                    "~/.pamsim/multipliers) with the Verilog's SHA-256; then "
                    "--mul table:NAME works in train, sweep and error.")
    q.add_argument("verilog", help="the Verilog file (read as given)")
    q.add_argument("--top", required=True, help="the multiplier's module name")
    q.add_argument("--fmt", type=format_arg, required=True,
                   help="operand format, at most 8 bits (e4m3fn, e5m2, e2m1fn, ...)")
    q.add_argument("--out-fmt", type=format_arg, default=emu.bfloat16,
                   help="format of y: bfloat16, float16, float32 or the operand format")
    q.add_argument("--name", required=True, help="the name to register (table:NAME)")
    q.set_defaults(run=run)
    p.set_defaults(run=run)


def run(args) -> int:
    from emu.multipliers import error_stats
    from sim.multiplier_import import import_multiplier
    t0 = time.perf_counter()
    try:
        got = import_multiplier(args.verilog, args.top, args.fmt, args.out_fmt, args.name)
    except (ValueError, RuntimeError) as exc:
        return fail(args, exc)
    n = 1 << (2 * args.fmt.width)
    st = error_stats(got.mul, args.fmt)
    print(f"{args.top} ({args.verilog}, sha256 {got.verilog_sha256[:12]}): ports ok, "
          f"{n:,} pairs simulated with Verilator in {time.perf_counter() - t0:.1f} s")
    print(f"relative error over {st.pairs:,} pairs of normal operands: mean "
          f"{100 * st.mean:+.3f} %, max |e| {100 * st.max_abs:.3f} %, RMS {100 * st.rms:.3f} %")
    print(f"saved {got.path}; use --mul {got.mul} (e.g. pamsim train --fmt {args.fmt.name} "
          f"--ops matmul --mul {got.mul})")
    return 0
