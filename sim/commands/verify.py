"""``pamsim verify``: run vectors through a simulated rtl unit and compare with emu bit
for bit, printing vectors per second and mismatches (sim.rtl_sim)."""
import sys
import time

import emu
from sim.cli import fail, format_arg, int_in, nonneg_int, positive_int

#: vectors when --vectors is not given
VECTORS = 100_000


def register(sub):
    from rtl import UNITS, PAMMac
    from sim.rtl_sim import MAX_VECTORS
    comb = "/".join(n for n, u in UNITS.items() if u.kind == "comb")
    stream = "/".join(n for n, u in UNITS.items() if u.kind == "stream")
    p = sub.add_parser(
        "verify", help="check a simulated rtl unit against emu bit for bit (vectors/s, mismatches)",
        description=f"{comb}: corner, boundary and random operands (every operand set "
                    f"for formats of at most 8 bits); {stream}: a random matrix product "
                    "with specials through sim.rtl_matmul, compared with emu.matmul(..., "
                    "mul=--mul) (pam: emu.pam_matmul).  Exit status: 0 "
                    "every result agrees, 1 MISMATCH (the RTL disagrees with emu), 2 bad "
                    "arguments, 3 the simulation harness failed (no verdict on the RTL).")
    p.add_argument("--unit", choices=list(UNITS), help="which unit (required unless --prebuild)")
    p.add_argument("--fmt", type=format_arg, default=emu.bfloat16,
                   help="operand format")
    p.add_argument("--acc", type=format_arg, default=emu.float32,
                   help="accumulation format of mac/array")
    p.add_argument("--mul", help=f"multiplier of mul/{stream}, a name of emu's registry: "
                                 f"{'/'.join(PAMMac.MULTIPLIERS)} (default pam; a table "
                                 "multiplier must be saved, e.g. by pamsim multiplier import)")
    p.add_argument("--vectors", type=int_in(1, MAX_VECTORS),
                   help=f"operand pairs (mac/array: multiply-accumulates), 1 to {MAX_VECTORS:,}; "
                        f"if not given: {VECTORS} (formats of at most 8 bits: every operand "
                        "set of the combinational units)")
    p.add_argument("--sim", choices=("verilator", "icarus"),
                   help="simulator (if not given: $SIM, else verilator)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="of the random operands")
    p.add_argument("--prebuild", action="store_true",
                   help="only build every simulator harness the test suite uses (set-up step)")
    p.add_argument("--jobs", type=positive_int, default=2, help="parallel builds for --prebuild")
    p.set_defaults(run=run)


def _rate(n, seconds):
    return f"{n / seconds:,.0f}/s" if seconds > 0 else "n/a"


def run(args) -> int:
    from rtl import UNITS
    from sim import rtl_sim
    if args.prebuild:
        return _prebuild(args)
    if args.unit is None:
        return fail(args, "--unit is required (one of " + ", ".join(UNITS) + ")")
    comb = UNITS[args.unit].kind == "comb"
    if comb and args.mul is not None and "mul" not in UNITS[args.unit].options:
        stream = "/".join(n for n, u in UNITS.items() if u.kind == "stream")
        return fail(args, f"unit={args.unit!r} takes no mul option (--mul applies to "
                          f"mul/{stream})")
    vectors = VECTORS if args.vectors is None else args.vectors
    t0 = time.perf_counter()
    try:
        sim = rtl_sim.default_simulator() if args.sim is None else rtl_sim.check_simulator(args.sim)
        if comb:
            reports = rtl_sim.verify_unit(args.unit, args.fmt, vectors, sim=sim,
                                          seed=args.seed, mul=args.mul or "pam")
        else:
            stats = rtl_sim.verify_matmul(args.fmt, args.acc, vectors, unit=args.unit,
                                          sim=sim, seed=args.seed, mul=args.mul or "pam")
    except rtl_sim.RTLVerificationError as exc:
        print(f"pamsim verify: MISMATCH\n{exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        return fail(args, exc)
    except (rtl_sim.RTLHarnessError, MemoryError) as exc:
        print(f"pamsim verify: error: the simulation harness failed; this is no verdict "
              f"on the RTL\n{exc}", file=sys.stderr)
        return 3
    wall = time.perf_counter() - t0
    if comb:
        mul = "" if args.mul is None else f" --mul {emu.multiplier(args.mul)}"
        print(f"pamsim verify --unit {args.unit}{mul} --fmt {args.fmt.name} ({sim})")
        print(f"{'vectors':>10}  {'kind':<12} {'mismatches':>10}  {'simulated':>12}  {'checked':>12}")
        for r in reports:
            print(f"{r['vectors']:>10,}  {r['kind']:<12} {r['mismatches']:>10}  "
                  f"{_rate(r['vectors'], r['sim_seconds']):>12}  {_rate(r['vectors'], r['seconds']):>12}")
        n = sum(r["vectors"] for r in reports)
        bad = sum(r["mismatches"] for r in reports)
        sim_s = sum(r["sim_seconds"] for r in reports)
        print(f"total: {n:,} vectors, {bad} mismatches; {_rate(n, sim_s)} through the simulator "
              f"(cocotb driving and reading included), {_rate(n, wall)} end to end "
              f"({wall:.1f} s incl. build check, simulator start and emu)")
        if args.fmt.width <= 8:
            ignored = "" if args.vectors is None else ", --vectors ignored"
            print(f"({args.fmt.width}-bit format: every one of the {n:,} operand "
                  f"sets{ignored})")
    else:
        m, k, n = stats["shape"]
        bad = stats["mismatches"]
        print(f"pamsim verify --unit {args.unit} --fmt {args.fmt.name} --acc {args.acc.name} "
              f"--mul {stats['mul']} ({sim}, {stats['harness']})")
        # PAM keeps its wording (docs/figures.toml reads it)
        ref = "emu.pam_matmul" if stats["mul"] == "pam" else f"emu.matmul(mul={stats['mul']!r})"
        print(f"C = A.B with A {m}x{k}, B {k}x{n}: {stats['vectors']:,} multiply-accumulates, "
              f"{bad} of {stats['entries']} entries differ from {ref}; "
              f"{_rate(stats['vectors'], stats['sim_seconds'])} through the simulator, "
              f"{_rate(stats['vectors'], wall)} end to end ({wall:.1f} s)")
        for e in stats["examples"]:
            print("  " + e)
    return 1 if bad else 0


def _prebuild(args) -> int:
    from sim import rtl_sim
    sims = rtl_sim.SIMULATORS if args.sim is None else (args.sim,)
    t0 = time.perf_counter()
    try:
        done = rtl_sim.prebuild(args.jobs, sims)
    except (ValueError, RuntimeError) as exc:
        print(f"pamsim verify --prebuild: error: {exc}", file=sys.stderr)
        return 2
    for key, sim, seconds in done:
        print(f"{sim:>9}  {key:<50} {seconds:6.1f} s")
    print(f"{len(done)} harnesses ready under {rtl_sim.build_root()} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0
