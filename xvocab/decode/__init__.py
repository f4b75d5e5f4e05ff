"""The decode room: the loop and its two doors, and what one round is.

    loop.py               the one decode loop (draft, verify in one target forward, commit), over a decoder interface
    doors.py              its two doors: xvocab.generate (one prompt), xvocab.generate_batch (many, continuous batching)
    state.py              each row's decode state: the two sides (ids, stream, cached positions), what a drafter reads
    request.py            a request's checks, its rows' proposal sampling and noise tape, its Output
    commit.py             the commit step after a verification (xvocab.verification.verify.verify_proposal)
    pair.py               a (target, draft) pair prepared once: the one owner of the tokenizers' facts
"""
