"""Every size threshold of pamsim in one place: where a call switches between kernels
(serial or parallel twin, small or tiled matmul, per-call path, fused composite).

Each is a speed choice, never a numerics one: both sides of every threshold give the
same bits (the tests force each side by patching the value here).  Code reads them as
``sizes.NAME`` at call time, so a patch reaches every user.
"""

#: composites (torch_bridge's fused activations, norms, losses, recurrent cells) of at
#: most this many elements run fused.  The fused kernels win on the per-call cost (an
#: autograd node and its Python per graph node).  Their per-element code is the scalar
#: definitions in one long chain: in float32 LLVM vectorises it and it beats the graph at
#: every size at one or two threads but for the norms, in other formats it stays scalar;
#: and it runs serially where the graph's kernels use every thread (docs/torch_bridge.md,
#: "Fast paths").
FUSED_MAX = 1 << 13
#: the same for GELU in a format other than float32, whose exponents take Babić
#: products (~100 nodes, each operand rounded by the scalar definition): its fused
#: pass (forward and backward, bfloat16, 1 thread) took 6.2 ms against the graph's 7.3
#: at 2^10 and 9.1 against 7.0 at 2176 elements (float32: 0.41 against 2.4, FUSED_MAX)
FUSED_MAX_GELU = 1 << 11

#: torch_bridge's elementwise operands of at most this many elements take the per-call
#: path: there an op and its derivative are one kernel each, whose per-element code LLVM
#: vectorises less than emu's chain of single-op kernels (an approximate derivative's
#: PAMs beside paexp2): beyond ~2^15 elements the general path is faster.
LEAN_ELEMENTWISE = 1 << 15

#: below this many elements an elementwise kernel's serial twin runs: a parallel region
#: has a fixed cost even on one thread, and on a loaded machine it can wait for a
#: descheduled worker (emu/_kernels.py, ``twins``).
SERIAL = 1 << 16

#: at most this many multiply-adds (batch · M · N · K) take the small float32 matmul
#: kernel (emu/_kernels_small.py) instead of the tiled one.
SMALL = 1 << 17

#: below this much work (elements, or multiply-adds for a matmul) torch_bridge runs emu
#: on one thread and takes the per-call path: waking a second thread costs more than it
#: saves, and on a loaded machine a parallel region can wait milliseconds for a
#: descheduled worker.
SERIAL_WORK = 1 << 18
