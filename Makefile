# cosmos_reason_ros: one-command setup, tests, lint and demo on a machine without ROS.
#   make demo                 set up if needed, then run the demo (CPU, tiny model):
#                             recording -> node -> replay -> out/demo/replay/report.html
#   make demo MODEL=/path/to/Cosmos-Reason2-2B   (GPU machine, x86_gpu preset, real answers)
#   make test                 set up if needed, then run the whole test suite
#   make test ROS_DISTRO=jazzy
#   make test ROS_DISTRO=jazzy-py310   (Jazzy wheels on Python 3.10, Humble's Python; no vLLM)
# Setup is idempotent: a re-run with nothing changed takes seconds.
ROS_DISTRO ?= kilted
PYTEST_ARGS ?=
ENVFILE := env-$(ROS_DISTRO).sh
SHELL := /bin/bash
# Python writes bytecode caches into the venv at first import (setup compiles none: see
# scripts/setup.sh), also in shells that set PYTHONDONTWRITEBYTECODE.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test lint demo clean lock

setup:
	@bash scripts/setup.sh $(ROS_DISTRO)

test: setup
	@bash scripts/run_tests.sh $(ROS_DISTRO) $(PYTEST_ARGS)

lint: setup
	@source $(ENVFILE) && ruff check . && echo "lint: clean"

demo: setup
	@source $(ENVFILE) && python -m cosmos_reason_ros.tools.demo $(if $(MODEL),--model $(MODEL)) $(DEMO_ARGS)

lock:
	@bash scripts/lock.sh $(ROS_DISTRO)

clean:
	rm -rf build/$(ROS_DISTRO) env-$(ROS_DISTRO).sh
