"""The measure room: what a decode costs and records.

    stats.py       per-decode statistics (tau, acceptance per position, TTFT, forwards)
    cost.py        forward costs and the speedup bound tau / (k c + v)
    policy.py      a draft length chosen per round from measured costs (never changes the output)
    records.py     JSON-lines records: atomic, resumable, with the machine and versions
"""
