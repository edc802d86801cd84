# Set-up, demo and tests. `make demo` and `make test` are the README's quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch: a torch already in $(VENV) is kept (your own CUDA build, say), and
# $(TORCH) is installed only where there is none; which build pip picks for it
# depends on its index (docs/install.md). `make install TORCH=SPEC` asks
# for SPEC explicitly: it is installed even over a torch already there.
TORCH  ?= torch==2.13.0
ifneq ($(filter command line environment,$(origin TORCH)),)
# torch alone, replaced (--no-deps); the install of the project below adds any dependency it lacks
TORCH_STEP = $(BIN)/pip install -q --force-reinstall --no-deps "$(TORCH)"
TORCH_FORCE = FORCE
else
TORCH_STEP = $(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
endif
EXAMPLE := moses_rnn/data/example.en-fr.phrase-table

.PHONY: install demo test bench clean FORCE

install: $(VENV)/.installed

# setup.py builds the C++ evaluator behind `cslm serve` (cslm/_native) from cslm/cpp/: reinstalled when they change
$(VENV)/.installed: pyproject.toml setup.py $(wildcard cslm/cpp/cslm_native.cc cslm/cpp/cslm_local.* cslm/cpp/cslm_kernels.* cslm/cpp/cslm_modeldir.* cslm/cpp/cslm_json.*) $(TORCH_FORCE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(TORCH_STEP)
	$(BIN)/pip install -q -e '.[test,pipeline,kenlm,analysis]'
	touch $@

demo: install
	$(BIN)/moses-rnn train $(EXAMPLE) -o demo/model --preset tiny --max-steps 500 --eval-every 250 --valid-pairs 40 --overwrite
	$(BIN)/moses-rnn score $(EXAMPLE) -m demo/model -o demo/example.rnn.gz --unknown
	@echo "scored table: demo/example.rnn.gz"; gzip -dc demo/example.rnn.gz | head -n 3
	@echo "The commands are in $(BIN). Put them on your PATH:"
	@echo '  . $(BIN)/activate    # or: export PATH="$$PWD/$(BIN):$$PATH"'

# one pytest worker per core (pytest-xdist), each test file on one worker; TEST_JOBS=0: one process
TEST_JOBS ?= auto
test: install
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# every benchmarks/bench_*.py, one summary table; BENCH_ARGS=--quick for small sizes
bench: install
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf demo .pytest_cache
