"""Chaos harness (`python -m bench.chaos --seeds N [--short]`, `make chaos SEEDS=N`).

Per seed: a Temporal dev server of its own (restartable, SQLite file kept), both twins and the
`osac-workers worker` process; two orders scaled up, one scaled down, the other up, both
decommissioned, while the worker is SIGKILLed and restarted, Temporal restarts once, BMaaS answers
503 to a fifth of the calls with latency spikes, the hub fails a tenth of the worker's writes with
500/409 and cuts its watches, some agents never register and chosen wipes fail. The invariants are
then proven from the twins' audit logs and final state (see `invariants.py`).

    config.py      sizes, fault levels, the seeded plan of disruptions
    processes.py   the Temporal dev server and worker subprocesses
    twins.py       arming the twins' faults, reading their state through the chaos
    scenario.py    one seed: the phases and what they observed
    invariants.py  the promises, judged with evidence
    __main__.py    the command line
"""
