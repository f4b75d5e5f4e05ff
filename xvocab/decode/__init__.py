"""The decode room: the loop and its two doors, and what one round is.

    loop.py               the one decode loop (draft, verify in one target forward, commit), over a decoder interface
    engine.py, batch.py   its doors: xvocab.generate (one prompt) and xvocab.generate_batch (many, continuous batching)
    rounds.py, commit.py  a round's rules: request checks, proposal sampling, verification; the commit step
    pair.py               a (target, draft) pair prepared once: the one owner of the tokenizers' facts
"""
