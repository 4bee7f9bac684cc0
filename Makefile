# The two entry points of the README. Both create or reuse .venv and install what they need,
# idempotently. The venv sees system packages so that a machine's own CUDA torch is kept;
# torch==2.13.0 only when no torch >= 2.4 is importable, then the project with its extras.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cswap-installed

.PHONY: demo test install bench clean

demo: $(STAMP)
	$(VENV)/bin/cswap train --model vgg16 --dataset digits --epochs 2 --policy cswap --tune bo

test: $(STAMP)
	$(PY) -m pytest -q

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import sys, torch; sys.exit(tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) < (2, 4))" 2>/dev/null \
		|| $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

bench: $(STAMP)
	$(PY) benchmarks/codecs.py --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
