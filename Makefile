# cosmos_reason_ros: one-command setup, tests, lint and demo on a machine without ROS.
#   make demo                 set up if needed, then run the demo (CPU, tiny model):
#                             recording -> node -> replay -> out/demo/replay/report.html
#   make demo MODEL=/path/to/Cosmos-Reason2-2B   (GPU machine, x86_gpu preset, real answers)
#   make test                 set up if needed, then run the whole test suite but the drills
#   make test ROS_DISTRO=jazzy
#   make test-fast            the fast tier: units and the in-process node on the scripted engine
#   make drills               the drills alone (faults, timings): build/drills/report.md
#   make test ROS_DISTRO=jazzy-py310   (Jazzy wheels on Python 3.10, Humble's Python; no vLLM)
# Setup is idempotent: a re-run with nothing changed takes seconds.
ROS_DISTRO ?= kilted
PYTEST_ARGS ?=
ENVFILE := env-$(ROS_DISTRO).sh
SHELL := /bin/bash
# Python writes bytecode caches into the venv at first import (setup compiles none: see
# scripts/setup.sh), also in shells that set PYTHONDONTWRITEBYTECODE.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test test-fast drills lint demo clean lock

setup:
	@bash scripts/setup.sh $(ROS_DISTRO)

test: setup
	@bash scripts/run_tests.sh $(ROS_DISTRO) $(PYTEST_ARGS)

# No real engine, nothing marked slow (scripts/run_tests.sh also leaves the drills out). Two
# pytest-xdist workers per core, a module at a time (its module-scoped node starts once): the
# in-process node's tests wait on DDS as much as on CPU (one worker per core kept 2 cores 45 %
# busy). On 2 cores, idle: 1 worker 195 s, 2 workers 97 s, 4 workers 69 s, 6 workers 68 s.
FAST_WORKERS := $(shell echo $$(( 2 * $$(nproc 2>/dev/null || echo 1) )))
test-fast: setup
	@bash scripts/run_tests.sh $(ROS_DISTRO) -m "not engine and not slow" -n $(FAST_WORKERS) \
	  --dist loadfile $(PYTEST_ARGS)

# One process, no xdist workers: the drills' figures are the mechanism's, not a neighbour's
# load. The figures' table is printed whether or not a drill failed.
drills: setup
	@source $(ENVFILE) && rm -f build/drills/report.json build/drills/report.md build/drills/junit.xml \
	  && mkdir -p build/drills \
	  && { python -m pytest -p no:cacheprovider -p no:xdist --timeout=900 -m drill \
	    --junitxml=build/drills/junit.xml test/drills $(PYTEST_ARGS); rc=$$?; \
	    cat build/drills/report.md 2>/dev/null || echo "drills: no figures recorded"; \
	    exit $$rc; }

# lint-imports: the layer map (import-linter contracts in pyproject.toml); --no-cache: the graph
# takes about a second, and no cache folder is left in the checkout.
lint: setup
	@source $(ENVFILE) && ruff check . && lint-imports --no-cache --no-logo \
	  && python scripts/check_test_timing.py && echo "lint: clean"

demo: setup
	@source $(ENVFILE) && python -m cosmos_reason_ros.tools.demo $(if $(MODEL),--model $(MODEL)) $(DEMO_ARGS)

lock:
	@bash scripts/lock.sh $(ROS_DISTRO)

clean:
	rm -rf build/$(ROS_DISTRO) env-$(ROS_DISTRO).sh
