"""The pure control plane (standard library + numpy only; tests/core/test_purity.py enforces it).

types.py       roles, sequences, slots, shift plans
throughput.py  per-replica decode/prefill time model and its relative-error fit (DESIGN §4.1)
waiting_queue.py  the shared waiting queue: priority heap + length index
dispatch.py    replica states + gain dispatch, abort, progress, clones (Move, the runtime's instruction)
scheduler.py   shift-aware scheduler: dispatch + Alg. 3/4 shift down/up with migration, rebalance (§4.2)
whatif.py      post-shift throughput of a role: migrate (clones) or summary (closed form)
planner.py     the five-step planner, Algorithm 1 DP, decisions for the timeline (§4.3)
strategies.py  registry of shift strategies: pivot, static, rule, vanilla
"""
