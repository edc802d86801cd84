# Set-up, demo and tests. `make demo` and `make test` are the README's quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch keeps set-up small; to use a GPU, install your CUDA
# build of torch into $(VENV) first (or pass TORCH=), it is then kept.
TORCH  ?= torch==2.13.0
EXAMPLE := moses_rnn/data/example.en-fr.phrase-table

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[test,pipeline,kenlm]'
	touch $@

demo: install
	$(BIN)/moses-rnn train $(EXAMPLE) -o demo/model --preset tiny --max-steps 500 --eval-every 250 --valid-pairs 40
	$(BIN)/moses-rnn score $(EXAMPLE) -m demo/model -o demo/example.rnn.gz --unknown
	@echo "scored table: demo/example.rnn.gz"; gzip -dc demo/example.rnn.gz | head -n 3

test: install
	$(BIN)/python -m pytest -q

# every benchmarks/bench_*.py, one summary table; BENCH_ARGS=--quick for small sizes
bench: install
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf demo .pytest_cache
