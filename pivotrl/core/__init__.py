"""The pure control plane (standard library + numpy only; tests/core/test_purity.py enforces it).

types.py       roles, sequences, slots, shift plans
throughput.py  per-replica decode/prefill time model and its relative-error fit (DESIGN §4.1)
scheduler.py   shift-aware scheduler: shared queue, gain dispatch, abort, Alg. 3/4 migration (§4.2)
whatif.py      post-shift throughput of a role: migrate (clones) or summary (closed form)
planner.py     the five-step planner, Algorithm 1 DP, decisions for the timeline (§4.3)
strategies.py  registry of shift strategies: pivot, static, rule, vanilla
"""
