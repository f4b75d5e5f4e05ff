"""The checks room: how the lossless claim is tested.

    lossless.py    the exact-law chi-square every sampling test uses
    ties.py        the bfloat16 policy: a greedy difference is a tie or a failure
    replay.py      replaying a recorded run step by step against the real models
"""
