# The two entry points of the README. Both create or reuse .venv and install what they need,
# idempotently. The venv sees system packages so that a machine's own CUDA torch is kept;
# torch==2.13.0 only when no torch >= 2.4 is importable, then the project with its extras.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Holds the torch version the last install left in the venv.
STAMP  := $(VENV)/.cswap-installed
# Holds the torch version the venv imports now; rewritten only when that changes.
TORCH_SEEN := $(VENV)/.cswap-torch
# The version of the torch the venv will import, read from its metadata without importing it (fast).
TORCH_VERSION := $(PY) -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null || echo none

.PHONY: demo test install bench clean gpu-check gpu-wheels FORCE

demo: $(STAMP)
	$(VENV)/bin/cswap train --model vgg16 --dataset digits --epochs 2 --policy cswap --tune bo --memory-budget 0.3

test: $(STAMP)
	$(PY) -m pytest -q

install: $(STAMP)

# A package installed after cswap may replace torch (timm pulls a CUDA build into the venv): the
# stamp is then older than $(TORCH_SEEN), and install runs again. A torch another package put
# inside the venv is removed first, so the rule below decides again as on a fresh venv: the
# machine's own torch >= 2.4, else torch==2.13.0 (README: adding packages keeps torch).
$(STAMP): pyproject.toml $(TORCH_SEEN)
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@installed="$$(cat $(STAMP) 2>/dev/null)"; now="$$($(TORCH_VERSION))"; \
	if [ -n "$$installed" ] && [ "$$installed" != "$$now" ] \
		&& $(PY) -c "import importlib.util, sys; sys.exit(not importlib.util.find_spec('torch').origin.startswith(sys.prefix))" 2>/dev/null; then \
		echo "torch $$now replaced torch $$installed in $(VENV) (a package installed since pulled it in): removing it"; \
		$(PY) -m pip uninstall --quiet -y torch; \
	fi
	$(PY) -c "import sys, torch; sys.exit(tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) < (2, 4))" 2>/dev/null \
		|| $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	@now="$$($(TORCH_VERSION))"; echo "$$now" > $(TORCH_SEEN); echo "$$now" > $(STAMP)

# Rewritten only when the venv's torch is not the one recorded (the file's time is then the time
# torch changed), so an unchanged venv costs one metadata read and installs nothing.
$(TORCH_SEEN): FORCE
	@mkdir -p $(@D); now="$$($(TORCH_VERSION))"; [ "$$now" = "$$(cat $@ 2>/dev/null)" ] || echo "$$now" > $@

FORCE:

bench: $(STAMP)
	$(PY) benchmarks/codecs.py --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis

# The GPU suite (never part of `test`): one command on a machine with one GPU, under 8 minutes,
# writing suite.json and summary.md into GPU_OUT. It runs with the machine's own Python (its CUDA
# torch, numba, numba-cuda); packages that Python lacks come from wheels in WHEELS, made here by
# `make gpu-wheels` (the versions this venv tested) and carried along.
GPU_PYTHON ?= python3
WHEELS     ?= .whl
GPU_SITE   ?= /tmp/cswap-wheels
GPU_OUT    ?= benchmarks/results/gpu-$(shell date -u +%F)
GPU_WHEEL_PACKAGES := scikit-optimize|pyaml|fastapi|starlette|pydantic|pydantic[-_]core|annotated[-_]types|annotated[-_]doc|typing[-_]inspection|uvicorn|opentelemetry[-_]api|anyio|sniffio|idna

gpu-check:
	@$(GPU_PYTHON) -c "import skopt, fastapi, pydantic" 2>/dev/null \
		|| $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) $(WHEELS)/*.whl
	PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) benchmarks/gpu_suite.py --device cuda --out $(GPU_OUT)

gpu-wheels: $(STAMP)
	$(PY) -m pip freeze | grep -iE '^($(GPU_WHEEL_PACKAGES))==' > $(WHEELS).txt
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(WHEELS) -r $(WHEELS).txt
