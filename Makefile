# Set-up and the two README commands.  `make run` and `make test` create .venv on
# first use: torch==2.13.0 first (the CPU wheel on local disk; a plain `torch`
# requirement would pull a multi-GB CUDA build), then pamsim with every extra.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pamsim-installed

.PHONY: run test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all]'
	# warm Numba's on-disk kernel cache once, so the first real run is not a surprise
	$(BIN)/python -c "import emu, numpy as np; emu.pam_matmul(np.ones((2, 2)), np.ones((2, 2)))"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/pamsim

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup

clean:
	rm -rf $(VENV) build *.egg-info
