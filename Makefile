# Two commands do all the set-up on a fresh machine: `make book` and `make test`.
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
DATA    ?= synthetic
FIELD   ?=
FIELD_TRAIN ?=
PROFILE ?= default
RUN_DIR ?= runs/$(PROFILE)
UNTIL   ?=
FORCE   ?=
REVIEW  ?=

.PHONY: book test lint venv bench clean explore

# The stamp is rebuilt when the requirements change; pip takes torch/torchvision from the local disk.
$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

venv: $(VENV)/.installed

book: venv
	$(PY) -m cropcop_utils book --data $(DATA) $(foreach f,$(FIELD),--field $(f)) $(if $(FIELD_TRAIN),--field-train $(FIELD_TRAIN)) $(if $(REVIEW),--review-verdicts $(REVIEW)) --profile $(PROFILE) --run-dir $(RUN_DIR) $(if $(UNTIL),--until $(UNTIL)) $(if $(FORCE),--force)

# The error explorer as an app on a finished run (Voilà on 127.0.0.1; prints its URL; Ctrl-C stops it).
explore: venv
	$(PY) -m cropcop_utils explore --run-dir $(RUN_DIR) $(if $(PORT),--port $(PORT))

lint: venv
	$(VENV)/bin/ruff check cropcop_utils tests bench

test: lint
	$(VENV)/bin/pytest -q -n auto --dist loadgroup --durations=25

bench: venv
	$(PY) bench/audit_bench.py
	$(PY) bench/train_bench.py
	$(PY) bench/runtime_bench.py

clean:
	rm -rf runs
