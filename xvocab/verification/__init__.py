"""The verification room: the rules that make decoding lossless, and the randomness they draw.

    verify.py      greedy, exact-match and rejection verification (with slow references beside the fast paths)
    sampling.py    the target's and draft's sampling distributions (temperature, top-k, top-p)
    coupling.py    the noise tape: exact-match verification as a race on noise shared with the drafter
    seeds.py       the random streams derived from one seed
"""
